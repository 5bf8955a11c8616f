//! The databases this backend speaks, and what differs between them: the statements' driver
//! calls (written once, generic over sqlx's traits), what each database does its own way
//! (`dialect/postgres.rs`, `dialect/sqlite.rs`: opening, waking workers, counting rows), which
//! errors are about the connection, and how long a statement waits for one.
//!
//! The route's code (`route.rs` and `route/`) is generic over [`Dialect`] and reaches the
//! driver only through [`sealed::Driver`]: values are bound as [`sealed::Value`]s and columns
//! read by index, so the few places where the databases differ are named here, not spread
//! through the job path.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Database, Row as _};
use stagedoor_jobs::BrokerError;

use crate::broker::SqlxBroker;
use crate::catalog::Layout;
use crate::sql::Flavor;

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

#[allow(unreachable_pub)]
pub(crate) mod sealed {
    use super::*;

    /// A value a statement binds: the four kinds this backend writes (an id is an integer or a
    /// text; `None` binds SQL `NULL` of that kind).
    #[derive(Clone, Debug)]
    pub enum Value {
        Int(Option<i64>),
        Text(Option<String>),
        Time(Option<DateTime<Utc>>),
        Bytes(Vec<u8>),
    }

    /// What each database does its own way. Implemented for `sqlx::Sqlite` and
    /// `sqlx::Postgres` only (in `dialect/sqlite.rs` and `dialect/postgres.rs`).
    pub trait Sealed: Database {
        /// Which statement text this database takes.
        const FLAVOR: Flavor;

        /// Opens the broker's pool from its source (at most once), and on Postgres starts the
        /// `LISTEN` task that wakes idle workers.
        fn open(broker: &SqlxBroker<Self>) -> impl Future<Output = Result<(), BrokerError>> + Send;

        /// Tells other processes' workers that `queue` has new rows, inside the publisher's
        /// transaction (Postgres `NOTIFY`; nothing on SQLite, whose workers are in this
        /// process), and wakes this process's.
        fn notify<'c>(
            broker: &'c SqlxBroker<Self>,
            conn: &'c mut Self::Connection,
            queue: &'c str,
        ) -> impl Future<Output = Result<(), BrokerError>> + Send + 'c;

        /// The layout of `table` as the catalog describes it (no columns when there is no
        /// such table).
        fn layout(
            pool: &sqlx::Pool<Self>,
            table: &stagedoor_jobs::inbox::Table,
        ) -> impl Future<Output = Result<Layout, sqlx::Error>> + Send;

        /// How many rows a statement changed.
        fn rows_affected(done: &Self::QueryResult) -> u64;

        /// Whether claims of a FIFO table take [`lock_fifo_group`](Self::lock_fifo_group)
        /// first. Postgres: yes (`SKIP LOCKED` alone would let a second worker take the row
        /// behind a locked head); SQLite: no (one writer at a time already).
        const LOCKS_FIFO_GROUPS: bool;

