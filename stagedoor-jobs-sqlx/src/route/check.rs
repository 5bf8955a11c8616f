//! The startup check of a route: the table's statements validated, its column types against
//! the row's fields, every statement prepared against the table, each mount's needs (attempt,
//! headers and group columns, a dead-letter table that can take its rows), and on SQLite an id
//! that could be reused by a later row.

use std::sync::Arc;

use stagedoor_jobs::Inbox;
use stagedoor_jobs::broker::{MountInfo, Problem};
use stagedoor_jobs::inbox::{ColumnType, Table};

use stagedoor_jobs::BrokerError;
use stagedoor_jobs::kit::lock;

use super::SqlxRoute;
use crate::dialect::sealed::Value;
use crate::dialect::{Dialect, acquire, db_err};
use crate::locks::BOOKKEEPING;
use crate::sql::{Flavor, Statements, Stmt};

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    /// [`Broker::check`](stagedoor_jobs::Broker::check): the table, its columns and every statement
    /// this route runs, against the mounts on it.
    pub(super) async fn check_mounts(&self, mounts: &[MountInfo]) -> Vec<Problem> {
        let table = self.table();
        let stmts = match &self.inner.stmts {
            Ok(s) => Arc::clone(s),
            Err(ps) => {
                return ps
                    .iter()
                    .map(|p| table_problem(table.name, p.clone()))
                    .collect();
            }
        };
        let Ok(pool) = self.pool() else {
            return vec![Problem {
                mount: "*".to_owned(),
                message: "the broker is not connected".to_owned(),
            }];
        };
        // Each role's column type against what the row's field needs, all at once; when
        // one is wrong, the statements' preparation would only add the database's first
        // error about it.
        let column_problems = crate::columns::check::<DB>(pool, table).await;
        let columns_ok = column_problems.is_empty();
        let mut problems: Vec<Problem> = column_problems
            .into_iter()
            .map(|message| table_problem(table.name, message))
            .collect();
        if columns_ok {
            problems.extend(self.statement_problem(&stmts).await);
        }
        for m in mounts {
            problems.extend(self.mount_problems(m, &stmts, pool).await);
        }
        problems.extend(self.id_reuse_problem(mounts, pool).await);
        if DB::FLAVOR == Flavor::Postgres && problems.is_empty() {
            let dead_tables: Vec<&str> = if self.grouped() {
                Vec::new()
            } else {
                mounts
                    .iter()
                    .filter_map(|m| m.dead_letter.as_deref())
                    .collect()
            };
            problems.extend(self.privilege_problems(pool, &dead_tables).await);
        }
        if table.retry_after.is_none() {
            tracing::warn!(
                table = table.name,
                "no retry_after column: retry_after(d) and delayed jobs return the row at once"
            );
        }
        problems
    }

    /// Every statement this route will run, prepared against the table now: a missing or
    /// misspelt column stops the service with its name (the first statement that fails).
    async fn statement_problem(&self, stmts: &Statements) -> Option<Problem> {
        let named: [(&str, &Stmt); 13] = [
            ("claim", &stmts.claim),
            ("claim by priority", &stmts.claim_prio),
            ("renew", &stmts.renew),
            ("ack", &stmts.delete_fenced),
            ("retry", &stmts.retry),
            ("retry in place", &stmts.retry_keep_place),
            ("dead letter", &stmts.dead_group),
            ("publish", &stmts.insert),
            ("stats", &stmts.stats),
            ("list", &stmts.list),
            ("replay", &stmts.replay_group),
            ("purge", &stmts.purge),
            ("next due", &stmts.next_due),
        ];
        for (name, stmt) in named {
            if Statements::lacks(stmt) {
                continue;
            }
            if let Err(e) = self.prepare_only(stmt.sql.clone()).await {
                let message = format!(
                    "the {name} statement does not prepare against the table: {e}: create the table, or make its columns match the fields of `{}`",
                    std::any::type_name::<Row>()
                );
                return Some(table_problem(self.table().name, message));
            }
        }
        None
    }

    /// What mount `m` needs of the table (an attempt column for a cap, a headers column for a
    /// kind, its queue on a table without groups, a dead-letter table that can take its rows).
    /// Records the dead letter it declares, for listings.
    async fn mount_problems(
        &self,
        m: &MountInfo,
        stmts: &Statements,
        pool: &sqlx::Pool<DB>,
    ) -> Vec<Problem> {
        let table = self.table();
        let mut messages = Vec::new();
        if m.max_attempts.is_some() && table.attempt.is_none() {
            messages.push(format!(
                "max_attempts needs an attempt column, and table `{}` has none: add an integer column with `#[field(attempt)]`",
                table.name
            ));
        }
        if m.kind.is_some() && table.headers.is_none() {
            messages.push(format!(
                "subscribing to a kind needs a headers column to store it, and table `{}` has none: add `#[field(headers)]`, or give the kind its own group",
                table.name
            ));
        }
        if table.group.is_none() && m.queue != *self.default_group && m.queue != table.name {
            messages.push(format!(
                "table `{}` has no group column, so its one queue is `{}`: subscribe to that name",
                table.name, self.default_group
            ));
        }
        if let Some(dead) = &m.dead_letter {
            lock(&self.inner.declared_dead).insert(dead.clone(), m.queue.clone());
            if !self.grouped() {
                messages.extend(self.dead_table_problems(dead, stmts, pool).await);
            }
        }
        let mount = format!("mount `{}` on queue `{}`", m.subscriber, m.queue);
        messages
            .into_iter()
            .map(|message| Problem {
                mount: mount.clone(),
                message,
            })
            .collect()
    }

    /// Whether the dead-letter table `dead` exists and can take this table's rows (the copy
    /// prepares, its columns are what a dead letter needs).
    async fn dead_table_problems(
        &self,
        dead: &str,
        stmts: &Statements,
        pool: &sqlx::Pool<DB>,
    ) -> Vec<String> {
        let dead_stmts = match self.dead_table(dead).await {
            Err(e) => return vec![format!("{e}")],
            Ok(s) => s,
        };
        let copy = stmts.copy_into(dead, true);
        if let Err(e) = self.prepare_only(copy.sql.clone()).await {
            return vec![format!(
                "the dead-letter table `{dead}` cannot take rows of `{}`: {e}: create it with the same columns",
                self.table().name
            )];
        }
        crate::columns::check_dead_table::<DB>(pool, &dead_stmts.table)
            .await
            .into_iter()
            .map(|message| format!("dead-letter table `{dead}`: {message}"))
            .collect()
    }

    /// A dead letter moved to another table keeps its id (a replay brings it back with it).
    /// SQLite gives a new row the id of a deleted one unless the id column is AUTOINCREMENT,
    /// so a later row could take the id of a dead letter: it could then never be moved into
    /// the dead table (the copy conflicts; the row is claimed again after every lease,
    /// forever), nor that dead letter be replayed.
    async fn id_reuse_problem(
        &self,
        mounts: &[MountInfo],
        pool: &sqlx::Pool<DB>,
    ) -> Option<Problem> {
        let table = self.table();
        if self.grouped()
            || !table.id.generated
            || table.id.ty != ColumnType::Integer
            || !mounts.iter().any(|m| m.dead_letter.is_some())
        {
            return None;
        }
        let reuses = match acquire(pool).await {
            Ok(mut conn) => DB::reuses_ids(&mut conn, table).await,
            Err(_) => None,
        };
        (reuses == Some(true)).then(|| table_problem(table.name, format!(
            "its dead letters move to another table with their ids, and SQLite gives new rows the ids of deleted ones unless the id is declared `{} INTEGER PRIMARY KEY AUTOINCREMENT`: a row that takes a dead letter's id could never be dead-lettered; declare the id column so",
            table.id.name
        )))
    }

    /// What the connected role may not do that a service needs (Postgres): read and change
    /// the job table and its dead-letter tables (and take numbers from the sequence of a
    /// generated id), and use the bookkeeping tables, or create those missing. Each problem
    /// names the statement that fixes it.
    async fn privilege_problems(
        &self,
        pool: &sqlx::Pool<DB>,
        dead_tables: &[&str],
    ) -> Vec<Problem> {
        match self.privileges(pool, dead_tables).await {
            Ok(problems) => problems,
            Err(e) => vec![Problem {
                mount: "*".to_owned(),
                message: format!("cannot read the connected role's privileges: {e}"),
            }],
        }
    }

    async fn privileges(
        &self,
        pool: &sqlx::Pool<DB>,
        dead_tables: &[&str],
    ) -> Result<Vec<Problem>, BrokerError> {
        let table = self.table();
        let mut conn = acquire(pool).await?;
        let who = DB::fetch(
            &mut conn,
            "SELECT CAST(current_user AS TEXT), CAST(current_schema() AS TEXT), CAST(COALESCE(has_schema_privilege(current_schema(), 'CREATE'), false) AS TEXT)".to_owned(),
            Vec::new(),
        )
        .await
        .map_err(db_err)?;
        let Some(row) = who.first() else {
            return Ok(Vec::new());
        };
        let role = text::<DB>(row, 0)?;
        let who = Who {
            role_q: format!("\"{}\"", role.replace('"', "\"\"")),
            role,
            schema: text::<DB>(row, 1)?,
            can_create: text::<DB>(row, 2)? == "true",
        };
        let role = &who.role;
        let mut problems = Vec::new();

        let mut job_tables = vec![(table.qualified(), table.name.to_owned(), "the job table")];
        for dead in dead_tables {
            let qualified = match table.schema {
                Some(s) => format!("\"{s}\".\"{dead}\""),
                None => format!("\"{dead}\""),
            };
            job_tables.push((qualified, (*dead).to_owned(), "a dead-letter table"));
        }
        for (qualified, name, what) in job_tables {
            match lacking::<DB>(&mut conn, qualified.clone()).await? {
                Some(missing) if !missing.is_empty() => problems.push(Problem {
                    mount: format!("table `{name}`"),
                    message: format!(
                        "role `{role}` lacks {} on {what} `{name}`, which every worker needs (claims update and delete its rows, publishes insert them): run `{}`",
                        missing.join(", "),
                        who.grant_all(&qualified)
                    ),
                }),
                _ => {}
            }
        }
        problems.extend(sequence_problem::<DB>(&mut conn, table, &who).await?);
        problems.extend(bookkeeping_problems::<DB>(&mut conn, &who).await?);
        Ok(problems)
    }

    /// Prepares `sql` on a connection of the pool (the driver's error when it does not).
    async fn prepare_only(&self, sql: String) -> Result<(), sqlx::Error> {
        let pool = self
            .pool()
            .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
        let mut conn = pool.acquire().await?;
        DB::prepare_only(&mut conn, sql).await
    }
}

