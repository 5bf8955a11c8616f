//! The `stagedoor-jobs` command end to end, spawned as a process, against real Redis
//! (`REDIS_URL`), Postgres (`DATABASE_URL`) and SQLite (a temp file): a dead letter filled with
//! 40 jobs of one kind and 3 of another by a service whose handlers fail under a cap of 1;
//! `queues` counts them; a replay by kind brings back the 40, which a service now runs, and
//! leaves the 3; a replay by id; a purge; and bad URLs, unknown queues, ids and tables, each
//! one line on stderr and its exit code.
//!
//! Run them with the servers up: `scripts/test-all -- cargo test --workspace --test cli -- --include-ignored`. A
//! missing `REDIS_URL` or `DATABASE_URL` fails the test under `scripts/test-all`; a plain `cargo test`
//! without it lists the test as ignored.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;
use stagedoor_jobs::broker::Broker;
use stagedoor_jobs::broker::DeadLetters;
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{Envelope, Inbox, Publish};
use stagedoor_jobs_redis::RedisBroker;
use stagedoor_jobs_sqlx::SqlxBroker;

// ---------------------------------------------------------------------------------------------
// The command
// ---------------------------------------------------------------------------------------------

/// The command with the arguments that point it at one backend.
struct Cli {
    base: Vec<String>,
}

/// What a run of the command did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Cli {
    fn new(base: &[&str]) -> Self {
        Self {
            base: base.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Runs the command with `args` after the backend's, stdin closed, no `STAGEDOOR_*` from
    /// the environment.
    fn run(&self, args: &[&str]) -> Run {
        run_command(
            self.base
                .iter()
                .map(String::as_str)
                .chain(args.iter().copied()),
        )
    }

    /// Runs with `--json`, expects exit 0, and parses stdout.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let r = self.run(&all);
        assert_eq!(r.code, 0, "stagedoor-jobs {args:?} failed: {r:?}");
        serde_json::from_str(&r.stdout)
            .unwrap_or_else(|e| panic!("stagedoor-jobs {args:?} printed no JSON ({e}): {r:?}"))
    }

    /// The `queues --json` row of `queue`.
    fn queue_row(&self, queue: &str) -> Value {
        let rows = self.json(&["queues"]);
        rows.as_array()
            .expect("queues prints an array")
            .iter()
            .find(|r| r["queue"] == queue)
            .cloned()
            .unwrap_or_else(|| panic!("no row for `{queue}` in {rows:#}"))
    }
}

