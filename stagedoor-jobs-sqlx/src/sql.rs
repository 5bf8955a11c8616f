//! The statements of one job table, built once from its validated layout.
//!
//! Only identifiers that passed [`is_plain_identifier`] are written into SQL, always quoted;
//! every value is a bind parameter, named by [`P`] and numbered in order of first use.
//!
//! This file holds what every statement shares (the parameters, the fence, the quoted names of
//! a table) and [`Statements`]; the statements themselves are built by the job's path:
//! `sql/claim.rs` (claims, renewal, next due time), `sql/settle.rs` (acknowledgement, retry,
//! dead letters, moves between tables), `sql/publish.rs` (inserts), `sql/inspect.rs` (stats,
//! listing, delayed rows, replay, purge).

use stagedoor_jobs::inbox::{Column, Table, is_plain_identifier};

mod claim;
mod inspect;
mod publish;
mod settle;

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
    /// The lowest due time a bounded claim looks at (see [`Statements::claim_from`]).
    Floor,
    /// The attempts a dead letter has spent.
    Attempt,
    /// The job's priority level (`-2..=2`), bound as a `BIGINT`.
    Priority,
    /// Where the row's version was when this delivery last wrote it (Postgres: its `ctid`, as
    /// text), or NULL when unknown; see [`Statements::renew_at`].
    Ctid,
}

/// One statement and the values it binds, in order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stmt {
    pub(crate) sql: String,
    pub(crate) params: Vec<P>,
}

impl Stmt {
    /// The placeholder of `p`, numbered on first use.
    fn p(&mut self, p: P) -> String {
        let n = match self.params.iter().position(|x| *x == p) {
            Some(i) => i + 1,
            None => {
                self.params.push(p);
                self.params.len()
            }
        };
        format!("${n}")
    }

    fn is_empty(&self) -> bool {
        self.sql.is_empty()
    }
}

/// How many lease values a fence accepts: the one last confirmed and up to three a statement
/// may have set without its reply arriving.
pub(crate) const FENCES: usize = 4;

/// The fence of statement `s`: the row's lease is one this delivery set.
fn fence(s: &mut Stmt, locked: &str) -> String {
    let ps: Vec<String> = [P::Lease, P::Fence1, P::Fence2, P::Fence3]
        .into_iter()
        .map(|p| s.p(p))
        .collect();
    format!("{locked} IN ({})", ps.join(", "))
}

/// The channel Postgres workers listen on.
pub(crate) const CHANNEL: &str = "stagedoor_jobs";

fn q(name: &str) -> String {
    format!("\"{name}\"")
}

/// The column `c` quoted, if the table has it.
fn col(c: Option<Column>) -> Option<String> {
    c.map(|c| q(c.name))
}

/// A table's quoted names, which every statement builder writes with.
struct Names {
    table: Table,
    flavor: Flavor,
    /// The table, schema-qualified.
    t: String,
    id: String,
    attempt: Option<String>,
    locked: String,
    group: Option<String>,
    due: Option<String>,
    /// The priority column; `None` for a table without one and for a FIFO table (refused by
    /// [`validate`]).
    priority: Option<String>,
}

