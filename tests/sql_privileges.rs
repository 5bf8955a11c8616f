//! Least privilege on Postgres (issue 29, item 11): a service connected as a role without
//! `CREATE` on its schema (the default for a new role on Postgres 15) and with only table
//! grants either works (the bookkeeping tables were made for it) or refuses to start, naming
//! the `GRANT` or `CREATE TABLE` to run. Before, it started, ran jobs, and failed cancellations
//! and worker reports for good ("permission denied for schema").
//!
//! Each test creates a real role (`CREATE ROLE ... LOGIN`) and connects as it. Postgres only:
//! SQLite has no roles.

mod common;

use std::time::Duration;

use common::{ConfRow, Db, Pg, Sql, conf_ddl};
use stagedoor_jobs::broker::{Activity, Inspect, Locks, Problem};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{Broker, JobId, ServiceError};
use stagedoor_jobs_sqlx::SqlxBroker;

/// The bookkeeping tables, as the README's "Database privileges" creates them.
const BOOKKEEPING_DDL: &str = "
CREATE TABLE stagedoor_locks (lock_key TEXT PRIMARY KEY, token TEXT NOT NULL, until_at TIMESTAMPTZ NOT NULL);
CREATE TABLE stagedoor_schedules (schedule TEXT PRIMARY KEY, last_tick TIMESTAMPTZ NOT NULL);
CREATE TABLE stagedoor_workers (worker_id TEXT PRIMARY KEY, report TEXT NOT NULL, until_at TIMESTAMPTZ NOT NULL);
CREATE TABLE stagedoor_minutes (queue TEXT NOT NULL, minute TIMESTAMPTZ NOT NULL, processed BIGINT NOT NULL, failed BIGINT NOT NULL, dead BIGINT NOT NULL, PRIMARY KEY (queue, minute));
CREATE TABLE stagedoor_permits (pool TEXT NOT NULL, token TEXT NOT NULL, until_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (pool, token));";

const BOOKKEEPING: [&str; 5] = [
    "stagedoor_locks",
    "stagedoor_schedules",
    "stagedoor_workers",
    "stagedoor_minutes",
    "stagedoor_permits",
];

/// A role of its own for one test: it can log in and use the schema, and has no other
/// privilege until the test grants one. Dropped with [`Role::drop`].
struct Role {
    name: String,
}

impl Role {
    async fn new(db: &Pg) -> Self {
        let name = format!("sd_role_{}", common::unique());
        db.run(format!(
            "CREATE ROLE {name} LOGIN; REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC; GRANT USAGE ON SCHEMA {schema} TO {name};",
            schema = db.schema
        ))
        .await;
        Self { name }
    }

    /// A broker connected as this role, working in the test's schema.
    fn broker(&self, db: &Pg) -> SqlxBroker<sqlx::Postgres> {
        let url = &db.url;
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        SqlxBroker::from_url(
            format!("{scheme}://{}@{host}", self.name),
            common::pg_options(&db.schema),
        )
        .poll_interval(Duration::from_millis(20))
    }

    async fn drop(self, db: &Pg) {
        db.run(format!(
            "DROP OWNED BY {name}; DROP ROLE {name};",
            name = self.name
        ))
        .await;
    }
}

async fn send(_: &u64) -> HandlerOutcome {
    HandlerOutcome::ack()
}

