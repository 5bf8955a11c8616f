//! The statements of inspection and of the dead letters' care within a table: a group's
//! counts, its listing, its delayed rows, a replay back to the origin group, a purge.

use super::parts::{Names, P, Stmt, col};

/// The inspecting statements of a table (see the fields of the same names in
/// [`Statements`](super::Statements)).
pub(super) struct Inspects {
    pub(super) stats: Stmt,
    pub(super) list: Stmt,
    pub(super) oldest: Stmt,
    pub(super) walk: Stmt,
    pub(super) walk_after: Stmt,
    pub(super) find_id: Stmt,
    pub(super) find_job: Stmt,
    pub(super) find_either: Stmt,
    pub(super) delayed: Stmt,
    pub(super) replay_group: Stmt,
    pub(super) purge: Stmt,
    pub(super) cancel: Stmt,
    pub(super) exists: Stmt,
}

pub(super) fn build(n: &Names) -> Inspects {
    Inspects {
        stats: stats(n),
        list: list(n),
        oldest: oldest(n),
        walk: walk(n, false),
        walk_after: walk(n, true),
        find_id: find(n, true, false),
        find_job: find(n, false, true),
        find_either: find(n, true, true),
        delayed: delayed(n),
        replay_group: replay_group(n),
        purge: purge(n),
        cancel: cancel(n),
        exists: exists(n),
    }
}

/// A group's counts: ready, running, delayed, and the oldest ready row's due time.
fn stats(n: &Names) -> Stmt {
    let (t, locked) = (&n.t, &n.locked);
    let mut s = Stmt::default();
    let gc = n.group_cond(&mut s);
    let now = s.p(P::Now);
    let free = format!("({locked} IS NULL OR {locked} <= {now})");
    let (ready, delayed, oldest) = match &n.due {
        Some(d) => (
            format!("{free} AND {d} <= {now}"),
            format!("{free} AND {d} > {now}"),
            format!("MIN(CASE WHEN {free} AND {d} <= {now} THEN {d} END)"),
        ),
        None => (free.clone(), "1 = 0".to_owned(), "NULL".to_owned()),
    };
    s.sql = format!(
        "SELECT CAST(COALESCE(SUM(CASE WHEN {ready} THEN 1 ELSE 0 END), 0) AS BIGINT), CAST(COALESCE(SUM(CASE WHEN {locked} > {now} THEN 1 ELSE 0 END), 0) AS BIGINT), CAST(COALESCE(SUM(CASE WHEN {delayed} THEN 1 ELSE 0 END), 0) AS BIGINT), {oldest} FROM {t} WHERE {gc}"
    );
    s
}

/// The order of a listing: newest first.
fn newest_first(n: &Names) -> String {
    let id = &n.id;
    n.due
        .as_ref()
        .map_or(format!("{id} DESC"), |d| format!("{d} DESC, {id} DESC"))
}

/// A group's rows, newest first, a page at a time: at most `Limit` rows after the first
/// `Offset`.
fn list(n: &Names) -> Stmt {
    let (t, order) = (&n.t, newest_first(n));
    let mut list = Stmt::default();
    let gc = n.group_cond(&mut list);
    let limit = list.p(P::Limit);
    let offset = list.p(P::Offset);
    list.sql = format!(
        "SELECT {} FROM {t} WHERE {gc} ORDER BY {order} LIMIT {limit} OFFSET {offset}",
        n.reads(n.attempt_read())
    );
    list
}

/// A group's oldest row (the one listed last): one row read.
fn oldest(n: &Names) -> Stmt {
    let (t, id) = (&n.t, &n.id);
    let oldest_order = n
        .due
        .as_ref()
        .map_or(format!("{id} ASC"), |d| format!("{d} ASC, {id} ASC"));
    let mut oldest = Stmt::default();
    let gc = n.group_cond(&mut oldest);
    oldest.sql = format!(
        "SELECT {} FROM {t} WHERE {gc} ORDER BY {oldest_order} LIMIT 1",
        n.reads(n.attempt_read())
    );
    oldest
}

/// A walk over a group by id, a page of `Limit` rows at a time, each page starting after the
/// last id of the one before (`after`: `walk_after`): a replay or purge of many rows holds one
/// page, and rows moved away or added meanwhile neither shift nor repeat a page.
fn walk(n: &Names, after: bool) -> Stmt {
    let (t, id) = (&n.t, &n.id);
    let mut s = Stmt::default();
    let gc = n.group_cond(&mut s);
    let cond = if after {
        let p = s.p(P::Id);
        format!(" AND {id} > {p}")
    } else {
        String::new()
    };
    let limit = s.p(P::Limit);
    s.sql = format!(
        "SELECT {} FROM {t} WHERE {gc}{cond} ORDER BY {id} LIMIT {limit}",
        n.reads(n.attempt_read())
    );
    s
}

