//! From `--url` (and `--table` for SQL) to a connected broker and what the commands need to
//! know about it: how its dead letters are named, and how to name it in messages.

use std::str::FromStr;
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use stagedoor_jobs::DeadLetters;
use stagedoor_jobs::inbox::Table;
use stagedoor_jobs_redis::RedisBroker;
use stagedoor_jobs_sqlx::{AnyTable, SqlxBroker, SqlxRoute};

use super::Cli;
use super::error::{Failure, mask};
use super::introspect;
use stagedoor_jobs::broker::Inspect;

/// A connected backend.
pub(crate) enum Opened {
    /// Redis Streams (standalone or Cluster).
    Redis(RedisBroker, Ctx),
    /// A job table of an SQLite database.
    Sqlite(SqlxRoute<sqlx::Sqlite, AnyTable>, Ctx),
    /// A job table of a Postgres database.
    Postgres(SqlxRoute<sqlx::Postgres, AnyTable>, Ctx),
}

/// How a backend names dead letters.
#[derive(Clone, Debug)]
pub(crate) enum Naming {
    /// A dead letter is its queue's name plus a suffix: `jobs:dead` (Redis), `emails.dead`
    /// (an SQL table with a group column).
    Suffix(&'static str),
    /// An SQL table without a group column is one queue, named as the table; its dead letters
    /// are other tables (`<table>_dead` by default). `tables` are the database's tables.
    Tables {
        /// The job table (and its one queue).
        table: String,
        /// The tables of its schema.
        tables: Vec<String>,
    },
}

/// What the commands know about the backend besides the broker.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    /// The backend in messages: "Redis at `redis://…`", "table `mail_jobs` of `sqlite://…`".
    pub(crate) place: String,
    /// How its dead letters are named.
    pub(crate) naming: Naming,
    /// The queues, when the broker cannot list them itself (a Redis Cluster: each node given
    /// was asked for its own).
    pub(crate) listed: Option<Vec<String>>,
    /// Whether the backend stores when a job was enqueued (an SQL table may have no
    /// `enqueued_at` column: its dead letters' enqueued time is then unknown, not shown).
    pub(crate) stores_enqueued: bool,
    /// Redis: the broker, to read a dead letter's fields exactly as stored.
    pub(crate) redis: Option<RedisBroker>,
}

impl Ctx {
    /// Whether `name` is a dead letter (rather than a queue).
    pub(crate) fn is_dead(&self, name: &str) -> bool {
        match &self.naming {
            Naming::Suffix(s) => name.ends_with(s),
            Naming::Tables { table, .. } => name != table,
        }
    }

    /// The queue whose dead letter `dead` is, by its name.
    pub(crate) fn source_of(&self, dead: &str) -> String {
        match &self.naming {
            Naming::Suffix(s) => dead.strip_suffix(s).unwrap_or(dead).to_owned(),
            Naming::Tables { table, .. } => table.clone(),
        }
    }

    /// The names of the queues and dead letters there are.
    pub(crate) async fn queues<B: DeadLetters>(
        &self,
        b: &B,
    ) -> Result<Vec<String>, stagedoor_jobs::BrokerError> {
        match &self.listed {
            Some(names) => Ok(names.clone()),
            None => b.queues().await,
        }
    }

    /// Whether dead letter `dead` can be read at all: an SQL dead-letter table must exist.
    pub(crate) fn dead_exists(&self, dead: &str) -> bool {
        match &self.naming {
            Naming::Suffix(_) => true,
            Naming::Tables { tables, .. } => tables.iter().any(|t| t == dead),
        }
    }
}

/// The kinds of URL this tool reads.
#[derive(Debug, PartialEq, Eq)]
enum Scheme {
    Redis,
    RedisCluster,
    Postgres,
    Sqlite,
}

fn scheme_of(url: &str) -> Result<Scheme, Failure> {
    let redis = |u: &str| {
        ["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|p| u.starts_with(p))
    };
    if url.contains(',') && url.split(',').all(|u| redis(u.trim())) {
        Ok(Scheme::RedisCluster)
    } else if redis(url) {
        Ok(Scheme::Redis)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Scheme::Postgres)
    } else if url.starts_with("sqlite:") {
        Ok(Scheme::Sqlite)
    } else {
        Err(Failure::connect(format!(
            "`{}` is not a URL stagedoor-jobs reads: write redis://host:port/db, rediss://…, postgres://user@host/database or sqlite://path/to/file.db",
            mask(url)
        )))
    }
}

