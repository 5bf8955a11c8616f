//! Crashes on the SQL backend: a worker process dies inside a handler, and nothing is lost.
//!
//! The worker is a child process: this test binary run again with the `crash_child` filter and
//! the environment naming its database and what its handler does (`crash_child` is a no-op in a
//! normal run). Each handler call first writes a mark row (job, attempt, process, time), so the
//! parent sees which deliveries happened, in which process, even in one that died.
//!
//! - [`a_worker_killed_inside_a_handler_loses_nothing`]: the child hangs in a handler and is
//!   SIGKILLed (`Child::kill`); after the lease another worker delivers the row again with its
//!   attempt one higher, and every row completes.
//! - [`a_job_that_kills_its_workers_is_dead_lettered_after_its_cap`]: a row whose handler aborts
//!   the process on every delivery, cap 3: child workers are started until the row is in the
//!   dead letter; it gets there after its 3 deliveries, without a 4th run, and every other row
//!   published with it completes.
//!
//! Both run on SQLite (no server) and Postgres (`DATABASE_URL`, under `scripts/test-all`).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use common::{ConfRow, Db, Lite, Pg, Sql, conf_ddl, eventually};
use serde::{Deserialize, Serialize};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{DeadSelector, Running};

/// The lease of every worker here: a dead worker's row is claimable again after it.
const LEASE: Duration = Duration::from_secs(1);
/// The queue (group) of the jobs.
const QUEUE: &str = "crash";
/// Its dead letter.
const DEAD: &str = "crash.dead";
/// The cap.
const CAP: u32 = 3;
/// What the child's handler does with the victim: `hang` or `abort`.
const ENV_MODE: &str = "STAGEDOOR_CRASH_MODE";
/// How long the parent waits for something a child does.
const PATIENCE: Duration = Duration::from_secs(60);

const MARKS_DDL: &str = "CREATE TABLE marks (n BIGINT NOT NULL, attempt BIGINT NOT NULL, pid BIGINT NOT NULL, at_ms BIGINT NOT NULL);";

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Msg {
    n: u64,
    /// The row whose handler hangs or aborts.
    victim: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The victim's handler sleeps for an hour (until the process is killed).
    Hang,
    /// The victim's handler aborts the process.
    Abort,
    /// Every handler acks (the surviving worker).
    Ack,
}

/// What the handler needs.
struct Crash {
    sql: Arc<dyn Sql>,
    mode: Mode,
}

/// Marks the delivery, then hangs, aborts or acks.
async fn crashes(
    msg: &Msg,
    Data(c): Data<Arc<Crash>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    c.sql
        .run(format!(
            "INSERT INTO marks (n, attempt, pid, at_ms) VALUES ({}, {}, {}, {})",
            msg.n,
            attempt.expect("SQL counts attempts"),
            std::process::id(),
            Utc::now().timestamp_millis()
        ))
        .await;
    if msg.victim {
        match c.mode {
            Mode::Hang => tokio::time::sleep(Duration::from_secs(3600)).await,
            Mode::Abort => std::process::abort(),
            Mode::Ack => {}
        }
    }
    HandlerOutcome::ack()
}

/// A worker service: one handler at a time (a dying worker takes only the victim with it), a
/// lease of [`LEASE`], cap [`CAP`].
fn worker<D: Db>(db: &D, mode: Mode) -> Service {
    let crash = Arc::new(Crash {
        sql: Arc::new(db.clone()),
        mode,
    });
    Service::new(AppInfo::new("sql-crash", "0.1.0"))
        .state(crash)
        .shutdown_timeout(Duration::from_secs(5))
        .with_broker(D::route::<ConfRow>(&db.broker().lease(LEASE), QUEUE), |b| {
            b.include(Subscriber::new(QUEUE, crashes).name("crashes"))
                .max_attempts(stagedoor_jobs::nonzero!(CAP))
                .dead_letter(DEAD)
                .concurrency(1);
        })
}

