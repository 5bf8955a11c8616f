//! The statements of one job table, built once from its validated layout.
//!
//! Only identifiers that passed [`is_plain_identifier`] are written into SQL, always quoted;
//! every value is a bind parameter, named by [`P`] and numbered in order of first use.

use stagedoor_jobs::inbox::{Column, Table, is_plain_identifier};

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

/// The bound attempt count `p`, typed: a statement prepared without argument types (the
/// startup check) would otherwise type it as the column (`SMALLINT`), and the driver's 8-byte
/// value would then not fit the cached statement.
fn attempt_param(p: &str) -> String {
    format!("CAST({p} AS BIGINT)")
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

/// The statements of a table. Reads return, in this order: id (text), attempt (bigint), payload,
/// locked_until, retry_after, last_error, headers, enqueued_at (missing roles read as NULL).
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
    /// SQLite only (a table with `retry_after`): claims the rows whose `retry_after` sorts after
    /// every timestamp (a text such as `'soon'`, a blob), which the claim would never reach, so
    /// that they are read, found unreadable and dead-lettered alone. Run when a claim came back
    /// empty. Empty elsewhere (Postgres types the column).
    pub(crate) claim_strays: Stmt,
    /// [`Statements::next_due`] bounded the same way.
    pub(crate) next_due_from: Stmt,
    pub(crate) renew: Stmt,
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
    pub(crate) list: Stmt,
    pub(crate) replay_group: Stmt,
    pub(crate) purge: Stmt,
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

/// The name the inserts return each stored row's id under (as text).
const INSERTED: &str = "stagedoor_inserted_id";

/// What an insert returns: the id (as text) of each row it stored; a row skipped because its id
/// was taken returns nothing.
fn insert_returning(id: &str) -> String {
    format!(" RETURNING CAST({id} AS TEXT) AS {INSERTED}")
}

fn insert_conflict(table: &Table) -> &'static str {
    if table.id.generated {
        ""
    } else {
        " ON CONFLICT DO NOTHING"
    }
}

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
    problems
}

