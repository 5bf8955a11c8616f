//! The core's conformance suite, unchanged, on SQLite: a fresh database file per test.

mod common;

use std::time::Duration;

use common::{ConfRow, SQLITE_CONF_SCHEMA, fresh_sqlite_url};
use sqlx::Connection;
use sqlx::sqlite::SqlitePoolOptions;
use stagedoor_jobs::conformance::Fixture;
use stagedoor_jobs_sqlx::{SqlxBroker, SqlxRoute};

struct SqliteFixture;

async fn fresh(lease: Option<Duration>) -> SqlxRoute<sqlx::Sqlite, ConfRow> {
    let url = fresh_sqlite_url("conf");
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("create the database");
    sqlx::raw_sql(SQLITE_CONF_SCHEMA)
        .execute(&mut conn)
        .await
        .expect("create the table");
    conn.close().await.expect("close");
    let mut broker = SqlxBroker::from_url(url, SqlitePoolOptions::new())
        .poll_interval(Duration::from_millis(20));
    if let Some(l) = lease {
        broker = broker.lease(l);
    }
    broker.route::<ConfRow>("cf")
}

impl Fixture for SqliteFixture {
    /// The backend decides no fate of its own: the runtime's rules hold on it.
    fn leaves_fates_to_the_runtime(&self) -> bool {
        true
    }

    type Broker = SqlxRoute<sqlx::Sqlite, ConfRow>;

    async fn broker(&self) -> Self::Broker {
        fresh(None).await
    }

    async fn broker_with_lease(&self, lease: Duration) -> Self::Broker {
        fresh(Some(lease)).await
    }

    fn paused(&self) -> bool {
        false
    }

    /// A row whose `retry_after` is `''`: a text, not a timestamp (SQLite columns hold any
    /// value), due before any timestamp.
    async fn store_unreadable_job(&self, broker: &Self::Broker, queue: &str) -> Option<String> {
        let pool = broker
            .broker()
            .pool()
            .expect("the fixture's broker is connected");
        sqlx::query(
            "INSERT INTO conf_jobs (id, queue, retry_after, payload, enqueued_at) \
             VALUES ('unreadable-1', $1, '', CAST('{\"n\":0}' AS BLOB), '2026-01-01T00:00:00+00:00')",
        )
        .bind(queue)
        .execute(pool)
        .await
        .expect("store the unreadable row");
        Some("retry_after".to_owned())
    }
}

stagedoor_jobs::conformance_tests!(SqliteFixture);
