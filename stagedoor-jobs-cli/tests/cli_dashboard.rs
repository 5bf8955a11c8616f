//! `stagedoor-jobs dashboard`, spawned as a process: it refuses an address beyond loopback
//! without a secret (before connecting anywhere), reads the secret from the environment
//! variable it is named, serves the dashboard of an SQLite table on a free loopback port
//! (401 without the token, the table's counts with it), and on Postgres with a password in the
//! URL shows the URL masked; `--read-only` refuses the actions.
//!
//! A missing `DATABASE_URL` fails the Postgres test under `scripts/test-all`; a plain
//! `cargo test` without it lists it as ignored.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{ConfRow, Db, Lite, Pg, conf_ddl};
use serde_json::json;
use stagedoor_jobs::broker::Settlement;
use stagedoor_jobs::{Broker, Failure, FailureCause, Job, Publish};

fn command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stagedoor-jobs"));
    c.env_remove("STAGEDOOR_URL")
        .env_remove("STAGEDOOR_TABLE")
        .env_remove("STAGEDOOR_NAMESPACE")
        .env_remove("STAGEDOOR_SCHEMA")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

/// A dashboard process, killed when dropped.
struct Served {
    child: Child,
    /// `host:port` it listens on.
    addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `command` and waits for the line with its URL.
fn serve(mut command: Command) -> Served {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stagedoor-jobs");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(l) if !l.is_empty() => l,
        other => {
            let _ = child.kill();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("the dashboard printed no URL ({other:?}); stderr: {err}");
        }
    };
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in `{line}`"));
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches(['/', ','])
        .to_owned();
    Served { child, addr }
}

/// One HTTP/1.1 request: the status and the body.
fn http(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    http_to(addr, addr, path, headers)
}

