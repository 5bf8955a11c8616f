//! Shared by the SQL test files: the conformance table and server URLs.
#![allow(dead_code)]

use stagedoor_jobs::inbox::{Column, ColumnType, Table};

/// The conformance suite's job table: a text id (so a job id published twice is recognised),
/// a group, every optional role (a priority among them).
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
        priority: Some(Column {
            name: "priority",
            generated: false,
            ty: ColumnType::Integer,
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
            "priority",
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
    headers TEXT,
    priority SMALLINT NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS conf_jobs_due ON conf_jobs (queue, retry_after, id);
CREATE INDEX IF NOT EXISTS conf_jobs_priority ON conf_jobs (queue, priority DESC, retry_after, id);";

pub(crate) const PG_CONF_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS conf_jobs (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt SMALLINT NOT NULL DEFAULT 1,
    retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_until TIMESTAMPTZ,
    payload BYTEA NOT NULL,
    enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error TEXT,
    headers TEXT,
    priority SMALLINT NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS conf_jobs_due ON conf_jobs (queue, retry_after, id);
CREATE INDEX IF NOT EXISTS conf_jobs_priority ON conf_jobs (queue, priority DESC, retry_after, id);";

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

// ---------------------------------------------------------------------------------------------
// The SQL backend's own tests (`sql_backend.rs`, `sql_crash.rs`): one test body, generic over
// the database it runs on, with a fresh database (SQLite) or schema (Postgres) per test.
// ---------------------------------------------------------------------------------------------

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Connection, Row as _, ValueRef as _};
use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs::{Broker, Inbox, Job, JobId};
use stagedoor_jobs_sqlx::{SqlReceipt, SqlxBroker, SqlxRoute};

/// One value read back from a table: what plain SQL sees, whichever database.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Val {
    Null,
    Int(i64),
    Time(DateTime<Utc>),
    Text(String),
    Bytes(Vec<u8>),
}

impl Val {
    pub(crate) fn int(&self) -> i64 {
        match self {
            Val::Int(i) => *i,
            other => panic!("expected an integer, got {other:?}"),
        }
    }
    pub(crate) fn text(&self) -> Option<String> {
        match self {
            Val::Null => None,
            Val::Text(s) => Some(s.clone()),
            Val::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
            other => panic!("expected text, got {other:?}"),
        }
    }
    pub(crate) fn time(&self) -> Option<DateTime<Utc>> {
        match self {
            Val::Null => None,
            Val::Time(t) => Some(*t),
            other => panic!("expected a timestamp, got {other:?}"),
        }
    }
    pub(crate) fn bytes(&self) -> Vec<u8> {
        match self {
            Val::Bytes(b) => b.clone(),
            Val::Text(s) => s.clone().into_bytes(),
            other => panic!("expected bytes, got {other:?}"),
        }
    }
    pub(crate) fn is_null(&self) -> bool {
        matches!(self, Val::Null)
    }
}

/// A boxed future, for the object-safe [`Sql`].
pub(crate) type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Plain SQL on a test's database, object-safe so handlers can hold it (`Data<Arc<dyn Sql>>`).
pub(crate) trait Sql: Send + Sync + 'static {
    /// Runs `sql` (one or more statements).
    fn run(&self, sql: String) -> Fut<'_, ()>;
    /// Every row of `sql`, each column decoded as the first of integer, timestamp, text, bytes
    /// that fits (cast integers to BIGINT on Postgres).
    fn rows(&self, sql: String) -> Fut<'_, Vec<Vec<Val>>>;
}

/// A database a test runs on: SQLite (a fresh file) or Postgres (a fresh schema).
pub(crate) trait Db: Sql + Clone + Sized {
    /// The sqlx driver.
    type DB: sqlx::Database;
    /// A route of a table of this database.
    type Route<R: Inbox>: Broker<Receipt = SqlReceipt> + Clone;

