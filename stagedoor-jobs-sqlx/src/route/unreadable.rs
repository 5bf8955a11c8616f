//! Rows a claim cannot read (a column value that does not decode, named in the row's
//! problem): returned to the runtime as [`Unreadable`] items, never run, and moved to the dead
//! letter the runtime picks ([`Broker::dead_letter_unreadable`]) with their columns kept.
//!
//! [`Broker::dead_letter_unreadable`]: stagedoor_jobs::Broker::dead_letter_unreadable

use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::{BrokerError, Delivery, Settled, Settlement, Unreadable};
use stagedoor_jobs::{Failure, FailureCause, Inbox};

use super::SqlxRoute;
use crate::dialect::Dialect;
use crate::headers::HeaderDoc;
use crate::receipt::{IdValue, SqlReceipt};
use crate::rows::RowRead;

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    /// The unreadable item of row `r` of `queue`, claimed with `lease` and fenced on `id`,
    /// which cannot be read because of `problem`: its error names the column, its value and
    /// the fix; its receipt holds the job as far as the row reads, for the move.
    pub(super) fn unreadable_of(
        &self,
        queue: &str,
        r: &RowRead,
        id: IdValue,
        lease: DateTime<Utc>,
        problem: &str,
    ) -> Unreadable<SqlReceipt> {
        let doc = HeaderDoc::parse(r.headers.as_deref());
        let job = self.envelope_of(queue, r, &doc);
        let error = format!(
            "the stored job (row {}) cannot be read, so it was dead-lettered without running: {problem}; then replay it",
            r.id
        );
        Unreadable {
            error,
            kind: Some(job.kind().to_owned()),
            receipt: SqlReceipt::unreadable(id, r.lease.unwrap_or(lease), r.ctid.clone(), job),
        }
    }

    /// [`Broker::dead_letter_unreadable`](stagedoor_jobs::Broker::dead_letter_unreadable):
    /// moves `item`'s row to `target` as a settlement to a dead letter moves a row (fenced on
    /// its lease, its columns kept, in one statement or transaction), with `item.error` as its
    /// error.
    pub(super) async fn move_unreadable(
        &self,
        queue: &str,
        item: &Unreadable<SqlReceipt>,
        target: &str,
    ) -> Result<Settled, BrokerError> {
        let Some(job) = item.receipt.unread() else {
            return Err(BrokerError::Invalid(format!(
                "this receipt is of a delivery of `{queue}` that was read, not of an unreadable row: settle it instead"
            )));
        };
        let delivery = Delivery::new(job.clone(), item.receipt.fenced_copy());
        let failure = Failure::new(FailureCause::Decode, item.error.clone(), String::new());
        let settlement = Settlement::DeadLetter {
            target: target.to_owned(),
            failure,
        };
        self.settle_row(queue, &delivery, settlement).await
    }
}