fn run_command<'a>(args: impl IntoIterator<Item = &'a str>) -> Run {
    let args: Vec<&str> = args.into_iter().collect();
    let out = Command::new(env!("CARGO_BIN_EXE_stagedoor-jobs"))
        .args(&args)
        .env_remove("STAGEDOOR_URL")
        .env_remove("STAGEDOOR_TABLE")
        .env_remove("STAGEDOOR_NAMESPACE")
        .env_remove("STAGEDOOR_SCHEMA")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("spawn stagedoor-jobs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The run failed with exit `code` and exactly one line on stderr, `error: ` and `contains`,
/// no backtrace, no Debug dump, nothing on stdout.
#[track_caller]
fn assert_one_line(r: &Run, code: i32, contains: &str) {
    assert_eq!(r.code, code, "exit code: {r:?}");
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {r:?}");
    assert!(lines[0].starts_with("error: "), "{r:?}");
    assert!(lines[0].contains(contains), "`{contains}` in {r:?}");
    for bad in [
        "panicked",
        "backtrace",
        "RUST_BACKTRACE",
        "Error {",
        "Some(",
        "\\n",
    ] {
        assert!(!lines[0].contains(bad), "`{bad}` in {r:?}");
    }
    assert!(r.stdout.is_empty(), "nothing on stdout: {r:?}");
}

// ---------------------------------------------------------------------------------------------
// The jobs and the handlers
// ---------------------------------------------------------------------------------------------

const RENDER: &str = "render_tickets";
const EMAIL: &str = "send_email";

#[derive(Debug, Serialize, Deserialize)]
struct Ticket {
    order_id: u64,
}

/// Fails every time: the seat label cannot be encoded (before the fix).
async fn render_broken(t: &Ticket) -> Result<(), std::io::Error> {
    Err(std::io::Error::other(format!(
        "SeatLabelInvalid: '14-C' is not a row letter and a seat number (order {})",
        t.order_id
    )))
}

/// The provider refuses every email.
async fn email_refused(_: &Ticket) -> Result<(), std::io::Error> {
    Err(std::io::Error::other("mail provider answered 503"))
}

/// What the fixed handler ran: (order, job id, attempt).
#[derive(Default)]
struct Ran(Mutex<Vec<(u64, String, u32)>>);

/// After the fix: renders, and notes what it ran.
async fn render_fixed(
    t: &Ticket,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(id): Ctx<keys::JobId>,
    Data(ran): Data<Arc<Ran>>,
) -> HandlerOutcome {
    ran.0
        .lock()
        .expect("lock")
        .push((t.order_id, id.to_string(), attempt.unwrap_or(0)));
    HandlerOutcome::ack()
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The scenario, the same on every backend
// ---------------------------------------------------------------------------------------------

/// Fills `queue`'s dead letter with 40 render jobs and 3 emails, then drives the command.
async fn scenario<B: Broker>(broker: B, cli: Cli, queue: &str) {
    let dead = broker.default_dead_letter(queue);

    // 43 jobs whose handlers fail, under a cap of 1: each is dead-lettered at once.
    let q = queue.to_owned();
    let running = Service::new(AppInfo::new("cli-test-broken", "0.1.0"))
        .with_broker(broker.clone(), |b| {
            b.include(Subscriber::new(q.clone(), render_broken).kind(RENDER))
                .max_attempts(nonzero!(1u32))
                .dead_letter(dead.clone());
            b.include(Subscriber::new(q.clone(), email_refused).kind(EMAIL))
                .max_attempts(nonzero!(1u32))
                .dead_letter(dead.clone());
        })
        .start()
        .await
        .expect("the failing service starts");
    for order_id in 0..40 {
        running
            .publish(
                Job::new(queue, &Ticket { order_id })
                    .expect("job")
                    .kind(RENDER),
            )
            .await
            .expect("publish");
    }
    for order_id in 100..103 {
        running
            .publish(
                Job::new(queue, &Ticket { order_id })
                    .expect("job")
                    .kind(EMAIL)
                    .request_id(format!("req-{order_id}")),
            )
            .await
            .expect("publish");
    }
    wait_for("43 dead letters", async || {
        broker.dead_len(&dead).await.expect("dead_len") == 43
    })
    .await;
    running.shutdown().await;

    // Another queue with one job of each state: ready, pending (claimed, not settled), delayed.
    let busy = format!("{queue}_busy");
    broker.prepare(&busy).await.expect("prepare");
    let now = Utc::now();
    let env = |n: u8| Envelope::new("busy", vec![b'{', b'}', n], now);
    broker
        .publish(
            &busy,
            vec![
                (env(1), None),
                (env(2), None),
                (env(3), Some(now + chrono::Duration::hours(1))),
            ],
        )
        .await
        .expect("publish busy");
    let claimed = broker
        .claim(
            &busy,
            1,
            Duration::from_secs(5),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);

    // `queues` counts them.
    let row = cli.queue_row(queue);
    assert_eq!(row["dead_letter"], dead.as_str(), "{row}");
    assert_eq!(
        (
            &row["ready"],
            &row["pending"],
            &row["delayed"],
            &row["dead"]
        ),
        (&0.into(), &0.into(), &0.into(), &43.into()),
        "{row}"
    );
    let row = cli.queue_row(&busy);
    assert_eq!(
        (
            &row["ready"],
            &row["pending"],
            &row["delayed"],
            &row["dead"]
        ),
        (&1.into(), &1.into(), &1.into(), &0.into()),
        "{row}"
    );
    assert!(row["oldest_seconds"].as_f64().is_some(), "{row}");
    // A dead letter is a row of its queue, not one of its own.
    let names: Vec<Value> = cli.json(&["queues"]).as_array().expect("array").clone();
    assert!(
        !names.iter().any(|r| r["queue"] == dead.as_str()),
        "{names:?}"
    );
    let table = cli.run(&["queues"]);
    assert_eq!(table.code, 0, "{table:?}");
    assert!(table.stdout.starts_with("QUEUE"), "{table:?}");
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == [queue, "0", "0", "0", "43", "-"]),
        "{table:?}"
    );

    // `dead list`: newest first, by kind, limited.
    let renders = cli.json(&["dead", "list", queue, "--kind", RENDER, "--limit", "100"]);
    let renders = renders.as_array().expect("array");
    assert_eq!(renders.len(), 40);
    assert!(
        renders
            .iter()
            .all(|d| d["kind"] == RENDER && d["attempts"] == 1)
    );
    let times: Vec<DateTime<Utc>> = renders
        .iter()
        .map(|d| {
            d["failed_at"]
                .as_str()
                .expect("failed_at")
                .parse()
                .expect("rfc3339")
        })
        .collect();
    // Newest first: the broker's order (a dead letter's time is stamped by its worker just
    // before the move, so concurrent workers may stamp a few milliseconds out of order).
    assert!(
        times
            .windows(2)
            .all(|w| w[0] + chrono::Duration::seconds(1) >= w[1]),
        "newest first: {times:?}"
    );
    let expected: Vec<String> = broker
        .dead_letters(
            &dead,
            &stagedoor_jobs::DeadSelector::Kind(RENDER.into()),
            100,
        )
        .await
        .expect("dead_letters")
        .into_iter()
        .map(|d| d.id)
        .collect();
    let got: Vec<&str> = renders
        .iter()
        .map(|d| d["id"].as_str().expect("id"))
        .collect();
    assert_eq!(got, expected, "the broker's order, newest first");
    assert_eq!(
        cli.json(&["dead", "list", queue, "--limit", "5"])
            .as_array()
            .map(Vec::len),
        Some(5)
    );
    let listed = cli.run(&["dead", "list", queue, "--limit", "5"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.starts_with("ID"), "{listed:?}");
    assert!(
        listed.stdout.contains("--limit"),
        "says there are more: {listed:?}"
    );

    // A dry run lists and moves nothing.
    let dry = cli.json(&["dead", "replay", queue, "--kind", RENDER, "--dry-run"]);
    assert_eq!(dry["would_replay"], 40, "{dry}");
    assert_eq!(broker.dead_len(&dead).await.expect("dead_len"), 43);

    // Replay by kind: the 40 go back (the bar stays hidden: stderr is not a terminal).
    let r = cli.run(&["dead", "replay", queue, "--kind", RENDER]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("replayed 40, skipped 0, failed 0"),
        "{r:?}"
    );
    assert!(r.stderr.is_empty(), "{r:?}");
    let row = cli.queue_row(queue);
    assert_eq!(
        (&row["ready"], &row["dead"]),
        (&40.into(), &3.into()),
        "{row}"
    );

    // The fix is deployed: the 40 run, each once, attempts reset; the 3 emails stay.
    let ran = Arc::new(Ran::default());
    let running = Service::new(AppInfo::new("cli-test-fixed", "0.1.0"))
        .state(Arc::clone(&ran))
        .with_broker(broker.clone(), |b| {
            b.include(Subscriber::new(q.clone(), render_fixed).kind(RENDER))
                .max_attempts(nonzero!(1u32))
                .dead_letter(dead.clone());
        })
        .start()
        .await
        .expect("the fixed service starts");
    wait_for("the 40 to run", async || {
        let s = broker.stats(queue).await.expect("stats");
        ran.0.lock().expect("lock").len() >= 40 && s.ready + s.pending + s.delayed == 0
    })
    .await;
    running.shutdown().await;
    {
        let ran = ran.0.lock().expect("lock");
        assert_eq!(ran.len(), 40, "each ran once");
        let orders: BTreeSet<u64> = ran.iter().map(|r| r.0).collect();
        assert_eq!(orders, (0..40).collect());
        assert!(ran.iter().all(|r| r.2 == 1), "attempts reset: {ran:?}");
        let ids: BTreeSet<&str> = ran.iter().map(|r| r.1.as_str()).collect();
        let listed: BTreeSet<&str> = renders
            .iter()
            .map(|d| d["job_id"].as_str().expect("id"))
            .collect();
        assert_eq!(ids, listed, "the same jobs, by id");
    }
    assert_eq!(broker.dead_len(&dead).await.expect("dead_len"), 3);

    // The dead letter's own name is accepted too.
    let emails = cli.json(&["dead", "list", &dead]);
    let emails = emails.as_array().expect("array");
    assert_eq!(emails.len(), 3);
    assert!(emails.iter().all(|d| d["kind"] == EMAIL), "{emails:?}");

    // `dead show`: every field, the error.
    let id = emails[0]["id"].as_str().expect("id").to_owned();
    let shown = cli.json(&["dead", "show", queue, &id]);
    assert_eq!(shown["id"], id.as_str());
    assert_eq!(shown["kind"], EMAIL);
    assert_eq!(shown["queue"], queue);
    assert_eq!(shown["attempts"], 1);
    assert_eq!(shown["error"], "mail provider answered 503", "{shown}");
    assert!(
        shown["request_id"]
            .as_str()
            .is_some_and(|r| r.starts_with("req-")),
        "{shown}"
    );
    assert!(
        shown["payload"]
            .as_str()
            .is_some_and(|p| p.contains("order_id")),
        "{shown}"
    );
    let human = cli.run(&["dead", "show", queue, &id]);
    assert_eq!(human.code, 0, "{human:?}");
    for field in [
        "dead letter",
        "kind",
        "job id",
        "attempts",
        "failed at",
        "payload",
        "error",
        "traceback",
    ] {
        assert!(
            human.stdout.lines().any(|l| l.starts_with(field)),
            "`{field}` in {human:?}"
        );
    }
    assert!(
        human.stdout.contains("mail provider answered 503"),
        "{human:?}"
    );

    // Replay one by id.
    let r = cli.run(&["dead", "replay", queue, &id]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("replayed 1, skipped 0, failed 0"),
        "{r:?}"
    );
    let row = cli.queue_row(queue);
    assert_eq!(
        (&row["ready"], &row["dead"]),
        (&1.into(), &2.into()),
        "{row}"
    );
    let left: Vec<String> = cli
        .json(&["dead", "list", queue])
        .as_array()
        .expect("array")
        .iter()
        .map(|d| d["id"].as_str().expect("id").to_owned())
        .collect();
    assert!(!left.contains(&id), "{left:?}");

    // An id that is not there (the one just replayed): code 4, one line.
    assert_one_line(
        &cli.run(&["dead", "show", queue, &id]),
        4,
        &format!("no dead letter `{id}`"),
    );
    assert_one_line(
        &cli.run(&["dead", "replay", queue, &id]),
        4,
        "no dead letter",
    );

    // Purge: refused without --yes when stdin is not a terminal, naming --yes.
    assert_one_line(&cli.run(&["dead", "purge", queue, "--all"]), 2, "--yes");
    assert_eq!(broker.dead_len(&dead).await.expect("dead_len"), 2);
    let dry = cli.json(&["dead", "purge", queue, "--all", "--dry-run"]);
    assert_eq!(dry["would_purge"], 2, "{dry}");
    let r = cli.run(&["dead", "purge", queue, "--all", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("purged 2, skipped 0"), "{r:?}");
    assert_eq!(broker.dead_len(&dead).await.expect("dead_len"), 0);
    let r = cli.json(&["dead", "purge", queue, "--kind", EMAIL, "--yes"]);
    assert_eq!(r["purged"], 0, "nothing left: {r}");

    // An unknown queue: code 4, one line naming it.
    assert_one_line(
        &cli.run(&["dead", "list", "no_such_queue"]),
        4,
        "unknown queue `no_such_queue`",
    );
    assert_one_line(
        &cli.run(&["dead", "replay", "no_such_queue", "--all"]),
        4,
        "unknown queue `no_such_queue`",
    );

    // Usage errors are clap's: code 2.
    let r = cli.run(&["dead", "replay", queue, "--kind", RENDER, "--all"]);
    assert_eq!(r.code, 2, "{r:?}");
    let r = cli.run(&["dead", "replay", queue]);
    assert_eq!(r.code, 2, "{r:?}");
}

// ---------------------------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------------------------

fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{tag}_{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| {
        panic!("REDIS_URL is not set: run the tests with `scripts/test-all`, which starts Redis and exports it")
    })
}

fn postgres_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(u) if u.starts_with("postgres") => u,
        _ => panic!(
            "DATABASE_URL is not set to a postgres:// URL: run the tests with `scripts/test-all`, which starts Postgres and exports it"
        ),
    }
}

