//! The SQL backend's own behaviour, beyond the conformance suite: table-form and group-form dead
//! letters (seed 002), FIFO groups, startup checks, tables without optional columns, the
//! `last_error` column, delayed and transactional publishing, LISTEN/NOTIFY wake-ups, and many
//! workers (in-process and in child processes) on one SQLite file.
//!
//! Each behaviour is written once as a generic `async fn` over [`Db`] and runs on SQLite (a fresh
//! database file per test) and on Postgres (a fresh schema per test): `on_both!` makes a module
//! per behaviour with a `sqlite` and a `postgres` test. Postgres reads `DATABASE_URL` (run under
//! `scripts/test-all`); there a missing URL is a failure; a plain `cargo test` without it lists the test as ignored.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::{ConfRow, Db, Lite, Pg, SQLITE_CONF_SCHEMA, Sql, conf_ddl, ddl, eventually};
use serde::{Deserialize, Serialize};
use stagedoor_jobs::broker::Problem;
use stagedoor_jobs::inbox::{Column, ColumnType, Table};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{Broker, DeadSelector, Fixed, Inbox, ServiceError};

/// How long a test waits for something that should happen within milliseconds.
const PATIENCE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// Tables (hand-written `impl Inbox`, as `#[derive(Inbox)]` would describe them)
// ---------------------------------------------------------------------------------------------

const fn col(name: &'static str, generated: bool, ty: ColumnType) -> Column {
    Column {
        name,
        generated,
        ty,
    }
}
const fn id() -> Column {
    col("id", true, ColumnType::Integer)
}
const fn attempt() -> Option<Column> {
    Some(col("attempt", true, ColumnType::Integer))
}
const fn due() -> Option<Column> {
    Some(col("retry_after", false, ColumnType::Timestamp))
}
const fn locked() -> Option<Column> {
    Some(col("locked_until", false, ColumnType::Timestamp))
}
const fn payload() -> Column {
    col("payload", false, ColumnType::Bytes)
}
const fn text(name: &'static str) -> Option<Column> {
    Some(col(name, false, ColumnType::Text))
}

/// A table without a group column: its dead letters go to another table with the same columns.
struct Plain;
impl Inbox for Plain {
    const TABLE: Table = Table {
        schema: None,
        name: "plain_jobs",
        id: id(),
        group: None,
        fifo: false,
        attempt: attempt(),
        retry_after: due(),
        locked_until: locked(),
        payload: payload(),
        enqueued_at: None,
        last_error: text("last_error"),
        headers: None,
        priority: None,
        columns: &[
            "id",
            "attempt",
            "retry_after",
            "locked_until",
            "payload",
            "last_error",
        ],
    };
}

/// The source table's id is never reused (see
/// [`sqlite_table_form_refuses_ids_that_sqlite_reuses`]).
const PLAIN_DDL: &str = "
CREATE TABLE plain_jobs (id {serial}, attempt INTEGER NOT NULL DEFAULT 1, retry_after {time} NOT NULL,
    locked_until {time}, payload {bytes} NOT NULL, last_error TEXT);
CREATE TABLE plain_jobs_dead (id {id}, attempt INTEGER NOT NULL DEFAULT 1, retry_after {time} NOT NULL,
    locked_until {time}, payload {bytes} NOT NULL, last_error TEXT);
CREATE TABLE plain_jobs_narrow (id {id}, attempt INTEGER NOT NULL DEFAULT 1, retry_after {time} NOT NULL,
    locked_until {time}, payload {bytes} NOT NULL);";

/// Seed 002's `SendMail`: a group column (`name`), no `last_error`, no `headers`.
struct Mail;
impl Inbox for Mail {
    const TABLE: Table = Table {
        schema: None,
        name: "mail_jobs",
        id: id(),
        group: text("name"),
        fifo: false,
        attempt: attempt(),
        retry_after: due(),
        locked_until: locked(),
        payload: payload(),
        enqueued_at: None,
        last_error: None,
        headers: None,
        priority: None,
        columns: &[
            "id",
            "name",
            "attempt",
            "retry_after",
            "locked_until",
            "payload",
        ],
    };
}

/// Seed 002's schema, word for word, on SQLite; the same table on Postgres.
fn mail_ddl<D: Db>() -> String {
    if D::NAME == "sqlite" {
        "CREATE TABLE IF NOT EXISTS mail_jobs (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    locked_until TEXT,
    payload BLOB NOT NULL
)"
        .to_owned()
    } else {
        "CREATE TABLE IF NOT EXISTS mail_jobs (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_until TIMESTAMPTZ,
    payload BYTEA NOT NULL
)"
        .to_owned()
    }
}

/// A table with FIFO groups.
struct Fifo;
impl Inbox for Fifo {
    const TABLE: Table = Table {
        schema: None,
        name: "fifo_jobs",
        id: id(),
        group: text("grp"),
        fifo: true,
        attempt: attempt(),
        retry_after: due(),
        locked_until: locked(),
        payload: payload(),
        enqueued_at: None,
        last_error: text("last_error"),
        headers: None,
        priority: None,
        columns: &[
            "id",
            "grp",
            "attempt",
            "retry_after",
            "locked_until",
            "payload",
            "last_error",
        ],
    };
}

const FIFO_DDL: &str = "
CREATE TABLE fifo_jobs (id {id}, grp TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,
    retry_after {time} NOT NULL, locked_until {time}, payload {bytes} NOT NULL, last_error TEXT);
CREATE INDEX fifo_jobs_due ON fifo_jobs (grp, retry_after, id);";

/// A table nobody created.
struct Ghost;
impl Inbox for Ghost {
    const TABLE: Table = Table {
        name: "ghost_jobs",
        ..Mail::TABLE
    };
}

/// The struct says `retry_after`; the table (see [`TYPO_DDL`]) says `retry_at`.
struct Typo;
impl Inbox for Typo {
    const TABLE: Table = Table {
        name: "typo_jobs",
        ..Mail::TABLE
    };
}

const TYPO_DDL: &str = "
CREATE TABLE typo_jobs (id {id}, name TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,
    retry_at {time} NOT NULL, locked_until {time}, payload {bytes} NOT NULL);";

/// A table without an attempt column (nor headers).
struct NoAttempt;
impl Inbox for NoAttempt {
    const TABLE: Table = Table {
        schema: None,
        name: "noattempt_jobs",
        id: id(),
        group: text("grp"),
        fifo: false,
        attempt: None,
        retry_after: due(),
        locked_until: locked(),
        payload: payload(),
        enqueued_at: None,
        last_error: None,
        headers: None,
        priority: None,
        columns: &["id", "grp", "retry_after", "locked_until", "payload"],
    };
}

const NOATTEMPT_DDL: &str = "
CREATE TABLE noattempt_jobs (id {id}, grp TEXT NOT NULL, retry_after {time} NOT NULL,
    locked_until {time}, payload {bytes} NOT NULL);";

/// A table without a `retry_after` column.
struct NoDue;
impl Inbox for NoDue {
    const TABLE: Table = Table {
        schema: None,
        name: "nodue_jobs",
        id: id(),
        group: text("grp"),
        fifo: false,
        attempt: attempt(),
        retry_after: None,
        locked_until: locked(),
        payload: payload(),
        enqueued_at: None,
        last_error: None,
        headers: None,
        priority: None,
        columns: &["id", "grp", "attempt", "locked_until", "payload"],
    };
}

