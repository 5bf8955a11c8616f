//! What SQLite does its own way: opening the database file (WAL, `synchronous = NORMAL`),
//! waking workers (no `NOTIFY`: this process's on publish, and on other connections' commits
//! seen by a watcher of the database files), and counting the rows a statement changed.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use sqlx::Row as _;
use stagedoor_jobs::BrokerError;
use stagedoor_jobs::inbox::Table;

use super::db_err;
use super::sealed::Sealed;
use crate::broker::{Source, SqlxBroker};
use crate::catalog::{Found, Layout};
use crate::sql::Flavor;

impl Sealed for sqlx::Sqlite {
    const FLAVOR: Flavor = Flavor::Sqlite;

    async fn notify<'c>(
        broker: &'c SqlxBroker<Self>,
        _conn: &'c mut sqlx::SqliteConnection,
        _queue: &'c str,
    ) -> Result<(), BrokerError> {
        broker.wake_all();
        Ok(())
    }

    /// The layout of `table` from the catalog (no columns when there is no such table).
    async fn layout(pool: &sqlx::SqlitePool, table: &Table) -> Result<Layout, sqlx::Error> {
        // The names passed `validate`: plain identifiers, quoted.
        let prefix = table.schema.map_or(String::new(), |s| format!("\"{s}\"."));
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "PRAGMA {prefix}table_info(\"{}\")",
            table.name
        )))
        .fetch_all(pool)
        .await?;
        let columns = rows
            .iter()
            .map(|r| {
                let declared: String = r.try_get("type")?;
                Ok(Found {
                    name: r.try_get("name")?,
                    base: declared.to_ascii_uppercase(),
                    declared,
                    not_null: r.try_get::<i64, _>("notnull")? != 0,
                    has_default: r.try_get::<Option<String>, _>("dflt_value")?.is_some(),
                    pk: r.try_get("pk")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        let master = match table.schema {
            Some(s) => format!("\"{s}\".sqlite_master"),
            None => "sqlite_master".to_owned(),
        };
        let ddl: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT sql FROM {master} WHERE type = 'table' AND name = $1"
        )))
        .bind(table.name)
        .fetch_optional(pool)
        .await?
        .flatten();
        let rowid = ddl.is_none_or(|d| {
            let words: Vec<String> = d
                .split(|c: char| c.is_whitespace() || c == ')')
                .filter(|w| !w.is_empty())
                .map(str::to_ascii_uppercase)
                .collect();
            !words
                .windows(2)
                .any(|w| w[0] == "WITHOUT" && w[1] == "ROWID")
        });
        Ok(Layout { columns, rowid })
    }

    fn rows_affected(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    const LOCKS_FIFO_GROUPS: bool = false;

    async fn lock_fifo_group(
        _conn: &mut sqlx::SqliteConnection,
        _key: String,
    ) -> Result<(), BrokerError> {
        Ok(())
    }

    /// `'now'` as SQLite reads it: this machine's clock, in milliseconds.
    async fn database_time(
        conn: &mut sqlx::SqliteConnection,
    ) -> Result<DateTime<Utc>, BrokerError> {
        let text = sqlx::query_scalar::<_, String>("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')")
            .fetch_one(&mut *conn)
            .await
            .map_err(db_err)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| {
                BrokerError::Backend(format!(
                    "the database's clock read `{text}`, which is not a time: {e}"
                ))
            })
    }

    /// The driver decodes every timestamp SQLite holds (RFC 3339 text) or refuses it.
    fn stored_time(
        _row: &sqlx::sqlite::SqliteRow,
        _i: usize,
    ) -> Option<Result<DateTime<Utc>, String>> {
        None
    }

    /// Whether `table`'s integer row id is declared without `AUTOINCREMENT` (SQLite then
    /// gives a new row the id of the deleted row with the highest id).
    async fn reuses_ids<'c>(
        conn: &'c mut sqlx::SqliteConnection,
        table: &'c Table,
    ) -> Option<bool> {
        let master = match table.schema {
            Some(s) => format!("\"{s}\".sqlite_master"),
            None => "sqlite_master".to_owned(),
        };
        let ddl: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT sql FROM {master} WHERE type = 'table' AND name = $1"
        )))
        .bind(table.name)
        .fetch_optional(&mut *conn)
        .await
        .ok()
        .flatten();
        ddl.map(|d| !d.to_ascii_uppercase().contains("AUTOINCREMENT"))
    }

    async fn open(broker: &SqlxBroker<Self>) -> Result<(), BrokerError> {
        use std::str::FromStr;
        let shared = &broker.shared;
        let pool = shared
            .pool
            .get_or_try_init(|| async {
                match broker.take_source() {
                    Some(Source::Pool(p)) => Ok(p),
                    Some(Source::Url(url, options)) => {
                        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&url)
                            .map_err(|e| BrokerError::Connection(format!(
                                "`{}` is not an SQLite URL ({e}): write sqlite://path/to/file.db",
                                shared.url_for_messages
                            )))?
                            .create_if_missing(true)
                            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
                            .busy_timeout(Duration::from_secs(10));
                        options.connect_with(opts).await.map_err(|e| BrokerError::Connection(format!(
                            "cannot open the SQLite database `{}`: {e}: check the path and that its folder exists",
                            shared.url_for_messages
                        )))
                    }
                    None => Err(BrokerError::Connection("the broker's connection failed earlier; restart the service".to_owned())),
                }
            })
            .await?
            .clone();
        if !shared
            .listening
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let files = database_files(&pool);
            if !files.is_empty() {
                let weak = std::sync::Arc::downgrade(&broker.shared);
                let spawned = std::thread::Builder::new()
                    .name("sqlite-change-watcher".to_owned())
                    .spawn(move || watch(&weak, &files));
                if let Err(e) = spawned {
                    // Workers still find new rows at their poll.
                    tracing::warn!(error = %e, "cannot start the SQLite change watcher: workers wake on other processes' jobs at their poll interval");
                }
            }
        }
        Ok(())
    }
}

