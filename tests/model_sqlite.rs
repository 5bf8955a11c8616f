//! The model-based random test of the broker contract (`stagedoor_jobs::conformance::run_model`)
//! on SQLite: a fresh database file per sequence, publishes in the caller's transaction
//! (`SqlxRoute::publish_in`), and hand-edited rows (a due time that is no timestamp, headers
//! that are no JSON, an attempt count and a priority out of range).
//!
//! SQLite has no server to restart: the database is a file the process opens itself. The
//! model's restart step does the nearest thing that happens to a running service: every
//! connection of the broker's pool closed at once, so that the next calls open new ones (as
//! the pool's idle timeout and maximum lifetime do over time), which checks that the broker
//! keeps nothing per connection that a reopened one lacks. The file is left as it is.

mod common;
mod common_model_sql;

use std::time::Duration;

use common::{ConfRow, SQLITE_CONF_SCHEMA, fresh_sqlite_url};
use common_model_sql::{SQL_JUNK, junk_row};
use sqlx::Connection;
use sqlx::sqlite::SqlitePoolOptions;
use stagedoor_jobs::conformance::{Fixture, Junk, ModelRun, Outage, run_model};
use stagedoor_jobs::{BrokerError, Job, Published};
use stagedoor_jobs_sqlx::{SqlxBroker, SqlxRoute};

struct SqliteModel;

type Route = SqlxRoute<sqlx::Sqlite, ConfRow>;

impl Fixture for SqliteModel {
    type Broker = Route;

    async fn broker(&self) -> Route {
        self.broker_with_lease(stagedoor_jobs::broker::DEFAULT_LEASE)
            .await
    }

    async fn broker_with_lease(&self, lease: Duration) -> Route {
        let url = fresh_sqlite_url("model");
        let mut conn = sqlx::SqliteConnection::connect(&url)
            .await
            .expect("create the database");
        sqlx::raw_sql(SQLITE_CONF_SCHEMA)
            .execute(&mut conn)
            .await
            .expect("create the table");
        conn.close().await.expect("close");
        SqlxBroker::from_url(url, SqlitePoolOptions::new())
            .poll_interval(Duration::from_millis(20))
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

    /// Closes every connection of the pool (none is in use between two steps; a pool holding
    /// none has nothing to close).
    async fn server_down(&self, route: &Route) -> Option<Result<Outage, String>> {
        let pool = route.broker().pool()?;
        // A connection a call let go of goes back to the pool in a task of its own: wait
        // (briefly) until every connection is idle.
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while pool.num_idle() < pool.size() as usize && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let size = pool.size();
        let mut held = Vec::new();
        while let Some(conn) = pool.try_acquire() {
            held.push(conn);
        }
        let closed = held.len() as u32;
        for conn in held {
            if let Err(e) = conn.close().await {
                return Some(Err(format!("closing a connection: {e}")));
            }
        }
        if pool.size() + closed > size {
            return Some(Err(format!(
                "the pool held {size} connections, {closed} were closed, and it holds {} now",
                pool.size()
            )));
        }
        Some(Ok(Outage::Cut))
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
        let sql = junk_row(junk, true)?;
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

/// Step kinds left out of CI while a defect they find is open (none now: the publish whose
/// XADD failed, the junk delayed member and the SQL `publish_in` unique key, found by this
/// test on the code before issue 29's fixes, are fixed).
const KNOWN: &[&str] = &[];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model() {
    run_model(
        SqliteModel,
        ModelRun {
            backend: "sqlite",
            rerun: "--test model_sqlite model",
            seeds: &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            steps: 40,
            lease: Duration::from_secs(1),
            known_defects: KNOWN,
        },
    )
    .await;
}
