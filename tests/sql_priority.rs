//! Priorities on the SQL backend, beyond the conformance rows (which run on the conformance
//! table, a priority column in it), on SQLite and Postgres:
//!
//! - a table without a priority column refuses, at publish, a job that asks for a level other
//!   than normal, naming the column to add; nothing of its batch is stored; normal jobs publish
//!   as before;
//! - a dead letter moved into another table keeps its level (the copy carries every column),
//!   and so does its replay;
//! - a FIFO table with a priority column is refused at startup (FIFO means publish order).
//!
//! Postgres reads `DATABASE_URL` (run under `scripts/test-all`); there a missing URL is a
//! failure; a plain `cargo test` without it lists the test as ignored.

mod common;

use std::time::Duration;

use common::{Db, Lite, ddl, on_both};
use stagedoor_jobs::broker::{DeadLetters, Publish, Settlement};
use stagedoor_jobs::inbox::{Column, ColumnType, Table};
use stagedoor_jobs::{Broker, DeadSelector, Failure, FailureCause, Inbox, Job, Priority};

const fn col(name: &'static str, generated: bool, ty: ColumnType) -> Column {
    Column {
        name,
        generated,
        ty,
    }
}

/// A grouped table without a priority column.
struct NoPriority;
impl Inbox for NoPriority {
    const TABLE: Table = Table {
        schema: None,
        name: "np_jobs",
        id: col("id", false, ColumnType::Text),
        group: Some(col("queue", false, ColumnType::Text)),
        fifo: false,
        attempt: Some(col("attempt", true, ColumnType::Integer)),
        retry_after: Some(col("retry_after", false, ColumnType::Timestamp)),
        locked_until: Some(col("locked_until", false, ColumnType::Timestamp)),
        payload: col("payload", false, ColumnType::Bytes),
        enqueued_at: None,
        last_error: None,
        headers: Some(col("headers", false, ColumnType::Text)),
        priority: None,
        columns: &[
            "id",
            "queue",
            "attempt",
            "retry_after",
            "locked_until",
            "payload",
            "headers",
        ],
    };
}

const NO_PRIORITY_DDL: &str = "
CREATE TABLE np_jobs (id TEXT PRIMARY KEY, queue TEXT NOT NULL, attempt SMALLINT NOT NULL DEFAULT 1,
    retry_after {time} NOT NULL, locked_until {time}, payload {bytes} NOT NULL, headers TEXT);";

/// A table without a group column (its dead letters go to another table), with a priority.
struct Single;
impl Inbox for Single {
    const TABLE: Table = Table {
        schema: None,
        name: "prio_jobs",
        id: col("id", true, ColumnType::Integer),
        group: None,
        fifo: false,
        attempt: Some(col("attempt", true, ColumnType::Integer)),
        retry_after: Some(col("retry_after", false, ColumnType::Timestamp)),
        locked_until: Some(col("locked_until", false, ColumnType::Timestamp)),
        payload: col("payload", false, ColumnType::Bytes),
        enqueued_at: None,
        last_error: Some(col("last_error", false, ColumnType::Text)),
        headers: None,
        priority: Some(col("priority", false, ColumnType::Integer)),
        columns: &[
            "id",
            "attempt",
            "retry_after",
            "locked_until",
            "payload",
            "last_error",
            "priority",
        ],
    };
}

const SINGLE_DDL: &str = "
CREATE TABLE prio_jobs (id {serial}, attempt SMALLINT NOT NULL DEFAULT 1, retry_after {time} NOT NULL,
    locked_until {time}, payload {bytes} NOT NULL, last_error TEXT, priority SMALLINT NOT NULL DEFAULT 0);
CREATE INDEX prio_jobs_priority ON prio_jobs (priority DESC, retry_after, id);
CREATE TABLE prio_jobs_dead (id {id}, attempt SMALLINT NOT NULL DEFAULT 1, retry_after {time} NOT NULL,
    locked_until {time}, payload {bytes} NOT NULL, last_error TEXT, priority SMALLINT NOT NULL DEFAULT 0);";

/// A FIFO table with a priority column: refused.
struct FifoWithPriority;
impl Inbox for FifoWithPriority {
    const TABLE: Table = Table {
        name: "fifo_prio_jobs",
        fifo: true,
        priority: Some(col("priority", false, ColumnType::Integer)),
        ..<NoPriority as Inbox>::TABLE
    };
}

fn job(queue: &str, n: u64) -> Job {
    Job::new(queue, &serde_json::json!({ "n": n })).expect("a job encodes")
}

fn n_of(payload: &[u8]) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(payload).expect("json");
    v["n"].as_u64().expect("n")
}

async fn count<D: Db>(db: &D, sql: &str) -> i64 {
    db.rows(sql.to_owned()).await[0][0].int()
}

on_both!(
    a_table_without_a_priority_column_refuses_a_priority_job,
    a_dead_letter_table_keeps_the_level_and_so_does_its_replay,
);

