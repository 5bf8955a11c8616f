//! The statements of one job table, built once from its validated layout.
//!
//! Only identifiers that passed [`is_plain_identifier`] are written into SQL, always quoted;
//! every value is a bind parameter, named by [`P`] and numbered in order of first use.
//!
//! This file builds [`Statements`] (held in `sql/statements.rs`) and validates a table; what
//! every statement shares (the parameters, the fence, the quoted names of a table) is in
//! `sql/parts.rs`; the statements themselves are built by the job's path:
//! `sql/claim.rs` (claims, renewal, next due time), `sql/settle.rs` (acknowledgement, retry,
//! dead letters, moves between tables), `sql/publish.rs` (inserts), `sql/inspect.rs` (stats,
//! listing, delayed rows, replay, purge). `sql/records.rs` holds the statements of records
//! (`route/records.rs`), which belong to no job table.

use stagedoor_jobs::inbox::{Table, is_plain_identifier};

mod claim;
mod inspect;
mod parts;
mod publish;
pub(crate) mod records;
mod settle;
mod statements;

#[cfg(feature = "postgres")]
pub(crate) use parts::CHANNEL;
#[allow(unreachable_pub)]
pub use parts::Flavor;
pub(crate) use parts::{FENCES, P, Stmt};
pub(crate) use statements::{Many, Statements};

use parts::Names;

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
        let c = claim::build(&n);
        let s = settle::build(&n);
        let p = publish::build(&n);
        let i = inspect::build(&n);
        Self {
            table,
            claim: c.claim,
            claim_from: c.claim_from,
            claim_prio: c.claim_prio,
            claim_prio_from: c.claim_prio_from,
            claim_strays: c.claim_strays,
            next_due: c.next_due,
            next_due_from: c.next_due_from,
            renew: c.renew,
            renew_at: c.renew_at,
            delete_fenced: s.delete_fenced,
            retry: s.retry,
            retry_keep_place: s.retry_keep_place,
            dead_group: s.dead_group,
            delete_by_id: s.delete_by_id,
            clear_lease: s.clear_lease,
            mark_dead: s.mark_dead,
            insert: p.insert,
            insert_notify: p.insert_notify,
            insert_cols: p.insert_cols,
            insert_row: p.insert_row,
            insert_conflict: p.insert_conflict,
            stats: i.stats,
            list: i.list,
            oldest: i.oldest,
            walk: i.walk,
            walk_after: i.walk_after,
            find_id: i.find_id,
            find_job: i.find_job,
            find_either: i.find_either,
            delayed: i.delayed,
            replay_group: i.replay_group,
            purge: i.purge,
            cancel: i.cancel,
            exists: i.exists,
            qualified: n.t,
            id_col: n.id,
            locked_col: n.locked,
            many: Default::default(),
        }
    }

    /// The same statements against another table with the same columns (a dead-letter table).
    pub(crate) fn for_table(&self, name: &'static str, flavor: Flavor) -> Self {
        let mut t = self.table;
        t.name = name;
        Self::new(t, flavor)
    }
}
