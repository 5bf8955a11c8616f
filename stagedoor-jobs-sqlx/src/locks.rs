//! The bookkeeping tables of the scheduler's locks and ticks (and `publish_once`'s guards), of
//! the workers' reports and per-minute counts, and taking a lock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use stagedoor_jobs::BrokerError;

use crate::dialect::sealed::{Driver, Value};
use crate::dialect::{acquire, db_err};

/// The bookkeeping tables of this backend, created on first use: `stagedoor_locks` (a row per
/// lock: scheduler ticks, with its owner's token and expiry), `stagedoor_schedules` (each
/// schedule's latest enqueued tick), `stagedoor_workers` (each worker's last report, JSON, until
/// it expires) and `stagedoor_minutes` (each queue's counts per minute; see
/// `route/activity.rs`).
const BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS stagedoor_locks (lock_key TEXT PRIMARY KEY, token TEXT NOT NULL, until_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS stagedoor_schedules (schedule TEXT PRIMARY KEY, last_tick TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS stagedoor_workers (worker_id TEXT PRIMARY KEY, report TEXT NOT NULL, until_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS stagedoor_minutes (queue TEXT NOT NULL, minute TIMESTAMPTZ NOT NULL, processed BIGINT NOT NULL, failed BIGINT NOT NULL, dead BIGINT NOT NULL, PRIMARY KEY (queue, minute))";

/// Takes lock `$1` for token `$2` until `$3`: a new row, or one whose `until_at` has passed
/// (`$4` is now). Changes one row when taken.
const TAKE_LOCK: &str = "INSERT INTO stagedoor_locks (lock_key, token, until_at) VALUES ($1, $2, $3) ON CONFLICT (lock_key) DO UPDATE SET token = excluded.token, until_at = excluded.until_at WHERE stagedoor_locks.until_at <= $4";

/// Deletes the locks that ran out before `$1`.
pub(crate) const DROP_OLD_LOCKS: &str = "DELETE FROM stagedoor_locks WHERE until_at < $1";

/// Releases lock `$1` if token `$2` holds it.
pub(crate) const UNLOCK: &str = "DELETE FROM stagedoor_locks WHERE lock_key = $1 AND token = $2";

/// The last tick of schedule `$1`.
pub(crate) const LAST_TICK: &str = "SELECT last_tick FROM stagedoor_schedules WHERE schedule = $1";

/// Records tick `$2` of schedule `$1`, unless a later one is recorded.
pub(crate) const MARK_TICK: &str = "INSERT INTO stagedoor_schedules (schedule, last_tick) VALUES ($1, $2) ON CONFLICT (schedule) DO UPDATE SET last_tick = excluded.last_tick WHERE stagedoor_schedules.last_tick < excluded.last_tick";

/// Creates the bookkeeping tables once per broker (`done`).
pub(crate) async fn ensure_bookkeeping<DB: Driver>(
    done: &tokio::sync::OnceCell<()>,
    pool: &sqlx::Pool<DB>,
) -> Result<(), BrokerError> {
    done.get_or_try_init(|| async {
        // Postgres races concurrent `CREATE TABLE IF NOT EXISTS` of one table (workers
        // starting together on a fresh database): the loser sees "already exists" or a
        // duplicate catalog key, and the table is there once the winner commits.
        let mut tries: u64 = 0;
        loop {
            let mut conn = acquire(pool).await?;
            match DB::run_script(&mut conn, BOOKKEEPING).await {
                Ok(()) => return Ok(()),
                Err(e)
                    if tries < 5 && {
                        let m = e.to_string();
                        m.contains("already exists") || m.contains("duplicate key")
                    } =>
                {
                    tries += 1;
                    drop(conn);
                    tokio::time::sleep(Duration::from_millis(20 * tries)).await;
                }
                Err(e) => return Err(db_err(e)),
            }
        }
    })
    .await?;
    Ok(())
}

/// Takes lock `key` for `token` until `until` on `conn` (a transaction, or a pooled
/// connection): `true` when it was free or its holder's time had passed at `now`.
pub(crate) async fn take_lock<DB: Driver>(
    conn: &mut DB::Connection,
    key: &str,
    token: &str,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<bool, BrokerError> {
    let binds = vec![
        Value::Text(Some(key.to_owned())),
        Value::Text(Some(token.to_owned())),
        Value::Time(Some(until)),
        Value::Time(Some(now)),
    ];
    let n = DB::run(conn, TAKE_LOCK.to_owned(), binds)
        .await
        .map_err(db_err)?;
    Ok(n == 1)
}