/// The job table of the SQL tests: the group column is `queue`, every optional role is there.
#[derive(Inbox)]
#[inbox(table = "cli_jobs")]
#[allow(dead_code)]
struct CliJob {
    #[field(id, generated)]
    id: i64,
    #[field(group)]
    queue: String,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
    #[field(enqueued_at)]
    enqueued_at: DateTime<Utc>,
    #[field(last_error)]
    last_error: Option<String>,
    #[field(headers)]
    headers: Option<String>,
}

const SQLITE_DDL: &str = "CREATE TABLE cli_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL,
    locked_until TEXT,
    payload BLOB NOT NULL,
    enqueued_at TEXT NOT NULL,
    last_error TEXT,
    headers TEXT
)";

const POSTGRES_DDL: &str = "CREATE TABLE cli_jobs (
    id BIGSERIAL PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_until TIMESTAMPTZ,
    payload BYTEA NOT NULL,
    enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error TEXT,
    headers TEXT
)";

/// A fresh SQLite file with the job table; its path.
async fn fresh_sqlite() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("stagedoor-cli-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{}.db", unique("cli")));
    let mut conn =
        sqlx::SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .expect("create the SQLite file");
    sqlx::raw_sql(SQLITE_DDL)
        .execute(&mut conn)
        .await
        .expect("create the table");
    conn.close().await.expect("close");
    path
}

