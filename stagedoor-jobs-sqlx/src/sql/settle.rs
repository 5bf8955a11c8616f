//! The statements that settle a delivery: its acknowledgement (one row or a batch), a retry,
//! a dead letter within the table (to another group) or into another table (a copy, then the
//! copied row marked and the original deleted), and a replay's move back out of one.

use super::parts::{FENCES, Names, P, Stmt, col, fence, q};
use super::statements::Statements;

/// The bound attempt count `p`, typed: a statement prepared without argument types (the
/// startup check) would otherwise type it as the column (`SMALLINT`), and the driver's 8-byte
/// value would then not fit the cached statement.
fn attempt_param(p: &str) -> String {
    format!("CAST({p} AS BIGINT)")
}

/// The settling statements of a table (see the fields of the same names in [`Statements`]).
pub(super) struct Settles {
    pub(super) delete_fenced: Stmt,
    pub(super) retry: Stmt,
    pub(super) retry_keep_place: Stmt,
    pub(super) dead_group: Stmt,
    pub(super) delete_by_id: Stmt,
    pub(super) clear_lease: Stmt,
    pub(super) mark_dead: Stmt,
}

pub(super) fn build(n: &Names) -> Settles {
    let (t, locked) = (&n.t, &n.locked);

    let mut delete_fenced = Stmt::default();
    {
        let idc = n.id_cond(&mut delete_fenced);
        let f = fence(&mut delete_fenced, locked);
        delete_fenced.sql = format!("DELETE FROM {t} WHERE {idc} AND {f}");
    }

    let mut delete_by_id = Stmt::default();
    {
        let idc = n.id_cond(&mut delete_by_id);
        delete_by_id.sql = format!("DELETE FROM {t} WHERE {idc}");
    }

    Settles {
        delete_fenced,
        retry: build_retry(n, true),
        retry_keep_place: build_retry(n, false),
        dead_group: build_dead_group(n),
        delete_by_id,
        clear_lease: build_clear(n, true),
        mark_dead: build_clear(n, false),
    }
}

/// A fenced retry: no lease, the last error; `move_due`: due at the retry's time (else the
/// row keeps its place).
fn build_retry(n: &Names, move_due: bool) -> Stmt {
    let (t, locked) = (&n.t, &n.locked);
    let mut s = Stmt::default();
    let mut sets = vec![format!("{locked} = NULL")];
    if let (Some(d), true) = (&n.due, move_due) {
        let p = s.p(P::Due);
        sets.push(format!("{d} = {p}"));
    }
    if let Some(e) = col(n.table.last_error) {
        let p = s.p(P::Error);
        sets.push(format!("{e} = {p}"));
    }
    let idc = n.id_cond(&mut s);
    let f = fence(&mut s, locked);
    s.sql = format!("UPDATE {t} SET {} WHERE {idc} AND {f}", sets.join(", "));
    s
}

/// A fenced move to the dead-letter group (empty for a table without groups).
fn build_dead_group(n: &Names) -> Stmt {
    let (t, locked) = (&n.t, &n.locked);
    let mut dead_group = Stmt::default();
    if let Some(g) = &n.group {
        let s = &mut dead_group;
        let target = s.p(P::Target);
        let mut sets = vec![format!("{locked} = NULL"), format!("{g} = {target}")];
        // A dead letter stores the attempts it spent: a subscriber of the dead-letter group
        // sees that number on its first delivery of it, and a listing reports it.
        if let Some(a) = &n.attempt {
            let p = s.p(P::Attempt);
            sets.push(format!("{a} = {}", attempt_param(&p)));
        }
        push_move_sets(n, s, &mut sets);
        let idc = n.id_cond(s);
        let f = fence(s, locked);
        s.sql = format!("UPDATE {t} SET {} WHERE {idc} AND {f}", sets.join(", "));
    }
    dead_group
}

