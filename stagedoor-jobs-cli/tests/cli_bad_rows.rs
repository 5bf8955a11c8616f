//! The `stagedoor-jobs` command on an SQLite job table holding rows edited by hand into values
//! nothing can read (`retry_after = ''` and `'soon'`, on a queued row and on a dead letter):
//! `queues`, `dead list` (table and JSON, the bad dead letter listed with its problem) and
//! `dead show` all succeed. The broker's side of the same rows (stats, listings, a worker
//! dead-lettering them alone) is `tests/sql_bad_rows.rs` of the workspace.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Command, Stdio};

use chrono::{DateTime, Utc};
use common::{Db, Lite, Sql, ddl};
use serde::{Deserialize, Serialize};
use stagedoor_jobs::{Inbox, Job};

const JOBS_DDL: &str = "
CREATE TABLE bad_jobs (id {id}, queue TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,
    retry_after {time} NOT NULL, locked_until {time}, payload {bytes}, last_error TEXT, headers TEXT);
CREATE INDEX bad_jobs_due ON bad_jobs (queue, retry_after, id);";

#[derive(Inbox)]
#[inbox(table = "bad_jobs")]
#[allow(dead_code)]
struct Jobs {
    #[field(id, generated)]
    id: i64,
    #[field(group)]
    queue: String,
    #[field(attempt, generated)]
    attempt: i64,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
    #[field(last_error)]
    last_error: Option<String>,
    #[field(headers)]
    headers: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Msg {
    n: u64,
}

/// The `stagedoor-jobs` command on `url`'s `bad_jobs` table.
fn cli(url: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_stagedoor-jobs"))
        .args(["--url", url, "--table", "bad_jobs"])
        .args(args)
        .env_remove("STAGEDOOR_URL")
        .env_remove("STAGEDOOR_TABLE")
        .env_remove("STAGEDOOR_NAMESPACE")
        .env_remove("STAGEDOOR_SCHEMA")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("spawn stagedoor-jobs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_rows_never_fail_the_cli() {
    const Q: &str = "jobs";
    let db = Lite::fresh("cli-bad", &ddl::<Lite>(JOBS_DDL)).await;
    let route = Lite::route::<Jobs>(&db.broker(), Q);
    for n in 1..=5 {
        Lite::publish(&route, Job::new(Q, &Msg { n }).expect("encodes")).await;
    }
    // 1: due '' (claimable, unreadable); 2: due 'soon' (never due); 3: good;
    // 4: a dead letter due 'soon'; 5: a good dead letter.
    db.run(
        "UPDATE bad_jobs SET retry_after = '' WHERE id = 1;
         UPDATE bad_jobs SET retry_after = 'soon' WHERE id = 2;
         UPDATE bad_jobs SET queue = 'jobs.dead', retry_after = 'soon', attempt = 3, last_error = 'it broke' WHERE id = 4;
         UPDATE bad_jobs SET queue = 'jobs.dead', attempt = 3, last_error = 'it broke' WHERE id = 5;"
            .to_owned(),
    )
    .await;

    let env = db.child_env();
    let url = env
        .iter()
        .find(|(k, _)| *k == common::ENV_URL)
        .map(|(_, v)| v.clone())
        .expect("the database URL");
    // The plain path: the CLI opens an existing file without `?mode=rwc`.
    let url = url.split('?').next().unwrap_or(&url).to_owned();
    for args in [
        &["queues"][..],
        &["--json", "queues"],
        &["dead", "list", Q],
        &["--json", "dead", "list", Q],
        &["dead", "show", Q, "4"],
    ] {
        let (code, stdout, stderr) = cli(&url, args);
        assert_eq!(code, 0, "stagedoor-jobs {args:?}: {stdout}\n{stderr}");
    }
    let (_, listed, _) = cli(&url, &["--json", "dead", "list", Q]);
    assert!(
        listed.contains("retry_after") && listed.contains("'soon'"),
        "the bad dead letter is listed with its problem: {listed}"
    );
    let (_, queues, _) = cli(&url, &["--json", "queues"]);
    assert!(queues.contains("\"jobs\""), "{queues}");
}
