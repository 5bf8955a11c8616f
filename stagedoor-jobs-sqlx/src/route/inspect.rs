//! [`Inspect`]: connecting, a queue's counts and oldest job, the queues a table holds, when
//! the next row is due, and the database's clock.

use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;
use stagedoor_jobs::broker::{BrokerError, Inspect, QueueStats};
use stagedoor_jobs::kit::lock;

use super::{STATS_TOLERANCE, SqlxRoute, fetch_in};
use crate::dialect::{Dialect, acquire, db_err};
use crate::rows::{Vals, shown};
use crate::sql::Statements;

impl<DB: Dialect, Row: Inbox> Inspect for SqlxRoute<DB, Row> {
    fn backend(&self) -> &'static str {
        "sqlx"
    }

    async fn connect(&self) -> Result<(), BrokerError> {
        DB::open(&self.broker).await
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, BrokerError> {
        let stmts = self.stmts_for(queue).await?;
        // The connection first, then the time: a row published "now" by another task
        // while this query waited for a connection must not look delayed. A job due
        // within STATS_TOLERANCE counts as ready.
        let mut conn = self.pool()?.acquire().await.map_err(db_err)?;
        let now = self.broker.now();
        let v = Vals {
            group: Some(queue.to_owned()),
            now: Some(now + STATS_TOLERANCE),
            ..Vals::default()
        };
        let rows = fetch_in::<DB>(&mut conn, &stmts.stats, &v, &stmts.table).await?;
        let row = rows.first().ok_or_else(|| {
            BrokerError::Backend("the stats statement returned no row".to_owned())
        })?;
        let n = |i: usize| -> Result<u64, BrokerError> {
            let count = DB::int(row, i).map_err(db_err)?.ok_or_else(|| {
                BrokerError::Backend(format!("the stats statement returned NULL in column {i}"))
            })?;
            Ok(u64::try_from(count).unwrap_or(0))
        };
        // A row whose due time is not a timestamp is counted; the oldest is then unknown.
        let oldest = self.first_time_at(row, 3, "queue stats");
        Ok(QueueStats {
            ready: n(0)?,
            pending: n(1)?,
            delayed: n(2)?,
            oldest: oldest.map(|o| (now - o).to_std().unwrap_or_default()),
        })
    }

    async fn queues(&self) -> Result<Vec<String>, BrokerError> {
        let table = *self.table();
        let mut names = match table.group {
            Some(g) => {
                let sql = format!(
                    "SELECT DISTINCT CAST(\"{}\" AS TEXT) FROM {}",
                    g.name,
                    table.qualified()
                );
                let mut conn = acquire(self.pool()?).await?;
                let rows = DB::fetch(&mut conn, sql, Vec::new())
                    .await
                    .map_err(db_err)?;
                // A group that is NULL names no queue; one that is not text (an SQLite
                // blob) is shown as it reads.
                rows.iter()
                    .filter_map(|r| match DB::text(r, 0) {
                        Ok(name) => name,
                        Err(_) => Some(shown::<DB>(r, 0)),
                    })
                    .collect()
            }
            None => vec![self.default_group.to_string()],
        };
        for m in lock(&self.inner.declared_dead).keys() {
            names.push(m.clone());
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    async fn next_due(&self, queue: &str) -> Option<DateTime<Utc>> {
        let stmts = self.stmts_for(queue).await.ok()?;
        if Statements::lacks(&stmts.next_due) {
            return None;
        }
        let v = Vals {
            group: Some(queue.to_owned()),
            ..Vals::default()
        };
        let mut conn = acquire(self.pool().ok()?).await.ok()?;
        let rows = fetch_in::<DB>(&mut conn, &stmts.next_due, &v, &stmts.table)
            .await
            .ok()?;
        self.first_time(rows.first()?, "next due time")
    }
}

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    /// The database's clock ([`Broker::server_time`](stagedoor_jobs::Broker::server_time)):
    /// Postgres `now()`, SQLite's `'now'` (this machine's clock as the database reads it).
    pub(super) async fn database_time(&self) -> Result<DateTime<Utc>, BrokerError> {
        let mut conn = acquire(self.pool()?).await?;
        DB::database_time(&mut conn).await
    }
}