/// Removes an SQLite file and its WAL files.
fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}

/// A fresh Postgres schema with the job table; its name.
async fn fresh_schema() -> String {
    let schema = unique("cli");
    let mut conn = sqlx::PgConnection::connect(&postgres_url())
        .await
        .expect("connect to DATABASE_URL");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {schema}; SET search_path TO {schema}; {POSTGRES_DDL}"
    )))
    .execute(&mut conn)
    .await
    .expect("create the schema and table");
    conn.close().await.expect("close");
    schema
}

/// A Postgres broker whose connections use `schema`.
fn postgres_broker(schema: &str) -> SqlxBroker<sqlx::Postgres> {
    let search_path = schema.to_owned();
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
    SqlxBroker::from_url(postgres_url(), options).poll_interval(Duration::from_millis(50))
}

async fn delete_redis_namespace(ns: &str) {
    let client = redis::Client::open(redis_url().as_str()).expect("redis client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{ns}*"))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_dead_letters_end_to_end() {
    let url = redis_url();
    let ns = format!("{}:", unique("cli"));
    let broker = RedisBroker::from_url(&url).namespace(&ns);
    scenario(
        broker,
        Cli::new(&["--url", &url, "--namespace", &ns]),
        "jobs",
    )
    .await;
    delete_redis_namespace(&ns).await;
}

