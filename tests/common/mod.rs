//! Shared by the SQL test files: the conformance table and server URLs.
#![allow(dead_code)]

use stagedoor_jobs::inbox::{Column, ColumnType, Table};

/// The conformance suite's job table: a text id (so a job id published twice is recognised),
/// a group, every optional role.
pub(crate) struct ConfRow;

impl stagedoor_jobs::Inbox for ConfRow {
    const TABLE: Table = Table {
        schema: None,
        name: "conf_jobs",
        id: Column {
            name: "id",
            generated: false,
            ty: ColumnType::Text,
        },
        group: Some(Column {
            name: "queue",
            generated: false,
            ty: ColumnType::Text,
        }),
        fifo: false,
        attempt: Some(Column {
            name: "attempt",
            generated: true,
            ty: ColumnType::Integer,
        }),
        retry_after: Some(Column {
            name: "retry_after",
            generated: false,
            ty: ColumnType::Timestamp,
        }),
        locked_until: Some(Column {
            name: "locked_until",
            generated: false,
            ty: ColumnType::Timestamp,
        }),
        payload: Column {
            name: "payload",
            generated: false,
            ty: ColumnType::Bytes,
        },
        enqueued_at: Some(Column {
            name: "enqueued_at",
            generated: false,
            ty: ColumnType::Timestamp,
        }),
        last_error: Some(Column {
            name: "last_error",
            generated: false,
            ty: ColumnType::Text,
        }),
        headers: Some(Column {
            name: "headers",
            generated: false,
            ty: ColumnType::Text,
        }),
        columns: &[
            "id",
            "queue",
            "attempt",
            "retry_after",
            "locked_until",
            "payload",
            "enqueued_at",
            "last_error",
            "headers",
        ],
    };
}

pub(crate) const SQLITE_CONF_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS conf_jobs (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL,
    locked_until TEXT,
    payload BLOB NOT NULL,
    enqueued_at TEXT NOT NULL,
    last_error TEXT,
    headers TEXT
);
CREATE INDEX IF NOT EXISTS conf_jobs_due ON conf_jobs (queue, retry_after);";

pub(crate) const PG_CONF_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS conf_jobs (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt SMALLINT NOT NULL DEFAULT 1,
    retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_until TIMESTAMPTZ,
    payload BYTEA NOT NULL,
    enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error TEXT,
    headers TEXT
);
CREATE INDEX IF NOT EXISTS conf_jobs_due ON conf_jobs (queue, retry_after);";

/// A fresh SQLite database file in the temp folder, its URL.
pub(crate) fn fresh_sqlite_url(tag: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!("stagedoor-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let n = N.fetch_add(1, Ordering::SeqCst);
    let path = dir.join(format!("{tag}-{n}.db"));
    let _ = std::fs::remove_file(&path);
    format!("sqlite://{}?mode=rwc", path.display())
}

/// The Postgres URL the test command exports; a failure (not a skip) when it is missing.
pub(crate) fn postgres_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(u) if u.starts_with("postgres") => u,
        _ => panic!(
            "DATABASE_URL is not set to a postgres:// URL: run the tests with `scripts/test-all`, which starts Postgres and exports it"
        ),
    }
}