/// A job of another level than normal, alone, in a batch, or unique: refused with the fix,
/// and nothing of its batch stored. Normal jobs publish as before.
async fn a_table_without_a_priority_column_refuses_a_priority_job<D: Db>() {
    let db = D::fresh("noprio", &ddl::<D>(NO_PRIORITY_DDL)).await;
    let route = D::route::<NoPriority>(&db.broker(), "q");
    D::publish(&route, job("q", 0)).await;

    let fix = |e: &dyn std::fmt::Display| {
        let e = e.to_string();
        for needle in [
            "np_jobs",
            "priority SMALLINT NOT NULL DEFAULT 0",
            "#[field(priority)] priority: i16",
        ] {
            assert!(e.contains(needle), "`{needle}` in: {e}");
        }
    };
    let e = route
        .publish_job(job("q", 1).priority(Priority::HIGH))
        .await
        .expect_err("a high job is refused");
    fix(&e);
    let e = route
        .publish_jobs([
            job("q", 2),
            job("q", 3).priority(Priority::LOWEST),
            job("q", 4),
        ])
        .await
        .expect_err("a batch with a low job is refused");
    fix(&e);
    let e = route
        .publish_job(
            job("q", 5)
                .priority(Priority::LOW)
                .unique("five", Duration::from_secs(60)),
        )
        .await
        .expect_err("a unique low job is refused");
    fix(&e);
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM np_jobs").await,
        1,
        "nothing of the refused jobs is stored"
    );

    let done = route
        .publish_jobs([job("q", 6), job("q", 7).priority(Priority::NORMAL)])
        .await
        .expect("normal jobs publish");
    assert!(done.iter().all(|p| p.is_stored()), "{done:?}");
    assert_eq!(count(&db, "SELECT COUNT(*) FROM np_jobs").await, 3);
    let got = route
        .claim(
            "q",
            10,
            Duration::from_secs(5),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    let mut ns: Vec<u64> = got.iter().map(|d| n_of(d.envelope.payload())).collect();
    ns.sort_unstable();
    assert_eq!(ns, [0, 6, 7], "the normal jobs are claimed");
    assert!(
        got.iter()
            .all(|d| d.envelope.priority() == Priority::NORMAL),
        "delivered at normal priority"
    );
}

/// A high job dead-lettered into `prio_jobs_dead` keeps its level there (the row, the listing);
/// replayed, it is claimed at that level, ahead of the normal job published before it.
async fn a_dead_letter_table_keeps_the_level_and_so_does_its_replay<D: Db>() {
    const Q: &str = "prio";
    const DEAD: &str = "prio_jobs_dead";
    let db = D::fresh("priodead", &ddl::<D>(SINGLE_DDL)).await;
    let route = D::route::<Single>(&db.broker(), Q);
    D::publish(&route, job(Q, 1)).await;
    D::publish(&route, job(Q, 2).priority(Priority::HIGH)).await;
    assert_eq!(
        count(&db, "SELECT CAST(priority AS BIGINT) FROM prio_jobs WHERE attempt = 1 ORDER BY id DESC LIMIT 1").await,
        1,
        "the level is stored"
    );

    let mut got = route
        .claim(
            Q,
            1,
            Duration::from_secs(5),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(got.len(), 1);
    let d = got.remove(0);
    assert_eq!(
        (n_of(d.envelope.payload()), d.envelope.priority()),
        (2, Priority::HIGH),
        "the high job first"
    );
    route
        .settle(
            Q,
            &d,
            Settlement::DeadLetter {
                target: DEAD.to_owned(),
                failure: Failure::new(FailureCause::Error, "no", ""),
            },
        )
        .await
        .expect("dead-letter");
    assert_eq!(
        count(&db, "SELECT CAST(priority AS BIGINT) FROM prio_jobs_dead").await,
        1,
        "the dead letter's row keeps the level"
    );
    let letters = route
        .dead_letters(DEAD, &DeadSelector::All, 10)
        .await
        .expect("dead letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(
        letters[0].envelope.priority(),
        Priority::HIGH,
        "listed at its level"
    );

    let report = route
        .replay(DEAD, &DeadSelector::Id(letters[0].id.clone()))
        .await
        .expect("replay");
    assert_eq!(report.replayed, 1, "{report:?}");
    let mut got = route
        .claim(
            Q,
            1,
            Duration::from_secs(5),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(got.len(), 1);
    let d = got.remove(0);
    assert_eq!(
        (n_of(d.envelope.payload()), d.envelope.priority()),
        (2, Priority::HIGH),
        "the replayed job, at its level, before the normal one published first"
    );
}

/// FIFO runs a group's jobs one at a time in publish order, which a priority would break: the
/// startup check refuses the combination, naming both fixes, and so does every publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_table_with_a_priority_column_is_refused() {
    let db = Lite::fresh("fifoprio", "").await;
    let route = Lite::route::<FifoWithPriority>(&db.broker(), "q");
    let problems = route.check(&[]).await;
    assert_eq!(problems.len(), 1, "{problems:?}");
    let message = &problems[0].message;
    for needle in [
        "fifo_prio_jobs",
        "FIFO",
        "drop `#[field(priority)]`",
        "drop `fifo`",
    ] {
        assert!(message.contains(needle), "`{needle}` in: {message}");
    }
    let e = route
        .publish_job(job("q", 1))
        .await
        .expect_err("no publish either");
    assert!(e.to_string().contains("drop `fifo`"), "{e}");
}
