//! [`DeadLetters`]: listing a dead letter's jobs (filtered), replaying them to the queue they
//! failed on (in place for a group, copied back for a dead-letter table), purging them.

use std::sync::Arc;

use stagedoor_jobs::Inbox;
use stagedoor_jobs::broker::{
    BrokerError, DeadLetter, DeadLetters, DeadSelector, Inspect, ReplayReport,
};

use super::{SqlxRoute, run_in};
use crate::dialect::{Dialect, acquire, db_err};
use crate::headers::HeaderDoc;
use crate::receipt::IdValue;
use crate::rows::Vals;

impl<DB: Dialect, Row: Inbox> DeadLetters for SqlxRoute<DB, Row> {
    async fn dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        let stmts = self.stmts_for(dead)?;
        let v = Vals {
            group: Some(dead.to_owned()),
            ..Vals::default()
        };
        let rows = self.fetch(&stmts, &stmts.list, &v).await?;
        Ok(rows
            .iter()
            .map(|r| self.dead_letter_of(dead, r))
            .filter(|d| selector.matches(d))
            .take(limit)
            .collect())
    }

    async fn replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<ReplayReport, BrokerError> {
        let letters = self.dead_letters(dead, selector, usize::MAX).await?;
        let mut report = ReplayReport::default();
        let now = self.broker.now();
        let stmts = Arc::clone(self.stmts()?);
        for d in letters {
            if d.origin.is_empty() {
                tracing::error!(dead_letter = %d.id, "cannot tell which queue it failed on: not replayed");
                report.failed += 1;
                continue;
            }
            let env = &d.envelope;
            let h = env.headers();
            let doc = HeaderDoc {
                kind: (env.kind() != d.origin).then(|| env.kind().to_owned()),
                job_id: Some(env.id().to_string()),
                request_id: h.request_id.clone(),
                trace: h.trace.clone(),
                extra: h.extra.clone(),
                ..HeaderDoc::default()
            };
            let id = IdValue::parse(&stmts.table, &d.id)?;
            let v = Vals {
                id: Some(id),
                group: Some(dead.to_owned()),
                target: Some(d.origin.clone()),
                now: Some(now),
                headers: Some(doc.to_json()),
                ..Vals::default()
            };
            let result = if self.grouped() {
                self.exec(&stmts.replay_group, &v).await
            } else {
                // The table form: copy back into the origin table and delete, in one transaction.
                let dead_stmts = self.dead_table(dead)?;
                async {
                    let mut tx = self.pool()?.begin().await.map_err(db_err)?;
                    let copy = dead_stmts.copy_into(self.table().name, false);
                    let n = run_in::<DB>(&mut tx, &copy, &v, &dead_stmts.table).await?;
                    if n == 1 {
                        run_in::<DB>(&mut *tx, &stmts.clear_lease, &v, &stmts.table).await?;
                        run_in::<DB>(&mut *tx, &dead_stmts.delete_by_id, &v, &dead_stmts.table)
                            .await?;
                        tx.commit().await.map_err(db_err)?;
                    }
                    Ok::<u64, BrokerError>(n)
                }
                .await
            };
            match result {
                Ok(1) => report.replayed += 1,
                Ok(_) => report.skipped += 1,
                Err(e) => {
                    tracing::error!(dead_letter = %d.id, error = %e, "replay failed");
                    report.failed += 1;
                }
            }
        }
        if report.replayed > 0 {
            self.broker.wake_all();
        }
        Ok(report)
    }

    async fn purge(&self, dead: &str, selector: &DeadSelector) -> Result<u64, BrokerError> {
        let letters = self.dead_letters(dead, selector, usize::MAX).await?;
        let stmts = self.stmts_for(dead)?;
        let mut conn = acquire(self.pool()?).await?;
        let mut n = 0;
        for d in letters {
            let v = Vals {
                id: Some(IdValue::parse(&stmts.table, &d.id)?),
                group: Some(dead.to_owned()),
                ..Vals::default()
            };
            n += run_in::<DB>(&mut conn, &stmts.purge, &v, &stmts.table).await?;
        }
        Ok(n)
    }

    async fn dead_len(&self, dead: &str) -> Result<u64, BrokerError> {
        let s = self.stats(dead).await?;
        Ok(s.ready + s.pending + s.delayed)
    }

    fn default_dead_letter(&self, queue: &str) -> String {
        if self.grouped() {
            format!("{queue}.dead")
        } else {
            format!("{}_dead", self.table().name)
        }
    }
}
