//! `--url sqlite://…` or `postgres://…` with `--table`: the job table's layout is read from
//! the database, then the table is opened as a route.

use std::str::FromStr;
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use stagedoor_jobs::DeadLetters;
use stagedoor_jobs::inbox::Table;
use stagedoor_jobs_sqlx::{AnyTable, SqlxBroker, SqlxRoute};

use crate::args::Cli;
use crate::ctx::{Ctx, Naming};
use crate::error::{Failure, connect_error, mask};
use crate::introspect::{self, ColumnInfo};

/// Opens the job table `--table` of the SQLite database at `url`.
pub(super) async fn open_sqlite(
    cli: &Cli,
    url: &str,
    timeout: Duration,
) -> Result<(SqlxRoute<sqlx::Sqlite, AnyTable>, Ctx), Failure> {
    let (table_name, group) = sql_args(cli)?;
    let opts = SqliteConnectOptions::from_str(url).map_err(|e| {
        Failure::connect(format!(
            "`{}` is not an SQLite URL ({e}): write sqlite://path/to/file.db",
            mask(url)
        ))
    })?;
    let path = opts.get_filename().to_path_buf();
    let in_memory = path.as_os_str().is_empty() || path.to_string_lossy() == ":memory:";
    if !in_memory && !path.exists() {
        return Err(Failure::connect(format!(
            "no SQLite database at `{}`: check the path in the URL (sqlite://path/to/file.db)",
            path.display()
        )));
    }
    let opts = opts
        .create_if_missing(false)
        .busy_timeout(Duration::from_secs(10));
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .acquire_timeout(timeout)
        .connect_with(opts)
        .await
        .map_err(|e| {
            Failure::connect(format!(
                "cannot open the SQLite database `{}`: {e}",
                path.display()
            ))
        })?;
    let schema = cli.schema.as_deref();
    let columns = introspect::sqlite_columns(&pool, schema, &table_name).await;
    let tables = introspect::sqlite_tables(&pool, schema).await;
    let (table, ctx) = read_layout(&table_name, group, schema, url, columns, tables)?;
    let route = SqlxBroker::new(pool).route_with_table(table, table_name);
    connect_sql(&route, timeout).await?;
    Ok((route, ctx))
}

/// Opens the job table `--table` of the Postgres database at `url`.
pub(super) async fn open_postgres(
    cli: &Cli,
    url: &str,
    timeout: Duration,
) -> Result<(SqlxRoute<sqlx::Postgres, AnyTable>, Ctx), Failure> {
    let (table_name, group) = sql_args(cli)?;
    // One connection first: the pool would retry a refused connection until its
    // timeout and then only say that it timed out.
    let first = async {
        let conn = sqlx::PgConnection::connect(url).await?;
        conn.close().await?;
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(timeout)
            .connect(url)
            .await
    };
    let pool = match tokio::time::timeout(timeout, first).await {
        Ok(Ok(p)) => p,
        Ok(Err(sqlx::Error::Configuration(e))) => {
            return Err(Failure::connect(format!(
                "`{}` is not a Postgres URL ({e}): write postgres://user:password@host:port/database",
                mask(url)
            )));
        }
        Ok(Err(e)) => {
            return Err(Failure::connect(format!(
                "cannot connect to Postgres at `{}`: {e}: check the URL and that the server is running",
                mask(url)
            )));
        }
        Err(_) => {
            return Err(Failure::connect(format!(
                "no answer from Postgres at `{}` within {}s: check the URL and that the server is running (or raise --timeout)",
                mask(url),
                timeout.as_secs()
            )));
        }
    };
    let schema = cli.schema.as_deref();
    let columns = introspect::postgres_columns(&pool, schema, &table_name).await;
    let tables = introspect::postgres_tables(&pool, schema).await;
    let (table, ctx) = read_layout(&table_name, group, schema, url, columns, tables)?;
    let route = SqlxBroker::new(pool).route_with_table(table, table_name);
    connect_sql(&route, timeout).await?;
    Ok((route, ctx))
}

/// The table and group column given for SQL; `--table` is required.
fn sql_args(cli: &Cli) -> Result<(String, Option<&str>), Failure> {
    let Some(table) = cli.table.as_deref().filter(|t| !t.is_empty()) else {
        return Err(Failure::usage(
            "a SQL URL needs --table <NAME>: the job table to read (or set STAGEDOOR_TABLE)",
        ));
    };
    introspect::check_identifier("the table", table)?;
    if let Some(s) = &cli.schema {
        introspect::check_identifier("the schema", s)?;
    }
    if let Some(g) = &cli.group_column {
        introspect::check_identifier("the group column", g)?;
    }
    Ok((table.to_owned(), cli.group_column.as_deref()))
}

/// The table's layout and the commands' context from what the database said of table
/// `name` (its columns, the tables there are), or why the table cannot be read.
fn read_layout(
    name: &str,
    group: Option<&str>,
    schema: Option<&str>,
    url: &str,
    columns: Result<Vec<ColumnInfo>, sqlx::Error>,
    tables: Result<Vec<String>, sqlx::Error>,
) -> Result<(Table, Ctx), Failure> {
    let columns =
        columns.map_err(|e| Failure::connect(format!("cannot read the table `{name}`: {e}")))?;
    let tables = tables.map_err(|e| Failure::connect(format!("cannot list the tables: {e}")))?;
    let place = format!("table `{name}` of `{}`", mask(url));
    describe(name, group, schema, &columns, tables, place)
}

/// The table's layout and the commands' context, or why the table cannot be read.
fn describe(
    name: &str,
    group: Option<&str>,
    schema: Option<&str>,
    columns: &[ColumnInfo],
    tables: Vec<String>,
    place: String,
) -> Result<(Table, Ctx), Failure> {
    if columns.is_empty() {
        let shown: Vec<&str> = tables.iter().take(12).map(String::as_str).collect();
        let listing = if shown.is_empty() {
            "it has no tables".to_owned()
        } else {
            format!(
                "its tables: {}{}",
                shown.join(", "),
                if tables.len() > shown.len() {
                    ", …"
                } else {
                    ""
                }
            )
        };
        let in_schema = schema.map_or(String::new(), |s| format!(" in schema `{s}`"));
        return Err(Failure::not_found(format!(
            "no table `{name}`{in_schema} in the database ({listing})"
        )));
    }
    let table = introspect::layout(schema, name, columns, group)?;
    let naming = if table.group.is_some() {
        Naming::Suffix(".dead")
    } else {
        Naming::Tables {
            table: name.to_owned(),
            tables,
        }
    };
    Ok((
        table,
        Ctx {
            place,
            naming,
            listed: None,
            stores_enqueued: table.enqueued_at.is_some(),
            redis: None,
        },
    ))
}

async fn connect_sql<B: DeadLetters>(route: &B, timeout: Duration) -> Result<(), Failure> {
    match tokio::time::timeout(timeout, route.connect()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(connect_error(e)),
        Err(_) => Err(Failure::connect(format!(
            "no answer from the database within {}s (or raise --timeout)",
            timeout.as_secs()
        ))),
    }
}