async fn count<D: Db>(db: &D, sql: &str) -> i64 {
    db.rows(sql.to_owned()).await[0][0].int()
}

/// `(attempt, pid, at_ms)` of every delivery of message `n`, in order.
async fn marks_of<D: Db>(db: &D, n: u64) -> Vec<(i64, u32, i64)> {
    db.rows(format!(
        "SELECT attempt, pid, at_ms FROM marks WHERE n = {n} ORDER BY attempt, at_ms"
    ))
    .await
    .iter()
    .map(|r| {
        (
            r[0].int(),
            u32::try_from(r[1].int()).expect("a pid"),
            r[2].int(),
        )
    })
    .collect()
}

/// Publishes the victim first (so a worker claims it first), then messages 1..=5.
async fn publish_jobs<D: Db>(db: &D) -> JobId {
    let route = D::route::<ConfRow>(&db.broker(), QUEUE);
    let victim = D::publish(
        &route,
        Job::new(QUEUE, &Msg { n: 0, victim: true }).expect("encodes"),
    )
    .await;
    for n in 1..=5 {
        D::publish(
            &route,
            Job::new(QUEUE, &Msg { n, victim: false }).expect("encodes"),
        )
        .await;
    }
    victim
}

/// A child worker process; killed (if still running) when dropped.
struct ChildWorker(Child);

impl ChildWorker {
    fn spawn<D: Db>(db: &D, mode: Mode) -> Self {
        let exe = std::env::current_exe().expect("the test binary");
        let child = Command::new(exe)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .envs(db.child_env())
            .env(ENV_MODE, format!("{mode:?}"))
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn a child worker");
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Waits for the child to exit, at most [`PATIENCE`].
    async fn exit(&mut self) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.0.try_wait().expect("the child's status") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the child worker did not exit within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The child worker: runs until the queue is empty (or until it is killed, or aborts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let Ok(mode) = std::env::var(ENV_MODE) else {
        return;
    };
    let mode = match mode.as_str() {
        "Hang" => Mode::Hang,
        "Abort" => Mode::Abort,
        other => panic!("unknown mode {other}"),
    };
    if let Some(db) = Lite::from_env().await {
        child(db, mode).await;
    } else if let Some(db) = Pg::from_env().await {
        child(db, mode).await;
    } else {
        panic!("the child's database is not in its environment");
    }
}

async fn child<D: Db>(db: D, mode: Mode) {
    let running: Running = worker(&db, mode)
        .start()
        .await
        .unwrap_or_else(|e| panic!("the child worker starts: {e}"));
    eventually("the queue is empty", Duration::from_secs(120), || async {
        count(
            &db,
            &format!("SELECT COUNT(*) FROM conf_jobs WHERE queue = '{QUEUE}'"),
        )
        .await
            == 0
    })
    .await;
    running.shutdown().await;
}

/// A worker SIGKILLed inside a handler: after the lease another worker delivers the row again,
/// attempt one higher; every row completes.
async fn a_worker_killed_inside_a_handler_loses_nothing<D: Db>() {
    let db = D::fresh("kill", &format!("{}\n{MARKS_DDL}", conf_ddl::<D>())).await;
    let victim = publish_jobs(&db).await;

    let mut child = ChildWorker::spawn(&db, Mode::Hang);
    let child_pid = child.pid();
    eventually(
        "the child is inside the victim's handler",
        PATIENCE,
        || async { !marks_of(&db, 0).await.is_empty() },
    )
    .await;
    child.0.kill().expect("SIGKILL the child");
    let status = child.exit().await;
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status}");
    let leased = db
        .rows(format!(
            "SELECT CAST(attempt AS BIGINT), locked_until FROM conf_jobs WHERE id = '{victim}'"
        ))
        .await;
    assert_eq!(leased.len(), 1, "the victim's row is still there");
    assert_eq!(leased[0][0].int(), 2, "its first delivery was counted");
    let lease_end = leased[0][1]
        .time()
        .expect("still leased by the dead worker");
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM marks").await,
        1,
        "the child ran only the victim"
    );

