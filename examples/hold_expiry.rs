//! Seed 000's scheduled jobs and the hold-expiry sweep: `expire_holds` every minute,
//! `reconcile_payments` at 03:00 in Prague (no retry), `purge_idempotency_keys` on the hour and
//! `purge_outbox` nightly, each enqueued once per tick on the queue `jobs` like any other job.
//!
//! `cargo run --example hold_expiry` keeps the seats, holds, idempotency keys and outbox in an
//! SQLite file in a temporary folder (`DATABASE_URL=postgres://...`: Postgres, in a schema of its
//! own that the run drops at the end), and the jobs in a `jobs` table of the same database. The
//! service runs under the test harness on a paused clock, so one whole day of ticks (1,440
//! sweeps, 24 hourly purges, the 03:00 reconciliation and the nightly purge) passes in seconds.
//!
//! With `REDIS_URL` set, the jobs go on the Redis stream `jobs` instead (the data stays in SQL).
//! Redis keeps its own time, so that run is live: the sweep runs every second for a few seconds,
//! and the other three kinds are published once, as an operator's "run it now" would.
//!
//! The run prints every sweep that expired holds and every other job, then the ticks enqueued,
//! and checks what the sweep promises: no expired hold is left, no seat is `held` without a
//! hold, every tick ran once, and a second sweep of the same tick changes nothing. It exits 1 if
//! any of that is false.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use stagedoor_jobs::RouteBuilder;
use stagedoor_jobs::broker::Broker;
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::schedule::Tz;
use stagedoor_jobs::testing::{Outcome, Record};
use stagedoor_jobs_redis::RedisBroker;
use stagedoor_jobs_sqlx::{Inbox, SqlxBroker};

/// The queue every scheduled kind goes on.
pub(crate) const QUEUE: &str = "jobs";
/// Reconciliation and the nightly purge are set in the organizer's time zone.
pub(crate) const ZONE: Tz = stagedoor_jobs::schedule::chrono_tz::Europe::Prague;
/// How many outbox rows one statement of `purge_outbox` deletes.
pub(crate) const OUTBOX_BATCH: i64 = 1_000;

// ---------------------------------------------------------------------------------------------
// The tables
// ---------------------------------------------------------------------------------------------