#[ignore = "needs Postgres: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_dead_letters_end_to_end() {
    let schema = fresh_schema().await;
    let route = postgres_broker(&schema).route::<CliJob>("emails");
    let url = postgres_url();
    scenario(
        route,
        Cli::new(&["--url", &url, "--table", "cli_jobs", "--schema", &schema]),
        "emails",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_dead_letters_end_to_end() {
    let path = fresh_sqlite().await;
    let url = format!("sqlite://{}", path.display());
    let route = SqlxBroker::from_url(&url, SqlitePoolOptions::new())
        .poll_interval(Duration::from_millis(50))
        .route::<CliJob>("emails");
    scenario(
        route,
        Cli::new(&["--url", &url, "--table", "cli_jobs"]),
        "emails",
    )
    .await;
    remove_sqlite(&path);
}

/// A password in the URL's query (`?password=`, which sqlx honours, in any case, `sslpassword`,
/// percent-encoded) is never printed: the connection error names the URL masked.
#[test]
fn a_password_in_the_query_is_never_printed() {
    // Nothing listens on port 1.
    for url in [
        "postgres://app@127.0.0.1:1/app?password=secret",
        "postgres://app@127.0.0.1:1/app?sslmode=disable&PassWord=secret",
        "postgres://app@127.0.0.1:1/app?%70assword=secret&sslpassword=secret",
        "postgres://app:secret@127.0.0.1:1/app?password=secret",
    ] {
        let r = run_command(["--url", url, "--table", "t", "queues"]);
        assert_one_line(&r, 3, "cannot connect to Postgres at `postgres://app");
        assert!(r.stderr.contains("=***"), "the password is masked: {r:?}");
        assert!(!r.stderr.contains("secret"), "{url}: {r:?}");
    }
}

/// A server that is down, a URL that is wrong, a database or table that is not there: one
/// line on stderr each, and the exit code for it.
#[ignore = "needs Redis and Postgres: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_unknown_tables_give_one_line() {
    // Nothing listens on port 1.
    let r = run_command(["--url", "redis://127.0.0.1:1/", "queues"]);
    assert_one_line(&r, 3, "cannot reach Redis at `redis://127.0.0.1:1/`");
    let r = run_command([
        "--url",
        "postgres://app:s3cret@127.0.0.1:1/app",
        "--table",
        "t",
        "queues",
    ]);
    assert_one_line(
        &r,
        3,
        "cannot connect to Postgres at `postgres://app:***@127.0.0.1:1/app`",
    );
    assert!(
        !r.stderr.contains("s3cret"),
        "the password is masked: {r:?}"
    );
    // Not a URL this tool reads.
    let r = run_command(["--url", "mysql://127.0.0.1/app", "queues"]);
    assert_one_line(&r, 3, "is not a URL stagedoor-jobs reads");
    let r = run_command(["--url", "redis://127.0.0.1:notaport/", "queues"]);
    assert_one_line(&r, 3, "redis://127.0.0.1:notaport/");
    // No SQLite file there: it is not created.
    let missing = std::env::temp_dir().join(format!("{}.db", unique("missing")));
    let r = run_command([
        "--url",
        &format!("sqlite://{}", missing.display()),
        "--table",
        "t",
        "queues",
    ]);
    assert_one_line(&r, 3, "no SQLite database at");
    assert!(!missing.exists(), "not created");

    // A real server that refuses: Redis has no database 99, Postgres no database of that name.
    let redis = redis_url();
    let wrong_db = format!("{}/99", redis.trim_end_matches('/'));
    let r = run_command(["--url", &wrong_db, "queues"]);
    assert_one_line(&r, 3, "Redis");
    let pg = postgres_url();
    let (base, _) = pg.rsplit_once('/').expect("a database in DATABASE_URL");
    let r = run_command([
        "--url",
        &format!("{base}/no_such_database"),
        "--table",
        "t",
        "queues",
    ]);
    assert_one_line(&r, 3, "no_such_database");

    // A table that is not there, or is not a job table.
    let schema = fresh_schema().await;
    let r = run_command([
        "--url",
        &pg,
        "--schema",
        &schema,
        "--table",
        "no_such_table",
        "queues",
    ]);
    assert_one_line(&r, 4, "no table `no_such_table`");
    assert!(
        r.stderr.contains("cli_jobs"),
        "lists the tables there: {r:?}"
    );
    let path = fresh_sqlite().await;
    let sqlite = format!("sqlite://{}", path.display());
    let r = run_command(["--url", &sqlite, "--table", "no_such_table", "queues"]);
    assert_one_line(&r, 4, "no table `no_such_table`");
    let r = run_command([
        "--url",
        &sqlite,
        "--table",
        "cli_jobs",
        "--group-column",
        "grp",
        "queues",
    ]);
    assert_one_line(&r, 4, "no column `grp`");
    let r = run_command(["--url", &sqlite, "--table", "sqlite_sequence", "queues"]);
    assert_one_line(&r, 3, "not a job table");
    // A SQL URL without --table is a usage error.
    let r = run_command(["--url", &sqlite, "queues"]);
    assert_one_line(&r, 2, "--table");
    // No URL at all: clap's usage error.
    let r = run_command(["queues"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("--url"), "{r:?}");
    remove_sqlite(&path);

    // The URL can come from the environment.
    let out = Command::new(env!("CARGO_BIN_EXE_stagedoor-jobs"))
        .args(["--json", "--table", "cli_jobs", "queues"])
        .env("STAGEDOOR_URL", &sqlite)
        .stdin(Stdio::null())
        .output()
        .expect("spawn");
    // The file was removed just above: the env URL was read, and said so.
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no SQLite database at"),
        "{out:?}"
    );
}

