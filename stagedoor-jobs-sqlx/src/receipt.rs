//! `SqlReceipt`: what a delivery holds of its row (its id and the lease fence), and the id
//! values rows are fenced on.

use std::sync::Mutex;

use chrono::{DateTime, Utc};
use stagedoor_jobs::inbox::{ColumnType, Table};
use stagedoor_jobs::kit::lock;
use stagedoor_jobs::{BrokerError, Envelope};

use crate::dialect::sealed::Value;

/// A claimed row: its id and the lease it holds (the fence every settlement checks).
///
/// A renewal moves the row's lease. One whose reply is lost (the connection broke after the
/// statement was sent) may have committed, so the receipt keeps the value it tried to set
/// beside the one last confirmed, and the fence accepts any of them: a lost reply never makes
/// the worker's own row look taken by another.
///
/// A SQL delivery reports no delivery count ([`Delivery::delivered`] is `None`): the claim
/// counts the row's attempt as it takes it, so a job that crashes its worker every time ends
/// at its mount's cap (`max_attempts`), and the runtime's poison count has nothing to read.
///
/// The receipt of a row a claim could not read (an [`Unreadable`] item) also holds the job as
/// far as its columns read: its move to a dead letter
/// ([`Broker::dead_letter_unreadable`]) writes that job's kind, id and headers beside the
/// row's columns, which it keeps as they are.
///
/// [`Delivery::delivered`]: stagedoor_jobs::broker::Delivery::delivered
/// [`Unreadable`]: stagedoor_jobs::broker::Unreadable
/// [`Broker::dead_letter_unreadable`]: stagedoor_jobs::Broker::dead_letter_unreadable
#[derive(Debug)]
pub struct SqlReceipt {
    pub(crate) id: IdValue,
    lease: Mutex<Fence>,
    /// The job as far as an unreadable row's columns read (see the type's documentation);
    /// `None` for a delivery.
    unread: Option<Box<Envelope>>,
    /// Where the row's version is, as far as this delivery knows (Postgres: the `ctid` its
    /// claim or last renewal returned, as text): settlements and renewals find the row there
    /// with a TID scan, whatever the planner believes of the table, and by id only when it
    /// moved. `None` when unknown (SQLite; after a renewal whose reply was lost).
    ctid: Mutex<Option<String>>,
}

/// The lease values a delivery may find on its row.
#[derive(Clone, Debug)]
struct Fence {
    /// The last one a statement confirmed setting.
    held: DateTime<Utc>,
    /// Set by statements whose reply never came (newest last, at most `FENCES - 1`).
    unsure: Vec<DateTime<Utc>>,
}

impl SqlReceipt {
    pub(crate) fn new(id: IdValue, lease: DateTime<Utc>, ctid: Option<String>) -> Self {
        Self {
            id,
            lease: Mutex::new(Fence {
                held: lease,
                unsure: Vec::new(),
            }),
            ctid: Mutex::new(ctid),
            unread: None,
        }
    }

    /// The receipt of a row a claim could not read: `job` is what its columns read as.
    pub(crate) fn unreadable(
        id: IdValue,
        lease: DateTime<Utc>,
        ctid: Option<String>,
        job: Envelope,
    ) -> Self {
        Self {
            unread: Some(Box::new(job)),
            ..Self::new(id, lease, ctid)
        }
    }

    /// The job as far as an unreadable row's columns read; `None` for a delivery.
    pub(crate) fn unread(&self) -> Option<&Envelope> {
        self.unread.as_deref()
    }

    /// A receipt of the same row with the same fence and place, for a settlement made
    /// through another delivery value (an unreadable row's move): nothing it holds changes
    /// when that settlement runs.
    pub(crate) fn fenced_copy(&self) -> Self {
        let fence = self.fence().clone();
        Self {
            id: self.id.clone(),
            lease: Mutex::new(fence),
            ctid: Mutex::new(self.ctid()),
            unread: None,
        }
    }