/// The privileges (of SELECT, INSERT, UPDATE, DELETE) the connected role lacks on the table
/// named `qualified` (Postgres); `None` when there is no such table.
async fn lacking<DB: Dialect>(
    conn: &mut DB::Connection,
    qualified: String,
) -> Result<Option<Vec<&'static str>>, BrokerError> {
    let rows = DB::fetch(
        conn,
        "SELECT CAST(to_regclass($1) AS TEXT), \
         CAST(has_table_privilege(to_regclass($1), 'SELECT') AS TEXT), \
         CAST(has_table_privilege(to_regclass($1), 'INSERT') AS TEXT), \
         CAST(has_table_privilege(to_regclass($1), 'UPDATE') AS TEXT), \
         CAST(has_table_privilege(to_regclass($1), 'DELETE') AS TEXT)"
            .to_owned(),
        vec![Value::Text(Some(qualified))],
    )
    .await
    .map_err(db_err)?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    if DB::text(row, 0).map_err(db_err)?.is_none() {
        return Ok(None);
    }
    let mut missing = Vec::new();
    for (i, p) in ["SELECT", "INSERT", "UPDATE", "DELETE"]
        .into_iter()
        .enumerate()
    {
        if DB::text(row, i + 1).map_err(db_err)?.as_deref() != Some("true") {
            missing.push(p);
        }
    }
    Ok(Some(missing))
}