    /// "sqlite" or "postgres".
    const NAME: &'static str;
    /// DDL: an integer primary key the database fills.
    const AUTO_ID: &'static str;
    /// DDL: an integer primary key the database fills and never reuses (SQLite's
    /// `AUTOINCREMENT`).
    const SERIAL_ID: &'static str;
    /// DDL: a UTC timestamp.
    const TIME: &'static str;
    /// DDL: bytes.
    const BYTES: &'static str;

    /// A fresh database (or schema) with `ddl` (see [`ddl`]) run in it.
    fn fresh(tag: &str, ddl: &str) -> impl Future<Output = Self> + Send;
    /// The database a parent process handed to this child through [`Db::child_env`].
    fn from_env() -> impl Future<Output = Option<Self>> + Send;
    /// What a child process needs to open this database (see [`Db::from_env`]).
    fn child_env(&self) -> Vec<(&'static str, String)>;
    /// A new broker on this database (its own pool; nothing connects until it starts), polling
    /// every 20 ms.
    fn broker(&self) -> SqlxBroker<Self::DB>;
    /// The route of `R`'s table with default group `group`.
    fn route<R: Inbox>(broker: &SqlxBroker<Self::DB>, group: &str) -> Self::Route<R>;
    /// `route.publish(job)` (the route's own API), connecting the route first.
    fn publish<R: Inbox>(route: &Self::Route<R>, job: Job) -> impl Future<Output = JobId> + Send;
    /// `route.publish_in(&mut tx, job)` inside a transaction of the test's own pool, then
    /// commits it or rolls it back.
    fn publish_in<R: Inbox>(
        &self,
        route: &Self::Route<R>,
        job: Job,
        commit: bool,
    ) -> impl Future<Output = JobId> + Send;
}

/// Fills a DDL template: `{id}` (an integer primary key the database fills), `{serial}` (one it
/// never reuses), `{time}`, `{bytes}`.
pub(crate) fn ddl<D: Db>(template: &str) -> String {
    template
        .replace("{id}", D::AUTO_ID)
        .replace("{serial}", D::SERIAL_ID)
        .replace("{time}", D::TIME)
        .replace("{bytes}", D::BYTES)
}

/// The conformance table's DDL for `D`.
pub(crate) fn conf_ddl<D: Db>() -> &'static str {
    if D::NAME == "sqlite" {
        SQLITE_CONF_SCHEMA
    } else {
        PG_CONF_SCHEMA
    }
}

/// A name no other test or run uses: pid, time, counter.
pub(crate) fn unique() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// The environment variables a child process reads its database from.
pub(crate) const ENV_BACKEND: &str = "STAGEDOOR_SQL_TEST_BACKEND";
pub(crate) const ENV_URL: &str = "STAGEDOOR_SQL_TEST_URL";
pub(crate) const ENV_SCHEMA: &str = "STAGEDOOR_SQL_TEST_SCHEMA";

/// An SQLite database file.
#[derive(Clone)]
pub(crate) struct Lite {
    url: String,
    pool: sqlx::SqlitePool,
}

impl Lite {
    async fn attach(url: String) -> Self {
        use std::str::FromStr;
        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&url)
            .expect("an SQLite URL")
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(20));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .expect("open the test's SQLite pool");
        Self { url, pool }
    }
}

fn decode_sqlite(row: &sqlx::sqlite::SqliteRow) -> Vec<Val> {
    (0..row.len())
        .map(|i| {
            if row.try_get_raw(i).expect("a column").is_null() {
                Val::Null
            } else if let Ok(v) = row.try_get::<i64, _>(i) {
                Val::Int(v)
            } else if let Ok(v) = row.try_get::<DateTime<Utc>, _>(i) {
                Val::Time(v)
            } else if let Ok(v) = row.try_get::<String, _>(i) {
                Val::Text(v)
            } else {
                Val::Bytes(row.try_get::<Vec<u8>, _>(i).expect("a readable column"))
            }
        })
        .collect()
}