    /// Where the row's version is, if known (see the field).
    pub(crate) fn ctid(&self) -> Option<String> {
        lock(&self.ctid).clone()
    }

    /// A statement of this delivery moved the row's version to `ctid` (`None`: it may have,
    /// and where to is not known).
    pub(crate) fn moved(&self, ctid: Option<String>) {
        *lock(&self.ctid) = ctid;
    }

    fn fence(&self) -> std::sync::MutexGuard<'_, Fence> {
        lock(&self.lease)
    }

    /// The lease values the fence accepts, padded with the confirmed one.
    pub(crate) fn leases(&self) -> [DateTime<Utc>; crate::sql::FENCES] {
        let f = self.fence();
        let mut out = [f.held; crate::sql::FENCES];
        for (slot, t) in out.iter_mut().skip(1).zip(f.unsure.iter().rev()) {
            *slot = *t;
        }
        out
    }

    /// A statement set `lease` for sure: the only value from now on.
    pub(crate) fn confirmed(&self, lease: DateTime<Utc>) {
        let mut f = self.fence();
        f.held = lease;
        f.unsure.clear();
    }

    /// A statement that would set `lease` failed after it was sent: it may have committed.
    pub(crate) fn maybe(&self, lease: DateTime<Utc>) {
        let mut f = self.fence();
        if f.unsure.len() + 1 >= crate::sql::FENCES {
            f.unsure.remove(0);
        }
        f.unsure.push(lease);
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum IdValue {
    Int(i64),
    Text(String),
}

impl IdValue {
    pub(crate) fn parse(table: &Table, text: &str) -> Result<Self, BrokerError> {
        match table.id.ty {
            ColumnType::Integer => {
                text.parse()
                    .map(IdValue::Int)
                    .map_err(|_| BrokerError::Malformed {
                        id: text.to_owned(),
                        reason: "an integer id column held a non-integer".to_owned(),
                    })
            }
            _ => Ok(IdValue::Text(text.to_owned())),
        }
    }
}

impl IdValue {
    pub(crate) fn text(&self) -> String {
        match self {
            IdValue::Int(i) => i.to_string(),
            IdValue::Text(s) => s.clone(),
        }
    }

    /// The id as a statement binds it.
    pub(crate) fn value(&self) -> Value {
        match self {
            IdValue::Int(i) => Value::Int(Some(*i)),
            IdValue::Text(s) => Value::Text(Some(s.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_accepts_the_leases_a_lost_reply_may_have_set() {
        let t = |s: i64| DateTime::from_timestamp(s, 0).expect("a time");
        let r = SqlReceipt::new(IdValue::Int(1), t(10), None);
        assert_eq!(r.leases(), [t(10); crate::sql::FENCES]);
        r.maybe(t(11));
        r.maybe(t(12));
        assert_eq!(r.leases(), [t(10), t(12), t(11), t(10)]);
        r.maybe(t(13));
        r.maybe(t(14));
        assert_eq!(
            r.leases(),
            [t(10), t(14), t(13), t(12)],
            "the newest unsure values"
        );
        r.confirmed(t(20));
        assert_eq!(r.leases(), [t(20); crate::sql::FENCES]);
    }

    #[test]
    fn a_fenced_copy_keeps_the_fence_and_place_but_not_the_unread_job() {
        let t = |s: i64| DateTime::from_timestamp(s, 0).expect("a time");
        let job = Envelope::new("q", b"{}".to_vec(), t(1));
        let r = SqlReceipt::unreadable(IdValue::Int(7), t(10), Some("(0,1)".to_owned()), job);
        r.maybe(t(11));
        assert!(
            r.unread().is_some(),
            "an unreadable row's receipt holds its job"
        );
        let copy = r.fenced_copy();
        assert_eq!(copy.id, IdValue::Int(7));
        assert_eq!(copy.leases(), r.leases());
        assert_eq!(copy.ctid().as_deref(), Some("(0,1)"));
        assert!(copy.unread().is_none());
    }
}