    let running = worker(&db, Mode::Ack)
        .start()
        .await
        .unwrap_or_else(|e| panic!("the surviving worker starts: {e}"));
    eventually("every row completed", PATIENCE, || async {
        count(&db, "SELECT COUNT(*) FROM conf_jobs").await == 0
    })
    .await;
    running.shutdown().await;

    let me = std::process::id();
    let marks = marks_of(&db, 0).await;
    assert_eq!(
        marks.iter().map(|(a, p, _)| (*a, *p)).collect::<Vec<_>>(),
        [(1, child_pid), (2, me)],
        "delivered again, attempt one higher, by the other worker"
    );
    assert!(
        marks[1].2 >= lease_end.timestamp_millis(),
        "not before the dead worker's lease ended: {marks:?}, lease until {lease_end}"
    );
    for n in 1..=5 {
        let m = marks_of(&db, n).await;
        assert_eq!(
            m.iter().map(|(a, p, _)| (*a, *p)).collect::<Vec<_>>(),
            [(1, me)],
            "message {n} ran once"
        );
    }
}

/// A job that aborts its worker process on every delivery, cap 3: after its 3 deliveries it is
/// dead-lettered on its 4th claim without running; every other row completes.
async fn a_job_that_kills_its_workers_is_dead_lettered_after_its_cap<D: Db>() {
    let db = D::fresh("abort", &format!("{}\n{MARKS_DDL}", conf_ddl::<D>())).await;
    let victim = publish_jobs(&db).await;

    let mut statuses = Vec::new();
    let dead_lettered = |db: D| async move {
        count(
            &db,
            &format!("SELECT COUNT(*) FROM conf_jobs WHERE queue = '{DEAD}'"),
        )
        .await
            == 1
            && count(
                &db,
                &format!("SELECT COUNT(*) FROM conf_jobs WHERE queue = '{QUEUE}'"),
            )
            .await
                == 0
    };
    for _ in 0..8 {
        let mut child = ChildWorker::spawn(&db, Mode::Abort);
        statuses.push(child.exit().await);
        if dead_lettered(db.clone()).await {
            break;
        }
    }
    assert!(
        dead_lettered(db.clone()).await,
        "the victim is in the dead letter and the queue is empty after {} workers: {statuses:?}",
        statuses.len()
    );
    let aborted = statuses.iter().filter(|s| s.signal() == Some(6)).count();
    assert_eq!(
        aborted, CAP as usize,
        "{CAP} workers died in the victim's handler: {statuses:?}"
    );
    assert!(
        statuses.last().is_some_and(ExitStatus::success),
        "the last worker dead-lettered the victim and finished: {statuses:?}"
    );

    let runs: Vec<i64> = marks_of(&db, 0).await.iter().map(|m| m.0).collect();
    assert_eq!(runs, [1, 2, 3], "3 deliveries ran; no 4th");
    for n in 1..=5 {
        let m = marks_of(&db, n).await;
        assert_eq!(m.len(), 1, "message {n} ran once: {m:?}");
    }

    let route = D::route::<ConfRow>(&db.broker(), QUEUE);
    route.connect().await.expect("connect");
    let letters = route
        .dead_letters(DEAD, &DeadSelector::All, 10)
        .await
        .expect("list");
    assert_eq!(letters.len(), 1, "only the victim: {letters:?}");
    let d = &letters[0];
    assert_eq!(d.envelope.id(), &victim);
    assert_eq!(d.origin, QUEUE);
    assert_eq!(d.attempts, CAP + 1, "every claim counted");
    assert!(
        d.error.contains(&format!("delivery {} ", CAP + 1))
            && d.error.contains(&format!("max_attempts({CAP})")),
        "the error says it was claimed too many times: {:?}",
        d.error
    );
}

use common::on_both;
use stagedoor_jobs::broker::{DeadLetters, Inspect};

on_both!(
    a_worker_killed_inside_a_handler_loses_nothing,
    a_job_that_kills_its_workers_is_dead_lettered_after_its_cap,
);