/// A table without a group column is one queue, named as the table; its dead letters are the
/// table `<table>_dead`, with the same columns.
#[derive(Inbox)]
#[inbox(table = "plain_jobs")]
#[allow(dead_code)]
struct PlainJob {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: String,
    #[field(last_error)]
    last_error: Option<String>,
}

const PLAIN_DDL: &str = "
CREATE TABLE plain_jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL, locked_until TEXT, payload TEXT NOT NULL, last_error TEXT);
CREATE TABLE plain_jobs_dead (id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL, locked_until TEXT, payload TEXT NOT NULL, last_error TEXT);";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_table_without_group_column() {
    let path = fresh_sqlite().await;
    let url = format!("sqlite://{}", path.display());
    {
        let mut conn = sqlx::SqliteConnection::connect(&url).await.expect("open");
        sqlx::raw_sql(PLAIN_DDL)
            .execute(&mut conn)
            .await
            .expect("create the tables");
        conn.close().await.expect("close");
    }
    let route = SqlxBroker::from_url(&url, SqlitePoolOptions::new())
        .poll_interval(Duration::from_millis(50))
        .route::<PlainJob>("plain_jobs");
    let dead = route.default_dead_letter("plain_jobs");
    assert_eq!(dead, "plain_jobs_dead");
    let running = Service::new(AppInfo::new("cli-test-plain", "0.1.0"))
        .with_broker(route.clone(), |b| {
            b.include(Subscriber::new("plain_jobs", render_broken))
                .max_attempts(nonzero!(1u32))
                .dead_letter(dead.clone());
        })
        .start()
        .await
        .expect("starts");
    for order_id in 0..3 {
        running
            .publish(Job::new("plain_jobs", &Ticket { order_id }).expect("job"))
            .await
            .expect("publish");
    }
    wait_for("3 dead letters", async || {
        route.dead_len(&dead).await.expect("dead_len") == 3
    })
    .await;
    running.shutdown().await;

    let cli = Cli::new(&["--url", &url, "--table", "plain_jobs"]);
    let rows = cli.json(&["queues"]);
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows:#}");
    let row = cli.queue_row("plain_jobs");
    assert_eq!(row["dead_letter"], "plain_jobs_dead");
    assert_eq!(
        (&row["ready"], &row["dead"]),
        (&0.into(), &3.into()),
        "{row}"
    );
    // The source's name and the dead table's name both read the dead table.
    for name in ["plain_jobs", "plain_jobs_dead"] {
        let listed = cli.json(&["dead", "list", name]);
        let listed = listed.as_array().expect("array");
        assert_eq!(listed.len(), 3, "{name}: {listed:?}");
        assert!(
            listed.iter().all(|d| d["queue"] == "plain_jobs"),
            "{listed:?}"
        );
        assert!(
            listed.iter().all(|d| d["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("SeatLabelInvalid"))),
            "{listed:?}"
        );
    }
    assert_one_line(
        &cli.run(&["dead", "list", "other_dead"]),
        4,
        "unknown queue `other_dead`",
    );
    let r = cli.json(&["dead", "replay", "plain_jobs", "--all"]);
    assert_eq!(
        (&r["replayed"], &r["failed"]),
        (&3.into(), &0.into()),
        "{r}"
    );
    let row = cli.queue_row("plain_jobs");
    assert_eq!(
        (&row["ready"], &row["dead"]),
        (&3.into(), &0.into()),
        "{row}"
    );
    remove_sqlite(&path);
}

/// On a Redis Cluster (`--url a,b,c`), `queues` asks every node given, so queues whose keys
/// live on different nodes are all listed; the dead-letter commands work as on one server.
#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_lists_every_node() {
    let urls = std::env::var("REDIS_CLUSTER_URLS").unwrap_or_else(|_| {
        panic!("REDIS_CLUSTER_URLS is not set: run the tests with `scripts/test-all`, which starts a Redis Cluster and exports it")
    });
    let ns = format!("{}:", unique("cli"));
    let broker = RedisBroker::cluster(urls.split(',')).namespace(&ns);
    let queues: Vec<String> = (0..6).map(|i| format!("q{i}")).collect();
    let running = Service::new(AppInfo::new("cli-test-cluster", "0.1.0"))
        .with_broker(broker.clone(), |b| {
            for q in &queues {
                b.include(Subscriber::new(q.clone(), email_refused))
                    .max_attempts(nonzero!(1u32))
                    .dead_letter(format!("{q}:dead"));
            }
        })
        .start()
        .await
        .expect("starts on the cluster");
    for q in &queues {
        running
            .publish(Job::new(q.as_str(), &Ticket { order_id: 1 }).expect("job"))
            .await
            .expect("publish");
    }
    wait_for("a dead letter per queue", async || {
        for q in &queues {
            if broker
                .dead_len(&format!("{q}:dead"))
                .await
                .expect("dead_len")
                != 1
            {
                return false;
            }
        }
        true
    })
    .await;
    running.shutdown().await;

    let cli = Cli::new(&["--url", &urls, "--namespace", &ns]);
    for q in &queues {
        let row = cli.queue_row(q);
        assert_eq!(row["dead"], 1, "{row}");
    }
    let r = cli.json(&["dead", "replay", "q5", "--all"]);
    assert_eq!(r["replayed"], 1, "{r}");
    assert_eq!(cli.queue_row("q5")["ready"], 1);
    assert_one_line(&cli.run(&["dead", "list", "q9"]), 4, "unknown queue `q9`");
}