impl Sql for Lite {
    fn run(&self, sql: String) -> Fut<'_, ()> {
        Box::pin(async move {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                .execute(&self.pool)
                .await
                .unwrap_or_else(|e| panic!("`{sql}`: {e}"));
        })
    }
    fn rows(&self, sql: String) -> Fut<'_, Vec<Vec<Val>>> {
        Box::pin(async move {
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .fetch_all(&self.pool)
                .await
                .unwrap_or_else(|e| panic!("`{sql}`: {e}"));
            rows.iter().map(decode_sqlite).collect()
        })
    }
}

impl Db for Lite {
    type DB = sqlx::Sqlite;
    type Route<R: Inbox> = SqlxRoute<sqlx::Sqlite, R>;
    const NAME: &'static str = "sqlite";
    const AUTO_ID: &'static str = "INTEGER PRIMARY KEY";
    const SERIAL_ID: &'static str = "INTEGER PRIMARY KEY AUTOINCREMENT";
    const TIME: &'static str = "TEXT";
    const BYTES: &'static str = "BLOB";

    async fn fresh(tag: &str, ddl: &str) -> Self {
        let url = fresh_sqlite_url(tag);
        let mut conn = sqlx::SqliteConnection::connect(&url)
            .await
            .expect("create the database");
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.to_owned()))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("create the tables: {e}\n{ddl}"));
        conn.close().await.expect("close");
        Self::attach(url).await
    }

    async fn from_env() -> Option<Self> {
        if std::env::var(ENV_BACKEND).ok()? != Self::NAME {
            return None;
        }
        Some(Self::attach(std::env::var(ENV_URL).expect("the child's database URL")).await)
    }

    fn child_env(&self) -> Vec<(&'static str, String)> {
        vec![
            (ENV_BACKEND, Self::NAME.to_owned()),
            (ENV_URL, self.url.clone()),
        ]
    }

    fn broker(&self) -> SqlxBroker<sqlx::Sqlite> {
        SqlxBroker::from_url(self.url.clone(), sqlx::sqlite::SqlitePoolOptions::new())
            .poll_interval(Duration::from_millis(20))
    }

    fn route<R: Inbox>(broker: &SqlxBroker<sqlx::Sqlite>, group: &str) -> Self::Route<R> {
        broker.route::<R>(group)
    }

    async fn publish<R: Inbox>(route: &Self::Route<R>, job: Job) -> JobId {
        route.connect().await.expect("connect the route");
        route.publish(job).await.expect("publish").into_id()
    }

    async fn publish_in<R: Inbox>(&self, route: &Self::Route<R>, job: Job, commit: bool) -> JobId {
        let mut tx = self.pool.begin().await.expect("begin");
        let id = route
            .publish_in(&mut tx, job)
            .await
            .expect("publish_in")
            .into_id();
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        id
    }
}

/// A Postgres schema of its own on `DATABASE_URL`.
#[derive(Clone)]
pub(crate) struct Pg {
    pub(crate) url: String,
    pub(crate) schema: String,
    pool: sqlx::PgPool,
}