const NODUE_DDL: &str = "
CREATE TABLE nodue_jobs (id {id}, grp TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,
    locked_until {time}, payload {bytes} NOT NULL);";

// ---------------------------------------------------------------------------------------------
// Messages, the probe the handlers report to, handlers
// ---------------------------------------------------------------------------------------------

/// Every test job's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Msg {
    n: u64,
    /// Whether the handler fails it (until the probe is healed).
    fail: bool,
}

fn msg_bytes(n: u64, fail: bool) -> Vec<u8> {
    serde_json::to_vec(&Msg { n, fail }).expect("a Msg encodes")
}

fn job(queue: &str, n: u64, fail: bool) -> Job {
    Job::new(queue, &Msg { n, fail }).expect("a Msg encodes")
}

/// One handler call.
#[derive(Clone, Debug)]
struct Run {
    queue: String,
    n: u64,
    attempt: u32,
    at: Instant,
}

/// What handlers report; shared through `Data<Arc<Probe>>`.
#[derive(Debug, Default)]
struct Probe {
    runs: Mutex<Vec<Run>>,
    healed: AtomicBool,
    in_flight: Mutex<HashMap<String, usize>>,
    max_in_flight: Mutex<HashMap<String, usize>>,
    total: AtomicUsize,
    max_total: AtomicUsize,
}

impl Probe {
    fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    fn record(&self, queue: &str, msg: &Msg, attempt: Option<u32>) {
        self.runs.lock().expect("probe").push(Run {
            queue: queue.to_owned(),
            n: msg.n,
            attempt: attempt.expect("SQL counts attempts"),
            at: Instant::now(),
        });
    }
    fn runs(&self) -> Vec<Run> {
        self.runs.lock().expect("probe").clone()
    }
    /// `(n, attempt)` of every run on `queue`, in order.
    fn seq(&self, queue: &str) -> Vec<(u64, u32)> {
        self.runs()
            .iter()
            .filter(|r| r.queue == queue)
            .map(|r| (r.n, r.attempt))
            .collect()
    }
    fn attempts_of(&self, queue: &str, n: u64) -> Vec<u32> {
        self.seq(queue)
            .into_iter()
            .filter(|(m, _)| *m == n)
            .map(|(_, a)| a)
            .collect()
    }
    fn heal(&self) {
        self.healed.store(true, Ordering::SeqCst);
    }
    fn fails(&self, msg: &Msg) -> bool {
        msg.fail && !self.healed.load(Ordering::SeqCst)
    }
    fn enter(&self, queue: &str) {
        let mut f = self.in_flight.lock().expect("probe");
        let now = f.entry(queue.to_owned()).or_default();
        *now += 1;
        let mut m = self.max_in_flight.lock().expect("probe");
        let max = m.entry(queue.to_owned()).or_default();
        *max = (*max).max(*now);
        let total = self.total.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_total.fetch_max(total, Ordering::SeqCst);
    }
    fn leave(&self, queue: &str) {
        *self
            .in_flight
            .lock()
            .expect("probe")
            .get_mut(queue)
            .expect("entered") -= 1;
        self.total.fetch_sub(1, Ordering::SeqCst);
    }
    fn max_in_flight(&self, queue: &str) -> usize {
        self.max_in_flight
            .lock()
            .expect("probe")
            .get(queue)
            .copied()
            .unwrap_or(0)
    }
}

/// The error handlers return.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Boom(&'static str);

const MAILBOX_ON_FIRE: &str = "the mailbox is on fire";
const LEDGER_CLOSED: &str = "the ledger is closed";
const PANIC_TEXT: &str = "boom 42, on purpose";

/// Acks, or returns an error while the message fails.
async fn sends(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(queue): Ctx<keys::Queue>,
) -> Result<(), Boom> {
    p.record(&queue, msg, attempt);
    if p.fails(msg) {
        Err(Boom(MAILBOX_ON_FIRE))
    } else {
        Ok(())
    }
}

/// Seed 002's `send` with the provider unavailable: `retry()` while the message fails.
async fn send(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(queue): Ctx<keys::Queue>,
) -> HandlerOutcome {
    p.record(&queue, msg, attempt);
    if p.fails(msg) {
        HandlerOutcome::retry()
    } else {
        HandlerOutcome::ack()
    }
}

/// Seed 002's `review`: reads the dead-letter group and acknowledges.
async fn review(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(queue): Ctx<keys::Queue>,
) -> HandlerOutcome {
    p.record(&queue, msg, attempt);
    HandlerOutcome::ack()
}

/// Acks after 10 ms, counting how many run at once per queue.
async fn fifo_work(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(queue): Ctx<keys::Queue>,
) -> HandlerOutcome {
    p.enter(&queue);
    p.record(&queue, msg, attempt);
    tokio::time::sleep(Duration::from_millis(10)).await;
    p.leave(&queue);
    HandlerOutcome::ack()
}

/// Message 0 is retried at once on its first two attempts; everything else acks.
async fn fifo_retry_head(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(queue): Ctx<keys::Queue>,
) -> HandlerOutcome {
    p.enter(&queue);
    p.record(&queue, msg, attempt);
    p.leave(&queue);
    if msg.n == 0 && attempt < Some(3) {
        HandlerOutcome::retry()
    } else {
        HandlerOutcome::ack()
    }
}

/// How long [`fifo_retry_after_head`] and [`retry_after_long`] ask to wait.
const FIFO_DELAY: Duration = Duration::from_millis(400);

/// Message 0 asks for `retry_after(FIFO_DELAY)` on its first attempt; everything else acks.
async fn fifo_retry_after_head(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(queue): Ctx<keys::Queue>,
) -> HandlerOutcome {
    p.enter(&queue);
    p.record(&queue, msg, attempt);
    p.leave(&queue);
    if msg.n == 0 && attempt == Some(1) {
        HandlerOutcome::retry_after(FIFO_DELAY)
    } else {
        HandlerOutcome::ack()
    }
}

/// What [`retry_after_long`] asks for on a table that cannot wait.
const LONG_DELAY: Duration = Duration::from_secs(30);

/// Asks for a 30 s wait on its first attempt; acks the next.
async fn retry_after_long(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(queue): Ctx<keys::Queue>,
) -> HandlerOutcome {
    p.record(&queue, msg, attempt);
    if attempt == Some(1) {
        HandlerOutcome::retry_after(LONG_DELAY)
    } else {
        HandlerOutcome::ack()
    }
}

/// Returns an error, always.
async fn errs(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(queue): Ctx<keys::Queue>,
) -> Result<(), Boom> {
    p.record(&queue, msg, attempt);
    Err(Boom(LEDGER_CLOSED))
}

/// Panics, always.
async fn panics(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(queue): Ctx<keys::Queue>,
) -> HandlerOutcome {
    p.record(&queue, msg, attempt);
    panic!("{PANIC_TEXT}");
}