impl Statements {
    /// Builds the statements of a validated table.
    pub(crate) fn new(table: Table, flavor: Flavor) -> Self {
        let t = table.qualified();
        let col = |c: Option<Column>| c.map(|c| q(c.name));
        let id = q(table.id.name);
        let attempt = col(table.attempt);
        let locked = q(table.locked_until.map_or("locked_until", |c| c.name));
        let group = col(table.group);
        let due = col(table.retry_after);
        let null = || "NULL".to_owned();
        let attempt_read = attempt
            .as_ref()
            .map_or("CAST(1 AS BIGINT)".to_owned(), |a| {
                format!("CAST({a} AS BIGINT)")
            });
        let reads = |attempt_expr: String| {
            [
                format!("CAST({id} AS TEXT)"),
                attempt_expr,
                q(table.payload.name),
                locked.clone(),
                due.clone().unwrap_or_else(null),
                col(table.last_error).unwrap_or_else(null),
                col(table.headers).unwrap_or_else(null),
                col(table.enqueued_at).unwrap_or_else(null),
            ]
            .join(", ")
        };

        // Claim: lease and count in one statement; returns the delivery's number (the stored
        // count before the claim, clamped: see [`delivery_of`]), which the batch carries out of
        // its pick, since `RETURNING` sees the row as updated. The counter saturates at
        // `MAX_ATTEMPT` ([`next_of`]): a `SMALLINT` column never overflows, a claim never fails
        // on it. The batch is picked in a `MATERIALIZED` CTE, which runs once whatever the plan:
        // on Postgres, `WHERE id IN (SELECT .. LIMIT n FOR UPDATE SKIP LOCKED)` lets the planner
        // pick a nested-loop semi join that runs the subquery again for every outer row, each
        // run skipping the rows the last one locked, so that the claim leases far more than `n`
        // rows (seen with statistics that say the table is nearly empty: a worked-off queue
        // after ANALYZE). SQLite has one writer and computes the CTE once, before the update.
        let build_claim = |floor: bool, strays: bool| {
            let mut claim = Stmt::default();
            let lease = claim.p(P::NewLease);
            let g = claim.p(P::Group);
            // `now` is bound only where a condition reads it (a table without `retry_after`
            // and FIFO reads none: an unused parameter has no type Postgres can infer).
            let reclaim = claim.p(P::Reclaim);
            let mut cond = vec![format!("({locked} IS NULL OR {locked} <= {reclaim})")];
            if let Some(gc) = &group {
                cond.push(format!("{gc} = {g}"));
            } else {
                cond.push(format!("CAST({g} AS TEXT) IS NOT NULL"));
            }
            if let Some(d) = &due {
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
            if let (Some(gc), true) = (&group, table.fifo) {
                let now = claim.p(P::Now);
                cond.push(format!(
                    "NOT EXISTS (SELECT 1 FROM {t} AS busy WHERE busy.{gc} = {g} AND busy.{locked} > {now})"
                ));
            }
            let limit = if table.fifo {
                "1".to_owned()
            } else {
                claim.p(P::Limit)
            };
            let order = due.as_ref().map_or(id.clone(), |d| format!("{d}, {id}"));
            let bump = attempt
                .as_ref()
                .map_or(String::new(), |a| format!(", {a} = {}", next_of(a, flavor)));
            let delivery = attempt
                .as_ref()
                .map_or("CAST(1 AS BIGINT)".to_owned(), |a| {
                    format!("CAST({} AS BIGINT)", delivery_of(a, flavor))
                });
            let returned = reads(
                "(SELECT stagedoor_attempt FROM stagedoor_batch WHERE stagedoor_id = {id})"
                    .replace("{id}", &id),
            );
            let lock = match flavor {
                Flavor::Postgres => " FOR UPDATE SKIP LOCKED",
                Flavor::Sqlite => "",
            };
            let pick = format!(
                "SELECT {id} AS stagedoor_id, {delivery} AS stagedoor_attempt FROM {t} WHERE {} ORDER BY {order} LIMIT {limit}{lock}",
                cond.join(" AND ")
            );
            claim.sql = format!(
                "WITH stagedoor_batch AS MATERIALIZED ({pick}) UPDATE {t} SET {locked} = {lease}{bump} WHERE {id} IN (SELECT stagedoor_id FROM stagedoor_batch) RETURNING {returned}"
            );
            claim
        };
        let claim = build_claim(false, false);
        let bounded = flavor == Flavor::Postgres && due.is_some() && !table.fifo;
        let claim_from = if bounded {
            build_claim(true, false)
        } else {
            Stmt::default()
        };
        let claim_strays = if flavor == Flavor::Sqlite && due.is_some() {
            build_claim(false, true)
        } else {
            Stmt::default()
        };

        let id_cond = |s: &mut Stmt| -> String {
            let p = s.p(P::Id);
            format!("{id} = {p}")
        };

        let mut renew = Stmt::default();
        {
            let new = renew.p(P::NewLease);
            let idc = id_cond(&mut renew);
            let f = fence(&mut renew, &locked);
            renew.sql = format!("UPDATE {t} SET {locked} = {new} WHERE {idc} AND {f}");
        }

        let mut delete_fenced = Stmt::default();
        {
            let idc = id_cond(&mut delete_fenced);
            let f = fence(&mut delete_fenced, &locked);
            delete_fenced.sql = format!("DELETE FROM {t} WHERE {idc} AND {f}");
        }

        let build_retry = |move_due: bool| {
            let mut s = Stmt::default();
            let mut sets = vec![format!("{locked} = NULL")];
            if let (Some(d), true) = (&due, move_due) {
                let p = s.p(P::Due);
                sets.push(format!("{d} = {p}"));
            }
            if let Some(e) = col(table.last_error) {
                let p = s.p(P::Error);
                sets.push(format!("{e} = {p}"));
            }
            let idc = id_cond(&mut s);
            let f = fence(&mut s, &locked);
            s.sql = format!("UPDATE {t} SET {} WHERE {idc} AND {f}", sets.join(", "));
            s
        };
        let retry = build_retry(true);
        let retry_keep_place = build_retry(false);

        let mut dead_group = Stmt::default();
        if let Some(g) = &group {
            let s = &mut dead_group;
            let target = s.p(P::Target);
            let mut sets = vec![format!("{locked} = NULL"), format!("{g} = {target}")];
            // A dead letter stores the attempts it spent: a subscriber of the dead-letter group
            // sees that number on its first delivery of it, and a listing reports it.
            if let Some(a) = &attempt {
                let p = s.p(P::Attempt);
                sets.push(format!("{a} = {}", attempt_param(&p)));
            }
            if let Some(d) = &due {
                let p = s.p(P::Now);
                sets.push(format!("{d} = {p}"));
            }
            if let Some(e) = col(table.last_error) {
                let p = s.p(P::Error);
                sets.push(format!("{e} = {p}"));
            }
            if let Some(h) = col(table.headers) {
                let p = s.p(P::Headers);
                sets.push(format!("{h} = {p}"));
            }
            let idc = id_cond(s);
            let f = fence(s, &locked);
            s.sql = format!("UPDATE {t} SET {} WHERE {idc} AND {f}", sets.join(", "));
        }

        let mut insert = Stmt::default();
        let mut insert_row = Vec::new();
        let insert_cols;
        {
            let s = &mut insert;
            let mut cols = Vec::new();
            let mut vals = Vec::new();
            let mut put = |c: Option<Column>, p: P, s: &mut Stmt| {
                if let Some(c) = c {
                    cols.push(q(c.name));
                    vals.push(s.p(p));
                    insert_row.push(Some(p));
                }
            };
            put(table.group, P::Group, s);
            put(Some(table.payload), P::Payload, s);
            put(table.retry_after, P::Due, s);
            put(table.enqueued_at, P::EnqueuedAt, s);
            put(table.headers, P::Headers, s);
            put((!table.id.generated).then_some(table.id), P::JobId, s);
            if let Some(a) = table.attempt.filter(|a| !a.generated) {
                cols.push(q(a.name));
                vals.push("1".to_owned());
                insert_row.push(None);
            }
            s.sql = format!(
                "INSERT INTO {t} ({}) VALUES ({}){}{}",
                cols.join(", "),
                vals.join(", "),
                insert_conflict(&table),
                insert_returning(&id)
            );
            insert_cols = cols.join(", ");
        }

        let insert_notify = match flavor {
            Flavor::Sqlite => insert.clone(),
            Flavor::Postgres => {
                let mut s = insert.clone();
                let g = s.p(P::Group);
                s.sql = format!(
                    "WITH ins AS ({}) SELECT ins.{INSERTED}, pg_notify('{CHANNEL}', CAST({g} AS TEXT)) FROM ins",
                    s.sql
                );
                s
            }
        };

        let group_cond = |s: &mut Stmt| -> String {
            let g = s.p(P::Group);
            match &group {
                Some(gc) => format!("{gc} = {g}"),
                None => format!("CAST({g} AS TEXT) IS NOT NULL"),
            }
        };

        let mut stats = Stmt::default();
        {
            let s = &mut stats;
            let gc = group_cond(s);
            let now = s.p(P::Now);
            let free = format!("({locked} IS NULL OR {locked} <= {now})");
            let (ready, delayed, oldest) = match &due {
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
        }

        let mut list = Stmt::default();
        {
            let gc = group_cond(&mut list);
            let order = due
                .as_ref()
                .map_or(format!("{id} DESC"), |d| format!("{d} DESC, {id} DESC"));
            list.sql = format!(
                "SELECT {} FROM {t} WHERE {gc} ORDER BY {order}",
                reads(attempt_read.clone())
            );
        }

        let mut replay_group = Stmt::default();
        if let Some(g) = &group {
            let s = &mut replay_group;
            let origin = s.p(P::Target);
            let mut sets = vec![format!("{g} = {origin}"), format!("{locked} = NULL")];
            if let Some(a) = &attempt {
                sets.push(format!("{a} = 1"));
            }
            if let Some(d) = &due {
                let p = s.p(P::Now);
                sets.push(format!("{d} = {p}"));
            }
            if let Some(h) = col(table.headers) {
                let p = s.p(P::Headers);
                sets.push(format!("{h} = {p}"));
            }
            let idc = id_cond(s);
            let dg = s.p(P::Group);
            s.sql = format!(
                "UPDATE {t} SET {} WHERE {idc} AND {g} = {dg}",
                sets.join(", ")
            );
        }

        let mut purge = Stmt::default();
        {
            let idc = id_cond(&mut purge);
            let gc = group_cond(&mut purge);
            purge.sql = format!("DELETE FROM {t} WHERE {idc} AND {gc}");
        }

        // When the next row becomes claimable: a waiting row at its due time, a claimed one when
        // its lease ends (its worker may have died).
        let mut next_due = Stmt::default();
        {
            let gc = group_cond(&mut next_due);
            let when = match &due {
                Some(d) => format!("CASE WHEN {locked} IS NULL THEN {d} ELSE {locked} END"),
                None => locked.clone(),
            };
            next_due.sql = format!("SELECT MIN({when}) FROM {t} WHERE {gc}");
        }
        let mut next_due_from = Stmt::default();
        if let (Some(d), true) = (&due, bounded) {
            let s = &mut next_due_from;
            let gc = group_cond(s);
            let f = s.p(P::Floor);
            s.sql = format!(
                "SELECT MIN(CASE WHEN {locked} IS NULL THEN {d} ELSE {locked} END) FROM {t} WHERE {gc} AND {d} >= {f}"
            );
        }

        let mut delete_by_id = Stmt::default();
        {
            let idc = id_cond(&mut delete_by_id);
            delete_by_id.sql = format!("DELETE FROM {t} WHERE {idc}");
        }

        // A row just copied into a table: no lease, due now, the error and headers of the move.
        // A replayed row starts counting again (`replayed`: its next delivery is 1); a dead
        // letter stores the attempts it spent (seed 002: "payload and attempt as they were").
        let build_clear = |replayed: bool| {
            let mut s = Stmt::default();
            let mut sets = vec![format!("{locked} = NULL")];
            if let Some(a) = &attempt {
                if replayed {
                    sets.push(format!("{a} = 1"));
                } else {
                    let p = s.p(P::Attempt);
                    sets.push(format!("{a} = {}", attempt_param(&p)));
                }
            }
            if let Some(d) = &due {
                let p = s.p(P::Now);
                sets.push(format!("{d} = {p}"));
            }
            if let Some(e) = col(table.last_error) {
                let p = s.p(P::Error);
                sets.push(format!("{e} = {p}"));
            }
            if let Some(h) = col(table.headers) {
                let p = s.p(P::Headers);
                sets.push(format!("{h} = {p}"));
            }
            let idc = id_cond(&mut s);
            s.sql = format!("UPDATE {t} SET {} WHERE {idc}", sets.join(", "));
            s
        };
        let clear_lease = build_clear(true);
        let mark_dead = build_clear(false);

        Self {
            table,
            qualified: t,
            claim,
            claim_from,
            claim_strays,
            next_due_from,
            renew,
            delete_fenced,
            retry,
            retry_keep_place,
            dead_group,
            insert,
            insert_notify,
            stats,
            list,
            replay_group,
            purge,
            next_due,
            delete_by_id,
            clear_lease,
            mark_dead,
            insert_cols,
            insert_row,
            insert_conflict: insert_conflict(&table),
            id_col: id,
            locked_col: locked,
        }
    }

    /// An insert of `n` rows (at most [`MAX_ROWS`]) in one statement, and the value of each
    /// placeholder in order: bind row 1's values, then row 2's, ... Returns the id (as text)
    /// of each row it stored, in no particular order.
    pub(crate) fn insert_many(&self, n: usize) -> (String, &[Option<P>]) {
        let mut k = 0;
        let tuples: Vec<String> = (0..n)
            .map(|_| {
                let vals: Vec<String> = self
                    .insert_row
                    .iter()
                    .map(|p| match p {
                        Some(_) => {
                            k += 1;
                            format!("${k}")
                        }
                        None => "1".to_owned(),
                    })
                    .collect();
                format!("({})", vals.join(", "))
            })
            .collect();
        let sql = format!(
            "INSERT INTO {} ({}) VALUES {}{}{}",
            self.qualified,
            self.insert_cols,
            tuples.join(", "),
            self.insert_conflict,
            insert_returning(&self.id_col)
        );
        (sql, &self.insert_row)
    }

    /// A fenced delete of `n` rows (at most [`MAX_ROWS`]): binds the id and the [`FENCES`]
    /// lease values of each, in order; returns the id (as text) of every row it deleted.
    pub(crate) fn delete_many(&self, n: usize) -> String {
        let (id, locked) = (&self.id_col, &self.locked_col);
        let per = 1 + FENCES;
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
        format!(
            "DELETE FROM {} WHERE {} RETURNING CAST({id} AS TEXT)",
            self.qualified,
            conds.join(" OR ")
        )
    }

    /// The same statements against another table with the same columns (a dead-letter table).
    pub(crate) fn for_table(&self, name: &'static str, flavor: Flavor) -> Self {
        let mut t = self.table;
        t.name = name;
        Self::new(t, flavor)
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

    /// Whether the table has no statement for `s` (a role it lacks).
    pub(crate) fn lacks(s: &Stmt) -> bool {
        s.is_empty()
    }
}