/// Pool options whose connections work in `schema`.
pub(crate) fn pg_options(schema: &str) -> sqlx::postgres::PgPoolOptions {
    let search_path = format!("SET search_path TO {schema}");
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(5)
        .after_connect(move |conn, _| {
            let sql = search_path.clone();
            Box::pin(async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
}

impl Pg {
    async fn attach(url: String, schema: String) -> Self {
        let pool = pg_options(&schema)
            .connect(&url)
            .await
            .expect("open the test's Postgres pool");
        Self { url, schema, pool }
    }
}

fn decode_pg(row: &sqlx::postgres::PgRow) -> Vec<Val> {
    (0..row.len())
        .map(|i| {
            if row.try_get_raw(i).expect("a column").is_null() {
                Val::Null
            } else if let Ok(v) = row.try_get::<i64, _>(i) {
                Val::Int(v)
            } else if let Ok(v) = row.try_get::<i32, _>(i) {
                Val::Int(v.into())
            } else if let Ok(v) = row.try_get::<i16, _>(i) {
                Val::Int(v.into())
            } else if let Ok(v) = row.try_get::<DateTime<Utc>, _>(i) {
                Val::Time(v)
            } else if let Ok(v) = row.try_get::<String, _>(i) {
                Val::Text(v)
            } else {
                Val::Bytes(row.try_get::<Vec<u8>, _>(i).expect("a readable column"))
            }
        })
        .collect()
}

impl Sql for Pg {
    fn run(&self, sql: String) -> Fut<'_, ()> {
        Box::pin(async move {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                .execute(&self.pool)
                .await
                .unwrap_or_else(|e| panic!("`{sql}`: {e}"));
        })
    }
    fn rows(&self, sql: String) -> Fut<'_, Vec<Vec<Val>>> {
        Box::pin(async move {
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .fetch_all(&self.pool)
                .await
                .unwrap_or_else(|e| panic!("`{sql}`: {e}"));
            rows.iter().map(decode_pg).collect()
        })
    }
}

impl Db for Pg {
    type DB = sqlx::Postgres;
    type Route<R: Inbox> = SqlxRoute<sqlx::Postgres, R>;
    const NAME: &'static str = "postgres";
    const AUTO_ID: &'static str = "BIGSERIAL PRIMARY KEY";
    const SERIAL_ID: &'static str = "BIGSERIAL PRIMARY KEY";
    const TIME: &'static str = "TIMESTAMPTZ";
    const BYTES: &'static str = "BYTEA";

    async fn fresh(tag: &str, ddl: &str) -> Self {
        let url = postgres_url();
        let schema = format!("{tag}_{}", unique());
        let mut conn = sqlx::PgConnection::connect(&url)
            .await
            .expect("connect to DATABASE_URL");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE SCHEMA {schema}; SET search_path TO {schema}; {ddl}"
        )))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("create the schema and tables: {e}\n{ddl}"));
        conn.close().await.expect("close");
        Self::attach(url, schema).await
    }

    async fn from_env() -> Option<Self> {
        if std::env::var(ENV_BACKEND).ok()? != Self::NAME {
            return None;
        }
        let url = std::env::var(ENV_URL).expect("the child's database URL");
        let schema = std::env::var(ENV_SCHEMA).expect("the child's schema");
        Some(Self::attach(url, schema).await)
    }

    fn child_env(&self) -> Vec<(&'static str, String)> {
        vec![
            (ENV_BACKEND, Self::NAME.to_owned()),
            (ENV_URL, self.url.clone()),
            (ENV_SCHEMA, self.schema.clone()),
        ]
    }

    fn broker(&self) -> SqlxBroker<sqlx::Postgres> {
        SqlxBroker::from_url(self.url.clone(), pg_options(&self.schema))
            .poll_interval(Duration::from_millis(20))
    }

    fn route<R: Inbox>(broker: &SqlxBroker<sqlx::Postgres>, group: &str) -> Self::Route<R> {
        broker.route::<R>(group)
    }

    async fn publish<R: Inbox>(route: &Self::Route<R>, job: Job) -> JobId {
        route.connect().await.expect("connect the route");
        route.publish(job).await.expect("publish").into_id()
    }

    async fn publish_in<R: Inbox>(&self, route: &Self::Route<R>, job: Job, commit: bool) -> JobId {
        let mut tx = self.pool.begin().await.expect("begin");
        let id = route
            .publish_in(&mut tx, job)
            .await
            .expect("publish_in")
            .into_id();
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        id
    }
}

/// Polls `cond` every 10 ms until it holds; panics after `patience` with `what`.
pub(crate) async fn eventually<F, Fu>(what: &str, patience: Duration, mut cond: F)
where
    F: FnMut() -> Fu,
    Fu: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + patience;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {patience:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs each named test, a generic `async fn name<D: Db>()`, on SQLite and on Postgres:
/// `on_both!(a, b)` makes `a::sqlite`, `a::postgres`, `b::sqlite`, `b::postgres`.
#[allow(unused_macros)]
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name::<crate::common::Lite>().await;
                }
                #[ignore = "needs Postgres: run scripts/test-all"]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$name::<crate::common::Pg>().await;
                }
            }
        )*
    };
}
#[allow(unused_imports)]
pub(crate) use on_both;
