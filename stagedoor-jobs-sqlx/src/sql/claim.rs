//! The statements of a claim: the claim itself (bounded by a due time on Postgres, the strays
//! on SQLite), the lease's renewal and when the next row becomes claimable.

use super::parts::{Flavor, Names, P, Stmt, fence};

/// The number of the delivery a claim of a row makes, from its `attempt` column `a` (the number
/// of its next delivery): the stored count clamped to `1..=MAX_ATTEMPT`. A count below 1 (a
/// hand-edited zero or negative, NULL, on SQLite a text) is a first delivery, so it can never get
/// around a cap; a count above the ceiling (an `INTEGER` column edited by hand) is the ceiling.
fn delivery_of(a: &str, flavor: Flavor) -> String {
    let max = stagedoor_jobs::broker::MAX_ATTEMPT;
    match flavor {
        Flavor::Postgres => {
            format!("LEAST(GREATEST(COALESCE(CAST({a} AS BIGINT), 1), 1), {max})")
        }
        // SQLite's scalar MIN/MAX return NULL when an argument is NULL; CAST turns a text into
        // the integer it starts with (0 for none).
        Flavor::Sqlite => format!("MIN(MAX(COALESCE(CAST({a} AS INTEGER), 1), 1), {max})"),
    }
}

/// The value a claim writes into the `attempt` column `a`: the next delivery's number,
/// saturating at `MAX_ATTEMPT`, so that it fits a `SMALLINT` column and never stops a claim.
fn next_of(a: &str, flavor: Flavor) -> String {
    let max = stagedoor_jobs::broker::MAX_ATTEMPT;
    let d = delivery_of(a, flavor);
    match flavor {
        Flavor::Postgres => format!("LEAST({d} + 1, {max})"),
        Flavor::Sqlite => format!("MIN({d} + 1, {max})"),
    }
}

/// The claim statements of a table (see the fields of the same names in
/// [`Statements`](super::Statements)).
pub(super) struct Claims {
    pub(super) claim: Stmt,
    pub(super) claim_from: Stmt,
    pub(super) claim_prio: Stmt,
    pub(super) claim_prio_from: Stmt,
    pub(super) claim_strays: Stmt,
    pub(super) next_due: Stmt,
    pub(super) next_due_from: Stmt,
    pub(super) renew: Stmt,
    pub(super) renew_at: Stmt,
}

pub(super) fn build(n: &Names) -> Claims {
    let due = &n.due;
    let claim = build_claim(n, false, false, false);
    let bounded = n.flavor == Flavor::Postgres && due.is_some() && !n.table.fifo;
    let claim_from = if bounded {
        build_claim(n, true, false, false)
    } else {
        Stmt::default()
    };
    let prio = n.priority.is_some();
    let claim_prio = if prio {
        build_claim(n, false, false, true)
    } else {
        Stmt::default()
    };
    let claim_prio_from = if prio && bounded {
        build_claim(n, true, false, true)
    } else {
        Stmt::default()
    };
    let claim_strays = if n.flavor == Flavor::Sqlite && due.is_some() {
        build_claim(n, false, true, false)
    } else {
        Stmt::default()
    };

    let (renew, renew_at) = renewals(n);
    let (next_due, next_due_from) = next_due(n, bounded);

    Claims {
        claim,
        claim_from,
        claim_prio,
        claim_prio_from,
        claim_strays,
        next_due,
        next_due_from,
        renew,
        renew_at,
    }
}

