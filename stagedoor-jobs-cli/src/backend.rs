//! From `--url` (and `--table` for SQL) to a connected broker and what the commands need to
//! know about it ([`Ctx`]): `redis.rs` connects Redis (standalone or Cluster), `sql.rs` a job
//! table of SQLite or Postgres, whose layout it reads from the database first.

mod redis;
mod sql;

use std::time::Duration;

use stagedoor_jobs_redis::RedisBroker;
use stagedoor_jobs_sqlx::{AnyTable, SqlxRoute};

use crate::args::Cli;
use crate::ctx::Ctx;
use crate::error::{Failure, mask};

/// A connected backend.
pub(crate) enum Opened {
    /// Redis Streams (standalone or Cluster).
    Redis(RedisBroker, Ctx),
    /// A job table of an SQLite database.
    Sqlite(SqlxRoute<sqlx::Sqlite, AnyTable>, Ctx),
    /// A job table of a Postgres database.
    Postgres(SqlxRoute<sqlx::Postgres, AnyTable>, Ctx),
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
            let namespace = cli.namespace.as_deref().unwrap_or_default();
            let (broker, ctx) = redis::open(url, namespace, timeout).await?;
            Ok(Opened::Redis(broker, ctx))
        }
        Scheme::Sqlite => {
            let (route, ctx) = sql::open_sqlite(cli, url, timeout).await?;
            Ok(Opened::Sqlite(route, ctx))
        }
        Scheme::Postgres => {
            let (route, ctx) = sql::open_postgres(cli, url, timeout).await?;
            Ok(Opened::Postgres(route, ctx))
        }
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(e.code, crate::error::CONNECT);
        assert!(e.message.contains("mysql://u:***@h/d"), "{}", e.message);
    }
}
