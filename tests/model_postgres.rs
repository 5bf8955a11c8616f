//! The model-based random test of the broker contract (`stagedoor_jobs::conformance::run_model`)
//! on Postgres: a fresh schema per sequence, publishes in the caller's transaction
//! (`SqlxRoute::publish_in`), and hand-edited rows (a due time of `-infinity`, headers that
//! are no JSON, an attempt count at the column's ceiling, a priority out of range).

mod common;
mod common_model_sql;

use std::time::Duration;

use common::{ConfRow, PG_CONF_SCHEMA, postgres_url, unique};
use common_model_sql::{SQL_JUNK, junk_row};
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;
use stagedoor_jobs::conformance::{Fixture, Junk, ModelRun, run_model};
use stagedoor_jobs::{BrokerError, Job, Published};
use stagedoor_jobs_sqlx::{SqlxBroker, SqlxRoute};

struct PostgresModel;

type Route = SqlxRoute<sqlx::Postgres, ConfRow>;

impl Fixture for PostgresModel {
    type Broker = Route;

    async fn broker(&self) -> Route {
        self.broker_with_lease(stagedoor_jobs::broker::DEFAULT_LEASE)
            .await
    }

    async fn broker_with_lease(&self, lease: Duration) -> Route {
        let url = postgres_url();
        let schema = format!("model_{}", unique());
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
        let options = PgPoolOptions::new()
            .max_connections(5)
            .after_connect(move |conn, _| {
                let sql = format!("SET search_path TO {schema}");
                Box::pin(async move {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(conn)
                        .await?;
                    Ok(())
                })
            });
        SqlxBroker::from_url(url, options)
            .poll_interval(Duration::from_millis(50))
            .lease(lease)
            .route::<ConfRow>("cf")
    }

    fn paused(&self) -> bool {
        false
    }

    async fn publish_in(
        &self,
        route: &Route,
        job: Job,
        commit: bool,
    ) -> Option<Result<Published, BrokerError>> {
        let pool = route.broker().pool()?;
        let mut tx = match pool.begin().await {
            Ok(tx) => tx,
            Err(e) => return Some(Err(BrokerError::Backend(format!("begin: {e}")))),
        };
        let got = route.publish_in(&mut *tx, job).await;
        let end = if commit && got.is_ok() {
            tx.commit().await
        } else {
            tx.rollback().await
        };
        Some(
            end.map_err(|e| BrokerError::Backend(format!("commit or rollback: {e}")))
                .and(got),
        )
    }

    async fn release(&self, route: &Route) {
        if let Some(pool) = route.broker().pool() {
            pool.close().await;
        }
    }

    fn junk_kinds(&self) -> Vec<Junk> {
        SQL_JUNK.to_vec()
    }

    async fn store_junk(
        &self,
        route: &Route,
        queue: &str,
        junk: Junk,
        id: &str,
    ) -> Result<(), String> {
        let sql = junk_row(junk, false)?;
        let pool = route.broker().pool().ok_or("the route is not connected")?;
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(queue)
            .execute(pool)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// Step kinds left out of CI while a defect they find is open (none now: `publish_in` ignoring
/// a unique key, found by this test before issue 29's fix, is fixed).
const KNOWN: &[&str] = &[];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(stagedoor_postgres),
    ignore = "needs Postgres: run scripts/test-all"
)]
async fn model() {
    run_model(
        PostgresModel,
        ModelRun {
            backend: "postgres",
            rerun: "--test model_postgres model",
            seeds: &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            steps: 40,
            lease: Duration::from_secs(1),
            known_defects: KNOWN,
        },
    )
    .await;
}
