//! [`DeadLetters`]: listing a dead letter's jobs (filtered), replaying them to the queue they
//! failed on (in place for a group, copied back for a dead-letter table), purging them.

use std::sync::Arc;

use stagedoor_jobs::Inbox;
use stagedoor_jobs::JobId;
use stagedoor_jobs::broker::{
    BrokerError, Cancelled, DeadLetter, DeadLetters, DeadSelector, Inspect, ReplayReport,
};
use stagedoor_jobs::kit::lock;

use super::{SqlxRoute, fetch_in, run_in};
use crate::dialect::sealed::Value;
use crate::dialect::{Dialect, acquire, db_err};
use crate::headers::HeaderDoc;
use crate::locks::{ensure_bookkeeping, take_lock};
use crate::receipt::IdValue;
use crate::rows::{RowRead, Vals};
use crate::sql::Statements;

/// The `stagedoor_locks` key marking job `id` of `queue` cancelled while running.
pub(crate) fn cancel_mark(queue: &str, id: &str) -> String {
    format!("cancel:{queue}:{id}")
}

impl<DB: Dialect, Row: Inbox> DeadLetters for SqlxRoute<DB, Row> {
    async fn cancel(&self, queue: &str, id: &JobId) -> Result<Cancelled, BrokerError> {
        // The row of the job: its id is the row's, or the one its headers keep. Reading the
        // group's rows is an operator's step, not a job path's (see the README).
        let found = self
            .dead_letters(queue, &DeadSelector::Id(id.to_string()), usize::MAX)
            .await?
            .into_iter()
            .find(|d| d.envelope.id() == id || d.id == id.as_str());
        let Some(d) = found else {
            return Ok(Cancelled::NotFound);
        };
        let stmts = self.stmts_for(queue).await?;
        let v = Vals {
            id: Some(IdValue::parse(&stmts.table, &d.id)?),
            group: Some(queue.to_owned()),
            now: Some(self.broker.now()),
            ..Vals::default()
        };
        let pool = self.pool()?;
        let mut conn = acquire(pool).await?;
        if run_in::<DB>(&mut conn, &stmts.cancel, &v, &stmts.table).await? > 0 {
            drop(conn);
            stagedoor_jobs::broker::release_unique(self, queue, d.envelope.headers(), id).await?;
            return Ok(Cancelled::Removed);
        }
        // Leased: running. Marked first, then looked for again, so that a job finishing
        // meanwhile is reported as not found rather than running.
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let now = self.broker.now();
        let until = now
            + stagedoor_jobs::broker::chrono_duration(stagedoor_jobs::broker::cancel_mark_ttl(
                self.broker.lease,
            ));
        take_lock::<DB>(
            &mut conn,
            &cancel_mark(queue, id.as_str()),
            "cancel",
            until,
            now,
        )
        .await?;
        let still = fetch_in::<DB>(&mut conn, &stmts.exists, &v, &stmts.table).await?;
        Ok(if still.is_empty() {
            Cancelled::NotFound
        } else {
            Cancelled::Running
        })
    }

