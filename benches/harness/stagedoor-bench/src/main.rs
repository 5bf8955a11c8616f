//! stagedoor-jobs as hardbyte/postgresql-job-queue-benchmarking drives a system: one process,
//! telemetry as JSONL on stdout, logs on stderr, configured by the harness's environment
//! (`DATABASE_URL`, `PRODUCER_RATE`, `WORKER_COUNT`, ...; see `../README.md`).
//!
//! It is written from stagedoor-jobs' README, as a user would write it:
//! - the mailer's table shape: a generated id, no headers column, the index the claim reads;
//! - a service with one subscriber at `WORKER_COUNT`, on a `SqlxBroker` route;
//! - a producer in the same process publishing with `publish_jobs`, batches of up to
//!   `PRODUCER_BATCH_MAX` (128) every `PRODUCER_BATCH_MS` (25 ms), the rate credited on real
//!   elapsed time as the harness's contract asks;
//! - the queue depth read from `Inspect::stats` every 200 ms.
//!
//! Claim latency is the harness's "pickup latency": the handler's start less the publish time
//! the producer wrote into the payload (wall clock, milliseconds).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use stagedoor_jobs_sqlx::SqlxRoute;
use stagedoor_jobs_sqlx::prelude::*;
use tokio::sync::Mutex;

const QUEUE: &str = "bench";
/// The harness's rolling window for the latency percentiles.
const WINDOW: Duration = Duration::from_secs(30);
/// How often the depth reader asks `stats`.
const DEPTH_EVERY: Duration = Duration::from_millis(200);

/// The mailer's table (README, "The SQL backend"), with the index the claim reads.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS mail_jobs (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL,
    attempt SMALLINT NOT NULL DEFAULT 1,
    retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_until TIMESTAMPTZ,
    payload BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS mail_jobs_due ON mail_jobs (name, retry_after, id);";

/// One row of `mail_jobs`.
#[derive(Inbox)]
#[inbox(table = "mail_jobs")]
#[allow(dead_code)]
struct MailJob {
    #[field(id, generated)]
    id: i64,
    #[field(group)]
    name: String,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The other shape the README teaches (`STAGEDOOR_TABLE=text`): a text id the publisher mints
/// (the job's id), the headers, the last error and the publish time in columns of their own.
const TEXT_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS text_jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    attempt SMALLINT NOT NULL DEFAULT 1,
    retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_until TIMESTAMPTZ,
    payload BYTEA NOT NULL,
    enqueued_at TIMESTAMPTZ,
    last_error TEXT,
    headers TEXT
);
CREATE INDEX IF NOT EXISTS text_jobs_due ON text_jobs (name, retry_after, id);";

/// One row of `text_jobs`.
#[derive(Inbox)]
#[inbox(table = "text_jobs")]
#[allow(dead_code)]
struct TextJob {
    #[field(id)]
    id: String,
    #[field(group)]
    name: String,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
    #[field(enqueued_at)]
    enqueued_at: Option<DateTime<Utc>>,
    #[field(last_error)]
    last_error: Option<String>,
    #[field(headers)]
    headers: Option<String>,
}

type Route<R> = SqlxRoute<sqlx::Postgres, R>;

/// What the producer publishes.
#[derive(Serialize, Deserialize)]
struct BenchJob {
    /// The publishing process (its pid): with `seq`, the job's name in the ledger.
    #[serde(default)]
    origin: u32,
    seq: u64,
    enqueued_at_ms: u64,
    payload_padding: String,
}

/// Latencies of the last 30 s (bounded by rate × window).
#[derive(Default)]
struct Window {
    items: VecDeque<(Instant, f64)>,
}

impl Window {
    fn push(&mut self, v: f64) {
        self.items.push_back((Instant::now(), v));
    }

