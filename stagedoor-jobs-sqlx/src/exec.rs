//! Running one statement on a connection (a pooled one or a transaction), with its values
//! bound in the statement's order: for the route's files, the settlement batch and the
//! dead-table move.

use stagedoor_jobs::broker::BrokerError;
use stagedoor_jobs::inbox::Table;

use crate::dialect::{Dialect, db_err};
use crate::rows::{Vals, params};
use crate::sql::Stmt;

/// Runs `stmt` on `conn` (a pooled connection or a transaction); the rows it changed.
pub(crate) async fn run_in<DB: Dialect>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    v: &Vals,
    table: &Table,
) -> Result<u64, BrokerError> {
    DB::run(conn, stmt.text(), params(stmt, v, table))
        .await
        .map_err(db_err)
}

/// Runs `stmt` on `conn`; the rows it returned, as the driver gives them.
pub(crate) async fn fetch_in<DB: Dialect>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    v: &Vals,
    table: &Table,
) -> Result<Vec<DB::Row>, BrokerError> {
    DB::fetch(conn, stmt.text(), params(stmt, v, table))
        .await
        .map_err(db_err)
}