        /// Serialises claims of one FIFO group until the end of the transaction on `conn`
        /// (`key` names the table and group).
        fn lock_fifo_group<'c>(
            conn: &'c mut Self::Connection,
            key: String,
        ) -> impl Future<Output = Result<(), BrokerError>> + Send + 'c;

        /// The database's clock.
        fn database_time<'c>(
            conn: &'c mut Self::Connection,
        ) -> impl Future<Output = Result<DateTime<Utc>, BrokerError>> + Send + 'c;

        /// Column `i` of `row` read as a timestamp from its stored form, where the driver's own
        /// decoding cannot be trusted with every value: `None` to use the driver's decoding
        /// (the column is NULL or not of such a type); `Err` with the value as shown in a
        /// message when chrono cannot hold it.
        fn stored_time(row: &Self::Row, i: usize) -> Option<Result<DateTime<Utc>, String>>;

        /// Whether the database may give a new row of `table` the id of a deleted one: SQLite
        /// does for an integer row id not declared `AUTOINCREMENT`; Postgres never does.
        /// `None` when the table's declaration cannot be read.
        fn reuses_ids<'c>(
            conn: &'c mut Self::Connection,
            table: &'c stagedoor_jobs::inbox::Table,
        ) -> impl Future<Output = Option<bool>> + Send + 'c;
    }

    /// The driver calls the route makes, for any database whose sqlx types bind and read what
    /// this backend writes. Written once below for every such database; the bounds that say
    /// so are there, not on each function of the route.
    pub trait Driver: Sealed {
        /// Runs `sql` with `binds`; the rows it changed.
        fn run<'c>(
            conn: &'c mut Self::Connection,
            sql: impl Into<Arc<str>>,
            binds: Vec<Value>,
        ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c;

        /// Runs `sql` with `binds`; the rows it returned.
        fn fetch<'c>(
            conn: &'c mut Self::Connection,
            sql: impl Into<Arc<str>>,
            binds: Vec<Value>,
        ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send + 'c;

        /// Runs `sql`, which may hold several statements and binds nothing (creating tables).
        fn run_script<'c>(
            conn: &'c mut Self::Connection,
            sql: &'static str,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;

        /// Prepares `sql` without running it (the startup check of a table).
        fn prepare_only<'c>(
            conn: &'c mut Self::Connection,
            sql: String,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;

        /// Column `i` as text; `None` for NULL; `Err` when it is not text.
        fn text(row: &Self::Row, i: usize) -> Result<Option<String>, sqlx::Error>;
        /// Column `i` as an integer.
        fn int(row: &Self::Row, i: usize) -> Result<Option<i64>, sqlx::Error>;
        /// Column `i` as a float.
        fn float(row: &Self::Row, i: usize) -> Result<Option<f64>, sqlx::Error>;
        /// Column `i` as bytes.
        fn bytes(row: &Self::Row, i: usize) -> Result<Option<Vec<u8>>, sqlx::Error>;
        /// Column `i` as a timestamp (the driver's own decoding).
        fn time(row: &Self::Row, i: usize) -> Result<Option<DateTime<Utc>>, sqlx::Error>;
        /// Whether column `i` is NULL; `Err` when there is no such column.
        fn is_null(row: &Self::Row, i: usize) -> Result<bool, sqlx::Error>;
        /// The name of column `i`'s type as the database gives it (`TIMESTAMPTZ`, `TEXT`).
        fn type_name(row: &Self::Row, i: usize) -> Result<String, sqlx::Error>;
    }

    fn query<DB: Database>(
        sql: Arc<str>,
        binds: Vec<Value>,
    ) -> sqlx::query::Query<'static, DB, DB::Arguments>
    where
        Option<i64>: sqlx::Encode<'static, DB> + sqlx::Type<DB>,
        Option<String>: sqlx::Encode<'static, DB> + sqlx::Type<DB>,
        Vec<u8>: sqlx::Encode<'static, DB> + sqlx::Type<DB>,
        Option<DateTime<Utc>>: sqlx::Encode<'static, DB> + sqlx::Type<DB>,
    {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for b in binds {
            q = match b {
                Value::Int(v) => q.bind(v),
                Value::Text(v) => q.bind(v),
                Value::Time(v) => q.bind(v),
                Value::Bytes(v) => q.bind(v),
            };
        }
        q
    }

    impl<DB> Driver for DB
    where
        DB: Sealed,
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        DB::Arguments: sqlx::IntoArguments<DB>,
        usize: sqlx::ColumnIndex<DB::Row>,
        Option<i64>: sqlx::Encode<'static, DB> + for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
        Option<f64>: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
        Option<String>: sqlx::Encode<'static, DB> + for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
        Vec<u8>: sqlx::Encode<'static, DB> + sqlx::Type<DB>,
        Option<Vec<u8>>: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
        Option<DateTime<Utc>>:
            sqlx::Encode<'static, DB> + for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    {
        fn run<'c>(
            conn: &'c mut Self::Connection,
            sql: impl Into<Arc<str>>,
            binds: Vec<Value>,
        ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c {
            let q = query::<DB>(sql.into(), binds);
            async move {
                let done = sqlx::Executor::execute(conn, q).await?;
                Ok(DB::rows_affected(&done))
            }
        }

        fn fetch<'c>(
            conn: &'c mut Self::Connection,
            sql: impl Into<Arc<str>>,
            binds: Vec<Value>,
        ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send + 'c {
            let q = query::<DB>(sql.into(), binds);
            sqlx::Executor::fetch_all(conn, q)
        }

        fn run_script<'c>(
            conn: &'c mut Self::Connection,
            sql: &'static str,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c {
            let done = sqlx::Executor::execute(conn, sqlx::raw_sql(sql));
            async move { done.await.map(|_| ()) }
        }

        fn prepare_only<'c>(
            conn: &'c mut Self::Connection,
            sql: String,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c {
            let prepared = sqlx::Executor::prepare(
                conn,
                sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(sql)),
            );
            async move { prepared.await.map(|_| ()) }
        }

        fn text(row: &Self::Row, i: usize) -> Result<Option<String>, sqlx::Error> {
            row.try_get(i)
        }

        fn int(row: &Self::Row, i: usize) -> Result<Option<i64>, sqlx::Error> {
            row.try_get(i)
        }

        fn float(row: &Self::Row, i: usize) -> Result<Option<f64>, sqlx::Error> {
            row.try_get(i)
        }

        fn bytes(row: &Self::Row, i: usize) -> Result<Option<Vec<u8>>, sqlx::Error> {
            row.try_get(i)
        }

        fn time(row: &Self::Row, i: usize) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
            row.try_get(i)
        }

        fn is_null(row: &Self::Row, i: usize) -> Result<bool, sqlx::Error> {
            row.try_get_raw(i).map(|v| sqlx::ValueRef::is_null(&v))
        }

        fn type_name(row: &Self::Row, i: usize) -> Result<String, sqlx::Error> {
            let raw = row.try_get_raw(i)?;
            Ok(sqlx::TypeInfo::name(&*sqlx::ValueRef::type_info(&raw)).to_owned())
        }
    }
}