/// `cancel QUEUE ID`: a waiting and a delayed job are removed (exit 0, their queue's counts
/// drop); the same id again, an id never published: one line, exit 4; an unknown queue: one
/// line naming it, exit 4; `--json` says what happened.
async fn cancel_scenario<B: Publish>(broker: B, cli: Cli, queue: &str) {
    broker.connect().await.expect("connect");
    let now = broker
        .publish_job(Job::new(queue, &Ticket { order_id: 1 }).expect("encode"))
        .await
        .expect("publish");
    let later = broker
        .publish_job(
            Job::new(queue, &Ticket { order_id: 2 })
                .expect("encode")
                .after(Duration::from_secs(3600)),
        )
        .await
        .expect("publish");
    broker
        .publish_job(Job::new(queue, &Ticket { order_id: 3 }).expect("encode"))
        .await
        .expect("publish");

    let r = cli.run(&["cancel", queue, now.id().as_str()]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout
            .contains("it was waiting, and is removed; it will not run"),
        "{r:?}"
    );
    let v = cli.json(&["cancel", queue, later.id().as_str()]);
    assert_eq!(v["cancelled"], "removed", "{v:#}");
    assert_eq!(v["job_id"], later.id().as_str(), "{v:#}");
    let row = cli.queue_row(queue);
    assert_eq!(
        (row["ready"].as_u64(), row["delayed"].as_u64()),
        (Some(1), Some(0)),
        "only the job not cancelled is left: {row:#}"
    );

    let again = cli.run(&["cancel", queue, now.id().as_str()]);
    assert_one_line(&again, 4, &format!("no job {} in `{queue}`", now.id()));
    let never = cli.run(&["cancel", queue, "no-such-job"]);
    assert_one_line(
        &never,
        4,
        "it finished, was cancelled already, or never was",
    );
    let unknown = cli.run(&["cancel", "no_such_queue", "x"]);
    assert_one_line(&unknown, 4, "unknown queue `no_such_queue`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_cancel() {
    let path = fresh_sqlite().await;
    let url = format!("sqlite://{}", path.display());
    let route = SqlxBroker::from_url(&url, SqlitePoolOptions::new()).route::<CliJob>("emails");
    cancel_scenario(
        route,
        Cli::new(&["--url", &url, "--table", "cli_jobs"]),
        "emails",
    )
    .await;
    remove_sqlite(&path);
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cancel() {
    let url = redis_url();
    let ns = format!("{}:", unique("cli"));
    let broker = RedisBroker::from_url(&url).namespace(&ns);
    stagedoor_jobs::Inspect::connect(&broker)
        .await
        .expect("connect");
    Broker::prepare(&broker, "jobs").await.expect("prepare");
    cancel_scenario(
        broker,
        Cli::new(&["--url", &url, "--namespace", &ns]),
        "jobs",
    )
    .await;
    delete_redis_namespace(&ns).await;
}