async fn acks(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(queue): Ctx<keys::Queue>,
) -> HandlerOutcome {
    p.record(&queue, msg, attempt);
    HandlerOutcome::ack()
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn service(probe: &Arc<Probe>) -> Service {
    Service::new(AppInfo::new("sql-backend", "0.1.0"))
        .state(Arc::clone(probe))
        .shutdown_timeout(Duration::from_secs(5))
}

async fn start(service: Service) -> TestApp {
    TestApp::start_live(service)
        .await
        .unwrap_or_else(|e| panic!("the service should start: {e}"))
}

/// The problems of a service that must refuse to start, and their text.
async fn refused(service: Service) -> (Vec<Problem>, String) {
    match service.start().await {
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
            panic!("the service started, but it must refuse to")
        }
    }
}

async fn count<D: Db>(db: &D, sql: &str) -> i64 {
    db.rows(sql.to_owned()).await[0][0].int()
}

use common::on_both;
use stagedoor_jobs::broker::{DeadLetters, Inspect};

on_both!(
    table_dead_letter_moves_the_row_to_the_dead_table,
    table_dead_letter_replay_and_purge_from_an_operator_route,
    dead_letter_table_missing_or_different_refuses_to_start,
    table_dead_letters_one_after_another_each_reach_the_dead_table,
    a_failed_move_to_the_dead_table_loses_nothing,
    group_dead_letter_keeps_payload_and_attempt_and_review_reads_it,
    seed_operator_statement_runs_dead_letters_again,
    fifo_group_runs_one_row_at_a_time_in_publish_order,
    fifo_retry_keeps_the_row_at_the_head_of_its_group,
    fifo_retry_after_lets_rows_due_earlier_pass,
    startup_refuses_a_missing_table,
    startup_refuses_a_misspelt_column,
    startup_refuses_a_cap_without_an_attempt_column,
    startup_refuses_a_kind_without_headers,
    startup_lists_every_problem_at_once,
    errors_and_panics_land_in_last_error,
    delayed_publish_writes_the_due_time,
    publish_in_follows_the_callers_transaction,
);

// ---------------------------------------------------------------------------------------------
// 1. Table-form dead letters
// ---------------------------------------------------------------------------------------------

/// A table without a group column: `dead_letter("plain_jobs_dead")` moves the row into that
/// table in one step, payload and attempt as they were, with its last error; listing and purge
/// work on it.
async fn table_dead_letter_moves_the_row_to_the_dead_table<D: Db>() {
    let db = D::fresh("tdl", &ddl::<D>(PLAIN_DDL)).await;
    let probe = Probe::new();
    let route = D::route::<Plain>(&db.broker(), "plain");
    let app = start(service(&probe).with_broker(route, |b| {
        b.include(Subscriber::new("plain", sends).name("sends"))
            .max_attempts(nonzero!(3u32))
            .dead_letter("plain_jobs_dead");
    }))
    .await;
    for (n, fail) in [(1, true), (2, false), (3, true)] {
        app.publish(job("plain", n, fail)).await.expect("publish");
    }
    app.drain().await;
    eventually(
        "both failing rows are in the dead table",
        PATIENCE,
        || async { count(&db, "SELECT COUNT(*) FROM plain_jobs_dead").await == 2 },
    )
    .await;

    assert_eq!(
        probe.attempts_of("plain", 1),
        [1, 2, 3],
        "{:?}",
        probe.runs()
    );
    assert_eq!(probe.attempts_of("plain", 3), [1, 2, 3]);
    assert_eq!(probe.attempts_of("plain", 2), [1]);
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM plain_jobs").await,
        0,
        "the rows left the source table"
    );
    let rows = db
        .rows(
            "SELECT CAST(attempt AS BIGINT), payload, locked_until, last_error, retry_after \
             FROM plain_jobs_dead ORDER BY id"
                .to_owned(),
        )
        .await;
    for (row, n) in rows.iter().zip([1, 3]) {
        // 3 deliveries spent: a dead letter's row stores the attempts it spent (issue 12).
        assert_eq!(row[0].int(), 3, "attempts spent: {row:?}");
        assert_eq!(row[1].bytes(), msg_bytes(n, true), "payload as it was");
        assert!(row[2].is_null(), "no lease in the dead table: {row:?}");
        assert_eq!(
            row[3].text().as_deref(),
            Some(MAILBOX_ON_FIRE),
            "last_error"
        );
        assert!(row[4].time().is_some());
    }

    let letters = app.dead_letters("plain_jobs_dead").await;
    assert_eq!(letters.len(), 2, "{letters:?}");
    for d in &letters {
        assert_eq!(d.attempts, 3, "{d:?}");
        assert_eq!(d.envelope.attempt(), 3);
        assert_eq!(d.origin, "plain");
        assert_eq!(d.error, MAILBOX_ON_FIRE);
        let m: Msg = serde_json::from_slice(d.envelope.payload()).expect("payload");
        assert!(m.fail && (m.n == 1 || m.n == 3), "{m:?}");
    }
    assert!(
        letters[0].failed_at >= letters[1].failed_at,
        "newest first: {letters:?}"
    );
    let purged = app.purge("plain_jobs_dead", DeadSelector::All).await;
    assert_eq!(purged, 2);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM plain_jobs_dead").await, 0);
    app.stop().await;
}

/// Replay and purge of a dead table through a route that never ran a service (an operator's
/// tool): a replayed row is back in the source table with attempt 1 and no lease, and runs
/// again.
async fn table_dead_letter_replay_and_purge_from_an_operator_route<D: Db>() {
    let db = D::fresh("tdlr", &ddl::<D>(PLAIN_DDL)).await;
    let probe = Probe::new();
    let mount = |b: &mut stagedoor_jobs::RouteBuilder<D::Route<Plain>>| {
        b.include(Subscriber::new("plain", sends).name("sends"))
            .max_attempts(nonzero!(2u32))
            .dead_letter("plain_jobs_dead");
    };
    let app =
        start(service(&probe).with_broker(D::route::<Plain>(&db.broker(), "plain"), mount)).await;
    app.publish(job("plain", 1, true)).await.expect("publish");
    app.publish(job("plain", 2, true)).await.expect("publish");
    app.drain().await;
    eventually("both rows are in the dead table", PATIENCE, || async {
        count(&db, "SELECT COUNT(*) FROM plain_jobs_dead").await == 2
    })
    .await;
    app.stop().await;

    // The operator's route: connected, never checked by a service.
    let op = D::route::<Plain>(&db.broker(), "plain");
    op.connect().await.expect("connect");
    let letters = op
        .dead_letters("plain_jobs_dead", &DeadSelector::All, 10)
        .await
        .expect("list");
    assert_eq!(letters.len(), 2, "{letters:?}");
    let first = letters
        .iter()
        .find(|d| {
            serde_json::from_slice::<Msg>(d.envelope.payload())
                .expect("payload")
                .n
                == 1
        })
        .expect("message 1 is a dead letter");
    assert_eq!(first.origin, "plain", "the table's one queue: {first:?}");
    assert_eq!(first.attempts, 2);

    let report = op
        .replay("plain_jobs_dead", &DeadSelector::Id(first.id.clone()))
        .await
        .expect("replay");
    assert_eq!(report.replayed, 1, "{report:?}");
    assert_eq!(report.failed, 0, "{report:?}");
    let back = db
        .rows(
            "SELECT CAST(id AS TEXT), CAST(attempt AS BIGINT), locked_until, payload, retry_after \
             FROM plain_jobs"
                .to_owned(),
        )
        .await;
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(
        back[0][0].text().as_deref(),
        Some(first.id.as_str()),
        "same id"
    );
    assert_eq!(back[0][1].int(), 1, "attempt reset");
    assert!(back[0][2].is_null(), "no lease");
    assert_eq!(back[0][3].bytes(), msg_bytes(1, true), "payload as it was");
    assert!(back[0][4].time().expect("due") <= Utc::now(), "due at once");
    assert_eq!(count(&db, "SELECT COUNT(*) FROM plain_jobs_dead").await, 1);

    let purged = op
        .purge("plain_jobs_dead", &DeadSelector::All)
        .await
        .expect("purge");
    assert_eq!(purged, 1);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM plain_jobs_dead").await, 0);

    // It runs again, from attempt 1.
    probe.heal();
    let before = probe.runs().len();
    let app =
        start(service(&probe).with_broker(D::route::<Plain>(&db.broker(), "plain"), mount)).await;
    eventually("the replayed row runs", PATIENCE, || async {
        probe.runs().len() > before
    })
    .await;
    app.drain().await;
    assert_eq!(
        probe.attempts_of("plain", 1),
        [1, 2, 1],
        "{:?}",
        probe.runs()
    );
    assert_eq!(count(&db, "SELECT COUNT(*) FROM plain_jobs").await, 0);
    app.stop().await;
}