/// What a moved row gets, in this order of parameters: due now, the error and the headers of
/// the move (each where the table has the column).
fn push_move_sets(n: &Names, s: &mut Stmt, sets: &mut Vec<String>) {
    if let Some(d) = &n.due {
        let p = s.p(P::Now);
        sets.push(format!("{d} = {p}"));
    }
    if let Some(e) = col(n.table.last_error) {
        let p = s.p(P::Error);
        sets.push(format!("{e} = {p}"));
    }
    if let Some(h) = col(n.table.headers) {
        let p = s.p(P::Headers);
        sets.push(format!("{h} = {p}"));
    }
}

/// A row just copied into a table: no lease, due now, the error and headers of the move.
/// A replayed row starts counting again (`replayed`: its next delivery is 1); a dead
/// letter keeps its payload and the attempts it spent, as they were.
fn build_clear(n: &Names, replayed: bool) -> Stmt {
    let (t, locked) = (&n.t, &n.locked);
    let mut s = Stmt::default();
    let mut sets = vec![format!("{locked} = NULL")];
    if let Some(a) = &n.attempt {
        if replayed {
            sets.push(format!("{a} = 1"));
        } else {
            let p = s.p(P::Attempt);
            sets.push(format!("{a} = {}", attempt_param(&p)));
        }
    }
    push_move_sets(n, &mut s, &mut sets);
    let idc = n.id_cond(&mut s);
    s.sql = format!("UPDATE {t} SET {} WHERE {idc}", sets.join(", "));
    s
}

impl Statements {
    /// A fenced delete of `n` rows (at most [`MAX_ROWS`](super::MAX_ROWS)): binds the id and the
    /// [`FENCES`] lease values of each, in order, then (`at`, Postgres) its `ctid` as text;
    /// returns the id (as text) of every row it deleted.
    ///
    /// `at`: the rows are found by their `ctid` (a TID scan) and the fence is checked on what
    /// is found, as one condition no index can serve: by id alone the planner may choose to
    /// walk a whole index for each row (statistics taken when the queue was empty say every
    /// index is one page), and a pinned xmin makes each walk longer. A row whose version
    /// moved is not found this way: the caller settles it again by id.
    pub(super) fn delete_many(&self, n: usize, at: bool) -> String {
        let (id, locked) = (&self.id_col, &self.locked_col);
        let per = 1 + FENCES + usize::from(at);
        let conds: Vec<String> = (0..n)
            .map(|i| {
                let leases: Vec<String> = (0..FENCES)
                    .map(|k| format!("${}", per * i + 2 + k))
                    .collect();
                format!(
                    "({id} = ${} AND {locked} IN ({}))",
                    per * i + 1,
                    leases.join(", ")
                )
            })
            .collect();
        let cond = if at {
            let tids: Vec<String> = (0..n)
                .map(|i| format!("CAST(${} AS tid)", per * i + 2 + FENCES))
                .collect();
            format!(
                "ctid = ANY(ARRAY[{}]) AND ({}) IS TRUE",
                tids.join(", "),
                conds.join(" OR ")
            )
        } else {
            conds.join(" OR ")
        };
        format!(
            "DELETE FROM {} WHERE {cond} RETURNING CAST({id} AS TEXT) AS settled_id",
            self.qualified
        )
    }

    /// Postgres: [`delete_many`](Self::delete_many) of `n` rows and
    /// [`retry_many`](Self::retry_many) of `n` other rows in one statement (one round trip, one
    /// commit): binds the delete's values, then the retry's; returns the id (as text) of every
    /// row either settled, and the retry's two flags.
    pub(super) fn delete_and_retry_many(&self, n: usize, at: bool) -> (String, bool, bool) {
        let delete = self.delete_many(n, at);
        let per = 1 + FENCES + usize::from(at);
        let (retry, has_due, has_error) = self.retry_many_from(n, n * per, at);
        (
            format!(
                "WITH a AS ({delete}), r AS ({retry}) SELECT settled_id FROM a UNION ALL SELECT settled_id FROM r"
            ),
            has_due,
            has_error,
        )
    }