    fn percentiles(&mut self) -> (f64, f64, f64) {
        let now = Instant::now();
        while let Some((t, _)) = self.items.front() {
            if now.duration_since(*t) > WINDOW {
                self.items.pop_front();
            } else {
                break;
            }
        }
        let mut v: Vec<f64> = self.items.iter().map(|(_, x)| *x).collect();
        if v.is_empty() {
            return (0.0, 0.0, 0.0);
        }
        v.sort_by(f64::total_cmp);
        let q = |p: f64| v[((p * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)];
        (q(0.5), q(0.95), q(0.99))
    }
}

/// What the handler, the producer, the depth reader and the sampler share.
struct Shared {
    enqueued: AtomicU64,
    completed: AtomicU64,
    depth: AtomicU64,
    depth_peak: AtomicU64,
    claim: Mutex<Window>,
    e2e: Mutex<Window>,
    producer: Mutex<Window>,
    work: Duration,
    stop: AtomicBool,
    /// `STAGEDOOR_LEDGER_DIR`: every job published and every job run, a line each, written at
    /// once (no buffer a kill would lose), so that a run with kills can be checked for jobs
    /// published and never run (`../check-ledger`).
    ledger: Option<Ledger>,
}

/// The ledger files of this process (see `Shared::ledger`).
struct Ledger {
    published: std::fs::File,
    ran: std::fs::File,
}

impl Ledger {
    fn open(dir: &str) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let pid = std::process::id();
        let open = |name: String| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(std::path::Path::new(dir).join(name))
        };
        Ok(Self {
            published: open(format!("published-{pid}.txt"))?,
            ran: open(format!("ran-{pid}.txt"))?,
        })
    }

    fn write(mut file: &std::fs::File, text: &str) {
        use std::io::Write;
        if let Err(e) = file.write_all(text.as_bytes()) {
            eprintln!("[stagedoor] ledger write failed: {e}");
        }
    }
}