/// A dead-letter table that does not exist, or lacks a column of the source table: the service
/// refuses to start, with a problem naming each table.
async fn dead_letter_table_missing_or_different_refuses_to_start<D: Db>() {
    let db = D::fresh("tdlbad", &ddl::<D>(PLAIN_DDL)).await;
    let probe = Probe::new();
    let broker = db.broker();
    let service = service(&probe)
        .with_broker(D::route::<Plain>(&broker, "plain"), |b| {
            b.include(Subscriber::new("plain", sends).name("to_nowhere"))
                .max_attempts(nonzero!(3u32))
                .dead_letter("plain_jobs_nowhere");
        })
        .with_broker(D::route::<Plain>(&broker, "plain"), |b| {
            b.include(Subscriber::new("plain", sends).name("to_narrow"))
                .max_attempts(nonzero!(3u32))
                .dead_letter("plain_jobs_narrow");
        });
    let (problems, text) = refused(service).await;
    assert_eq!(problems.len(), 2, "{text}");
    let nowhere = problems
        .iter()
        .find(|p| p.mount.contains("to_nowhere"))
        .unwrap_or_else(|| panic!("a problem for the missing table: {text}"));
    assert!(nowhere.message.contains("`plain_jobs_nowhere`"), "{text}");
    let narrow = problems
        .iter()
        .find(|p| p.mount.contains("to_narrow"))
        .unwrap_or_else(|| panic!("a problem for the narrow table: {text}"));
    assert!(narrow.message.contains("`plain_jobs_narrow`"), "{text}");
    assert!(
        narrow.message.contains("last_error"),
        "names the column: {text}"
    );
}

/// Dead letters one after another: the second row, published after the first was moved, gets a
/// dead-table row of its own (its id is not the first's), and both replay.
async fn table_dead_letters_one_after_another_each_reach_the_dead_table<D: Db>() {
    let db = D::fresh("tdlseq", &ddl::<D>(PLAIN_DDL)).await;
    let probe = Probe::new();
    let route = D::route::<Plain>(&db.broker(), "plain");
    let app = start(service(&probe).with_broker(route.clone(), |b| {
        b.include(Subscriber::new("plain", sends).name("sends"))
            .max_attempts(nonzero!(2u32))
            .dead_letter("plain_jobs_dead");
    }))
    .await;
    for n in 1..=2 {
        // The source table is empty when each is published.
        app.publish(job("plain", n, true)).await.expect("publish");
        eventually("the row is in the dead table", PATIENCE, || async {
            count(&db, "SELECT COUNT(*) FROM plain_jobs_dead").await == n as i64
                && count(&db, "SELECT COUNT(*) FROM plain_jobs").await == 0
        })
        .await;
    }
    assert_eq!(probe.attempts_of("plain", 2), [1, 2], "{:?}", probe.runs());
    app.stop().await;

    let report = route
        .replay("plain_jobs_dead", &DeadSelector::All)
        .await
        .expect("replay");
    assert_eq!(report.replayed, 2, "{report:?}");
    assert_eq!(count(&db, "SELECT COUNT(*) FROM plain_jobs").await, 2);
}

/// A move into the dead table that fails (the dead table has a column the copy cannot fill)
/// loses nothing: the row stays in the source table, and once the dead table is fixed its next
/// claim moves it there, without running it again.
async fn a_failed_move_to_the_dead_table_loses_nothing<D: Db>() {
    let strict = "
CREATE TABLE plain_jobs_strict (id {id}, attempt INTEGER NOT NULL DEFAULT 1, retry_after {time} NOT NULL,
    locked_until {time}, payload {bytes} NOT NULL, last_error TEXT, reviewed_by TEXT NOT NULL);";
    let db = D::fresh("tdlfail", &ddl::<D>(&format!("{PLAIN_DDL}{strict}"))).await;
    let probe = Probe::new();
    let broker = db.broker().lease(Duration::from_secs(1));
    let app = start(
        service(&probe).with_broker(D::route::<Plain>(&broker, "plain"), |b| {
            b.include(Subscriber::new("plain", sends).name("sends"))
                .max_attempts(nonzero!(2u32))
                .dead_letter("plain_jobs_strict");
        }),
    )
    .await;
    app.publish(job("plain", 1, true)).await.expect("publish");
    eventually("both attempts ran", PATIENCE, || async {
        probe.runs().len() == 2
    })
    .await;
    // The settlement retries for under a second, then leaves the row to its lease.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM plain_jobs_strict").await,
        0
    );
    let rows = db
        .rows("SELECT CAST(attempt AS BIGINT), payload FROM plain_jobs".to_owned())
        .await;
    assert_eq!(rows.len(), 1, "the row is still in the source table");
    assert_eq!(rows[0][1].bytes(), msg_bytes(1, true));

    db.run("ALTER TABLE plain_jobs_strict DROP COLUMN reviewed_by".to_owned())
        .await;
    eventually("the row reached the dead table", PATIENCE, || async {
        count(&db, "SELECT COUNT(*) FROM plain_jobs_strict").await == 1
            && count(&db, "SELECT COUNT(*) FROM plain_jobs").await == 0
    })
    .await;
    assert_eq!(
        probe.attempts_of("plain", 1),
        [1, 2],
        "dead-lettered on its next claim, without running"
    );
    app.stop().await;
}