    async fn dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        let stmts = self.stmts_for(dead).await?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        if let DeadSelector::Id(id) = selector {
            // The rows that id can name, found by the index of the id (and the headers that
            // may keep it as their job's id), not by reading the group.
            let rows = self.rows_named(&stmts, dead, id).await?;
            return Ok(rows
                .iter()
                .map(|r| self.dead_letter_of(dead, r))
                .filter(|d| selector.matches(d))
                .take(limit)
                .collect());
        }
        // Newest first, a page at a time, until `limit` are selected: a listing reads about
        // as many rows as it returns (more only for a kind that other rows are between).
        let page = match selector {
            DeadSelector::All => limit,
            _ => limit.clamp(LIST_PAGE, 10 * LIST_PAGE),
        };
        let mut out = Vec::new();
        let mut offset = 0_usize;
        loop {
            let v = Vals {
                group: Some(dead.to_owned()),
                limit: i64::try_from(page).unwrap_or(i64::MAX),
                offset: i64::try_from(offset).unwrap_or(i64::MAX),
                ..Vals::default()
            };
            let rows = self.fetch(&stmts, &stmts.list, &v).await?;
            let read = rows.len();
            out.extend(
                rows.iter()
                    .map(|r| self.dead_letter_of(dead, r))
                    .filter(|d| selector.matches(d))
                    .take(limit - out.len()),
            );
            if out.len() >= limit || read < page {
                return Ok(out);
            }
            offset = offset.saturating_add(read);
        }
    }

    async fn oldest_dead_letter(&self, dead: &str) -> Result<Option<DeadLetter>, BrokerError> {
        let stmts = self.stmts_for(dead).await?;
        let v = Vals {
            group: Some(dead.to_owned()),
            ..Vals::default()
        };
        let rows = self.fetch(&stmts, &stmts.oldest, &v).await?;
        Ok(rows.first().map(|r| self.dead_letter_of(dead, r)))
    }

    async fn replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<ReplayReport, BrokerError> {
        self.check_dead_letter(dead).await?;
        let mut report = ReplayReport::default();
        let now = self.broker.now();
        if let DeadSelector::Id(_) = selector {
            for d in self.dead_letters(dead, selector, usize::MAX).await? {
                self.replay_one(dead, &d, now, &mut report).await?;
            }
        } else {
            let mut walk = Walk::new(self.stmts_for(dead).await?);
            while let Some(page) = self.walk_page(dead, &mut walk).await? {
                for d in page.iter().filter(|d| selector.matches(d)) {
                    self.replay_one(dead, d, now, &mut report).await?;
                }
            }
        }
        if report.replayed > 0 {
            self.broker.wake_all();
        }
        Ok(report)
    }

    async fn purge(&self, dead: &str, selector: &DeadSelector) -> Result<u64, BrokerError> {
        self.check_dead_letter(dead).await?;
        let stmts = self.stmts_for(dead).await?;
        let mut n = 0;
        if let DeadSelector::Id(_) = selector {
            let letters = self.dead_letters(dead, selector, usize::MAX).await?;
            return self.purge_ids(dead, &stmts, letters.iter()).await;
        }
        let mut walk = Walk::new(Arc::clone(&stmts));
        while let Some(page) = self.walk_page(dead, &mut walk).await? {
            n += self
                .purge_ids(dead, &stmts, page.iter().filter(|d| selector.matches(d)))
                .await?;
        }
        Ok(n)
    }

    // A dead letter is `<queue>.dead` (a dead-letter table `<table>_dead` for a table without
    // groups), or one a mount declared (see `ensure_dead_letter`); the route's own table is
    // never one.
    async fn check_dead_letter(&self, dead: &str) -> Result<(), BrokerError> {
        if !self.grouped() && (dead == self.table().name || dead == &*self.default_group) {
            return Err(BrokerError::Invalid(format!(
                "`{dead}` is the job table itself, not a dead letter, so nothing was replayed or purged: its dead letters are in `{}`",
                self.default_dead_letter(dead)
            )));
        }
        let declared: Vec<String> = lock(&self.inner.declared_dead).keys().cloned().collect();
        let suffix = if self.grouped() { ".dead" } else { "_dead" };
        stagedoor_jobs::broker::ensure_dead_letter(self, dead, suffix, &declared).await
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

/// The rows one page of a listing by kind reads at least.
const LIST_PAGE: usize = 200;

/// The rows one page of a replay's or purge's walk reads.
const WALK_PAGE: usize = 500;

/// A replay's or purge's walk over a group (or dead-letter table) by id, a page at a time.
struct Walk {
    stmts: Arc<Statements>,
    /// The last id read.
    after: Option<String>,
    done: bool,
}

impl Walk {
    fn new(stmts: Arc<Statements>) -> Self {
        Self {
            stmts,
            after: None,
            done: false,
        }
    }
}

/// `text` in a `LIKE` pattern whose escape character is `!`.
fn like_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '!' | '%' | '_') {
            out.push('!');
        }
        out.push(c);
    }
    out
}

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    /// The rows of group (or dead-letter table) `dead` that `id` may name: the row of that id,
    /// and the rows whose headers hold it as their job's id (a superset, checked by
    /// [`DeadSelector::matches`] once read).
    async fn rows_named(
        &self,
        stmts: &Statements,
        dead: &str,
        id: &str,
    ) -> Result<Vec<RowRead>, BrokerError> {
        let row_id = IdValue::parse(&stmts.table, id).ok();
        let by_job = !Statements::lacks(&stmts.find_job);
        let stmt = match (row_id.is_some(), by_job) {
            (true, true) => &stmts.find_either,
            (true, false) => &stmts.find_id,
            (false, true) => &stmts.find_job,
            (false, false) => return Ok(Vec::new()),
        };
        // The id as the headers' JSON writes it, quotes included.
        let json = serde_json::to_string(id).map_err(|e| BrokerError::Backend(e.to_string()))?;
        let v = Vals {
            id: row_id,
            group: Some(dead.to_owned()),
            job_id: Some(format!("%{}%", like_escaped(&json))),
            ..Vals::default()
        };
        self.fetch(stmts, stmt, &v).await
    }

    /// Replays dead letter `d` of `dead` to the queue it failed on, in one atomic step, and
    /// counts the outcome in `report` (an error is logged and counted as failed).
    async fn replay_one(
        &self,
        dead: &str,
        d: &DeadLetter,
        now: chrono::DateTime<chrono::Utc>,
        report: &mut ReplayReport,
    ) -> Result<(), BrokerError> {
        if d.origin.is_empty() {
            tracing::error!(dead_letter = %d.id, "cannot tell which queue it failed on: not replayed");
            report.failed += 1;
            return Ok(());
        }
        let stmts = Arc::clone(self.stmts()?);
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
        let v = Vals {
            id: Some(IdValue::parse(&stmts.table, &d.id)?),
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
            let dead_stmts = self.dead_table(dead).await?;
            async {
                let mut tx = self.pool()?.begin().await.map_err(db_err)?;
                let copy = dead_stmts.copy_into(self.table().name, false);
                let n = run_in::<DB>(&mut tx, &copy, &v, &dead_stmts.table).await?;
                if n == 1 {
                    run_in::<DB>(&mut *tx, &stmts.clear_lease, &v, &stmts.table).await?;
                    run_in::<DB>(&mut *tx, &dead_stmts.delete_by_id, &v, &dead_stmts.table).await?;
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
        Ok(())
    }

    /// Deletes `letters` from `dead` by id, on one connection; returns how many went.
    async fn purge_ids<'a>(
        &self,
        dead: &str,
        stmts: &Statements,
        letters: impl Iterator<Item = &'a DeadLetter>,
    ) -> Result<u64, BrokerError> {
        let mut conn = None;
        let mut n = 0;
        for d in letters {
            let v = Vals {
                id: Some(IdValue::parse(&stmts.table, &d.id)?),
                group: Some(dead.to_owned()),
                now: Some(self.broker.now()),
                ..Vals::default()
            };
            let c = match &mut conn {
                Some(c) => c,
                None => conn.insert(acquire(self.pool()?).await?),
            };
            n += run_in::<DB>(c, &stmts.purge, &v, &stmts.table).await?;
        }
        Ok(n)
    }

    /// The next page of [`Walk`] over `dead`'s rows by id, read as dead letters; `None` once
    /// every row was read.
    async fn walk_page(
        &self,
        dead: &str,
        walk: &mut Walk,
    ) -> Result<Option<Vec<DeadLetter>>, BrokerError> {
        if walk.done {
            return Ok(None);
        }
        let stmts = Arc::clone(&walk.stmts);
        let (stmt, id) = match &walk.after {
            Some(after) => (
                &stmts.walk_after,
                Some(IdValue::parse(&stmts.table, after)?),
            ),
            None => (&stmts.walk, None),
        };
        let v = Vals {
            id,
            group: Some(dead.to_owned()),
            limit: i64::try_from(WALK_PAGE).unwrap_or(i64::MAX),
            ..Vals::default()
        };
        let rows = self.fetch(&stmts, stmt, &v).await?;
        walk.done = rows.len() < WALK_PAGE;
        let Some(last) = rows.last() else {
            return Ok(None);
        };
        walk.after = Some(last.id.clone());
        Ok(Some(
            rows.iter().map(|r| self.dead_letter_of(dead, r)).collect(),
        ))
    }

    /// [`Broker::cancelled`](stagedoor_jobs::Broker::cancelled): which of `ids` have a
    /// cancellation mark in `stagedoor_locks`.
    pub(super) async fn cancel_marks(
        &self,
        queue: &str,
        ids: &[JobId],
    ) -> Result<Vec<JobId>, BrokerError> {
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let now = self.broker.now();
        let mut found = Vec::new();
        let mut conn = acquire(pool).await?;
        for chunk in ids.chunks(500) {
            let marks: Vec<String> = chunk
                .iter()
                .map(|i| cancel_mark(queue, i.as_str()))
                .collect();
            let list = (2..marks.len() + 2)
                .map(|i| format!("${i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "SELECT lock_key FROM stagedoor_locks WHERE until_at > $1 AND lock_key IN ({list})"
            );
            let mut binds = vec![Value::Time(Some(now))];
            binds.extend(marks.iter().map(|m| Value::Text(Some(m.clone()))));
            let rows = DB::fetch(&mut conn, sql, binds).await.map_err(db_err)?;
            for row in &rows {
                if let Some(key) = DB::text(row, 0).map_err(db_err)?
                    && let Some(i) = marks.iter().position(|m| *m == key)
                {
                    found.push(chunk[i].clone());
                }
            }
        }
        Ok(found)
    }
}