/// The renewal of a lease, fenced on the leases this delivery set, and on Postgres the same at
/// the row version's place ([`P::Ctid`]); both return, on Postgres, where the row's new version
/// is (see `SqlReceipt::ctid`).
fn renewals(n: &Names) -> (Stmt, Stmt) {
    let (t, locked) = (&n.t, &n.locked);
    let moved = match n.flavor {
        Flavor::Postgres => " RETURNING CAST(ctid AS TEXT)",
        Flavor::Sqlite => "",
    };
    let mut renew = Stmt::default();
    {
        let new = renew.p(P::NewLease);
        let idc = n.id_cond(&mut renew);
        let f = fence(&mut renew, locked);
        renew.sql = format!("UPDATE {t} SET {locked} = {new} WHERE {idc} AND {f}{moved}");
    }
    let mut renew_at = Stmt::default();
    if n.flavor == Flavor::Postgres {
        let s = &mut renew_at;
        let new = s.p(P::NewLease);
        let at = s.p(P::Ctid);
        let idc = n.id_cond(s);
        let f = fence(s, locked);
        s.sql = format!(
            "UPDATE {t} SET {locked} = {new} WHERE ctid = CAST({at} AS tid) AND ({idc} AND {f}) IS TRUE{moved}"
        );
    }
    (renew, renew_at)
}

/// When the next row becomes claimable: a waiting row at its due time, a claimed one when its
/// lease ends (its worker may have died); and the same bounded below by [`P::Floor`] when
/// claims are (`bounded`).
fn next_due(n: &Names, bounded: bool) -> (Stmt, Stmt) {
    let (t, locked, due) = (&n.t, &n.locked, &n.due);
    let mut next_due = Stmt::default();
    {
        let gc = n.group_cond(&mut next_due);
        let when = match due {
            Some(d) => format!("CASE WHEN {locked} IS NULL THEN {d} ELSE {locked} END"),
            None => locked.clone(),
        };
        next_due.sql = format!("SELECT MIN({when}) FROM {t} WHERE {gc}");
    }
    let mut next_due_from = Stmt::default();
    if let (Some(d), true) = (due, bounded) {
        let s = &mut next_due_from;
        let gc = n.group_cond(s);
        let f = s.p(P::Floor);
        s.sql = format!(
            "SELECT MIN(CASE WHEN {locked} IS NULL THEN {d} ELSE {locked} END) FROM {t} WHERE {gc} AND {d} >= {f}"
        );
    }
    (next_due, next_due_from)
}

/// The claim: lease and count in one statement; returns the delivery's number (the stored
/// count before the claim, clamped: see [`delivery_of`]), which the batch carries out of
/// its pick, since `RETURNING` sees the row as updated. The counter saturates at
/// `MAX_ATTEMPT` ([`next_of`]): a `SMALLINT` column never overflows, a claim never fails
/// on it. The batch is picked in a `MATERIALIZED` CTE, which runs once whatever the plan:
/// on Postgres, `WHERE id IN (SELECT .. LIMIT n FOR UPDATE SKIP LOCKED)` lets the planner
/// pick a nested-loop semi join that runs the subquery again for every outer row, each
/// run skipping the rows the last one locked, so that the claim leases far more than `n`
/// rows (seen with statistics that say the table is nearly empty: a worked-off queue
/// after ANALYZE). SQLite has one writer and computes the CTE once, before the update.
///
/// `floor`: bounded below by a due time ([`P::Floor`]); `strays`: the rows whose due time is no
/// timestamp (SQLite); `prio`: the highest priority first (`{priority} DESC, {due}, {id}`, which
/// an index on `(group, priority DESC, due, id)` serves), else in due order alone.
fn build_claim(n: &Names, floor: bool, strays: bool, prio: bool) -> Stmt {
    let (t, id, locked, flavor) = (&n.t, &n.id, &n.locked, n.flavor);
    let mut claim = Stmt::default();
    let lease = claim.p(P::NewLease);
    let g = claim.p(P::Group);
    let cond = claim_conds(n, &mut claim, &g, floor, strays);
    let limit = if n.table.fifo {
        "1".to_owned()
    } else {
        claim.p(P::Limit)
    };
    let order = claim_order(n, prio);
    let bump = n
        .attempt
        .as_ref()
        .map_or(String::new(), |a| format!(", {a} = {}", next_of(a, flavor)));
    let delivery = n
        .attempt
        .as_ref()
        .map_or("CAST(1 AS BIGINT)".to_owned(), |a| {
            format!("CAST({} AS BIGINT)", delivery_of(a, flavor))
        });
    let returned = n.reads(
        "(SELECT stagedoor_attempt FROM stagedoor_batch WHERE stagedoor_id = {id})"
            .replace("{id}", id),
    );
    let (lock, picked, matched, at) = pick_and_match(id, flavor);
    let pick = format!(
        "SELECT {id} AS stagedoor_id, {delivery} AS stagedoor_attempt{picked} FROM {t} WHERE {} ORDER BY {order} LIMIT {limit}{lock}",
        cond.join(" AND ")
    );
    claim.sql = format!(
        "WITH stagedoor_batch AS MATERIALIZED ({pick}) UPDATE {t} SET {locked} = {lease}{bump} WHERE {matched} RETURNING {returned}{at}"
    );
    claim
}