/// The databases this backend speaks: `sqlx::Sqlite` (feature `sqlite`, on by default) and
/// `sqlx::Postgres` (feature `postgres`).
pub trait Dialect: sealed::Driver {}
#[cfg(feature = "sqlite")]
impl Dialect for sqlx::Sqlite {}
#[cfg(feature = "postgres")]
impl Dialect for sqlx::Postgres {}

/// Whether `e` is about reaching or using the database rather than about the statement: a
/// broken or refused connection, a pool that gave no connection, TLS, Postgres' connection
/// exceptions (SQLSTATE class `08`) and shutdowns (`57P01` admin, `57P02` crash, `57P03`
/// cannot connect now), SQLite's `BUSY` and `LOCKED` (another writer held the database).
pub(crate) fn is_connection_error(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => {
            let Some(code) = d.code() else {
                return false;
            };
            if code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03") {
                return true;
            }
            // SQLite reports its (extended) result code as a number: the primary code is the
            // low byte. 5 is SQLITE_BUSY, 6 SQLITE_LOCKED.
            is_sqlite_error(&**d) && code.parse::<i64>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
        }
        _ => false,
    }
}

#[cfg(feature = "sqlite")]
fn is_sqlite_error(d: &(dyn sqlx::error::DatabaseError + 'static)) -> bool {
    d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
}

#[cfg(not(feature = "sqlite"))]
fn is_sqlite_error(_: &(dyn sqlx::error::DatabaseError + 'static)) -> bool {
    false
}

/// A driver error as a [`BrokerError`]: [`BrokerError::Connection`] for what
/// [`is_connection_error`] says is about the connection (the same call can succeed later
/// unchanged), [`BrokerError::Backend`] for the rest.
pub(crate) fn db_err(e: sqlx::Error) -> BrokerError {
    if is_connection_error(&e) {
        BrokerError::Connection(e.to_string())
    } else {
        BrokerError::Backend(e.to_string())
    }
}

/// The longest a statement waits for a Postgres connection: during an outage the pool tries to
/// connect again with a backoff that grows to a fifth of its acquire timeout (6 s by default),
/// so a claim waiting inside one acquire would resume seconds after the server answers. Each
/// try gives up after this long instead, and the runtime tries again (at most 500 ms later)
/// with a fresh backoff.
pub(crate) const PG_ACQUIRE_WAIT: Duration = Duration::from_secs(2);

/// A connection of `pool`; on Postgres within [`PG_ACQUIRE_WAIT`].
pub(crate) async fn acquire<DB: Database + sealed::Sealed>(
    pool: &sqlx::Pool<DB>,
) -> Result<sqlx::pool::PoolConnection<DB>, BrokerError> {
    if DB::FLAVOR != Flavor::Postgres {
        return pool.acquire().await.map_err(db_err);
    }
    match tokio::time::timeout(PG_ACQUIRE_WAIT, pool.acquire()).await {
        Ok(r) => r.map_err(db_err),
        Err(_) => Err(BrokerError::Connection(format!(
            "no connection to Postgres within {PG_ACQUIRE_WAIT:?}: the server is not answering (restarting, or unreachable), or every connection of the pool is busy (raise max_connections)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_errors_are_told_from_statement_errors() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(is_connection_error(&sqlx::Error::Io(refused)));
        assert!(is_connection_error(&sqlx::Error::PoolTimedOut));
        assert!(is_connection_error(&sqlx::Error::PoolClosed));
        assert!(!is_connection_error(&sqlx::Error::RowNotFound));
        assert!(!is_connection_error(&sqlx::Error::Protocol(
            "unexpected".to_owned()
        )));
        assert!(matches!(
            db_err(sqlx::Error::PoolTimedOut),
            BrokerError::Connection(_)
        ));
        assert!(matches!(
            db_err(sqlx::Error::RowNotFound),
            BrokerError::Backend(_)
        ));
    }
}