/// The connected role, as the privilege check names it.
struct Who {
    role: String,
    /// The role quoted, for a `GRANT`.
    role_q: String,
    /// Its current schema.
    schema: String,
    /// Whether it may create tables in that schema.
    can_create: bool,
}

impl Who {
    /// The `GRANT` of what every job and bookkeeping table needs on `on`.
    fn grant_all(&self, on: &str) -> String {
        let missing = ["SELECT", "INSERT", "UPDATE", "DELETE"];
        format!("GRANT {} ON {on} TO {}", missing.join(", "), self.role_q)
    }
}

/// Column `i` of `row` as text (empty for NULL).
fn text<DB: Dialect>(row: &DB::Row, i: usize) -> Result<String, BrokerError> {
    Ok(DB::text(row, i).map_err(db_err)?.unwrap_or_default())
}

/// A generated id numbered by a sequence: publishing takes a number from it, which the role
/// must be allowed.
async fn sequence_problem<DB: Dialect>(
    conn: &mut DB::Connection,
    table: &Table,
    who: &Who,
) -> Result<Option<Problem>, BrokerError> {
    if !table.id.generated {
        return Ok(None);
    }
    let rows = DB::fetch(
        conn,
        "SELECT pg_get_serial_sequence($1, $2), CAST(has_sequence_privilege(pg_get_serial_sequence($1, $2), 'USAGE') AS TEXT) WHERE to_regclass($1) IS NOT NULL AND pg_get_serial_sequence($1, $2) IS NOT NULL".to_owned(),
        vec![
            Value::Text(Some(table.qualified())),
            Value::Text(Some(table.id.name.to_owned())),
        ],
    )
    .await
    .map_err(db_err)?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    if text::<DB>(row, 1)? == "true" {
        return Ok(None);
    }
    let seq = text::<DB>(row, 0)?;
    let (role, role_q) = (&who.role, &who.role_q);
    Ok(Some(Problem {
        mount: format!("table `{}`", table.name),
        message: format!(
            "role `{role}` cannot take numbers from `{seq}`, the sequence of the id of `{}`, which publishing needs: run `GRANT USAGE ON SEQUENCE {seq} TO {role_q}`",
            table.name
        ),
    }))
}

