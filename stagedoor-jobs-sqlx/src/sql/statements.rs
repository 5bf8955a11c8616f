//! [`Statements`]: every statement of one job table, built by `sql.rs` from its children.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use stagedoor_jobs::inbox::Table;
use stagedoor_jobs::kit::lock;

use super::parts::{P, Stmt};

/// The statements of a table. Reads return, in this order: id (text), attempt (bigint), payload,
/// locked_until, retry_after, last_error, headers, enqueued_at, priority (missing roles read as
/// NULL).
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) table: Table,
    pub(crate) qualified: String,
    pub(crate) claim: Stmt,
    /// The claim bounded below by a due time ([`P::Floor`]), so that its index scan starts
    /// there instead of walking every entry of the group: on Postgres, a table whose dead rows
    /// cannot be vacuumed (a transaction held open elsewhere pins xmin) keeps an index entry per
    /// deleted and per updated row, and an unbounded claim visits each of them, every time.
    /// Empty for a table without a `retry_after` column and for FIFO tables.
    pub(crate) claim_from: Stmt,
    /// The claim by priority: the highest level first, in due order among equals. Empty for a
    /// table without a priority column, whose claims are [`Statements::claim`]'s (due order);
    /// with one, a claim the runtime asks for in due order
    /// ([`ClaimOrder::Due`](stagedoor_jobs::ClaimOrder::Due), its turn that keeps any level from
    /// starving) is [`Statements::claim`]'s.
    pub(crate) claim_prio: Stmt,
    /// [`Statements::claim_prio`] bounded below by a due time, as [`Statements::claim_from`].
    pub(crate) claim_prio_from: Stmt,
    /// SQLite only (a table with `retry_after`): claims the rows whose `retry_after` sorts after
    /// every timestamp (a text such as `'soon'`, a blob), which the claim would never reach, so
    /// that they are read, found unreadable and dead-lettered alone. Run when a claim came back
    /// empty. Empty elsewhere (Postgres types the column).
    pub(crate) claim_strays: Stmt,
    /// [`Statements::next_due`] bounded the same way.
    pub(crate) next_due_from: Stmt,
    pub(crate) renew: Stmt,
    /// Postgres: [`renew`](Self::renew) of the row version at [`P::Ctid`] (a TID scan, whatever
    /// the statistics say), still fenced on the id and lease; both return the renewed
    /// version's `ctid`. Empty on SQLite.
    pub(crate) renew_at: Stmt,
    pub(crate) delete_fenced: Stmt,
    pub(crate) retry: Stmt,
    pub(crate) retry_keep_place: Stmt,
    pub(crate) dead_group: Stmt,
    /// One row; returns its id as text when it is stored (nothing when its id was taken).
    pub(crate) insert: Stmt,
    /// The insert, and on Postgres a `NOTIFY` in the same statement (delivered at commit);
    /// returns the stored row's id as text first.
    pub(crate) insert_notify: Stmt,
    pub(crate) stats: Stmt,
    /// A page of a group's rows, newest first: [`P::Limit`] rows after the first
    /// [`P::Offset`].
    pub(crate) list: Stmt,
    /// A group's oldest row, the one [`list`](Self::list) lists last.
    pub(crate) oldest: Stmt,
    /// The first [`P::Limit`] rows of a group by id.
    pub(crate) walk: Stmt,
    /// The next [`P::Limit`] rows of a group by id, after id [`P::Id`].
    pub(crate) walk_after: Stmt,
    /// The row of id [`P::Id`] in a group.
    pub(crate) find_id: Stmt,
    /// The rows of a group whose headers are like [`P::JobId`] (`!` escapes); empty without a
    /// headers column.
    pub(crate) find_job: Stmt,
    /// The rows of [`find_id`](Self::find_id) and [`find_job`](Self::find_job).
    pub(crate) find_either: Stmt,
    /// A group's rows due later than now ([`P::Now`]), soonest first, at most [`P::Limit`].
    /// Empty for a table without a `retry_after` column.
    pub(crate) delayed: Stmt,
    pub(crate) replay_group: Stmt,
    pub(crate) purge: Stmt,
    /// Deletes row `id` of a group unless it is leased (running): a cancel.
    pub(crate) cancel: Stmt,
    /// Whether row `id` of a group is there.
    pub(crate) exists: Stmt,
    pub(crate) next_due: Stmt,
    pub(crate) delete_by_id: Stmt,
    /// A replayed row: no lease, due now, attempt reset to 1.
    pub(crate) clear_lease: Stmt,
    /// A row moved into a dead-letter table: no lease, its error, the attempts it spent.
    pub(crate) mark_dead: Stmt,
    /// The insert's columns, its value per column (`None`: the literal `1`), its conflict clause.
    pub(super) insert_cols: String,
    pub(super) insert_row: Vec<Option<P>>,
    pub(super) insert_conflict: &'static str,
    pub(super) id_col: String,
    pub(super) locked_col: String,
    /// The batch statements built so far, by kind, row count and `at` (see [`Many`]): each is
    /// built once, not at every batch. Bounded: batches come in a few sizes of at most
    /// [`MAX_ROWS`](super::MAX_ROWS) rows.
    pub(super) many: Mutex<HashMap<(Many, usize, bool), Batch>>,
}

/// A statement over many rows, for [`Statements::many`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Many {
    /// [`Statements::delete_many`].
    Delete,
    /// [`Statements::retry_many`].
    Retry,
    /// [`Statements::delete_and_retry_many`] (Postgres).
    DeleteAndRetry,
    /// [`Statements::insert_many`] (`at` unused).
    Insert,
}

/// A built batch statement: its text, and whether it binds a due time and an error per retried
/// row (as the builders of [`Many`] return them).
#[derive(Clone, Debug)]
pub(crate) struct Batch {
    pub(crate) sql: Arc<str>,
    pub(crate) has_due: bool,
    pub(crate) has_error: bool,
}

impl Statements {
    /// Whether the table has no statement for `s` (a role it lacks).
    pub(crate) fn lacks(s: &Stmt) -> bool {
        s.is_empty()
    }

    /// The statement `which` over `n` rows (`at`: found at their place), built at its first
    /// use and shared after.
    pub(crate) fn many(&self, which: Many, n: usize, at: bool) -> Batch {
        let key = (which, n, at);
        if let Some(b) = lock(&self.many).get(&key) {
            return b.clone();
        }
        let (sql, has_due, has_error) = match which {
            Many::Delete => (self.delete_many(n, at), false, false),
            Many::Retry => self.retry_many(n, at),
            Many::DeleteAndRetry => self.delete_and_retry_many(n, at),
            Many::Insert => (self.insert_many(n), false, false),
        };
        let b = Batch {
            sql: sql.into(),
            has_due,
            has_error,
        };
        lock(&self.many).insert(key, b.clone());
        b
    }
}