impl Names {
    fn new(table: Table, flavor: Flavor) -> Self {
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

    /// The columns a read returns (see [`Statements`]), the attempt as `attempt_expr`.
    fn reads(&self, attempt_expr: String) -> String {
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
    fn priority_read(&self) -> Option<String> {
        let p = self.priority.as_ref()?;
        Some(match self.flavor {
            Flavor::Postgres => format!("CAST({p} AS BIGINT)"),
            Flavor::Sqlite => p.clone(),
        })
    }

    /// The stored attempt count as read (1 for a table without the column).
    fn attempt_read(&self) -> String {
        self.attempt
            .as_ref()
            .map_or("CAST(1 AS BIGINT)".to_owned(), |a| {
                format!("CAST({a} AS BIGINT)")
            })
    }

    /// The condition on the row id of statement `s`.
    fn id_cond(&self, s: &mut Stmt) -> String {
        let p = s.p(P::Id);
        format!("{} = {p}", self.id)
    }

    /// The condition on the group of statement `s` (any row, for a table without groups).
    fn group_cond(&self, s: &mut Stmt) -> String {
        let g = s.p(P::Group);
        match &self.group {
            Some(gc) => format!("{gc} = {g}"),
            None => format!("CAST({g} AS TEXT) IS NOT NULL"),
        }
    }
}

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
    /// with one, every [`FAIR_CLAIM_EVERY`](stagedoor_jobs::FAIR_CLAIM_EVERY)-th claim of a
    /// queue is [`Statements::claim`]'s, so that no level starves.
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
    insert_cols: String,
    insert_row: Vec<Option<P>>,
    insert_conflict: &'static str,
    id_col: String,
    locked_col: String,
}

/// Most rows one multi-row statement carries (SQLite binds at most 32,766 values).
pub(crate) const MAX_ROWS: usize = 512;

/// Validates a table's names and roles; every problem, each naming the fix.
pub(crate) fn validate(table: &Table) -> Vec<String> {
    let mut problems = Vec::new();
    let roles = [
        Some(table.id),
        table.group,
        table.attempt,
        table.retry_after,
        table.locked_until,
        Some(table.payload),
        table.enqueued_at,
        table.last_error,
        table.headers,
        table.priority,
    ];
    let names = table
        .schema
        .iter()
        .copied()
        .chain([table.name])
        .chain(table.columns.iter().copied())
        .chain(roles.into_iter().flatten().map(|c| c.name));
    for n in names {
        if !is_plain_identifier(n) {
            problems.push(format!(
                "`{n}` is not a plain SQL identifier (letters, digits, `_`)"
            ));
        }
    }
    if table.locked_until.is_none() {
        problems.push(format!(
            "table `{}` has no `locked_until` column, so claims cannot be leased: add a nullable timestamp column with `#[field(locked_until)]`",
            table.name
        ));
    }
    if let (true, Some(p)) = (table.fifo, table.priority) {
        problems.push(format!(
            "table `{}` is FIFO (`#[field(group, fifo)]`: one job of a group at a time, in publish order) and has a priority column `{}`, which would reorder them: drop `#[field(priority)]` from it, or drop `fifo` from its group",
            table.name, p.name
        ));
    }
    problems
}

impl Statements {
    /// Builds the statements of a validated table.
    pub(crate) fn new(table: Table, flavor: Flavor) -> Self {
        let n = Names::new(table, flavor);
        let claim::Claims {
            claim,
            claim_from,
            claim_prio,
            claim_prio_from,
            claim_strays,
            next_due,
            next_due_from,
            renew,
            renew_at,
        } = claim::build(&n);
        let settle::Settles {
            delete_fenced,
            retry,
            retry_keep_place,
            dead_group,
            delete_by_id,
            clear_lease,
            mark_dead,
        } = settle::build(&n);
        let publish::Inserts {
            insert,
            insert_notify,
            insert_cols,
            insert_row,
            insert_conflict,
        } = publish::build(&n);
        let inspect::Inspects {
            stats,
            list,
            oldest,
            walk,
            walk_after,
            find_id,
            find_job,
            find_either,
            delayed,
            replay_group,
            purge,
            cancel,
            exists,
        } = inspect::build(&n);
        Self {
            table,
            qualified: n.t,
            claim,
            claim_from,
            claim_prio,
            claim_prio_from,
            claim_strays,
            next_due_from,
            renew,
            renew_at,
            delete_fenced,
            retry,
            retry_keep_place,
            dead_group,
            insert,
            insert_notify,
            stats,
            list,
            oldest,
            walk,
            walk_after,
            find_id,
            find_job,
            find_either,
            delayed,
            replay_group,
            purge,
            cancel,
            exists,
            next_due,
            delete_by_id,
            clear_lease,
            mark_dead,
            insert_cols,
            insert_row,
            insert_conflict,
            id_col: n.id,
            locked_col: n.locked,
        }
    }

    /// The same statements against another table with the same columns (a dead-letter table).
    pub(crate) fn for_table(&self, name: &'static str, flavor: Flavor) -> Self {
        let mut t = self.table;
        t.name = name;
        Self::new(t, flavor)
    }

    /// Whether the table has no statement for `s` (a role it lacks).
    pub(crate) fn lacks(s: &Stmt) -> bool {
        s.is_empty()
    }
}