/// The bookkeeping tables the role cannot use: missing where it may not create them, or
/// lacking privileges.
async fn bookkeeping_problems<DB: Dialect>(
    conn: &mut DB::Connection,
    who: &Who,
) -> Result<Vec<Problem>, BrokerError> {
    let (role, role_q, schema) = (&who.role, &who.role_q, &who.schema);
    let mut problems = Vec::new();
    for (name, what, ddl) in BOOKKEEPING {
        match lacking::<DB>(conn, name.to_owned()).await? {
            None if !who.can_create => problems.push(Problem {
                mount: "*".to_owned(),
                message: format!(
                    "the bookkeeping table `{name}` ({what}) does not exist, and role `{role}` may not create it (no CREATE on schema `{schema}`): as the schema's owner run `{ddl}` and `{}`, or run `GRANT CREATE ON SCHEMA \"{schema}\" TO {role_q}` (the README's \"Database privileges\" lists every table)",
                    who.grant_all(name)
                ),
            }),
            Some(missing) if !missing.is_empty() => problems.push(Problem {
                mount: "*".to_owned(),
                message: format!(
                    "role `{role}` lacks {} on the bookkeeping table `{name}` ({what}): run `{}`",
                    missing.join(", "),
                    who.grant_all(name)
                ),
            }),
            _ => {}
        }
    }
    Ok(problems)
}

/// A problem of table `name` itself.
fn table_problem(name: &str, message: String) -> Problem {
    Problem {
        mount: format!("table `{name}`"),
        message,
    }
}
