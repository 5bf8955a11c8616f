//! The bookkeeping tables of the scheduler's locks and ticks (and `publish_once`'s guards).

use std::time::Duration;

use sqlx::Database;
use stagedoor_jobs::BrokerError;

use crate::dialect::db_err;

/// The bookkeeping tables of this backend, created on first use: `stagedoor_locks` (a row per
/// lock: scheduler ticks, with its owner's token and expiry) and `stagedoor_schedules` (each
/// schedule's latest enqueued tick).
const BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS stagedoor_locks (lock_key TEXT PRIMARY KEY, token TEXT NOT NULL, until_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS stagedoor_schedules (schedule TEXT PRIMARY KEY, last_tick TIMESTAMPTZ NOT NULL)";

pub(crate) async fn ensure_bookkeeping<DB: Database>(
    done: &tokio::sync::OnceCell<()>,
    pool: &sqlx::Pool<DB>,
) -> Result<(), BrokerError>
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    done.get_or_try_init(|| async {
        // Postgres races concurrent `CREATE TABLE IF NOT EXISTS` of one table (workers
        // starting together on a fresh database): the loser sees "already exists" or a
        // duplicate catalog key, and the table is there once the winner commits.
        let mut tries: u64 = 0;
        loop {
            match sqlx::raw_sql(BOOKKEEPING).execute(pool).await {
                Ok(_) => return Ok(()),
                Err(e)
                    if tries < 5 && {
                        let m = e.to_string();
                        m.contains("already exists") || m.contains("duplicate key")
                    } =>
                {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(20 * tries)).await;
                }
                Err(e) => return Err(db_err(e)),
            }
        }
    })
    .await?;
    Ok(())
}
