//! `stagedoor-jobs dead list/show` on dead letters that lack facts or hold odd bytes, spawned
//! as a process against real Redis (`REDIS_URL`) and SQLite (a temp file): the command shows
//! what is stored and says what is missing, never a made-up value.
//!
//! - Redis dead entries added by hand or by an old producer, without `kind`, `job_id`,
//!   `enqueued_at` or `failed_at`: the job id shown is the stored `job_id` (or the entry's
//!   id), the same on every call, and `dead show` finds the dead letter by it; the kind and
//!   the enqueued time are shown as missing or unknown, not as "" and now.
//! - A field name and value that are not UTF-8 are shown with those bytes escaped (`\xff`),
//!   never replaced by U+FFFD.
//! - A 1 MiB binary payload is shown as a bounded preview with its size and how to get all of
//!   it (`--payload-to FILE`), which writes its exact bytes.
//! - An SQLite table without an `enqueued_at` column: the enqueued time is unknown (it was
//!   shown as the row's `retry_after`).
//!
//! A missing `REDIS_URL` fails the test under `scripts/test-all`; a plain `cargo test`
//! without it lists the test as ignored.

use std::process::{Command, Stdio};

use redis::cmd;
use serde_json::Value;
use sqlx::Connection;

/// What a run of the command did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: Vec<u8>,
    /// Shown when an assertion fails.
    #[allow(dead_code)]
    stderr: String,
}

impl Run {
    fn text(&self) -> String {
        String::from_utf8(self.stdout.clone()).expect("the command prints UTF-8")
    }
}

