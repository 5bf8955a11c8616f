//! The databases this backend speaks, and what differs between them at the connection:
//! which errors are about the connection, and how long a statement waits for one.

use std::time::Duration;

use sqlx::Database;
use stagedoor_jobs::BrokerError;

use crate::sql::Flavor;

#[allow(unreachable_pub)]
pub(crate) mod sealed {
    use crate::sql::Flavor;
    pub trait Sealed {
        const FLAVOR: Flavor;
    }
    impl Sealed for sqlx::Sqlite {
        const FLAVOR: Flavor = Flavor::Sqlite;
    }
    impl Sealed for sqlx::Postgres {
        const FLAVOR: Flavor = Flavor::Postgres;
    }
}

/// The databases this backend speaks: `sqlx::Sqlite` and `sqlx::Postgres`.
pub trait Dialect: Database + sealed::Sealed {}
impl Dialect for sqlx::Sqlite {}
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
            d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
                && code.parse::<i64>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
        }
        _ => false,
    }
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
pub(crate) async fn acquire<DB: Dialect>(
    pool: &sqlx::Pool<DB>,
) -> Result<sqlx::pool::PoolConnection<DB>, BrokerError> {
    if <DB as sealed::Sealed>::FLAVOR != Flavor::Postgres {
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
