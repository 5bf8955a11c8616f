//! What every statement of a table is written with: the dialect, the parameters and their
//! numbering, the fence, quoting, and a table's quoted names ([`Names`]).

use stagedoor_jobs::inbox::{Column, Table};

/// SQL dialect differences that matter here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(unreachable_pub)]
pub enum Flavor {
    Sqlite,
    Postgres,
}

/// The values a statement binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum P {
    /// The row id.
    Id,
    /// The lease a delivery holds (the fence).
    Lease,
    /// The other values the fence accepts: leases this delivery tried to set by a statement
    /// whose reply was lost (it may have committed). Padded with [`P::Lease`].
    Fence1,
    /// See [`P::Fence1`].
    Fence2,
    /// See [`P::Fence1`].
    Fence3,
    /// The claim takes a row whose lease ran out at or before this time: now, or long ago while
    /// the broker is cautious after a connection error.
    Reclaim,
    /// A new lease.
    NewLease,
    /// The group (queue) read or written.
    Group,
    /// Another group: a dead letter's target, a replay's origin.
    Target,
    /// The time now.
    Now,
    /// When the row becomes due.
    Due,
    /// How many rows.
    Limit,
    /// How many rows to pass over first (a page of a listing).
    Offset,
    /// The last error.
    Error,
    /// The headers JSON.
    Headers,
    /// The payload.
    Payload,
    /// When the job was published.
    EnqueuedAt,
    /// The job id (a text id column).
    JobId,
    /// The lowest due time a bounded claim looks at (see [`Statements::claim_from`](super::Statements::claim_from)).
    Floor,
    /// The attempts a dead letter has spent.
    Attempt,
    /// The job's priority level (`-2..=2`), bound as a `BIGINT`.
    Priority,
    /// Where the row's version was when this delivery last wrote it (Postgres: its `ctid`, as
    /// text), or NULL when unknown; see [`Statements::renew_at`](super::Statements::renew_at).
    Ctid,
}

/// One statement and the values it binds, in order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stmt {
    pub(crate) sql: String,
    pub(crate) params: Vec<P>,
    /// [`sql`](Self::sql) as shared text, made at the first run: each run hands the driver a
    /// reference to it instead of a copy.
    shared: std::sync::OnceLock<std::sync::Arc<str>>,
}

impl Stmt {
    /// The statement's text, shared (a statement is built once and never changed after).
    pub(crate) fn text(&self) -> std::sync::Arc<str> {
        std::sync::Arc::clone(self.shared.get_or_init(|| self.sql.as_str().into()))
    }

    /// The placeholder of `p`, numbered on first use.
    pub(crate) fn p(&mut self, p: P) -> String {
        let n = match self.params.iter().position(|x| *x == p) {
            Some(i) => i + 1,
            None => {
                self.params.push(p);
                self.params.len()
            }
        };
        format!("${n}")
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sql.is_empty()
    }
}

/// How many lease values a fence accepts: the one last confirmed and up to three a statement
/// may have set without its reply arriving.
pub(crate) const FENCES: usize = 4;

/// The fence of statement `s`: the row's lease is one this delivery set.
pub(crate) fn fence(s: &mut Stmt, locked: &str) -> String {
    let ps: Vec<String> = [P::Lease, P::Fence1, P::Fence2, P::Fence3]
        .into_iter()
        .map(|p| s.p(p))
        .collect();
    format!("{locked} IN ({})", ps.join(", "))
}

/// The channel Postgres workers listen on.
pub(crate) const CHANNEL: &str = "stagedoor_jobs";

pub(crate) fn q(name: &str) -> String {
    format!("\"{name}\"")
}

/// The column `c` quoted, if the table has it.
pub(crate) fn col(c: Option<Column>) -> Option<String> {
    c.map(|c| q(c.name))
}

/// A table's quoted names, which every statement builder writes with.
pub(crate) struct Names {
    pub(crate) table: Table,
    pub(crate) flavor: Flavor,
    /// The table, schema-qualified.
    pub(crate) t: String,
    pub(crate) id: String,
    pub(crate) attempt: Option<String>,
    pub(crate) locked: String,
    pub(crate) group: Option<String>,
    pub(crate) due: Option<String>,
    /// The priority column; `None` for a table without one and for a FIFO table (refused by
    /// [`validate`](super::validate)).
    pub(crate) priority: Option<String>,
}

impl Names {
    pub(crate) fn new(table: Table, flavor: Flavor) -> Self {
        Self {
            table,
            flavor,
            t: table.qualified(),
            id: q(table.id.name),
            attempt: col(table.attempt),
            locked: q(table.locked_until.map_or("locked_until", |c| c.name)),
            group: col(table.group),
            due: col(table.retry_after),
            priority: col(table.priority.filter(|_| !table.fifo)),
        }
    }

    /// The columns a read returns (see [`Statements`](super::Statements)), the attempt as `attempt_expr`.
    pub(crate) fn reads(&self, attempt_expr: String) -> String {
        let null = || "NULL".to_owned();
        [
            format!("CAST({} AS TEXT)", self.id),
            attempt_expr,
            q(self.table.payload.name),
            self.locked.clone(),
            self.due.clone().unwrap_or_else(null),
            col(self.table.last_error).unwrap_or_else(null),
            col(self.table.headers).unwrap_or_else(null),
            col(self.table.enqueued_at).unwrap_or_else(null),
            self.priority_read().unwrap_or_else(null),
        ]
        .join(", ")
    }

    /// The priority as read: a `BIGINT` on Postgres (whatever integer type the column has);
    /// as stored on SQLite, where a column holds any value, so that a text there is read as
    /// what it is (a problem), not cast to the number it starts with.
    pub(crate) fn priority_read(&self) -> Option<String> {
        let p = self.priority.as_ref()?;
        Some(match self.flavor {
            Flavor::Postgres => format!("CAST({p} AS BIGINT)"),
            Flavor::Sqlite => p.clone(),
        })
    }

    /// The stored attempt count as read (1 for a table without the column).
    pub(crate) fn attempt_read(&self) -> String {
        self.attempt
            .as_ref()
            .map_or("CAST(1 AS BIGINT)".to_owned(), |a| {
                format!("CAST({a} AS BIGINT)")
            })
    }

    /// The condition on the row id of statement `s`.
    pub(crate) fn id_cond(&self, s: &mut Stmt) -> String {
        let p = s.p(P::Id);
        format!("{} = {p}", self.id)
    }

    /// The condition on the group of statement `s` (any row, for a table without groups).
    pub(crate) fn group_cond(&self, s: &mut Stmt) -> String {
        let g = s.p(P::Group);
        match &self.group {
            Some(gc) => format!("{gc} = {g}"),
            None => format!("CAST({g} AS TEXT) IS NOT NULL"),
        }
    }
}