fn service(broker: &SqlxBroker<sqlx::Postgres>) -> Service {
    Service::new(AppInfo::new("least-privilege", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(5))
        .with_broker(broker.route::<ConfRow>("emails"), |b| {
            b.include(Subscriber::new("emails", send).name("send"));
        })
}

/// A role with SELECT, INSERT and UPDATE on the job table, no DELETE, no CREATE on the schema
/// and no bookkeeping tables: the service refuses to start, with one problem naming the GRANT
/// on the job table and one per bookkeeping table naming its CREATE TABLE and the schema grant.
async fn a_role_missing_grants_is_refused_naming_the_fix() {
    let db = Pg::fresh("lp_refused", conf_ddl::<Pg>()).await;
    let role = Role::new(&db).await;
    db.run(format!(
        "GRANT SELECT, INSERT, UPDATE ON conf_jobs TO {}",
        role.name
    ))
    .await;
    let result = service(&role.broker(&db)).start().await;
    let (problems, text): (Vec<Problem>, String) = match result {
        Err(e @ ServiceError::Refused { .. }) => {
            let text = e.to_string();
            let ServiceError::Refused { problems, .. } = e else {
                unreachable!()
            };
            (problems, text)
        }
        Err(other) => panic!("expected a refusal listing problems, got: {other}"),
        Ok(running) => {
            running.shutdown().await;
            role.drop(&db).await;
            panic!("the service started without DELETE on its table nor its bookkeeping tables")
        }
    };
    let table = problems
        .iter()
        .find(|p| p.message.contains("conf_jobs"))
        .unwrap_or_else(|| panic!("a problem for the job table: {text}"));
    assert!(
        table.message.contains("lacks DELETE")
            && table
                .message
                .contains("GRANT SELECT, INSERT, UPDATE, DELETE ON \"conf_jobs\""),
        "names the missing privilege and the GRANT: {text}"
    );
    for name in BOOKKEEPING {
        let p = problems
            .iter()
            .find(|p| p.message.contains(&format!("`{name}`")))
            .unwrap_or_else(|| panic!("a problem for `{name}`: {text}"));
        assert!(
            p.message
                .contains(&format!("CREATE TABLE IF NOT EXISTS {name} ("))
                && p.message.contains("GRANT CREATE ON SCHEMA"),
            "names the CREATE TABLE and the schema grant: {text}"
        );
    }
    assert_eq!(problems.len(), 1 + BOOKKEEPING.len(), "{text}");
    role.drop(&db).await;
}

/// A role without CREATE on the schema, whose bookkeeping tables were made for it with
/// grants: the service starts and runs a job, and what needs the bookkeeping tables works
/// (locks, a running job's cancellation marks, worker reports, permits). Before, each of them
/// failed with "permission denied for schema".
async fn a_role_with_tables_made_for_it_works() {
    let db = Pg::fresh("lp_works", conf_ddl::<Pg>()).await;
    db.run(BOOKKEEPING_DDL.to_owned()).await;
    let role = Role::new(&db).await;
    db.run(format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON conf_jobs, {} TO {}",
        BOOKKEEPING.join(", "),
        role.name
    ))
    .await;
    let broker = role.broker(&db);
    let route = broker.route::<ConfRow>("emails");
    route.connect().await.expect("connect as the role");

    assert!(
        route
            .try_lock("lp-lock", "me", Duration::from_secs(5))
            .await
            .expect("a lock")
    );
    let marks = route
        .cancelled("emails", &[JobId::from_string("nobody")])
        .await
        .expect("the cancellation marks");
    assert!(marks.is_empty());
    route.workers().await.expect("the workers' reports");
    let permits = route
        .take_permits("lp-pool", 2, &["a".to_owned()], Duration::from_secs(5))
        .await
        .expect("permits");
    assert_eq!(permits.taken, 1);

    let app = stagedoor_jobs::testing::TestApp::start_live(service(&broker))
        .await
        .unwrap_or_else(|e| panic!("the service starts as the role: {e}"));
    let published = app
        .publish(Job::new("emails", &1_u64).expect("encodes"))
        .await
        .expect("publish");
    common::eventually("the job ran", Duration::from_secs(20), || async {
        app.outcomes("send")
            .iter()
            .any(|o| o.job_id == *published.id())
    })
    .await;
    app.stop().await;
    role.drop(&db).await;
}

#[ignore = "needs Postgres: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_role_missing_grants_is_refused_naming_the_fix() {
    a_role_missing_grants_is_refused_naming_the_fix().await;
}

#[ignore = "needs Postgres: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_role_with_tables_made_for_it_works() {
    a_role_with_tables_made_for_it_works().await;
}
