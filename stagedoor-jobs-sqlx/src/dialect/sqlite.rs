//! What SQLite does its own way: opening the database file (WAL, `synchronous = NORMAL`),
//! waking workers (no `NOTIFY`: this process's on publish, and on other connections' commits
//! seen by a change watcher), and counting the rows a statement changed.

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
            let broker = broker.clone();
            // Restarted after a panic; it returns when the pool closes.
            tokio::spawn(stagedoor_jobs::supervise::restart_on_panic(
                "sqlite change watcher",
                move || watch(broker.clone(), pool.clone()),
            ));
        }
        Ok(())
    }
}

/// How often a process with an idle worker asks SQLite whether another connection committed.
pub(crate) const CHANGE_CHECK: Duration = Duration::from_millis(2);

/// Wakes this process's idle workers when another connection (another process, another broker
/// of this one, or this broker's own pool) commits to the database: `PRAGMA data_version`, on
/// a connection of its own, changes exactly then. Checked every [`CHANGE_CHECK`], and only
/// while a claim waits (a busy worker looks for rows anyway); a no-op statement (a claim that
/// found nothing) commits nothing, so an idle process never wakes itself. This broker's own
/// publishes wake its workers at once without it. Returns when `pool` closes.
async fn watch(broker: SqlxBroker<sqlx::Sqlite>, pool: sqlx::SqlitePool) {
    use sqlx::Connection as _;
    let closed = pool.close_event();
    tokio::pin!(closed);
    let shared = &broker.shared;
    let mut conn: Option<sqlx::SqliteConnection> = None;
    let mut last: Option<i64> = None;
    loop {
        // Sleep while no claim waits.
        loop {
            let started = shared.idle_started.notified();
            tokio::pin!(started);
            started.as_mut().enable();
            if shared.idle_claims.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                break;
            }
            tokio::select! {
                _ = started => {}
                _ = &mut closed => return,
            }
        }
        let version = match conn.as_mut() {
            Some(c) => sqlx::query_scalar::<_, i64>("PRAGMA data_version")
                .fetch_one(&mut *c)
                .await
                .map_err(|e| e.to_string()),
            None => match sqlx::SqliteConnection::connect_with(&pool.connect_options()).await {
                Ok(c) => {
                    conn = Some(c);
                    continue;
                }
                Err(e) => Err(e.to_string()),
            },
        };
        let pause = match version {
            Ok(v) => {
                // A first count (a new connection) wakes too: a commit may have come
                // between a claim's look and it.
                if last != Some(v) {
                    broker.wake_all();
                }
                last = Some(v);
                CHANGE_CHECK
            }
            Err(e) => {
                // Workers still poll meanwhile; a new connection starts a new count.
                tracing::debug!(error = %e, "sqlite change watcher: cannot read data_version; trying again");
                if let Some(c) = conn.take() {
                    let _ = c.close().await;
                }
                last = None;
                Duration::from_millis(100)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = &mut closed => return,
        }
    }
}
