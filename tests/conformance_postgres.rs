//! The core's conformance suite, unchanged, on Postgres: a fresh schema per test, so parallel
//! tests and repeated runs never meet.

mod common;

use std::time::Duration;

use common::{ConfRow, PG_CONF_SCHEMA, postgres_url};
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;
use stagedoor_jobs::conformance::Fixture;
use stagedoor_jobs_sqlx::{SqlxBroker, SqlxRoute};

struct PostgresFixture;

async fn fresh(lease: Option<Duration>) -> SqlxRoute<sqlx::Postgres, ConfRow> {
    let url = postgres_url();
    let schema = format!("conf_{}", uuid_like());
    let mut conn = sqlx::PgConnection::connect(&url)
        .await
        .expect("connect to DATABASE_URL");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {schema}; SET search_path TO {schema}; {PG_CONF_SCHEMA}"
    )))
    .execute(&mut conn)
    .await
    .expect("create the schema and table");
    conn.close().await.expect("close");
    let search_path = schema.clone();
    let options = PgPoolOptions::new()
        .max_connections(5)
        .after_connect(move |conn, _| {
            let sql = format!("SET search_path TO {search_path}");
            Box::pin(async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(conn)
                    .await?;
                Ok(())
            })
        });
    let mut broker = SqlxBroker::from_url(url, options).poll_interval(Duration::from_millis(50));
    if let Some(l) = lease {
        broker = broker.lease(l);
    }
    broker.route::<ConfRow>("cf")
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

impl Fixture for PostgresFixture {
    /// The backend decides no fate of its own: the runtime's rules hold on it.
    fn leaves_fates_to_the_runtime(&self) -> bool {
        true
    }

    type Broker = SqlxRoute<sqlx::Postgres, ConfRow>;

    async fn broker(&self) -> Self::Broker {
        fresh(None).await
    }

    async fn broker_with_lease(&self, lease: Duration) -> Self::Broker {
        fresh(Some(lease)).await
    }

    fn paused(&self) -> bool {
        false
    }

    /// A row whose `retry_after` is `-infinity`: a timestamp no client type can hold.
    async fn store_unreadable_job(&self, broker: &Self::Broker, queue: &str) -> Option<String> {
        let pool = broker
            .broker()
            .pool()
            .expect("the fixture's broker is connected");
        sqlx::query(
            "INSERT INTO conf_jobs (id, queue, retry_after, payload) \
             VALUES ('unreadable-1', $1, '-infinity', convert_to('{\"n\":0}', 'UTF8'))",
        )
        .bind(queue)
        .execute(pool)
        .await
        .expect("store the unreadable row");
        Some("retry_after".to_owned())
    }
}

stagedoor_jobs::conformance_tests!(
    PostgresFixture,
    #[ignore = "needs Postgres: run scripts/test-all"]
);