    /// A fenced retry of `n` rows (at most [`MAX_ROWS`](super::MAX_ROWS)): releases each, due
    /// at its own time (a NULL due keeps the row's: a FIFO row retried at once keeps its
    /// place), with its own last error. Binds, for each row in order, the id, the [`FENCES`]
    /// lease values, then the due time when the table has a `retry_after` column and the error
    /// when it has a `last_error` one (the two flags returned), then (`at`) its `ctid` as text;
    /// returns the id (as text) of every row it released. `at`: as in
    /// [`delete_many`](Self::delete_many).
    pub(super) fn retry_many(&self, n: usize, at: bool) -> (String, bool, bool) {
        self.retry_many_from(n, 0, at)
    }

    /// [`retry_many`](Self::retry_many) whose first parameter is number `skip + 1`.
    fn retry_many_from(&self, n: usize, skip: usize, at: bool) -> (String, bool, bool) {
        let (id, locked) = (&self.id_col, &self.locked_col);
        let due = self.table.retry_after.map(|c| q(c.name));
        let error = self.table.last_error.map(|c| q(c.name));
        let per = 1
            + FENCES
            + usize::from(due.is_some())
            + usize::from(error.is_some())
            + usize::from(at);
        let ph = |i: usize, k: usize| format!("${}", skip + per * i + 1 + k);
        let mut conds = Vec::with_capacity(n);
        let mut dues = Vec::with_capacity(n);
        let mut errors = Vec::with_capacity(n);
        let mut tids = Vec::with_capacity(n);
        for i in 0..n {
            let leases: Vec<String> = (0..FENCES).map(|k| ph(i, 1 + k)).collect();
            conds.push(format!(
                "({id} = {} AND {locked} IN ({}))",
                ph(i, 0),
                leases.join(", ")
            ));
            let mut k = 1 + FENCES;
            if let Some(d) = &due {
                dues.push(format!(
                    "WHEN {id} = {} THEN COALESCE({}, {d})",
                    ph(i, 0),
                    ph(i, k)
                ));
                k += 1;
            }
            if error.is_some() {
                errors.push(format!("WHEN {id} = {} THEN {}", ph(i, 0), ph(i, k)));
                k += 1;
            }
            if at {
                tids.push(format!("CAST({} AS tid)", ph(i, k)));
            }
        }
        let mut sets = vec![format!("{locked} = NULL")];
        if let Some(d) = &due {
            sets.push(format!("{d} = CASE {} ELSE {d} END", dues.join(" ")));
        }
        if let Some(e) = &error {
            sets.push(format!("{e} = CASE {} ELSE {e} END", errors.join(" ")));
        }
        let cond = if at {
            format!(
                "ctid = ANY(ARRAY[{}]) AND ({}) IS TRUE",
                tids.join(", "),
                conds.join(" OR ")
            )
        } else {
            conds.join(" OR ")
        };
        let sql = format!(
            "UPDATE {} SET {} WHERE {cond} RETURNING CAST({id} AS TEXT) AS settled_id",
            self.qualified,
            sets.join(", "),
        );
        (sql, due.is_some(), error.is_some())
    }

    /// Copies a row into table `target` (same columns): binds Id, and Lease when `fenced`.
    pub(crate) fn copy_into(&self, target: &str, fenced: bool) -> Stmt {
        let mut s = Stmt::default();
        let cols: Vec<String> = self.table.columns.iter().map(|c| q(c)).collect();
        let cols = cols.join(", ");
        let locked = q(self.table.locked_until.map_or("locked_until", |c| c.name));
        let target = match self.table.schema {
            Some(sc) => format!("{}.{}", q(sc), q(target)),
            None => q(target),
        };
        let idp = s.p(P::Id);
        let mut cond = format!("{} = {idp}", q(self.table.id.name));
        if fenced {
            let f = fence(&mut s, &locked);
            cond.push_str(&format!(" AND {f}"));
        }
        s.sql = format!(
            "INSERT INTO {target} ({cols}) SELECT {cols} FROM {} WHERE {cond}",
            self.qualified
        );
        s
    }
}