fn env<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn now_iso() -> String {
    Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn emit(v: serde_json::Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// The handler: the pickup latency, the synthetic work, the completion.
async fn handle(job: &BenchJob, Data(s): Data<Arc<Shared>>) -> HandlerOutcome {
    let started = now_ms();
    s.claim
        .lock()
        .await
        .push(started.saturating_sub(job.enqueued_at_ms) as f64);
    if !s.work.is_zero() {
        tokio::time::sleep(s.work).await;
    }
    s.e2e
        .lock()
        .await
        .push(now_ms().saturating_sub(job.enqueued_at_ms) as f64);
    s.completed.fetch_add(1, Ordering::Relaxed);
    if let Some(l) = &s.ledger {
        Ledger::write(&l.ran, &format!("{}:{}\n", job.origin, job.seq));
    }
    HandlerOutcome::ack()
}

fn route<R: Inbox>(url: &str, pool: u32) -> Route<R> {
    SqlxBroker::<sqlx::Postgres>::from_url(
        url,
        sqlx::postgres::PgPoolOptions::new().max_connections(pool),
    )
    .route::<R>(QUEUE)
}

/// The fixed-rate producer: up to `batch_max` jobs every `batch_ms`, credited on elapsed time.
async fn producer<R: Inbox>(
    r: Route<R>,
    s: Arc<Shared>,
    rate: f64,
    batch_max: usize,
    batch_ms: u64,
) {
    let padding = "x".repeat(env::<usize>("JOB_PAYLOAD_BYTES", 256).saturating_sub(64));
    let mut tick = tokio::time::interval(Duration::from_millis(batch_ms.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut credit = 0.0f64;
    let mut last = Instant::now();
    let mut seq = 0u64;
    while !s.stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let now = Instant::now();
        credit += rate * now.duration_since(last).as_secs_f64();
        last = now;
        // Never owe more than a second: a stalled database does not turn into a burst after.
        credit = credit.min(rate.max(1.0));
        while credit >= 1.0 && !s.stop.load(Ordering::Relaxed) {
            let n = (credit.floor() as usize).min(batch_max);
            let mut jobs = Vec::with_capacity(n);
            for _ in 0..n {
                seq += 1;
                let body = BenchJob {
                    origin: std::process::id(),
                    seq,
                    enqueued_at_ms: now_ms(),
                    payload_padding: padding.clone(),
                };
                match Job::new(QUEUE, &body) {
                    Ok(j) => jobs.push(j),
                    Err(e) => {
                        eprintln!("[stagedoor] cannot build a job: {e}");
                        return;
                    }
                }
            }
            let started = Instant::now();
            let (first, last) = (seq + 1 - n as u64, seq);
            match r.publish_jobs(jobs).await {
                Ok(_) => {
                    if let Some(l) = &s.ledger {
                        let pid = std::process::id();
                        let lines: String =
                            (first..=last).map(|q| format!("{pid}:{q}\n")).collect();
                        Ledger::write(&l.published, &lines);
                    }
                    let per = started.elapsed().as_secs_f64() * 1000.0 / n as f64;
                    let mut w = s.producer.lock().await;
                    for _ in 0..n {
                        w.push(per);
                    }
                    drop(w);
                    s.enqueued.fetch_add(n as u64, Ordering::Relaxed);
                    credit -= n as f64;
                }
                Err(e) => {
                    eprintln!("[stagedoor] publish failed: {e}; backing off 200 ms");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}

/// The depth reader: `stats` every 200 ms.
async fn depth_reader<R: Inbox>(r: Route<R>, s: Arc<Shared>) {
    while !s.stop.load(Ordering::Relaxed) {
        match Inspect::stats(&r, QUEUE).await {
            Ok(st) => {
                s.depth.store(st.ready, Ordering::Relaxed);
                s.depth_peak.fetch_max(st.ready, Ordering::Relaxed);
            }
            Err(e) => eprintln!("[stagedoor] stats failed: {e}"),
        }
        tokio::time::sleep(DEPTH_EVERY).await;
    }
}

/// Every `SAMPLE_EVERY_S`, aligned on the wall clock: one record per metric.
async fn sampler(system: &'static str, s: Arc<Shared>, every: u64) {
    let period = every.max(1) * 1000;
    // The first sample's rates cover the time since the adapter started.
    let mut last_at = Instant::now();
    let wait = period - now_ms() % period;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let mut tick = tokio::time::interval(Duration::from_millis(period));
    let (mut last_enq, mut last_done) = (0u64, 0u64);
    loop {
        tick.tick().await;
        let elapsed = last_at.elapsed().as_secs_f64().max(0.001);
        last_at = Instant::now();
        let (enq, done) = (
            s.enqueued.load(Ordering::Relaxed),
            s.completed.load(Ordering::Relaxed),
        );
        let (c50, c95, c99) = s.claim.lock().await.percentiles();
        let (e50, e95, e99) = s.e2e.lock().await.percentiles();
        let (p50, p95, p99) = s.producer.lock().await.percentiles();
        let peak = s
            .depth_peak
            .swap(s.depth.load(Ordering::Relaxed), Ordering::Relaxed);
        let t = now_iso();
        let w = WINDOW.as_secs();
        for (metric, value, window) in [
            ("claim_p50_ms", c50, w),
            ("claim_p95_ms", c95, w),
            ("claim_p99_ms", c99, w),
            ("end_to_end_p50_ms", e50, w),
            ("end_to_end_p95_ms", e95, w),
            ("end_to_end_p99_ms", e99, w),
            ("producer_p50_ms", p50, w),
            ("producer_p95_ms", p95, w),
            ("producer_p99_ms", p99, w),
            ("enqueue_rate", (enq - last_enq) as f64 / elapsed, every),
            (
                "completion_rate",
                (done - last_done) as f64 / elapsed,
                every,
            ),
            ("queue_depth", s.depth.load(Ordering::Relaxed) as f64, 0),
            ("queue_depth_peak", peak as f64, every),
        ] {
            emit(serde_json::json!({
                "t": t, "system": system, "kind": "adapter", "subject_kind": "adapter",
                "subject": "", "metric": metric, "value": value, "window_s": window,
                "instance_id": env::<u32>("BENCH_INSTANCE_ID", 0),
            }));
        }
        last_enq = enq;
        last_done = done;
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
    }
}

/// Makes the table if it is missing. Rows already there stay: the harness gives each run a
/// fresh database, and a replica it restarts (the chaos scenarios' `start-worker`) finds the
/// jobs the killed one left, which it must run, not drop.
async fn prepare(url: &str, schema: &'static str) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await?;
    sqlx::raw_sql(schema).execute(&mut c).await?;
    c.close().await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    match env::<String>("STAGEDOOR_TABLE", "mailer".into()).as_str() {
        "mailer" => {
            run::<MailJob>("stagedoor", SCHEMA, "mail_jobs", "generated id, no headers").await
        }
        "text" => {
            run::<TextJob>(
                "stagedoor-text",
                TEXT_SCHEMA,
                "text_jobs",
                "text id, headers",
            )
            .await
        }
        other => Err(format!("STAGEDOOR_TABLE is mailer or text, not {other}").into()),
    }
}

/// The adapter as system `system` (the harness's name) on table `table` (made by `schema`),
/// its rows `R`.
async fn run<R: Inbox>(
    system: &'static str,
    schema: &'static str,
    table: &str,
    shape: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL must be set")?;
    let scenario = env::<String>("SCENARIO", "long_horizon".into());
    if scenario != "long_horizon" {
        return Err(
            format!("stagedoor-bench runs SCENARIO=long_horizon only, not {scenario}").into(),
        );
    }
    if env::<String>("PRODUCER_MODE", "fixed".into()) != "fixed" {
        return Err("stagedoor-bench runs PRODUCER_MODE=fixed only".into());
    }
    let rate = env::<f64>("PRODUCER_RATE", 800.0);
    let workers = env::<usize>("WORKER_COUNT", 32);
    let batch_max = env::<usize>("PRODUCER_BATCH_MAX", 128);
    let batch_ms = env::<u64>("PRODUCER_BATCH_MS", 25);
    let every = env::<u64>("SAMPLE_EVERY_S", 5);
    // The pool: sqlx's default (10) unless set.
    let pool = env::<u32>("STAGEDOOR_POOL", 10);
    prepare(&url, schema).await?;

    let shared = Arc::new(Shared {
        enqueued: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        depth: AtomicU64::new(0),
        depth_peak: AtomicU64::new(0),
        claim: Mutex::new(Window::default()),
        e2e: Mutex::new(Window::default()),
        producer: Mutex::new(Window::default()),
        work: Duration::from_millis(env::<u64>("JOB_WORK_MS", 1)),
        stop: AtomicBool::new(false),
        ledger: match std::env::var("STAGEDOOR_LEDGER_DIR") {
            Ok(dir) => Some(Ledger::open(&dir)?),
            Err(_) => None,
        },
    });

    let service = Service::new(AppInfo::new("stagedoor-harness", env!("CARGO_PKG_VERSION")))
        .state(shared.clone())
        .with_broker(route::<R>(&url, pool), |b| {
            b.include(Subscriber::new(QUEUE.to_owned(), handle))
                .max_attempts(nonzero!(5u32))
                .dead_letter(format!("{QUEUE}.dead"))
                .concurrency(workers);
        });
    let running = service.start().await?;

    // The producer and the depth reader: routes of their own in this process.
    let publisher = route::<R>(&url, 2);
    Inspect::connect(&publisher).await?;
    let reader = route::<R>(&url, 1);
    Inspect::connect(&reader).await?;
    let checker = reader.clone();

    emit(serde_json::json!({
        "kind": "descriptor", "system": system, "event_tables": [format!("public.{table}")],
        "event_indexes": [format!("public.{table}_pkey"), format!("public.{table}_due")],
        "extensions": [], "version": format!("stagedoor-jobs@{}", env!("CARGO_PKG_VERSION")),
        "schema_version": format!("{table} ({shape})"),
        "db_name": url.rsplit('/').next().unwrap_or(""), "started_at": now_iso(),
    }));
    eprintln!(
        "[stagedoor] rate {rate}/s, {workers} workers, batches of up to {batch_max} every {batch_ms} ms, pool {pool}"
    );

    let tasks = [
        tokio::spawn(producer(
            publisher,
            shared.clone(),
            rate,
            batch_max,
            batch_ms,
        )),
        tokio::spawn(depth_reader(reader, shared.clone())),
        tokio::spawn(sampler(system, shared.clone(), every)),
    ];

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    shared.stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(3), running.shutdown()).await;
    // What is left in the queue when this process stops (the ledger's check counts it).
    if let Ok(st) = Inspect::stats(&checker, QUEUE).await {
        eprintln!(
            "[stagedoor] left at stop: {} ready, {} running, {} delayed",
            st.ready, st.pending, st.delayed
        );
        if let Some(l) = &shared.ledger {
            Ledger::write(
                &l.ran,
                &format!("# left {} {} {}\n", st.ready, st.pending, st.delayed),
            );
        }
    }
    for t in tasks {
        t.abort();
    }
    Ok(())
}