/// The conditions of a claim's pick, in the order their parameters are numbered: the lease
/// ran out ([`P::Reclaim`]), the group, the due time (or a stray's, `strays`), the floor
/// (`floor`), and a FIFO group's rows none of which is running.
fn claim_conds(n: &Names, claim: &mut Stmt, g: &str, floor: bool, strays: bool) -> Vec<String> {
    let (t, locked, group, due) = (&n.t, &n.locked, &n.group, &n.due);
    // `now` is bound only where a condition reads it (a table without `retry_after`
    // and FIFO reads none: an unused parameter has no type Postgres can infer).
    let reclaim = claim.p(P::Reclaim);
    let mut cond = vec![format!("({locked} IS NULL OR {locked} <= {reclaim})")];
    if let Some(gc) = group {
        cond.push(format!("{gc} = {g}"));
    } else {
        cond.push(format!("CAST({g} AS TEXT) IS NOT NULL"));
    }
    if let Some(d) = due {
        if strays {
            // On SQLite, a text sorting at or after ':' (just after '9') is no
            // timestamp (those start with a digit or a sign), nor is a blob: such a
            // row would never be due and never read.
            cond.push(format!("{d} >= ':'"));
        } else {
            let now = claim.p(P::Now);
            cond.push(format!("{d} <= {now}"));
        }
        if floor {
            let f = claim.p(P::Floor);
            cond.push(format!("{d} >= {f}"));
        }
    }
    if let (Some(gc), true) = (group, n.table.fifo) {
        let now = claim.p(P::Now);
        cond.push(format!(
            "NOT EXISTS (SELECT 1 FROM {t} AS busy WHERE busy.{gc} = {g} AND busy.{locked} > {now})"
        ));
    }
    cond
}

/// The order of a claim: due order (then id), after the priority, highest first (`prio`).
fn claim_order(n: &Names, prio: bool) -> String {
    let (id, due) = (&n.id, &n.due);
    let order = due.as_ref().map_or(id.clone(), |d| format!("{d}, {id}"));
    match (&n.priority, prio) {
        (Some(p), true) => format!("{p} DESC, {order}"),
        _ => order,
    }
}

/// What differs by flavor in a claim: the pick's lock, what it keeps of each row, how the
/// update finds the picked rows, what the update returns after the row's values.
fn pick_and_match(id: &str, flavor: Flavor) -> (&'static str, &'static str, String, &'static str) {
    let lock = match flavor {
        Flavor::Postgres => " FOR UPDATE SKIP LOCKED",
        Flavor::Sqlite => "",
    };
    // Postgres finds the picked rows again by their place (a TID scan): by id, the planner
    // may walk a whole index per row (see [`build_claim`]), and a table under a pinned xmin
    // makes every such walk longer. The rows are locked by the pick, so their place holds.
    let (picked, matched, at) = match flavor {
        Flavor::Postgres => (
            ", ctid AS stagedoor_ctid",
            "ctid = ANY(ARRAY(SELECT stagedoor_ctid FROM stagedoor_batch))".to_owned(),
            ", CAST(ctid AS TEXT)",
        ),
        Flavor::Sqlite => (
            "",
            format!("{id} IN (SELECT stagedoor_id FROM stagedoor_batch)"),
            "",
        ),
    };
    (lock, picked, matched, at)
}