/// How often a process with an idle worker looks whether the database files changed, while
/// the database is busy: for [`BUSY_FOR`] after the last change or wake-up seen.
pub(crate) const CHANGE_CHECK: Duration = Duration::from_millis(2);

/// How often it looks once the database has been quiet for [`BUSY_FOR`]: a job published after
/// a long quiet waits about half of this more.
pub(crate) const QUIET_CHECK: Duration = Duration::from_millis(10);

/// How long after a change the checks stay at [`CHANGE_CHECK`].
pub(crate) const BUSY_FOR: Duration = Duration::from_secs(1);

/// How often the watcher looks whether a claim waits, while none does.
const NOBODY_WAITS: Duration = Duration::from_millis(20);

/// The files a commit to the pool's database writes: the database, its write-ahead log and
/// the log's shared index (WAL mode). None for an in-memory database.
fn database_files(pool: &sqlx::SqlitePool) -> Vec<std::path::PathBuf> {
    let db = pool.connect_options().get_filename().to_path_buf();
    let name = db.to_string_lossy();
    if name.is_empty() || name.contains(":memory:") || !db.exists() {
        return Vec::new();
    }
    let with = |suffix: &str| {
        let mut f = db.clone().into_os_string();
        f.push(suffix);
        std::path::PathBuf::from(f)
    };
    vec![db.clone(), with("-wal"), with("-shm")]
}

/// What [`signature`] reads of one file: its size and modification time.
type FileState = Option<(u64, Option<std::time::SystemTime>)>;

/// What a commit changes of `files` (see [`database_files`]): each one's size and modification
/// time, read with `stat` only. The watcher never opens these files: POSIX advisory locks
/// belong to the process, and closing any descriptor of a file drops every lock the process
/// holds on it, SQLite's own included (a reader of the log's index header got SQLite
/// connections of the same process "locking protocol" errors under load). Two commits within
/// one tick of the file system's clock that leave a full-size log as it was look alike: the
/// second's rows are then found at the poll.
fn signature(files: &[std::path::PathBuf]) -> Vec<FileState> {
    files
        .iter()
        .map(|f| {
            std::fs::metadata(f)
                .ok()
                .map(|m| (m.len(), m.modified().ok()))
        })
        .collect()
}

/// Wakes this process's idle workers when another process (or another broker of this one)
/// commits to the database: a commit changes the size or the modification time of the
/// database's files, as [`signature`] reads them. Looked at every [`CHANGE_CHECK`]
/// while the database is busy, every [`QUIET_CHECK`] once it has been quiet, and only while a
/// claim waits (a busy worker looks for rows anyway); a claim that found nothing writes
/// nothing, so an idle process does not wake itself. Should a change go unseen, its rows are
/// found at the poll, as without the watcher.
/// This broker's own publishes wake its workers at once without it.
///
/// A thread of its own, not a task: a few microseconds per look (a task's timer wake-ups cost
/// ten times more on an idle runtime). Stops when the broker is dropped or its pool closed; a
/// panic restarts it.
fn watch(
    shared: &std::sync::Weak<crate::broker::Shared<sqlx::Sqlite>>,
    files: &[std::path::PathBuf],
) {
    loop {
        let run =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| watch_files(shared, files)));
        if run.is_ok() {
            return;
        }
        tracing::error!("the SQLite change watcher panicked: starting it again");
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn watch_files(
    shared: &std::sync::Weak<crate::broker::Shared<sqlx::Sqlite>>,
    files: &[std::path::PathBuf],
) {
    use std::sync::atomic::Ordering::SeqCst;
    let mut last = signature(files);
    let mut busy = std::time::Instant::now();
    let mut wakes = None;
    loop {
        let pause = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            if shared.pool.get().is_none_or(sqlx::Pool::is_closed) {
                return;
            }
            if shared.idle_claims.load(SeqCst) == 0 {
                NOBODY_WAITS
            } else {
                let now = signature(files);
                if now != last {
                    shared.wakes.fetch_add(1, SeqCst);
                    shared.wake.notify_waiters();
                    busy = std::time::Instant::now();
                    last = now;
                }
                let woken = shared.wakes.load(SeqCst);
                if wakes != Some(woken) {
                    busy = std::time::Instant::now();
                    wakes = Some(woken);
                }
                if busy.elapsed() < BUSY_FOR {
                    CHANGE_CHECK
                } else {
                    QUIET_CHECK
                }
            }
        };
        std::thread::sleep(pause);
    }
}