/// One HTTP/1.1 request to `addr` naming `host`: the status and the body.
fn http_to(addr: &str, host: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the dashboard");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not HTTP: {out}"));
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// 2 ready jobs in `mail`, 3 in the dead letter `billing.dead`.
async fn seed<B: Broker>(b: &B) {
    b.connect().await.expect("connect");
    for n in 0..2 {
        b.publish_job(Job::new("mail", &json!({ "n": n })).unwrap())
            .await
            .expect("publish");
    }
    for n in 0..3 {
        b.publish_job(
            Job::new("billing", &json!({ "n": n }))
                .unwrap()
                .kind("invoice"),
        )
        .await
        .expect("publish");
    }
    let mut settled = 0;
    for _ in 0..50 {
        for d in b
            .claim(
                "billing",
                3,
                Duration::from_millis(200),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim")
        {
            b.settle(
                "billing",
                &d,
                Settlement::DeadLetter {
                    target: "billing.dead".into(),
                    failure: Failure::new(FailureCause::Error, "declined", ""),
                },
            )
            .await
            .expect("settle");
            settled += 1;
        }
        if settled == 3 {
            break;
        }
    }
    assert_eq!(b.dead_len("billing.dead").await.unwrap(), 3);
}

#[test]
fn an_open_address_without_a_secret_is_refused_before_connecting() {
    // The URL points nowhere: the refusal comes first.
    let out = command()
        .args([
            "--url",
            "postgres://app:pw@127.0.0.1:1/none",
            "--table",
            "jobs",
            "dashboard",
            "--listen",
            "0.0.0.0:0",
        ])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("without authentication"), "{err}");
    assert!(
        err.contains("--auth-token-env") && err.contains("--basic-auth-env"),
        "names the fix: {err}"
    );
    // A secret named but not set is said as such.
    let out = command()
        .args([
            "--url",
            "postgres://app:pw@127.0.0.1:1/none",
            "--table",
            "jobs",
            "dashboard",
            "--listen",
            "0.0.0.0:0",
            "--auth-token-env",
            "STAGEDOOR_TEST_NO_SUCH_VAR",
        ])
        .env_remove("STAGEDOOR_TEST_NO_SUCH_VAR")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("STAGEDOOR_TEST_NO_SUCH_VAR") && err.contains("not set"),
        "{err}"
    );
    // Basic auth needs user:password.
    let out = command()
        .args([
            "--url",
            "sqlite://nowhere.db",
            "--table",
            "jobs",
            "dashboard",
            "--basic-auth-env",
            "STAGEDOOR_TEST_BASIC",
        ])
        .env("STAGEDOOR_TEST_BASIC", "no-colon")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("user:password"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_an_sqlite_table_behind_a_token() {
    let db = Lite::fresh("clidash", conf_ddl::<Lite>()).await;
    let route = Lite::route::<ConfRow>(&db.broker(), "mail");
    seed(&route).await;
    let url = db.child_env()[1].1.clone();
    let mut c = command();
    c.args([
        "--url",
        &url,
        "--table",
        "conf_jobs",
        "dashboard",
        "--listen",
        "127.0.0.1:0",
        "--auth-token-env",
        "STAGEDOOR_TEST_DASH_TOKEN",
    ])
    .env("STAGEDOOR_TEST_DASH_TOKEN", "tok-123");
    let served = serve(c);
    let addr = served.addr.clone();
    let (status, body) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || http(&addr, "/", &[])
    })
    .await
    .unwrap();
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("data-queue"), "{body}");
    let (status, body) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || http(&addr, "/", &[("Authorization", "Bearer tok-123")])
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#"<tr data-queue="mail">"#), "{body}");
    assert!(body.contains(r#"data-field="ready">2<"#), "{body}");
    assert!(body.contains(">3</a>"), "billing's 3 dead letters: {body}");
    let (status, body) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || http(&addr, "/api/queues", &[("Authorization", "Bearer tok-123")])
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let billing = v["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "billing")
        .cloned()
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(billing["dead_count"], 3, "{v}");
    drop(served);
}

/// Without auth on loopback, a `Host` of another name (a DNS rebinding) is refused with 421
/// naming `--allowed-host`; a name given with `--allowed-host` is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_its_own_and_allowed_host_names_are_answered() {
    let db = Lite::fresh("clidash", conf_ddl::<Lite>()).await;
    let route = Lite::route::<ConfRow>(&db.broker(), "mail");
    seed(&route).await;
    let url = db.child_env()[1].1.clone();
    let mut c = command();
    c.args([
        "--url",
        &url,
        "--table",
        "conf_jobs",
        "dashboard",
        "--listen",
        "127.0.0.1:0",
        "--allowed-host",
        "jobs.example.com",
        "--allowed-host",
        "ops.example.com:8443",
    ]);
    let served = serve(c);
    let addr = served.addr.clone();
    let port = addr.rsplit_once(':').unwrap().1.to_owned();
    for (host, want) in [
        (addr.clone(), 200),
        (format!("localhost:{port}"), 200),
        ("jobs.example.com".to_owned(), 200),
        ("ops.example.com:8443".to_owned(), 200),
        (format!("attacker.example:{port}"), 421),
        ("ops.example.com".to_owned(), 421),
    ] {
        let (status, body) = tokio::task::spawn_blocking({
            let (addr, host) = (addr.clone(), host.clone());
            move || http_to(&addr, &host, "/workers", &[])
        })
        .await
        .unwrap();
        assert_eq!(status, want, "Host: {host}: {body}");
        if want == 421 {
            assert!(body.contains("--allowed-host"), "{body}");
        }
    }
    drop(served);
    let out = command()
        .args([
            "--url",
            &url,
            "dashboard",
            "--allowed-host",
            "https://jobs.example.com/",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no scheme"), "{err}");
}

#[ignore = "needs Postgres: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_url_password_is_masked_and_read_only_refuses() {
    let db = Pg::fresh("clidash", conf_ddl::<Pg>()).await;
    let route = Pg::route::<ConfRow>(&db.broker(), "mail");
    seed(&route).await;
    // The test server trusts local connections: a password in the URL is accepted and unused.
    let url = db.url.replacen("://postgres@", "://postgres:hunter2@", 1);
    assert!(
        url.contains("hunter2"),
        "DATABASE_URL's user is postgres: {url}"
    );
    let mut c = command();
    c.args([
        "--url",
        &url,
        "--table",
        "conf_jobs",
        "--schema",
        &db.schema,
        "dashboard",
        "--listen",
        "127.0.0.1:0",
        "--read-only",
    ]);
    let served = serve(c);
    let addr = served.addr.clone();
    let pages = tokio::task::spawn_blocking(move || {
        [
            "/",
            "/dead",
            "/dead?dl=billing.dead",
            "/dead/confirm?dl=billing.dead&action=replay&all=1",
            "/workers",
            "/scheduled",
        ]
        .map(|p| (p, http(&addr, p, &[])))
    })
    .await
    .unwrap();
    for (path, (status, body)) in &pages {
        assert!(!body.contains("hunter2"), "{path}: {body}");
        if path.starts_with("/dead/confirm") {
            assert_eq!(*status, 403, "read-only: {body}");
        } else {
            assert_eq!(*status, 200, "{path}: {body}");
        }
    }
    let (_, home) = &pages[0].1;
    assert!(
        home.contains("postgres:***@"),
        "the title names the URL, masked: {home}"
    );
    let (_, list) = &pages[2].1;
    assert!(list.contains("<tr data-id="), "{list}");
    assert!(!list.contains("Replay selected"), "read-only: {list}");
}