/// The data, in SQLite: seats, holds (at most one per seat), idempotency keys, the outbox.
pub(crate) const SQLITE_DATA: &str = "
CREATE TABLE IF NOT EXISTS seats (
    id INTEGER PRIMARY KEY,
    status TEXT NOT NULL CHECK (status IN ('available', 'held', 'sold')),
    version INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS holds (
    id INTEGER PRIMARY KEY,
    seat_id INTEGER NOT NULL UNIQUE REFERENCES seats (id),
    expires_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS holds_expires_at ON holds (expires_at);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_keys_created_at ON idempotency_keys (created_at);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY,
    published_at TEXT
);
CREATE INDEX IF NOT EXISTS outbox_published_at ON outbox (published_at);";

/// The job table in SQLite: a group column (the queue) and headers (the kind, the job id).
pub(crate) const SQLITE_JOBS: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL,
    locked_until TEXT,
    payload BLOB NOT NULL,
    headers TEXT,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (queue, retry_after, id);";

pub(crate) const POSTGRES_DATA: &str = "
CREATE TABLE IF NOT EXISTS seats (
    id BIGINT PRIMARY KEY,
    status TEXT NOT NULL CHECK (status IN ('available', 'held', 'sold')),
    version BIGINT NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS holds (
    id BIGSERIAL PRIMARY KEY,
    seat_id BIGINT NOT NULL UNIQUE REFERENCES seats (id),
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS holds_expires_at ON holds (expires_at);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_keys_created_at ON idempotency_keys (created_at);
CREATE TABLE IF NOT EXISTS outbox (
    id BIGSERIAL PRIMARY KEY,
    published_at TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS outbox_published_at ON outbox (published_at);";

pub(crate) const POSTGRES_JOBS: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    id BIGSERIAL PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt SMALLINT NOT NULL DEFAULT 1,
    retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_until TIMESTAMPTZ,
    payload BYTEA NOT NULL,
    headers TEXT,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (queue, retry_after, id);";

/// One row of the `jobs` table: `queue` is the group a row waits in (`jobs`, `jobs.dead`), and
/// `headers` carries each row's kind and job id, so the four kinds share the table.
#[derive(Inbox)]
#[inbox(table = "jobs")]
#[allow(dead_code)]
pub(crate) struct JobRow {
    #[field(id, generated)]
    id: i64,
    #[field(group)]
    queue: String,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
    #[field(headers)]
    headers: Option<String>,
    #[field(last_error)]
    last_error: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// The database the handlers work on
// ---------------------------------------------------------------------------------------------

/// The application's database, shared with every handler through `Data<Db>`.
#[derive(Clone, Debug)]
pub(crate) enum Db {
    /// An SQLite file.
    Sqlite(SqlitePool),
    /// A Postgres database (the pool's connections work in the run's schema).
    Postgres(PgPool),
}

/// Runs `$body` with `$pool` bound to the pool of whichever database `$db` is (the code is the
/// same; the types differ).
macro_rules! on_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            Db::Sqlite($pool) => $body,
            Db::Postgres($pool) => $body,
        }
    };
}

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sweep {
    /// The holds deleted: `(hold id, seat id)`, by hold id.
    pub(crate) holds: Vec<(i64, i64)>,
    /// The seats set back to `available` (those of the deleted holds that were still `held`).
    pub(crate) released: Vec<i64>,
}

/// What a database looks like to the checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Health {
    /// Holds whose time has passed.
    pub(crate) expired_holds: i64,
    /// Seats `held` with no hold row.
    pub(crate) held_without_hold: i64,
}

/// What [`Db::seed`] wrote.
#[derive(Clone, Debug)]
pub(crate) struct Seeded {
    /// Seats `held` whose hold had expired.
    pub(crate) expired: usize,
    /// Holds expiring later.
    pub(crate) live: usize,
    /// Idempotency keys older than 24 hours.
    pub(crate) old_keys: usize,
    /// Idempotency keys.
    pub(crate) keys: usize,
    /// Outbox rows published more than 7 days ago.
    pub(crate) old_outbox: i64,
    /// Outbox rows.
    pub(crate) outbox: i64,
}

impl Db {
    /// Opens the database `url` names (`sqlite://...` or `postgres://...`); a Postgres pool's
    /// connections work in `schema` when one is given.
    pub(crate) async fn open(url: &str, schema: Option<&str>) -> Result<Self, sqlx::Error> {
        if url.starts_with("postgres") {
            let mut options = PgPoolOptions::new().max_connections(8);
            if let Some(schema) = schema {
                let set = format!("SET search_path TO {schema}");
                options = options.after_connect(move |conn, _| {
                    let set = set.clone();
                    Box::pin(async move {
                        sqlx::raw_sql(sqlx::AssertSqlSafe(set))
                            .execute(conn)
                            .await
                            .map(|_| ())
                    })
                });
            }
            Ok(Db::Postgres(options.connect(url).await?))
        } else {
            use std::str::FromStr;
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(10));
            Ok(Db::Sqlite(
                SqlitePoolOptions::new()
                    .max_connections(8)
                    .connect_with(options)
                    .await?,
            ))
        }
    }

    /// Creates the tables (and the job table when the jobs live in this database too).
    pub(crate) async fn create_tables(&self, job_table: bool) -> Result<(), sqlx::Error> {
        let (data, jobs) = match self {
            Db::Sqlite(_) => (SQLITE_DATA, SQLITE_JOBS),
            Db::Postgres(_) => (POSTGRES_DATA, POSTGRES_JOBS),
        };
        on_pool!(self, pool => {
            sqlx::raw_sql(data).execute(pool).await?;
            if job_table {
                sqlx::raw_sql(jobs).execute(pool).await?;
            }
        });
        Ok(())
    }

    /// Seeds the tables relative to `now`, with holds expiring at multiples of `period` (the
    /// sweep's): seats 1-3 held with expired holds, seat 8 sold with a stale expired hold (the
    /// sale came first; the sweep must not make it available), seats 4-7 held with holds that
    /// expire later, seats 9-10 available; idempotency keys older and newer than 24 hours;
    /// 2,500 outbox rows published 8 days ago, 5 published yesterday and 5 not yet published.
    pub(crate) async fn seed(
        &self,
        now: DateTime<Utc>,
        period: Duration,
    ) -> Result<Seeded, sqlx::Error> {
        let p = chrono::Duration::from_std(period).expect("a short period");
        let h = chrono::Duration::hours;
        let seats: [(i64, &str, Option<chrono::Duration>); 10] = [
            (1, "held", Some(-p * 10)),
            (2, "held", Some(-p * 3)),
            (3, "held", Some(-p / 2)),
            (4, "held", Some(p * 3 / 2)),
            (5, "held", Some(p * 25)),
            (6, "held", Some(p * 300)),
            (7, "held", Some(p * 2 * 24 * 60)),
            (8, "sold", Some(-p * 20)),
            (9, "available", None),
            (10, "available", None),
        ];
        let keys: [(&str, chrono::Duration); 6] = [
            ("order-1001", -h(30)),
            ("order-1002", -h(25)),
            ("order-1003", -h(24) - chrono::Duration::minutes(1)),
            ("order-1004", -h(20)),
            ("order-1005", -h(1)),
            ("order-1006", -chrono::Duration::minutes(10)),
        ];
        let (old_outbox, outbox) = (2_500_i64, 2_510_i64);
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            for (id, status, hold) in seats {
                sqlx::query("INSERT INTO seats (id, status, version) VALUES ($1, $2, 1)")
                    .bind(id)
                    .bind(status)
                    .execute(&mut *tx)
                    .await?;
                if let Some(offset) = hold {
                    sqlx::query("INSERT INTO holds (seat_id, expires_at) VALUES ($1, $2)")
                        .bind(id)
                        .bind(now + offset)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            for (key, age) in keys {
                sqlx::query("INSERT INTO idempotency_keys (key, created_at) VALUES ($1, $2)")
                    .bind(key)
                    .bind(now + age)
                    .execute(&mut *tx)
                    .await?;
            }
            let rows = "INSERT INTO outbox (published_at) WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) SELECT $2 FROM n";
            sqlx::query(rows).bind(old_outbox).bind(now - h(8 * 24)).execute(&mut *tx).await?;
            sqlx::query(rows).bind(5_i64).bind(now - h(24)).execute(&mut *tx).await?;
            sqlx::query(rows).bind(5_i64).bind(None::<DateTime<Utc>>).execute(&mut *tx).await?;
            tx.commit().await?;
        });
        let expired = seats
            .iter()
            .filter(|(_, s, o)| *s == "held" && o.is_some_and(|o| o < chrono::Duration::zero()))
            .count();
        Ok(Seeded {
            expired,
            live: seats
                .iter()
                .filter(|(_, _, o)| o.is_some_and(|o| o > chrono::Duration::zero()))
                .count(),
            old_keys: keys.iter().filter(|(_, age)| *age < -h(24)).count(),
            keys: keys.len(),
            old_outbox,
            outbox,
        })
    }

    /// Seed 000's sweep: deletes every hold whose time has passed (by `now`) and returns its seat
    /// to `available` (version + 1), touching only seats still `held`, in one transaction. A
    /// second run with the same `now` finds nothing expired and changes nothing.
    pub(crate) async fn expire_holds(&self, now: DateTime<Utc>) -> Result<Sweep, sqlx::Error> {
        let update = match self {
            Db::Sqlite(_) => {
                "UPDATE seats SET status = 'available', version = version + 1 \
                 WHERE status = 'held' AND id IN (SELECT value FROM json_each($1)) RETURNING id"
            }
            Db::Postgres(_) => {
                "UPDATE seats SET status = 'available', version = version + 1 \
                 WHERE status = 'held' AND id IN (SELECT CAST(value AS BIGINT) FROM json_array_elements_text(CAST($1 AS JSON))) RETURNING id"
            }
        };
        let mut sweep = on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let holds: Vec<(i64, i64)> =
                sqlx::query_as("DELETE FROM holds WHERE expires_at < $1 RETURNING id, seat_id")
                    .bind(now)
                    .fetch_all(&mut *tx)
                    .await?;
            let seat_ids: Vec<i64> = holds.iter().map(|(_, seat)| *seat).collect();
            let released: Vec<i64> = if seat_ids.is_empty() {
                Vec::new()
            } else {
                sqlx::query_scalar(update)
                    .bind(serde_json::to_string(&seat_ids).expect("ids encode"))
                    .fetch_all(&mut *tx)
                    .await?
            };
            tx.commit().await?;
            Sweep { holds, released }
        });
        sweep.holds.sort_unstable();
        sweep.released.sort_unstable();
        Ok(sweep)
    }

    /// Deletes the idempotency keys older than 24 hours; returns how many.
    pub(crate) async fn purge_idempotency_keys(
        &self,
        now: DateTime<Utc>,
    ) -> Result<u64, sqlx::Error> {
        let cutoff = now - chrono::Duration::hours(24);
        Ok(on_pool!(self, pool => {
            sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
                .bind(cutoff)
                .execute(pool)
                .await?
                .rows_affected()
        }))
    }

    /// Deletes the outbox rows published more than 7 days ago, [`OUTBOX_BATCH`] rows per
    /// statement (each its own short transaction); returns the rows and the statements.
    pub(crate) async fn purge_outbox(&self, now: DateTime<Utc>) -> Result<(u64, u32), sqlx::Error> {
        let cutoff = now - chrono::Duration::days(7);
        let (mut rows, mut batches) = (0, 0);
        loop {
            let n = on_pool!(self, pool => {
                sqlx::query(
                    "DELETE FROM outbox WHERE id IN \
                     (SELECT id FROM outbox WHERE published_at < $1 ORDER BY id LIMIT $2)",
                )
                .bind(cutoff)
                .bind(OUTBOX_BATCH)
                .execute(pool)
                .await?
                .rows_affected()
            });
            if n == 0 {
                break;
            }
            rows += n;
            batches += 1;
            if n < OUTBOX_BATCH as u64 {
                break;
            }
        }
        Ok((rows, batches))
    }

    /// The counts the sweep's promise is about, as of `now`.
    pub(crate) async fn health(&self, now: DateTime<Utc>) -> Result<Health, sqlx::Error> {
        Ok(on_pool!(self, pool => {
            let expired_holds: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM holds WHERE expires_at < $1")
                    .bind(now)
                    .fetch_one(pool)
                    .await?;
            let held_without_hold: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM seats s WHERE s.status = 'held' \
                 AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.seat_id = s.id)",
            )
            .fetch_one(pool)
            .await?;
            Health { expired_holds, held_without_hold }
        }))
    }

    /// `SELECT COUNT(*)` of a table, or of the rows a `WHERE` clause picks.
    pub(crate) async fn count(&self, from: &str) -> Result<i64, sqlx::Error> {
        let sql = format!("SELECT COUNT(*) FROM {from}");
        Ok(on_pool!(self, pool => {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_one(pool).await?
        }))
    }

    /// Idempotency keys older than 24 hours at `keys_at`, and outbox rows published more than 7
    /// days before `outbox_at`.
    pub(crate) async fn stale(
        &self,
        keys_at: DateTime<Utc>,
        outbox_at: DateTime<Utc>,
    ) -> Result<(i64, i64), sqlx::Error> {
        Ok(on_pool!(self, pool => {
            let keys: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_keys WHERE created_at < $1")
                .bind(keys_at - chrono::Duration::hours(24))
                .fetch_one(pool)
                .await?;
            let outbox: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox WHERE published_at < $1")
                .bind(outbox_at - chrono::Duration::days(7))
                .fetch_one(pool)
                .await?;
            (keys, outbox)
        }))
    }

    /// `(id, status, version)` of every seat, by id.
    pub(crate) async fn seats(&self) -> Result<Vec<(i64, String, i64)>, sqlx::Error> {
        Ok(on_pool!(self, pool => {
            sqlx::query_as("SELECT id, status, CAST(version AS BIGINT) FROM seats ORDER BY id")
                .fetch_all(pool)
                .await?
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// The handlers: each payload is the tick it was enqueued for
// ---------------------------------------------------------------------------------------------

/// The payload of every scheduled job: its tick. The handlers measure "expired" and "older than"
/// from it, so a duplicate of a tick (a second delivery, a replay) does exactly what the first
/// did, which is nothing once the first has committed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Tick {
    /// The tick (or, for a job published by hand, the time it was published for).
    pub(crate) at: DateTime<Utc>,
}

fn hhmm(t: DateTime<Utc>) -> String {
    t.format("%b %d %H:%M:%SZ").to_string()
}

/// Deletes every expired hold and returns its seat to the map (seed 000's sweep).
pub(crate) async fn expire_holds(tick: &Tick, Data(db): Data<Db>) -> Result<(), sqlx::Error> {
    let sweep = db.expire_holds(tick.at).await?;
    if !sweep.holds.is_empty() {
        let kept: Vec<i64> = sweep
            .holds
            .iter()
            .map(|(_, s)| *s)
            .filter(|s| !sweep.released.contains(s))
            .collect();
        println!(
            "{}  expire_holds            expired {} hold(s); seats {:?} available again{}",
            hhmm(tick.at),
            sweep.holds.len(),
            sweep.released,
            if kept.is_empty() {
                String::new()
            } else {
                format!(" (seats {kept:?} were no longer held: left as they are)")
            }
        );
    }
    Ok(())
}

/// Deletes the idempotency keys older than 24 hours.
pub(crate) async fn purge_idempotency_keys(
    tick: &Tick,
    Data(db): Data<Db>,
) -> Result<(), sqlx::Error> {
    let n = db.purge_idempotency_keys(tick.at).await?;
    if n > 0 {
        println!(
            "{}  purge_idempotency_keys  deleted {n} key(s) older than 24 h",
            hhmm(tick.at)
        );
    }
    Ok(())
}

/// Deletes the outbox rows published more than 7 days ago, in batches of 1,000.
pub(crate) async fn purge_outbox(tick: &Tick, Data(db): Data<Db>) -> Result<(), sqlx::Error> {
    let (rows, batches) = db.purge_outbox(tick.at).await?;
    println!(
        "{}  purge_outbox            deleted {rows} row(s) published more than 7 days ago, in {batches} batch(es) of at most {OUTBOX_BATCH}",
        hhmm(tick.at)
    );
    Ok(())
}

/// Walks the day's payments (simulated). Never retried: the next night's run covers a failure.
pub(crate) async fn reconcile_payments(tick: &Tick) -> HandlerOutcome {
    println!(
        "{}  reconcile_payments      walked the payments of {} (it is {} in Prague)",
        hhmm(tick.at),
        (tick.at.with_timezone(&ZONE) - chrono::Duration::days(1)).format("%b %d"),
        tick.at.with_timezone(&ZONE).format("%H:%M %Z")
    );
    HandlerOutcome::ack()
}

/// The subscriptions, the same on every backend: four kinds on the queue `jobs`, a policy each.
pub(crate) fn mount<B: Broker>(b: &mut RouteBuilder<B>, dead: &str) {
    b.include(Subscriber::new(QUEUE, expire_holds).kind("expire_holds"))
        .max_attempts(nonzero!(3u32))
        .dead_letter(dead);
    b.include(Subscriber::new(QUEUE, purge_idempotency_keys).kind("purge_idempotency_keys"))
        .max_attempts(nonzero!(3u32))
        .dead_letter(dead);
    b.include(Subscriber::new(QUEUE, purge_outbox).kind("purge_outbox"))
        .max_attempts(nonzero!(3u32))
        .dead_letter(dead);
    // One attempt, no retry: a second walk over every payment of the day is worse than waiting
    // for the next night's run. A failure goes straight to the dead letter.
    b.include(Subscriber::new(QUEUE, reconcile_payments).kind("reconcile_payments"))
        .max_attempts(nonzero!(1u32))
        .dead_letter(dead);
}

/// The four schedules; `sweep` is the sweep's period (a minute; a second on the live run).
pub(crate) fn schedules(sweep: Duration) -> Vec<Schedule> {
    let tick = |t: DateTime<Utc>| Tick { at: t };
    vec![
        Schedule::every("expire_holds", sweep)
            .on(QUEUE)
            .payload_with(tick),
        Schedule::cron("reconcile_payments", cron!("0 3 * * *"))
            .in_tz(ZONE)
            .on(QUEUE)
            .payload_with(tick),
        Schedule::hourly("purge_idempotency_keys")
            .on(QUEUE)
            .payload_with(tick),
        Schedule::daily_at("purge_outbox", 4, 30)
            .in_tz(ZONE)
            .on(QUEUE)
            .payload_with(tick),
    ]
}

/// Where the jobs wait.
#[derive(Clone, Debug)]
pub(crate) enum Jobs {
    /// In the `jobs` table of the application's own database.
    Sql,
    /// On a Redis stream `jobs`, every key under `namespace`.
    Redis {
        /// The server.
        url: String,
        /// The run's own namespace.
        namespace: String,
    },
}

/// The worker: the database as state, the four kinds mounted, the four schedules.
pub(crate) fn service(db: &Db, jobs: &Jobs, sweep: Duration) -> Service {
    let mut service = Service::new(AppInfo::new("hold-expiry", "0.1.0"))
        .state(db.clone())
        .shutdown_timeout(Duration::from_secs(10));
    for s in schedules(sweep) {
        service = service.schedule(s);
    }
    match (jobs, db) {
        (Jobs::Redis { url, namespace }, _) => service.with_broker(
            RedisBroker::from_url(url).namespace(namespace.clone()),
            |b| mount(b, "jobs:dead"),
        ),
        (Jobs::Sql, Db::Sqlite(pool)) => service
            .with_broker(SqlxBroker::new(pool.clone()).route::<JobRow>(QUEUE), |b| {
                mount(b, "jobs.dead")
            }),
        (Jobs::Sql, Db::Postgres(pool)) => service
            .with_broker(SqlxBroker::new(pool.clone()).route::<JobRow>(QUEUE), |b| {
                mount(b, "jobs.dead")
            }),
    }
}

/// The tick a scheduled job id names (`expire_holds@1764411360`).
pub(crate) fn tick_of(id: &str) -> Option<DateTime<Utc>> {
    let (_, secs) = id.rsplit_once('@')?;
    DateTime::<Utc>::from_timestamp(secs.parse().ok()?, 0)
}

/// The ticks of each kind that ran (acked), in order.
pub(crate) fn ticks_by_kind(records: &[Record]) -> BTreeMap<String, Vec<DateTime<Utc>>> {
    let mut out: BTreeMap<String, Vec<DateTime<Utc>>> = BTreeMap::new();
    for r in records {
        if r.outcome == Outcome::Acked
            && let Some(t) = tick_of(r.job_id.as_str())
        {
            out.entry(r.kind.clone()).or_default().push(t);
        }
    }
    for ticks in out.values_mut() {
        ticks.sort();
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------------

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What went wrong with a promise, collected and printed at the end.
#[derive(Default)]
struct Verdict(Vec<String>);

impl Verdict {
    fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.0.push(what.into());
        }
    }
}

fn spaced(n: i64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One day on a paused clock, the jobs in the database's own table.
async fn run_paused(db: &Db, verdict: &mut Verdict) -> Result<(), BoxError> {
    let minute = Duration::from_secs(60);
    let app = TestApp::start(service(db, &Jobs::Sql, minute)).await?;
    let start = app.now();
    let seeded = db.seed(start, minute).await?;
    report_seed(&seeded, start);
    app.advance(Duration::from_secs(24 * 3600)).await;
    let end = app.now();
    let records = app.records();
    let dead = app.dead_letters("jobs.dead").await;
    app.stop().await;

    let ticks = ticks_by_kind(&records);
    println!();
    println!("ticks enqueued and run, each once:");
    for (kind, t) in &ticks {
        let first = t.first().map_or_else(String::new, |t| hhmm(*t));
        let last = t.last().map_or_else(String::new, |t| hhmm(*t));
        if t.len() > 2 {
            println!("  {kind:<24} {:>5} ticks, {first} .. {last}", t.len());
        } else {
            let list: Vec<String> = t.iter().map(|t| hhmm(*t)).collect();
            println!("  {kind:<24} {:>5} tick(s): {}", t.len(), list.join(", "));
        }
    }
    // What a day of ticks must be: each tick once, at its time.
    for s in schedules(minute) {
        let mut expected = Vec::new();
        let mut t = s.next_after(start);
        while let Some(tick) = t.filter(|t| *t <= end) {
            expected.push(tick);
            t = s.next_after(tick);
        }
        let got = ticks.get(s.name()).cloned().unwrap_or_default();
        verdict.check(
            got == expected,
            format!(
                "{}: ran {} ticks, expected {} (every tick once, none twice)",
                s.name(),
                got.len(),
                expected.len()
            ),
        );
    }
    verdict.check(dead.is_empty(), format!("dead letters: {dead:?}"));
    let last_sweep = ticks
        .get("expire_holds")
        .and_then(|t| t.last().copied())
        .unwrap_or(start);
    check_data(db, last_sweep, verdict).await?;
    let last = |kind: &str| ticks.get(kind).and_then(|t| t.last().copied());
    check_purges(
        db,
        last("purge_idempotency_keys"),
        last("purge_outbox"),
        verdict,
    )
    .await
}

/// A few seconds on the real clock, the jobs on a Redis stream.
async fn run_live(db: &Db, url: &str, verdict: &mut Verdict) -> Result<(), BoxError> {
    let second = Duration::from_secs(1);
    let namespace = format!("hold-expiry-{}:", std::process::id());
    let jobs = Jobs::Redis {
        url: url.to_owned(),
        namespace: namespace.clone(),
    };
    let app = TestApp::start_live(service(db, &jobs, second))
        .await
        .map_err(|e| format!("{e} (start a Redis, or point REDIS_URL at one)"))?;
    let start = Utc::now();
    let seeded = db.seed(start, second).await?;
    report_seed(&seeded, start);
    app.advance(Duration::from_millis(3_500)).await;
    // The other kinds, published by hand as an operator's "run it now" would.
    let now = Tick { at: Utc::now() };
    for kind in [
        "purge_idempotency_keys",
        "purge_outbox",
        "reconcile_payments",
    ] {
        app.publish(Job::new(QUEUE, &now)?.kind(kind)).await?;
    }
    app.drain().await;
    let records = app.records();
    let dead = app.dead_letters("jobs:dead").await;
    app.stop().await;
    let ticks = ticks_by_kind(&records);
    let sweeps = ticks.get("expire_holds").cloned().unwrap_or_default();
    println!();
    println!(
        "expire_holds ticks enqueued and run: {}",
        sweeps
            .iter()
            .map(|t| hhmm(*t))
            .collect::<Vec<_>>()
            .join(", ")
    );
    verdict.check(sweeps.len() >= 2, "fewer than 2 sweeps in 3.5 s");
    verdict.check(
        sweeps
            .windows(2)
            .all(|w| w[1] - w[0] == chrono::Duration::seconds(1)),
        format!("sweep ticks are not each second once: {sweeps:?}"),
    );
    verdict.check(dead.is_empty(), format!("dead letters: {dead:?}"));
    let ran = records
        .iter()
        .filter(|r| r.outcome == Outcome::Acked)
        .count();
    verdict.check(
        ran == sweeps.len() + 3,
        format!("{ran} jobs ran, expected the sweeps and 3 more"),
    );
    let last_sweep = sweeps.last().copied().unwrap_or(start);
    let result = async {
        check_data(db, last_sweep, verdict).await?;
        check_purges(db, Some(now.at), Some(now.at), verdict).await
    }
    .await;
    remove_keys(url, &namespace).await?;
    result
}

fn report_seed(s: &Seeded, start: DateTime<Utc>) {
    println!(
        "seeded at {}: {} held seats with expired holds and 1 sold seat with a stale one, {} holds \
         expiring later; {} idempotency keys ({} older than 24 h); {} outbox rows ({} published \
         more than 7 days ago)",
        hhmm(start),
        s.expired,
        s.live,
        s.keys,
        s.old_keys,
        spaced(s.outbox),
        spaced(s.old_outbox)
    );
    println!();
}

/// The sweep's promise, and that a second sweep of the last tick changes nothing.
async fn check_data(db: &Db, last: DateTime<Utc>, verdict: &mut Verdict) -> Result<(), BoxError> {
    let health = db.health(last).await?;
    let seats = db.seats().await?;
    println!();
    println!(
        "after: {} expired hold(s), {} seat(s) held without a hold; seats {}",
        health.expired_holds,
        health.held_without_hold,
        seats
            .iter()
            .map(|(id, s, v)| format!("{id}:{s}/v{v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    verdict.check(health.expired_holds == 0, "an expired hold is left");
    verdict.check(
        health.held_without_hold == 0,
        "a seat is held without a hold",
    );
    verdict.check(
        seats
            .iter()
            .any(|(id, s, v)| *id == 8 && s == "sold" && *v == 1),
        "the sold seat was touched",
    );
    let again = db.expire_holds(last).await?;
    let seats_again = db.seats().await?;
    println!(
        "a second sweep of {}: {} hold(s) deleted, {} seat(s) changed",
        hhmm(last),
        again.holds.len(),
        seats
            .iter()
            .zip(&seats_again)
            .filter(|(a, b)| a != b)
            .count()
    );
    verdict.check(
        again == Sweep::default() && seats == seats_again,
        "a second sweep changed something",
    );
    Ok(())
}

/// The purges' promise: nothing older than they keep, as of the last tick of each.
async fn check_purges(
    db: &Db,
    keys_at: Option<DateTime<Utc>>,
    outbox_at: Option<DateTime<Utc>>,
    verdict: &mut Verdict,
) -> Result<(), BoxError> {
    let keys_at = keys_at.ok_or("purge_idempotency_keys never ran")?;
    let outbox_at = outbox_at.ok_or("purge_outbox never ran")?;
    let (keys, outbox) = db.stale(keys_at, outbox_at).await?;
    println!(
        "idempotency keys older than 24 h: {keys}; outbox rows published more than 7 days ago: {outbox}; outbox rows left: {}",
        db.count("outbox").await?
    );
    verdict.check(keys == 0, "an idempotency key older than 24 h is left");
    verdict.check(outbox == 0, "an outbox row older than 7 days is left");
    Ok(())
}

/// Deletes every key of the run's namespace.
pub(crate) async fn remove_keys(url: &str, namespace: &str) -> Result<(), BoxError> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{{{namespace}*"))
        .query_async(&mut conn)
        .await?;
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let redis_url = std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty());
    let postgres = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| u.starts_with("postgres"));
    let dir = std::env::temp_dir().join(format!("stagedoor-hold-expiry-{}", std::process::id()));
    let schema = format!("hold_expiry_{}", std::process::id());
    let db = match &postgres {
        Some(url) => {
            let admin = Db::open(url, None).await?;
            if let Db::Postgres(pool) = &admin {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
                )))
                .execute(pool)
                .await?;
            }
            Db::open(url, Some(&schema)).await?
        }
        None => {
            std::fs::create_dir_all(&dir)?;
            let url = format!("sqlite://{}", dir.join("stagedoor.db").display());
            Db::open(&url, None).await?
        }
    };
    let data = if postgres.is_some() {
        format!("Postgres (schema {schema})")
    } else {
        format!("SQLite ({})", dir.join("stagedoor.db").display())
    };
    db.create_tables(redis_url.is_none()).await?;
    let mut verdict = Verdict::default();
    let result = match &redis_url {
        None => {
            println!("hold_expiry: data and jobs on {data}; one day on a paused clock\n");
            run_paused(&db, &mut verdict).await
        }
        Some(url) => {
            println!(
                "hold_expiry: data on {data}, jobs on the Redis stream `jobs`; a few seconds on the real clock, the sweep every second\n"
            );
            run_live(&db, url, &mut verdict).await
        }
    };
    // Leave nothing behind.
    if let (Some(url), Db::Postgres(pool)) = (&postgres, &db) {
        pool.close().await;
        if let Db::Postgres(admin) = Db::open(url, None).await? {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE"
            )))
            .execute(&admin)
            .await?;
        }
    } else if let Db::Sqlite(pool) = &db {
        pool.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
    result?;
    if verdict.0.is_empty() {
        println!("\nok: no expired hold, no seat held without a hold, every tick once");
        Ok(())
    } else {
        for v in &verdict.0 {
            eprintln!("FAILED: {v}");
        }
        std::process::exit(1);
    }
}
