//! `stagedoor-jobs result ID` and `stagedoor-jobs flow ID`, spawned as a process against an
//! SQLite file: a flow of two jobs (the second after the first) published through the library;
//! `flow` lists both nodes, their states and what holds the flow, before and after a service ran
//! them; `result` shows what a real handler returned and its last progress; an unknown id, and
//! hostile ids (quotes, newlines, `../`, 600 characters), give one line and an exit code, never a
//! panic.

use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::Connection;
use sqlx::sqlite::SqlitePoolOptions;
use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{Flow, Flows, Inbox};
use stagedoor_jobs_sqlx::SqlxBroker;

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(url: &str, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_stagedoor-jobs"))
        .args(["--url", url, "--table", "flow_jobs"])
        .args(args)
        .env_remove("STAGEDOOR_URL")
        .env_remove("STAGEDOOR_TABLE")
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

/// Exit `code`, one line on stderr holding `contains`, no panic, nothing on stdout.
#[track_caller]
fn assert_one_line(r: &Run, code: i32, contains: &str) {
    assert_eq!(r.code, code, "exit code: {r:?}");
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {r:?}");
    assert!(lines[0].starts_with("error: "), "{r:?}");
    assert!(lines[0].contains(contains), "`{contains}` in {r:?}");
    assert!(!r.stderr.contains("panic"), "{r:?}");
    assert!(r.stdout.is_empty(), "nothing on stdout: {r:?}");
}

#[derive(Inbox)]
#[inbox(table = "flow_jobs")]
#[allow(dead_code)]
struct FlowJob {
    // The job's id: a flow's table stores a job published twice once (flows are refused on ids
    // the database generates).
    #[field(id)]
    id: String,
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

const DDL: &str = "CREATE TABLE flow_jobs (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL,
    locked_until TEXT,
    payload BLOB NOT NULL,
    enqueued_at TEXT NOT NULL,
    last_error TEXT,
    headers TEXT
)";

#[derive(Debug, Serialize, Deserialize)]
struct Report {
    pages: u32,
}

/// Reports half way, then returns what it rendered.
async fn render(r: &Report, progress: JobProgress) -> HandlerOutcome {
    progress
        .set(0.5, "half of the \"pages\"\nrendered")
        .await
        .expect("progress kept");
    HandlerOutcome::ack_with(&serde_json::json!({ "pages": r.pages, "file": "report <1>.pdf" }))
}

async fn fresh_sqlite() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("stagedoor-cli-flows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let nanos = Utc::now().timestamp_nanos_opt().unwrap_or_default();
    let path = dir.join(format!("flows_{nanos}.db"));
    let mut conn =
        sqlx::SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .expect("create the SQLite file");
    sqlx::raw_sql(DDL).execute(&mut conn).await.expect("table");
    conn.close().await.expect("close");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_flow_and_result() {
    let path = fresh_sqlite().await;
    let url = format!("sqlite://{}", path.display());
    let route = SqlxBroker::from_url(&url, SqlitePoolOptions::new())
        .poll_interval(Duration::from_millis(50))
        .route::<FlowJob>("reports");
    route.connect().await.expect("connect");
    let mut flow = Flow::new().with_id("nightly-report");
    let first = flow.add(Job::new("reports", &Report { pages: 3 }).expect("job"));
    let second = flow
        .add_after(
            Job::new("reports", &Report { pages: 7 }).expect("job"),
            [&first],
        )
        .expect("add after");
    let id = route.publish_flow(flow).await.expect("publish the flow");

    let r = run(&url, &["flow", &id]);
    assert_eq!(r.code, 0, "{r:?}");
    for want in [first.as_str(), second.as_str(), "released", "waiting"] {
        assert!(r.stdout.contains(want), "`{want}` in {r:?}");
    }
    assert!(
        r.stdout
            .contains(&format!("{} waits for {}", second.as_str(), first.as_str())),
        "the summary names what holds it: {r:?}"
    );
    let before = run(&url, &["result", first.as_str()]);
    assert_one_line(&before, 4, "no result for job");

    let running = Service::new(AppInfo::new("cli-flows", "0.1.0"))
        .with_broker(route.clone(), |b| {
            b.include(Subscriber::new("reports", render));
        })
        .start()
        .await
        .expect("the service starts");
    route
        .wait_result(second.as_str(), Duration::from_secs(60))
        .await
        .expect("the second job ran");
    running.shutdown().await;

    let r = run(&url, &["flow", &id]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("2 jobs: 2 done; nothing holds it"),
        "{r:?}"
    );
    let v: Value = serde_json::from_str(&run(&url, &["--json", "flow", &id]).stdout).expect("json");
    assert_eq!(v["nodes"][0]["state"], "done", "{v:#}");
    assert_eq!(v["nodes"][1]["parents"][0], first.as_str(), "{v:#}");

    let r = run(&url, &["result", first.as_str()]);
    assert_eq!(r.code, 0, "{r:?}");
    for want in [
        "\"pages\": 3",
        "report <1>.pdf",
        "finished at",
        "50% half of the",
    ] {
        assert!(r.stdout.contains(want), "`{want}` in {r:?}");
    }
    assert!(
        !r.stdout.contains("pages\"\nrendered"),
        "a message's line break is escaped: {r:?}"
    );
    let v: Value = serde_json::from_str(&run(&url, &["--json", "result", second.as_str()]).stdout)
        .expect("json");
    assert_eq!(v["result"]["pages"], 7, "{v:#}");
    assert_eq!(v["progress"]["fraction"], 0.5, "{v:#}");

    hostile_ids(&url);
    let _ = std::fs::remove_file(&path);
}

/// Unknown and hostile ids: one line and exit 4 (not found) or 2 (past the limit).
fn hostile_ids(url: &str) {
    assert_one_line(&run(url, &["flow", "no-such-flow"]), 4, "no flow or batch");
    // (An argument cannot hold a NUL: the OS refuses it before the command runs.)
    for id in [
        "a'b\"c",
        "line\nbreak",
        "../../etc/passwd",
        "<script>x</script>",
    ] {
        for cmd in ["flow", "result"] {
            let r = run(url, &[cmd, id]);
            assert_one_line(&r, 4, "no ");
            assert!(!r.stderr.contains("line\nbreak"), "{r:?}");
        }
    }
    let long = "x".repeat(600);
    for cmd in ["flow", "result"] {
        assert_one_line(
            &run(url, &[cmd, &long]),
            2,
            "must be 1 to 500 bytes, not 600",
        );
    }
}