/// On SQLite a table-form source table whose id SQLite reuses (`INTEGER PRIMARY KEY` without
/// `AUTOINCREMENT`) is refused: a row taking a dead letter's id could never be dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_table_form_refuses_ids_that_sqlite_reuses() {
    let reused = PLAIN_DDL.replacen("{serial}", "{id}", 1);
    let db = Lite::fresh("tdlreuse", &ddl::<Lite>(&reused)).await;
    let probe = Probe::new();
    let (problems, text) = refused(service(&probe).with_broker(
        Lite::route::<Plain>(&db.broker(), "plain"),
        |b| {
            b.include(Subscriber::new("plain", sends).name("sends"))
                .max_attempts(nonzero!(2u32))
                .dead_letter("plain_jobs_dead");
        },
    ))
    .await;
    assert_eq!(problems.len(), 1, "{text}");
    assert!(problems[0].mount.contains("plain_jobs"), "{text}");
    assert!(
        problems[0]
            .message
            .contains("INTEGER PRIMARY KEY AUTOINCREMENT"),
        "names the fix: {text}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Group-form dead letters (seed 002)
// ---------------------------------------------------------------------------------------------

/// A row dead-lettered to `emails.dead` keeps payload and attempt; a `review` subscriber on
/// `emails.dead` reads it like any queue.
async fn group_dead_letter_keeps_payload_and_attempt_and_review_reads_it<D: Db>() {
    let db = D::fresh("gdl", &mail_ddl::<D>()).await;
    let probe = Probe::new();
    let mailer = |with_review: bool| {
        service(&probe).with_broker(D::route::<Mail>(&db.broker(), "emails"), move |b| {
            b.include(Subscriber::new("emails", send).name("send"))
                .max_attempts(nonzero!(3u32))
                .dead_letter("emails.dead");
            if with_review {
                b.include(Subscriber::new("emails.dead", review).name("review"));
            }
        })
    };
    let app = start(mailer(false)).await;
    app.publish(job("emails", 1, true)).await.expect("publish");
    app.publish(job("emails", 2, true)).await.expect("publish");
    app.publish(job("emails", 3, false)).await.expect("publish");
    app.drain().await;
    eventually("both failing rows are dead letters", PATIENCE, || async {
        count(
            &db,
            "SELECT COUNT(*) FROM mail_jobs WHERE name = 'emails.dead'",
        )
        .await
            == 2
    })
    .await;
    let letters = app.dead_letters("emails.dead").await;
    app.stop().await;

    assert_eq!(probe.attempts_of("emails", 1), [1, 2, 3]);
    assert_eq!(probe.attempts_of("emails", 2), [1, 2, 3]);
    let rows = db
        .rows(
            "SELECT name, CAST(attempt AS BIGINT), payload, locked_until FROM mail_jobs ORDER BY id"
                .to_owned(),
        )
        .await;
    assert_eq!(rows.len(), 2, "the acked row left the table: {rows:?}");
    for (row, n) in rows.iter().zip([1, 2]) {
        assert_eq!(row[0].text().as_deref(), Some("emails.dead"));
        assert_eq!(row[1].int(), 3, "attempts spent, 3 deliveries: {row:?}");
        assert_eq!(row[2].bytes(), msg_bytes(n, true), "payload as it was");
        assert!(row[3].is_null(), "no lease: {row:?}");
    }
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert!(
        letters
            .iter()
            .all(|d| d.attempts == 3 && d.origin == "emails"),
        "{letters:?}"
    );

    // Seed 002's service, `review` included: it reads the dead letters like any queue.
    let app = start(mailer(true)).await;
    eventually("review read both dead letters", PATIENCE, || async {
        probe.seq("emails.dead").len() == 2
    })
    .await;
    app.drain().await;
    app.stop().await;
    let mut seen = probe.seq("emails.dead");
    seen.sort_unstable();
    assert_eq!(
        seen,
        [(1, 3), (2, 3)],
        "review saw each row with the attempts it spent"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM mail_jobs").await,
        0,
        "review acked them"
    );
    assert!(
        probe.attempts_of("emails", 1).len() == 3,
        "send did not run them again"
    );
}

/// Seed 002's operator statement moves the dead letters back: they run again from attempt 1.
async fn seed_operator_statement_runs_dead_letters_again<D: Db>() {
    let db = D::fresh("gop", &mail_ddl::<D>()).await;
    let probe = Probe::new();
    let app = start(
        service(&probe).with_broker(D::route::<Mail>(&db.broker(), "emails"), |b| {
            b.include(Subscriber::new("emails", send).name("send"))
                .max_attempts(nonzero!(3u32))
                .dead_letter("emails.dead");
        }),
    )
    .await;
    app.publish(job("emails", 1, true)).await.expect("publish");
    app.publish(job("emails", 2, true)).await.expect("publish");
    app.drain().await;
    eventually("both rows are dead letters", PATIENCE, || async {
        count(
            &db,
            "SELECT COUNT(*) FROM mail_jobs WHERE name = 'emails.dead'",
        )
        .await
            == 2
    })
    .await;

    probe.heal();
    db.run(
        "UPDATE mail_jobs SET name = 'emails', attempt = 1, locked_until = NULL WHERE name = 'emails.dead';"
            .to_owned(),
    )
    .await;
    eventually("both rows ran again", PATIENCE, || async {
        probe.seq("emails").len() == 8
    })
    .await;
    app.drain().await;
    assert_eq!(
        probe.attempts_of("emails", 1),
        [1, 2, 3, 1],
        "{:?}",
        probe.runs()
    );
    assert_eq!(probe.attempts_of("emails", 2), [1, 2, 3, 1]);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM mail_jobs").await, 0);
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 3. FIFO groups
// ---------------------------------------------------------------------------------------------

/// At most one row of a FIFO group in work at a time, even with concurrency 8, in publish
/// order; two groups still run side by side.
async fn fifo_group_runs_one_row_at_a_time_in_publish_order<D: Db>() {
    let db = D::fresh("fifo", &ddl::<D>(FIFO_DDL)).await;
    let probe = Probe::new();
    let route = D::route::<Fifo>(&db.broker(), "g1");
    let app = start(service(&probe).with_broker(route, |b| {
        b.include(Subscriber::new("g1", fifo_work).name("g1"))
            .concurrency(8);
        b.include(Subscriber::new("g2", fifo_work).name("g2"))
            .concurrency(8);
    }))
    .await;
    const N: u64 = 20;
    for n in 0..N {
        app.publish(job("g1", n, false)).await.expect("publish");
        app.publish(job("g2", n, false)).await.expect("publish");
    }
    eventually("every row ran", PATIENCE, || async {
        probe.runs().len() == 2 * N as usize
    })
    .await;
    app.drain().await;
    app.stop().await;

    let order: Vec<u64> = (0..N).collect();
    for g in ["g1", "g2"] {
        assert_eq!(probe.max_in_flight(g), 1, "one row of {g} at a time");
        let ran: Vec<u64> = probe.seq(g).iter().map(|(n, _)| *n).collect();
        assert_eq!(ran, order, "{g} ran in publish order");
    }
    assert!(
        probe.max_total.load(Ordering::SeqCst) >= 2,
        "the two groups ran side by side"
    );
    assert_eq!(count(&db, "SELECT COUNT(*) FROM fifo_jobs").await, 0);
}

/// Publishes messages 0, 1, 2 into FIFO group `g` before any worker runs.
async fn publish_three<D: Db>(db: &D) {
    let route = D::route::<Fifo>(&db.broker(), "g");
    for n in 0..3 {
        D::publish(&route, job("g", n, false)).await;
    }
}

/// `retry()` keeps a row at the head of its group: its next delivery comes before the rows
/// published after it.
async fn fifo_retry_keeps_the_row_at_the_head_of_its_group<D: Db>() {
    let db = D::fresh("fifor", &ddl::<D>(FIFO_DDL)).await;
    publish_three(&db).await;
    let probe = Probe::new();
    let app = start(
        service(&probe).with_broker(D::route::<Fifo>(&db.broker(), "g"), |b| {
            // A cap: an uncapped mount would wait UNCAPPED_FLOOR before each retry.
            b.include(Subscriber::new("g", fifo_retry_head).name("g"))
                .max_attempts(nonzero!(5u32))
                .dead_letter("g.dead")
                .concurrency(8);
        }),
    )
    .await;
    eventually("every delivery ran", PATIENCE, || async {
        probe.runs().len() == 5
    })
    .await;
    app.drain().await;
    app.stop().await;
    assert_eq!(
        probe.seq("g"),
        [(0, 1), (0, 2), (0, 3), (1, 1), (2, 1)],
        "the retried row stays at the head"
    );
    assert_eq!(probe.max_in_flight("g"), 1);
}

/// `retry_after(d)` lets the rows due earlier pass the row.
async fn fifo_retry_after_lets_rows_due_earlier_pass<D: Db>() {
    let db = D::fresh("fifora", &ddl::<D>(FIFO_DDL)).await;
    publish_three(&db).await;
    let probe = Probe::new();
    let app = start(
        service(&probe).with_broker(D::route::<Fifo>(&db.broker(), "g"), |b| {
            // A cap: an uncapped mount would wait UNCAPPED_FLOOR before each retry.
            b.include(Subscriber::new("g", fifo_retry_after_head).name("g"))
                .max_attempts(nonzero!(5u32))
                .dead_letter("g.dead")
                .concurrency(8);
        }),
    )
    .await;
    eventually("every delivery ran", PATIENCE, || async {
        probe.runs().len() == 4
    })
    .await;
    app.drain().await;
    app.stop().await;
    assert_eq!(
        probe.seq("g"),
        [(0, 1), (1, 1), (2, 1), (0, 2)],
        "the rows due earlier passed the delayed one"
    );
    let runs = probe.runs();
    let waited = runs[3].at - runs[0].at;
    assert!(waited >= FIFO_DELAY, "the delayed row waited {waited:?}");
}

// ---------------------------------------------------------------------------------------------
// 4. Startup checks
// ---------------------------------------------------------------------------------------------

async fn startup_refuses_a_missing_table<D: Db>() {
    let db = D::fresh("nt", "SELECT 1").await;
    let probe = Probe::new();
    let (problems, text) = refused(service(&probe).with_broker(
        D::route::<Ghost>(&db.broker(), "emails"),
        |b| {
            b.include(Subscriber::new("emails", send).name("send"));
        },
    ))
    .await;
    assert_eq!(problems.len(), 1, "{text}");
    assert!(problems[0].mount.contains("ghost_jobs"), "{text}");
    assert!(
        problems[0].message.contains("ghost_jobs"),
        "the database's error names the table: {text}"
    );
}

async fn startup_refuses_a_misspelt_column<D: Db>() {
    let db = D::fresh("typo", &ddl::<D>(TYPO_DDL)).await;
    let probe = Probe::new();
    let (problems, text) = refused(service(&probe).with_broker(
        D::route::<Typo>(&db.broker(), "emails"),
        |b| {
            b.include(Subscriber::new("emails", send).name("send"));
        },
    ))
    .await;
    assert_eq!(problems.len(), 1, "{text}");
    assert!(
        problems[0].message.contains("retry_after"),
        "names the column: {text}"
    );
}

async fn startup_refuses_a_cap_without_an_attempt_column<D: Db>() {
    let db = D::fresh("noatt", &ddl::<D>(NOATTEMPT_DDL)).await;
    let probe = Probe::new();
    let (problems, text) = refused(service(&probe).with_broker(
        D::route::<NoAttempt>(&db.broker(), "emails"),
        |b| {
            b.include(Subscriber::new("emails", send).name("send"))
                .max_attempts(nonzero!(5u32))
                .dead_letter("emails.dead");
        },
    ))
    .await;
    assert_eq!(problems.len(), 1, "{text}");
    assert!(problems[0].mount.contains("send"), "{text}");
    assert!(problems[0].message.contains("attempt column"), "{text}");
}

async fn startup_refuses_a_kind_without_headers<D: Db>() {
    let db = D::fresh("nohdr", &mail_ddl::<D>()).await;
    let probe = Probe::new();
    let (problems, text) = refused(service(&probe).with_broker(
        D::route::<Mail>(&db.broker(), "emails"),
        |b| {
            b.include(
                Subscriber::new("emails", send)
                    .kind("welcome")
                    .name("welcome"),
            );
        },
    ))
    .await;
    assert_eq!(problems.len(), 1, "{text}");
    assert!(problems[0].mount.contains("welcome"), "{text}");
    assert!(problems[0].message.contains("headers column"), "{text}");
}

/// Two bad routes, three bad mounts: every problem is listed at once.
async fn startup_lists_every_problem_at_once<D: Db>() {
    let db = D::fresh("every", &ddl::<D>(NOATTEMPT_DDL)).await;
    let probe = Probe::new();
    let broker = db.broker();
    let (problems, text) = refused(
        service(&probe)
            .with_broker(D::route::<Ghost>(&broker, "emails"), |b| {
                b.include(Subscriber::new("emails", send).name("ghostly"));
            })
            .with_broker(D::route::<NoAttempt>(&broker, "emails"), |b| {
                b.include(Subscriber::new("emails", send).name("capped"))
                    .max_attempts(nonzero!(5u32))
                    .dead_letter("emails.dead");
                b.include(
                    Subscriber::new("emails", send)
                        .kind("welcome")
                        .name("kinded"),
                );
            }),
    )
    .await;
    assert_eq!(problems.len(), 3, "{text}");
    assert!(
        problems.iter().any(|p| p.message.contains("ghost_jobs")),
        "{text}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.mount.contains("capped") && p.message.contains("attempt column")),
        "{text}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.mount.contains("kinded") && p.message.contains("headers column")),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. A table without `retry_after`
// ---------------------------------------------------------------------------------------------

/// Everything the thread's log subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }
}

/// `retry_after(30 s)` on a table without a `retry_after` column: the row comes back at once,
/// with a warning, and the job still completes. Runs on a current-thread runtime so that the
/// test's log subscriber sees every event of the service.
async fn retry_after_without_the_column_returns_the_row_at_once<D: Db>() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let db = D::fresh("nodue", &ddl::<D>(NODUE_DDL)).await;
    let probe = Probe::new();
    let app = start(
        service(&probe).with_broker(D::route::<NoDue>(&db.broker(), "later"), |b| {
            b.include(Subscriber::new("later", retry_after_long).name("later"))
                .max_attempts(nonzero!(5u32))
                .dead_letter("later.dead");
        }),
    )
    .await;
    app.publish(job("later", 1, false)).await.expect("publish");
    eventually(
        "the second attempt ran",
        Duration::from_secs(10),
        || async { probe.runs().len() == 2 },
    )
    .await;
    app.drain().await;
    app.stop().await;
    let runs = probe.runs();
    assert_eq!(probe.seq("later"), [(1, 1), (1, 2)]);
    let waited = runs[1].at - runs[0].at;
    assert!(
        waited < LONG_DELAY / 3,
        "back at once, not after {LONG_DELAY:?}: {waited:?}"
    );
    assert_eq!(count(&db, "SELECT COUNT(*) FROM nodue_jobs").await, 0);
    let text = logs.text();
    assert!(
        text.contains("no retry_after column: the row is due again at once"),
        "a warning says so:\n{text}"
    );
}

mod retry_after_without_the_column_returns_the_row_at_once {
    #[tokio::test(flavor = "current_thread")]
    async fn sqlite() {
        super::retry_after_without_the_column_returns_the_row_at_once::<crate::common::Lite>()
            .await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "current_thread")]
    async fn postgres() {
        super::retry_after_without_the_column_returns_the_row_at_once::<crate::common::Pg>().await;
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Outcomes in `last_error`
// ---------------------------------------------------------------------------------------------

/// An `Err` and a panic leave their text in the row's `last_error` while it waits for its retry.
async fn errors_and_panics_land_in_last_error<D: Db>() {
    let db = D::fresh("lerr", conf_ddl::<D>()).await;
    let probe = Probe::new();
    let wait = Duration::from_secs(60);
    let app = start(
        service(&probe).with_broker(D::route::<ConfRow>(&db.broker(), "errs"), |b| {
            b.include(Subscriber::new("errs", errs).name("errs"))
                .max_attempts(nonzero!(5u32))
                .dead_letter("errs.dead")
                .backoff(Fixed::new(wait));
            b.include(Subscriber::new("panics", panics).name("panics"))
                .max_attempts(nonzero!(5u32))
                .dead_letter("panics.dead")
                .backoff(Fixed::new(wait));
        }),
    )
    .await;
    let e = app
        .publish(job("errs", 1, true))
        .await
        .expect("publish")
        .into_id();
    let p = app
        .publish(job("panics", 2, true))
        .await
        .expect("publish")
        .into_id();
    let t0 = Utc::now();
    app.drain().await;
    let row = |id: JobId| {
        let db = db.clone();
        async move {
            db.rows(format!(
                "SELECT last_error, CAST(attempt AS BIGINT), locked_until, retry_after \
                 FROM conf_jobs WHERE id = '{id}'"
            ))
            .await
        }
    };
    for (id, want) in [(e, LEDGER_CLOSED), (p, PANIC_TEXT)] {
        eventually("the failed attempt is settled", PATIENCE, || {
            let row = row(id.clone());
            async move {
                let r = row.await;
                r.len() == 1 && !r[0][0].is_null() && r[0][2].is_null()
            }
        })
        .await;
        let r = &row(id.clone()).await[0];
        let error = r[0].text().expect("last_error");
        assert!(
            error.contains(want),
            "last_error {error:?} contains {want:?}"
        );
        assert_eq!(r[1].int(), 2, "one delivery spent");
        let due = r[3].time().expect("retry_after");
        assert!(
            due >= t0 + chrono::Duration::seconds(50),
            "waits for its retry: due {due}, now {t0}"
        );
    }
    assert_eq!(probe.runs().len(), 2, "no retry yet: {:?}", probe.runs());
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 7. Publishing
// ---------------------------------------------------------------------------------------------

async fn due_of<D: Db>(db: &D, id: &JobId) -> DateTime<Utc> {
    db.rows(format!(
        "SELECT retry_after FROM conf_jobs WHERE id = '{id}'"
    ))
    .await[0][0]
        .time()
        .expect("retry_after")
}

/// `route.publish(job.after(d))` and `.at(t)` write the due time into `retry_after`.
async fn delayed_publish_writes_the_due_time<D: Db>() {
    let db = D::fresh("pubd", conf_ddl::<D>()).await;
    let route = D::route::<ConfRow>(&db.broker(), "later");
    let ms = chrono::Duration::milliseconds(1);

    let d = Duration::from_secs(90);
    let t0 = Utc::now();
    let after = D::publish(&route, job("later", 1, false).after(d)).await;
    let t1 = Utc::now();
    let due = due_of(&db, &after).await;
    let dd = chrono::Duration::from_std(d).expect("a duration");
    assert!(
        due >= t0 + dd - ms && due <= t1 + dd + ms,
        "after({d:?}) published between {t0} and {t1} is due at {due}"
    );

    let t = DateTime::from_timestamp_millis(
        (Utc::now() + chrono::Duration::hours(2)).timestamp_millis(),
    )
    .expect("a time");
    let at = D::publish(&route, job("later", 2, false).at(t)).await;
    assert_eq!(due_of(&db, &at).await, t, "at(t) is due at t");

    let t2 = Utc::now();
    let past = D::publish(
        &route,
        job("later", 3, false).at(t2 - chrono::Duration::hours(1)),
    )
    .await;
    let due = due_of(&db, &past).await;
    assert!(
        due >= t2 - ms,
        "a time in the past is due now, not before: {due}"
    );

    let stats = route.stats("later").await.expect("stats");
    assert_eq!((stats.ready, stats.delayed), (1, 2), "{stats:?}");
}

/// `route.publish_in(&mut *tx, job)`: a rolled-back transaction leaves no job; a committed one
/// runs.
async fn publish_in_follows_the_callers_transaction<D: Db>() {
    let db = D::fresh("pubtx", conf_ddl::<D>()).await;
    let probe = Probe::new();
    let route = D::route::<ConfRow>(&db.broker(), "tx");
    let app = start(service(&probe).with_broker(route.clone(), |b| {
        b.include(Subscriber::new("tx", acks).name("acks"));
    }))
    .await;
    let rolled_back = db.publish_in(&route, job("tx", 1, false), false).await;
    assert_eq!(
        count(
            &db,
            &format!("SELECT COUNT(*) FROM conf_jobs WHERE id = '{rolled_back}'")
        )
        .await,
        0,
        "a rolled-back publish leaves no row"
    );
    let committed = db.publish_in(&route, job("tx", 2, false), true).await;
    eventually("the committed job runs", PATIENCE, || async {
        !probe.seq("tx").is_empty()
    })
    .await;
    // Give a phantom of the rolled-back job time to show up, if it could.
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.drain().await;
    assert_eq!(probe.seq("tx"), [(2, 1)], "only the committed job ran");
    assert_eq!(
        count(
            &db,
            &format!("SELECT COUNT(*) FROM conf_jobs WHERE id = '{committed}'")
        )
        .await,
        0,
        "and was acked"
    );
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 8. Wake-ups on Postgres
// ---------------------------------------------------------------------------------------------

/// A claim waiting on a broker that polls once a minute returns within seconds when another
/// broker instance (another process, as far as this one knows) publishes: LISTEN/NOTIFY.
#[ignore = "needs Postgres: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_notify_wakes_a_waiting_claim_of_another_broker() {
    let db = Pg::fresh("wake", conf_ddl::<Pg>()).await;
    let waiting = Pg::route::<ConfRow>(&db.broker().poll_interval(Duration::from_secs(60)), "wake");
    waiting.connect().await.expect("connect");
    let other = Pg::route::<ConfRow>(&db.broker(), "wake");
    other.connect().await.expect("connect");
    // Let the waiting broker's LISTEN connection come up.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let started = Instant::now();
    let claim = tokio::spawn(async move {
        let got = waiting
            .claim(
                "wake",
                1,
                Duration::from_secs(30),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim");
        (got.len(), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    Pg::publish(&other, job("wake", 1, false)).await;
    let (claimed, took) = claim.await.expect("the claim task");
    assert_eq!(claimed, 1, "the claim took the row");
    assert!(
        took < Duration::from_secs(5),
        "woken by NOTIFY, not by its 60 s poll (nor the 30 s wait): {took:?}"
    );
}

/// A worker whose poll interval is 60 s runs a row another broker instance publishes within
/// seconds.
///
/// Note: this end-to-end check also passes without NOTIFY today, because the runtime calls
/// `claim` again every 500 ms (its claim wait) and each call queries before it waits, so an idle
/// worker looks every 500 ms whatever its poll interval. The NOTIFY path itself is proven by
/// [`postgres_notify_wakes_a_waiting_claim_of_another_broker`], which fails without it.
#[ignore = "needs Postgres: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_worker_polling_every_minute_runs_another_process_job_within_seconds() {
    let db = Pg::fresh("wakesvc", conf_ddl::<Pg>()).await;
    let probe = Probe::new();
    let broker = db.broker().poll_interval(Duration::from_secs(60));
    let app = start(
        service(&probe).with_broker(Pg::route::<ConfRow>(&broker, "wake"), |b| {
            b.include(Subscriber::new("wake", acks).name("acks"));
        }),
    )
    .await;
    let other = Pg::route::<ConfRow>(&db.broker(), "wake");
    other.connect().await.expect("connect");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let published = Instant::now();
    Pg::publish(&other, job("wake", 1, false)).await;
    eventually(
        "the worker runs the job",
        Duration::from_secs(5),
        || async { !probe.seq("wake").is_empty() },
    )
    .await;
    let took = probe.runs()[0].at - published;
    assert!(took < Duration::from_secs(5), "{took:?}");
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 9. Many workers on one SQLite file: in-process services and child processes
// ---------------------------------------------------------------------------------------------

/// The child's role.
const ENV_ROLE: &str = "STAGEDOOR_SQL_TEST_ROLE";
/// How many jobs the test publishes.
const MANY: usize = 200;

const MULTI_DDL: &str = "
CREATE TABLE results (job_id TEXT NOT NULL, worker TEXT NOT NULL);
CREATE TABLE ready (worker TEXT NOT NULL);
CREATE TABLE control (k TEXT NOT NULL);";

/// What [`counts`] needs: where to write, and who it is.
struct Worker {
    db: Lite,
    name: String,
}

/// Writes `(job id, worker)` into `results`, then acks.
async fn counts(
    _msg: &Msg,
    Data(w): Data<Arc<Worker>>,
    Ctx(id): Ctx<keys::JobId>,
) -> HandlerOutcome {
    w.db.run(format!(
        "INSERT INTO results (job_id, worker) VALUES ('{id}', '{}')",
        w.name
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    HandlerOutcome::ack()
}

/// A worker service on the test's SQLite file.
async fn multi_worker(db: &Lite, name: String) -> stagedoor_jobs::Running {
    let w = Arc::new(Worker {
        db: db.clone(),
        name,
    });
    Service::new(AppInfo::new("sql-multi", "0.1.0"))
        .state(w)
        .with_broker(Lite::route::<ConfRow>(&db.broker(), "multi"), |b| {
            b.include(Subscriber::new("multi", counts).name("counts"))
                .concurrency(2);
        })
        .start()
        .await
        .unwrap_or_else(|e| panic!("a worker starts: {e}"))
}

/// The child process of [`sqlite_services_and_processes_run_each_job_once`]; a no-op in a
/// normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_process_child() {
    if std::env::var(ENV_ROLE).as_deref() != Ok("multi") {
        return;
    }
    let db = Lite::from_env().await.expect("the parent's SQLite file");
    let name = format!("child-{}", std::process::id());
    let running = multi_worker(&db, name.clone()).await;
    db.run(format!("INSERT INTO ready (worker) VALUES ('{name}')"))
        .await;
    eventually(
        "the parent published and every job ran",
        Duration::from_secs(120),
        || async {
            count(&db, "SELECT COUNT(*) FROM control").await == 1
                && count(&db, "SELECT COUNT(*) FROM conf_jobs").await == 0
        },
    )
    .await;
    running.shutdown().await;
}

/// Kills the child when the test ends, whatever happened.
struct Reaped(Child);
impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Three services in this process and two child processes on one SQLite file run 200 jobs: each
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_services_and_processes_run_each_job_once() {
    let db = Lite::fresh("multi", &format!("{SQLITE_CONF_SCHEMA}{MULTI_DDL}")).await;
    let exe = std::env::current_exe().expect("the test binary");
    let mut children = Vec::new();
    for _ in 0..2 {
        let child = Command::new(&exe)
            .args([
                "multi_process_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .envs(db.child_env())
            .env(ENV_ROLE, "multi")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn a child worker");
        children.push(Reaped(child));
    }
    let mut services = Vec::new();
    for i in 0..3 {
        services.push(multi_worker(&db, format!("service-{i}")).await);
    }
    eventually(
        "both children are ready",
        Duration::from_secs(60),
        || async { count(&db, "SELECT COUNT(*) FROM ready").await == 2 },
    )
    .await;

    let route = Lite::route::<ConfRow>(&db.broker(), "multi");
    route.connect().await.expect("connect");
    let mut published = Vec::new();
    let mut batch = Vec::new();
    for n in 0..MANY as u64 {
        let (_, envelope, at) = job("multi", n, false).into_parts(Utc::now());
        published.push(envelope.id().to_string());
        batch.push((envelope, at));
    }
    Broker::publish(&route, "multi", batch)
        .await
        .expect("publish");
    db.run("INSERT INTO control (k) VALUES ('published')".to_owned())
        .await;

    eventually("every job ran", Duration::from_secs(60), || async {
        count(&db, "SELECT COUNT(*) FROM conf_jobs").await == 0
            && count(&db, "SELECT COUNT(*) FROM results").await >= MANY as i64
    })
    .await;
    for s in services {
        s.shutdown().await;
    }
    for mut c in children {
        let status = c.0.wait().expect("a child's status");
        assert!(status.success(), "a child worker failed: {status}");
    }

    let rows = db
        .rows("SELECT job_id, worker FROM results".to_owned())
        .await;
    let mut runs: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_worker: BTreeMap<String, usize> = BTreeMap::new();
    for r in &rows {
        *runs.entry(r[0].text().expect("job id")).or_default() += 1;
        *by_worker.entry(r[1].text().expect("worker")).or_default() += 1;
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "jobs run more than once: {twice:?}");
    let mut expected = published.clone();
    expected.sort();
    assert_eq!(
        runs.keys().cloned().collect::<Vec<_>>(),
        expected,
        "every job ran"
    );
    let children_ran = by_worker.keys().filter(|w| w.starts_with("child-")).count();
    assert!(
        children_ran >= 1 && by_worker.len() >= 3,
        "the work was shared between processes: {by_worker:?}"
    );
}
