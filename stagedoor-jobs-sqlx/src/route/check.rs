//! The startup check of a route: the table's statements validated, its column types against
//! the row's fields, every statement prepared against the table, each mount's needs (attempt,
//! headers and group columns, a dead-letter table that can take its rows), and on SQLite an id
//! that could be reused by a later row.

use std::sync::Arc;

use stagedoor_jobs::Inbox;
use stagedoor_jobs::broker::{MountInfo, Problem};
use stagedoor_jobs::inbox::ColumnType;

use super::SqlxRoute;
use crate::dialect::{Dialect, acquire};
use crate::sql::{Statements, Stmt};

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    /// [`Broker::check`](stagedoor_jobs::Broker::check): the table, its columns and every statement
    /// this route runs, against the mounts on it.
    pub(super) async fn check_mounts(&self, mounts: &[MountInfo]) -> Vec<Problem> {
        let table = self.table();
        let who = |m: &MountInfo| format!("mount `{}` on queue `{}`", m.subscriber, m.queue);
        let mut problems = Vec::new();
        let stmts = match &self.inner.stmts {
            Ok(s) => Arc::clone(s),
            Err(ps) => {
                return ps
                    .iter()
                    .map(|p| Problem {
                        mount: format!("table `{}`", table.name),
                        message: p.clone(),
                    })
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
        // one is wrong, the statements' preparation below would only add the database's
        // first error about it.
        let column_problems = crate::columns::check::<DB>(pool, table).await;
        let columns_ok = column_problems.is_empty();
        problems.extend(column_problems.into_iter().map(|message| Problem {
            mount: format!("table `{}`", table.name),
            message,
        }));
        // Every statement this route will run, prepared against the table now: a
        // missing or misspelt column stops the service with its name.
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
        let named: &[(&str, &Stmt)] = if columns_ok { &named } else { &[] };
        for (name, stmt) in named {
            if Statements::lacks(stmt) {
                continue;
            }
            if let Err(e) = self.prepare_only(stmt.sql.clone()).await {
                problems.push(Problem {
                    mount: format!("table `{}`", table.name),
                    message: format!(
                        "the {name} statement does not prepare against the table: {e}: create the table, or make its columns match the fields of `{}`",
                        std::any::type_name::<Row>()
                    ),
                });
                break;
            }
        }
        for m in mounts {
            if m.max_attempts.is_some() && table.attempt.is_none() {
                problems.push(Problem {
                    mount: who(m),
                    message: format!(
                        "max_attempts needs an attempt column, and table `{}` has none: add an integer column with `#[field(attempt)]`",
                        table.name
                    ),
                });
            }
            if m.kind.is_some() && table.headers.is_none() {
                problems.push(Problem {
                    mount: who(m),
                    message: format!(
                        "subscribing to a kind needs a headers column to store it, and table `{}` has none: add `#[field(headers)]`, or give the kind its own group",
                        table.name
                    ),
                });
            }
            if table.group.is_none() && m.queue != *self.default_group && m.queue != table.name {
                problems.push(Problem {
                    mount: who(m),
                    message: format!(
                        "table `{}` has no group column, so its one queue is `{}`: subscribe to that name",
                        table.name, self.default_group
                    ),
                });
            }
            if let Some(dead) = &m.dead_letter {
                self.inner
                    .origins
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(dead.clone(), m.queue.clone());
                if !self.grouped() {
                    match self.dead_table(dead).await {
                        Err(e) => problems.push(Problem {
                            mount: who(m),
                            message: format!("{e}"),
                        }),
                        Ok(dead_stmts) => {
                            let copy = stmts.copy_into(dead, true);
                            if let Err(e) = self.prepare_only(copy.sql.clone()).await {
                                problems.push(Problem {
                                    mount: who(m),
                                    message: format!(
                                        "the dead-letter table `{dead}` cannot take rows of `{}`: {e}: create it with the same columns",
                                        table.name
                                    ),
                                });
                            } else {
                                for message in
                                    crate::columns::check_dead_table::<DB>(pool, &dead_stmts.table)
                                        .await
                                {
                                    problems.push(Problem {
                                        mount: who(m),
                                        message: format!("dead-letter table `{dead}`: {message}"),
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        // A dead letter moved to another table keeps its id (a replay brings it back
        // with it). SQLite gives a new row the id of a deleted one unless the id column
        // is AUTOINCREMENT, so a later row could take the id of a dead letter: it could
        // then never be moved into the dead table (the copy conflicts; the row is claimed
        // again after every lease, forever), nor that dead letter be replayed.
        if !self.grouped()
            && table.id.generated
            && table.id.ty == ColumnType::Integer
            && mounts.iter().any(|m| m.dead_letter.is_some())
        {
            let reuses = match acquire(pool).await {
                Ok(mut conn) => DB::reuses_ids(&mut conn, table).await,
                Err(_) => None,
            };
            if reuses == Some(true) {
                problems.push(Problem {
                    mount: format!("table `{}`", table.name),
                    message: format!(
                        "its dead letters move to another table with their ids, and SQLite gives new rows the ids of deleted ones unless the id is declared `{} INTEGER PRIMARY KEY AUTOINCREMENT`: a row that takes a dead letter's id could never be dead-lettered; declare the id column so",
                        table.id.name
                    ),
                });
            }
        }
        if table.retry_after.is_none() {
            tracing::warn!(
                table = table.name,
                "no retry_after column: retry_after(d) and delayed jobs return the row at once"
            );
        }
        problems
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