fn run(base: &[&str], args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_stagedoor-jobs"))
        .args(base)
        .args(args)
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
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[track_caller]
fn ok(base: &[&str], args: &[&str]) -> Run {
    let r = run(base, args);
    assert_eq!(r.code, 0, "stagedoor-jobs {args:?}: {r:?}");
    r
}

fn json(base: &[&str], args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let r = ok(base, &all);
    serde_json::from_slice(&r.stdout)
        .unwrap_or_else(|e| panic!("stagedoor-jobs {args:?} printed no JSON ({e}): {r:?}"))
}

/// The line of `dead show` output that starts with `label`.
fn line<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` line in:\n{text}"))
}

fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{tag}{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn redis_url() -> String {
    match std::env::var("REDIS_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "REDIS_URL is not set: run the tests with `scripts/test-all`, which starts Redis and exports it"
        ),
    }
}

const BINARY_NAME: &[u8] = b"h.\xffraw";
const BINARY_VALUE: &[u8] = b"\x00\xfe";

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_dead_letters_show_what_is_stored() {
    let ns = format!("{}:", unique("clidead"));
    let dead_key = format!("{{{ns}jobs}}:dead");
    let client = redis::Client::open(redis_url().as_str()).expect("REDIS_URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to REDIS_URL");
    let mut xadd = async |fields: &[(&[u8], &[u8])]| -> String {
        let mut c = cmd("XADD");
        c.arg(&dead_key).arg("*");
        for (k, v) in fields {
            c.arg(*k).arg(*v);
        }
        c.query_async(&mut conn).await.expect("XADD")
    };
    // An old producer's dead letter: a job id, no kind, no enqueued time.
    xadd(&[
        (b"job_id", b"stored-1"),
        (b"payload", b"{\"order\":1}"),
        (b"attempts", b"2"),
        (b"error", b"boom"),
        (b"failed_at", b"2026-11-29T20:49:04+00:00"),
        (b"origin", b"jobs"),
    ])
    .await;
    // By hand: no job id, no failed_at, a field whose name is not UTF-8.
    let bare = xadd(&[
        (b"kind", b"render"),
        (b"payload", b"x"),
        (BINARY_NAME, BINARY_VALUE),
        (b"error", b"by hand"),
    ])
    .await;
    // A 1 MiB binary payload.
    let big: Vec<u8> = (0..1usize << 20).map(|i| (i % 251) as u8 | 0x80).collect();
    xadd(&[
        (b"kind", b"upload"),
        (b"job_id", b"big-1"),
        (b"payload", &big),
        (b"attempts", b"1"),
        (b"enqueued_at", b"1795985344000"),
        (b"error", b"too big"),
        (b"failed_at", b"2026-11-29T20:49:04+00:00"),
        (b"origin", b"jobs"),
    ])
    .await;

    let url = redis_url();
    let base = ["--url", url.as_str(), "--namespace", ns.as_str()];

    // The job ids are the stored ones (or the entry's id), the same on every call.
    let first = json(&base, &["dead", "list", "jobs"]);
    let second = json(&base, &["dead", "list", "jobs"]);
    let ids = |v: &Value| -> Vec<String> {
        v.as_array()
            .expect("an array")
            .iter()
            .map(|d| d["job_id"].as_str().expect("a job id").to_owned())
            .collect()
    };
    assert_eq!(
        ids(&first),
        ["big-1", bare.as_str(), "stored-1"],
        "{first:#}"
    );
    assert_eq!(ids(&first), ids(&second), "stable across calls");
    let stored = &first[2];
    assert_eq!(stored["kind"], Value::Null, "no kind stored: {stored:#}");
    assert_eq!(stored["enqueued_at"], Value::Null, "unknown: {stored:#}");
    assert_eq!(first[1]["job_id_stored"], false);
    let table = ok(&base, &["dead", "list", "jobs"]).text();
    assert!(
        line(&table, &bare).contains("render"),
        "the table lists the entry's own id as its job id: {table}"
    );
    assert!(
        table.contains("(missing)"),
        "the missing kind is said: {table}"
    );

    // `dead show` by the stored job id finds it, and says what is missing.
    let shown = ok(&base, &["dead", "show", "jobs", "stored-1"]).text();
    assert!(line(&shown, "job id").contains("stored-1"), "{shown}");
    assert!(line(&shown, "kind").contains("missing"), "{shown}");
    assert!(
        line(&shown, "enqueued at").contains("unknown"),
        "no enqueued time is stored: {shown}"
    );
    assert!(line(&shown, "payload").contains("{\"order\":1}"), "{shown}");

    // Bytes that are not UTF-8 are escaped, not replaced.
    let shown = ok(&base, &["dead", "show", "jobs", &bare]).text();
    assert!(!shown.contains('\u{fffd}'), "no U+FFFD: {shown}");
    let field = line(&shown, "field h.\\xffraw");
    assert!(field.ends_with("\\x00\\xfe"), "the value's bytes: {field}");
    assert!(line(&shown, "job id").contains("none stored"), "{shown}");
    assert!(
        line(&shown, "failed at").contains("no `failed_at`"),
        "{shown}"
    );
    let as_json = json(&base, &["dead", "show", "jobs", &bare]);
    assert_eq!(as_json["fields"]["h.\\xffraw"], "\\x00\\xfe", "{as_json:#}");

    // A large payload: a bounded preview, its size, and how to get all of it.
    let r = ok(&base, &["dead", "show", "jobs", "big-1"]);
    assert!(
        r.stdout.len() < 8 * 1024,
        "bounded: {} bytes printed",
        r.stdout.len()
    );
    let shown = r.text();
    assert!(
        line(&shown, "enqueued at").contains("2026-11-29 20:49:04"),
        "a stored enqueued time is shown: {shown}"
    );
    let size = line(&shown, "payload size");
    assert!(
        size.contains("1048576 bytes") && size.contains("--payload-to"),
        "{size}"
    );
    let file = std::env::temp_dir().join(format!("{}.bin", unique("payload")));
    let file_arg = file.display().to_string();
    ok(
        &base,
        &["dead", "show", "jobs", "big-1", "--payload-to", &file_arg],
    );
    assert!(
        std::fs::read(&file).expect("the payload file") == big,
        "--payload-to writes the exact bytes"
    );
    let _ = std::fs::remove_file(&file);
    let raw = ok(
        &base,
        &["dead", "show", "jobs", "big-1", "--payload-to", "-"],
    );
    assert!(raw.stdout == big, "`--payload-to -` prints the bytes alone");

    let _: () = cmd("DEL")
        .arg(&dead_key)
        .query_async(&mut client.get_multiplexed_async_connection().await.expect("c"))
        .await
        .expect("DEL");
}

/// The README's mailer table: a group column, no `enqueued_at`, no `headers`.
const MAILER_DDL: &str = "CREATE TABLE mail_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL,
    locked_until TEXT,
    payload BLOB NOT NULL
);
INSERT INTO mail_jobs (queue, attempt, retry_after, payload)
VALUES ('emails.dead', 4, '2020-01-02 03:04:05+00:00', x'7b7d');";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_table_without_enqueued_at_shows_it_unknown() {
    let dir = std::env::temp_dir().join(format!("stagedoor-cli-dead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{}.db", unique("mailer")));
    let url = format!("sqlite://{}", path.display());
    {
        let mut conn = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
            .await
            .expect("create the SQLite file");
        sqlx::raw_sql(MAILER_DDL)
            .execute(&mut conn)
            .await
            .expect("create the table and a dead row");
        conn.close().await.expect("close");
    }
    let base = ["--url", url.as_str(), "--table", "mail_jobs"];
    let shown = ok(&base, &["dead", "show", "emails", "1"]).text();
    let enqueued = line(&shown, "enqueued at");
    assert!(
        enqueued.contains("unknown") && enqueued.contains("enqueued_at"),
        "the table keeps no enqueued time: {shown}"
    );
    assert!(!enqueued.contains("2020"), "not the retry_after: {shown}");
    let as_json = json(&base, &["dead", "show", "emails", "1"]);
    assert_eq!(as_json["enqueued_at"], Value::Null, "{as_json:#}");
    assert_eq!(as_json["payload"], "{}", "{as_json:#}");
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}

/// `dead purge --all` of more than 1,000 dead letters deletes exactly the ones it listed: a
/// dead letter that arrives once the purge has begun (a trigger adds one at the first delete)
/// is left, as are the jobs of the live queue (waiting, delayed, running). Before, above 1,000
/// the purge deleted by selector and took the late one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_purge_of_many_deletes_exactly_what_it_listed() {
    const LISTED: i64 = 1_200;
    let dir = std::env::temp_dir().join(format!("stagedoor-cli-purge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{}.db", unique("mailer")));
    let url = format!("sqlite://{}", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
        .await
        .expect("create the SQLite file");
    let ddl = format!(
        "CREATE TABLE mail_jobs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            queue TEXT NOT NULL,
            attempt INTEGER NOT NULL DEFAULT 1,
            retry_after TEXT NOT NULL,
            locked_until TEXT,
            payload BLOB NOT NULL
        );
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {LISTED})
        INSERT INTO mail_jobs (queue, attempt, retry_after, payload)
        SELECT 'emails.dead', 3, '2020-01-02 03:04:05+00:00', x'7b7d' FROM n;
        INSERT INTO mail_jobs (queue, attempt, retry_after, locked_until, payload) VALUES
            ('emails', 1, '2020-01-02 03:04:05+00:00', NULL, x'7b7d'),
            ('emails', 1, '2999-01-02 03:04:05+00:00', NULL, x'7b7d'),
            ('emails', 1, '2020-01-02 03:04:05+00:00', '2999-01-02 03:04:05+00:00', x'7b7d');
        CREATE TABLE arrived (n INTEGER);
        CREATE TRIGGER a_late_letter AFTER DELETE ON mail_jobs
        WHEN OLD.queue = 'emails.dead' AND NOT EXISTS (SELECT 1 FROM arrived)
        BEGIN
            INSERT INTO arrived VALUES (1);
            INSERT INTO mail_jobs (queue, attempt, retry_after, payload)
            VALUES ('emails.dead', 3, '2030-01-02 03:04:05+00:00', x'6c617465');
        END;"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&mut conn)
        .await
        .expect("create the table, its dead letters and live jobs");
    let base = ["--url", url.as_str(), "--table", "mail_jobs"];
    let done = json(&base, &["dead", "purge", "emails", "--all", "--yes"]);
    assert_eq!(done["purged"], LISTED, "{done:#}");
    let left: Vec<(String, Vec<u8>)> =
        sqlx::query_as("SELECT queue, payload FROM mail_jobs ORDER BY id")
            .fetch_all(&mut conn)
            .await
            .expect("read what is left");
    let dead: Vec<&(String, Vec<u8>)> = left.iter().filter(|(q, _)| q == "emails.dead").collect();
    assert_eq!(
        dead.len(),
        1,
        "only the letter that arrived after the listing is left: {left:?}"
    );
    assert_eq!(dead[0].1, b"late".to_vec());
    assert_eq!(
        left.iter().filter(|(q, _)| q == "emails").count(),
        3,
        "the live queue's waiting, delayed and running jobs are all there"
    );
    conn.close().await.expect("close");
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}

/// On tables without a group column, where a dead letter is a table of its own, `dead purge`
/// and `dead replay` of another job table (a live one, not a dead letter) are refused, naming
/// what a dead letter is; its rows are all there after. Before, the purge deleted them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_purge_of_a_live_table_is_refused() {
    let dir = std::env::temp_dir().join(format!("stagedoor-cli-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{}.db", unique("tables")));
    let url = format!("sqlite://{}", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
        .await
        .expect("create the SQLite file");
    let table = |name: &str| {
        format!(
            "CREATE TABLE {name} (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                attempt INTEGER NOT NULL DEFAULT 1,
                retry_after TEXT NOT NULL,
                locked_until TEXT,
                payload BLOB NOT NULL
            );
            INSERT INTO {name} (retry_after, locked_until, payload) VALUES
                ('2020-01-02 03:04:05+00:00', NULL, x'7b7d'),
                ('2999-01-02 03:04:05+00:00', NULL, x'7b7d'),
                ('2020-01-02 03:04:05+00:00', '2999-01-02 03:04:05+00:00', x'7b7d');"
        )
    };
    let ddl = format!("{}{}", table("plain_jobs"), table("sms_jobs"));
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&mut conn)
        .await
        .expect("create two live job tables");
    let base = ["--url", url.as_str(), "--table", "plain_jobs"];
    for args in [
        &["dead", "purge", "sms_jobs", "--all", "--yes"][..],
        &["dead", "replay", "sms_jobs", "--all"][..],
    ] {
        let r = run(&base, args);
        assert_ne!(r.code, 0, "{args:?} is refused: {r:?}");
        assert!(
            r.stderr.contains("`sms_jobs` is not a dead letter") && r.stderr.contains("_dead"),
            "{args:?} names what a dead letter is: {r:?}"
        );
    }
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sms_jobs")
        .fetch_one(&mut conn)
        .await
        .expect("count");
    assert_eq!(
        left, 3,
        "the live table's waiting, delayed and running rows are all there"
    );
    conn.close().await.expect("close");
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}
