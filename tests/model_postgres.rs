//! The model-based random test of the broker contract (`stagedoor_jobs::conformance::run_model`)
//! on Postgres: a fresh schema per sequence, publishes in the caller's transaction
//! (`SqlxRoute::publish_in`), and hand-edited rows (a due time of `-infinity`, headers that
//! are no JSON, an attempt count at the column's ceiling, a priority out of range), and server
//! restarts: every connection of the broker under test (its pool's and its `LISTEN`
//! connection, told apart by an `application_name` of their own) terminated from an admin
//! connection, as a server restart or a failover cuts them. The shared server itself is not
//! stopped, and other tests' connections to the same database are left alone.

mod common;
mod common_model_sql;

use std::time::Duration;

use common::{ConfRow, PG_CONF_SCHEMA, postgres_url, unique};
use common_model_sql::{SQL_JUNK, junk_row};
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;
use stagedoor_jobs::conformance::{Fixture, Junk, ModelRun, Outage, run_model};
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
        let schema = format!("model_{}", unique());
        let url = postgres_url();
        // The connections of this broker, and only these, are what a restart terminates.
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}application_name={schema}");
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

    /// Terminates every connection of the broker's (pool and `LISTEN`), from a connection of
    /// its own.
    async fn server_down(&self, route: &Route) -> Option<Result<Outage, String>> {
        let pool = route.broker().pool()?;
        let options = pool.connect_options();
        let Some(name) = options.get_application_name() else {
            return Some(Err(
                "the pool's connections have no application_name".to_owned()
            ));
        };
        let cut = async {
            let mut admin = sqlx::PgConnection::connect(&postgres_url()).await?;
            // Two statements: in one, Postgres may call pg_terminate_backend on rows before
            // the filter has kept them (other tests' connections, this one).
            let pids: Vec<i32> = sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity \
                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
            )
            .bind(name)
            .fetch_all(&mut admin)
            .await?;
            sqlx::query("SELECT pg_terminate_backend(p) FROM unnest($1::int4[]) AS p")
                .bind(&pids)
                .execute(&mut admin)
                .await?;
            // Gone, not only signalled: a call made next finds its connection broken.
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                let left: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                        .bind(&pids)
                        .fetch_one(&mut admin)
                        .await?;
                if left == 0 || std::time::Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            admin.close().await?;
            Ok::<usize, sqlx::Error>(pids.len())
        };
        Some(match cut.await {
            Ok(0) => Err(format!(
                "no connection named {name} to terminate: the broker holds none"
            )),
            Ok(_) => Ok(Outage::Cut),
            Err(e) => Err(format!("terminating the connections of {name}: {e}")),
        })
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
#[ignore = "needs Postgres: run scripts/test-all"]
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

/// The model's fixture lets go of each broker (`release`: its pool closed); that must close
/// every connection of the broker's, its `LISTEN` connection included, or thousands of
/// sequences (`scripts/soak`) exhaust the server's `max_connections` ("too many clients
/// already", seen after about 90 sequences: each left its `LISTEN` connection open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Postgres: run scripts/test-all"]
async fn a_released_broker_leaves_no_connection_open() {
    use stagedoor_jobs::broker::{Broker, Inspect};
    let fixture = PostgresModel;
    let route = fixture.broker_with_lease(Duration::from_secs(1)).await;
    route.connect().await.expect("connect");
    route.prepare("model").await.expect("prepare");
    let name = route
        .broker()
        .pool()
        .expect("connected")
        .connect_options()
        .get_application_name()
        .expect("the fixture names its connections")
        .to_owned();
    let mut admin = sqlx::PgConnection::connect(&postgres_url())
        .await
        .expect("connect to DATABASE_URL");
    let count = async |admin: &mut sqlx::PgConnection, listen: bool| -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
             AND (NOT $2 OR query LIKE 'LISTEN%')",
        )
        .bind(&name)
        .bind(listen)
        .fetch_one(admin)
        .await
        .expect("read pg_stat_activity")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while count(&mut admin, true).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the broker's LISTEN connection did not open within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fixture.release(&route).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let left = count(&mut admin, false).await;
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} connections of the released broker ({name}) are still open 5 s after its pool closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