/// The rows of a group that one id may name (see `DeadSelector::Id`): the row of that id
/// (`find_id`), the rows whose headers may hold it as their job's id (`find_job`: `JobId` is a
/// `LIKE` pattern, the rows it takes are checked once read), or either (`find_either`). Empty
/// without a headers column.
fn find(n: &Names, by_id: bool, by_job: bool) -> Stmt {
    let (t, order) = (&n.t, newest_first(n));
    let mut s = Stmt::default();
    let gc = n.group_cond(&mut s);
    let mut conds = Vec::new();
    if by_id {
        conds.push(n.id_cond(&mut s));
    }
    if by_job {
        let Some(h) = col(n.table.headers) else {
            return Stmt::default();
        };
        let pat = s.p(P::JobId);
        conds.push(format!("CAST({h} AS TEXT) LIKE {pat} ESCAPE '!'"));
    }
    s.sql = format!(
        "SELECT {} FROM {t} WHERE {gc} AND ({}) ORDER BY {order}",
        n.reads(n.attempt_read()),
        conds.join(" OR ")
    );
    s
}

/// The rows of a group due later than now, soonest first (none without a due column).
fn delayed(n: &Names) -> Stmt {
    let (t, id) = (&n.t, &n.id);
    let mut delayed = Stmt::default();
    if let Some(d) = &n.due {
        let s = &mut delayed;
        let gc = n.group_cond(s);
        let now = s.p(P::Now);
        let limit = s.p(P::Limit);
        s.sql = format!(
            "SELECT {} FROM {t} WHERE {gc} AND {d} > {now} ORDER BY {d}, {id} LIMIT {limit}",
            n.reads(n.attempt_read())
        );
    }
    delayed
}

/// A dead letter back to its origin group: no lease, attempt 1, due now, its headers.
fn replay_group(n: &Names) -> Stmt {
    let (t, locked) = (&n.t, &n.locked);
    let mut replay_group = Stmt::default();
    if let Some(g) = &n.group {
        let s = &mut replay_group;
        let origin = s.p(P::Target);
        let mut sets = vec![format!("{g} = {origin}"), format!("{locked} = NULL")];
        if let Some(a) = &n.attempt {
            sets.push(format!("{a} = 1"));
        }
        if let Some(d) = &n.due {
            let p = s.p(P::Now);
            sets.push(format!("{d} = {p}"));
        }
        if let Some(h) = col(n.table.headers) {
            let p = s.p(P::Headers);
            sets.push(format!("{h} = {p}"));
        }
        let idc = n.id_cond(s);
        let dg = s.p(P::Group);
        // A row a subscriber of the dead-letter group is running is left to it.
        let now = s.p(P::Now);
        s.sql = format!(
            "UPDATE {t} SET {} WHERE {idc} AND {g} = {dg} AND ({locked} IS NULL OR {locked} <= {now})",
            sets.join(", ")
        );
    }
    replay_group
}

/// Deletes a dead letter.
fn purge(n: &Names) -> Stmt {
    let (t, locked) = (&n.t, &n.locked);
    let mut purge = Stmt::default();
    let idc = n.id_cond(&mut purge);
    let gc = n.group_cond(&mut purge);
    // A row a subscriber of the dead-letter group is running is left to it.
    let now = purge.p(P::Now);
    purge.sql =
        format!("DELETE FROM {t} WHERE {idc} AND {gc} AND ({locked} IS NULL OR {locked} <= {now})");
    purge
}

/// Deletes a row unless it is running.
fn cancel(n: &Names) -> Stmt {
    let (t, locked) = (&n.t, &n.locked);
    let mut cancel = Stmt::default();
    let idc = n.id_cond(&mut cancel);
    let gc = n.group_cond(&mut cancel);
    let now = cancel.p(P::Now);
    cancel.sql =
        format!("DELETE FROM {t} WHERE {idc} AND {gc} AND ({locked} IS NULL OR {locked} <= {now})");
    cancel
}

/// Whether a row of a group is there.
fn exists(n: &Names) -> Stmt {
    let (t, id) = (&n.t, &n.id);
    let mut exists = Stmt::default();
    let idc = n.id_cond(&mut exists);
    let gc = n.group_cond(&mut exists);
    exists.sql = format!("SELECT {id} FROM {t} WHERE {idc} AND {gc}");
    exists
}