/// Connects to the backend `cli` names; for SQL, reads the table's layout first.
pub(crate) async fn open(cli: &Cli) -> Result<Opened, Failure> {
    let url = cli.url.as_deref().unwrap_or_default().trim();
    let timeout = Duration::from_secs(cli.timeout.max(1));
    match scheme_of(url)? {
        Scheme::Redis | Scheme::RedisCluster => {
            let cluster = url.contains(',');
            let mut broker = if cluster {
                RedisBroker::cluster(url.split(',').map(str::trim))
            } else {
                RedisBroker::from_url(url)
            };
            let namespace = cli.namespace.as_deref().unwrap_or_default();
            if !namespace.is_empty() {
                broker = broker.namespace(namespace);
            }
            let what = if cluster { "Redis Cluster" } else { "Redis" };
            let place = if namespace.is_empty() {
                format!("{what} at `{}`", mask(url))
            } else {
                format!("namespace `{namespace}` of {what} at `{}`", mask(url))
            };
            // A server that refuses connections is said at once; the broker's own connection
            // retries for a while first.
            for u in url.split(',').map(str::trim) {
                probe_redis(u, timeout).await?;
            }
            match tokio::time::timeout(timeout, broker.connect()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(connect_error(e)),
                Err(_) => {
                    return Err(Failure::connect(format!(
                        "no answer from {what} at `{}` within {}s: check the URL and that the server is running (or raise --timeout)",
                        mask(url),
                        timeout.as_secs()
                    )));
                }
            }
            // A cluster connection's SCAN answers for one node: ask each node given.
            let listed = if cluster {
                let mut names = Vec::new();
                for u in url.split(',').map(str::trim) {
                    let mut node = RedisBroker::from_url(u);
                    if !namespace.is_empty() {
                        node = node.namespace(namespace);
                    }
                    let found = async {
                        node.connect().await?;
                        node.queues().await
                    };
                    match tokio::time::timeout(timeout, found).await {
                        Ok(Ok(n)) => names.extend(n),
                        Ok(Err(e)) => return Err(connect_error(e)),
                        Err(_) => {
                            return Err(Failure::connect(format!(
                                "no answer from the Redis Cluster node `{}` within {}s",
                                mask(u),
                                timeout.as_secs()
                            )));
                        }
                    }
                }
                names.sort();
                names.dedup();
                Some(names)
            } else {
                None
            };
            let ctx = Ctx {
                place,
                naming: Naming::Suffix(":dead"),
                listed,
                stores_enqueued: true,
                redis: Some(broker.clone()),
            };
            Ok(Opened::Redis(broker, ctx))
        }
        Scheme::Sqlite => {
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
            let columns = introspect::sqlite_columns(&pool, schema, &table_name)
                .await
                .map_err(|e| {
                    Failure::connect(format!("cannot read the table `{table_name}`: {e}"))
                })?;
            let tables = introspect::sqlite_tables(&pool, schema)
                .await
                .map_err(|e| Failure::connect(format!("cannot list the tables: {e}")))?;
            let place = format!("table `{table_name}` of `{}`", mask(url));
            let (table, ctx) = describe(&table_name, group, schema, &columns, tables, place)?;
            let route = SqlxBroker::new(pool).route_with_table(table, table_name);
            connect_sql(&route, timeout).await?;
            Ok(Opened::Sqlite(route, ctx))
        }
        Scheme::Postgres => {
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
            let columns = introspect::postgres_columns(&pool, schema, &table_name)
                .await
                .map_err(|e| {
                    Failure::connect(format!("cannot read the table `{table_name}`: {e}"))
                })?;
            let tables = introspect::postgres_tables(&pool, schema)
                .await
                .map_err(|e| Failure::connect(format!("cannot list the tables: {e}")))?;
            let place = format!("table `{table_name}` of `{}`", mask(url));
            let (table, ctx) = describe(&table_name, group, schema, &columns, tables, place)?;
            let route = SqlxBroker::new(pool).route_with_table(table, table_name);
            connect_sql(&route, timeout).await?;
            Ok(Opened::Postgres(route, ctx))
        }
    }
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

/// The table's layout and the commands' context, or why the table cannot be read.
fn describe(
    name: &str,
    group: Option<&str>,
    schema: Option<&str>,
    columns: &[introspect::ColumnInfo],
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

/// A broker's error at connect, without the variant's prefix.
fn connect_error(e: stagedoor_jobs::BrokerError) -> Failure {
    match e {
        stagedoor_jobs::BrokerError::Connection(m) => Failure::connect(m),
        other => Failure::connect(other.to_string()),
    }
}

/// Host and port of a `redis://` URL (`None` for a Unix socket).
fn redis_addr(url: &str) -> Option<(String, u16)> {
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) = v6.split_once(']')?;
        (h.to_owned(), after.strip_prefix(':').unwrap_or_default())
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p),
            None => (hostport.to_owned(), ""),
        }
    };
    let port = if port.is_empty() {
        6379
    } else {
        port.parse().ok()?
    };
    let host = if host.is_empty() {
        "127.0.0.1".to_owned()
    } else {
        host
    };
    Some((host, port))
}

/// Fails at once when nothing listens at a Redis URL's address.
async fn probe_redis(url: &str, timeout: Duration) -> Result<(), Failure> {
    let Some((host, port)) = redis_addr(url) else {
        return Ok(());
    };
    match tokio::time::timeout(
        timeout,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Failure::connect(format!(
            "cannot reach Redis at `{}`: {e}: check the URL and that the server is running",
            mask(url)
        ))),
        Err(_) => Err(Failure::connect(format!(
            "no answer from Redis at `{}` within {}s: check the URL and that the server is running (or raise --timeout)",
            mask(url),
            timeout.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redis_addresses() {
        assert_eq!(redis_addr("redis://h:7/"), Some(("h".into(), 7)));
        assert_eq!(redis_addr("redis://:pw@h/0"), Some(("h".into(), 6379)));
        assert_eq!(
            redis_addr("redis://u:p@[::1]:7000"),
            Some(("::1".into(), 7000))
        );
        assert_eq!(redis_addr("redis+unix:///tmp/r.sock"), None);
    }

    use super::*;

    #[test]
    fn schemes() {
        assert_eq!(scheme_of("redis://h:1/").unwrap(), Scheme::Redis);
        assert_eq!(scheme_of("rediss://h:1/").unwrap(), Scheme::Redis);
        assert_eq!(
            scheme_of("redis://a:1/,redis://b:2/").unwrap(),
            Scheme::RedisCluster
        );
        assert_eq!(scheme_of("postgresql://u@h/d").unwrap(), Scheme::Postgres);
        assert_eq!(scheme_of("sqlite://x.db").unwrap(), Scheme::Sqlite);
        let e = scheme_of("mysql://u:pw@h/d").unwrap_err();
        assert_eq!(e.code, super::super::error::CONNECT);
        assert!(e.message.contains("mysql://u:***@h/d"), "{}", e.message);
    }
}
