//! The dead-table move: a row moved to its dead letter, to a group of its own table or (the
//! table form) copied into the dead-letter table, the copy marked, the row deleted. One place
//! for the settlement task's batches (`batch.rs`) and a dead-letter table's own rows
//! (`route/settle.rs`).

use std::sync::Arc;

use stagedoor_jobs::BrokerError;

use crate::dialect::Dialect;
use crate::exec::run_in;
use crate::rows::Vals;
use crate::sql::Statements;

/// Moves the row `v` names (fenced on its lease) to its dead letter on `conn`: `table` is the
/// dead-letter table's name and statements when dead letters are another table, `None` when
/// they are a group of this one. The rows moved (1, or 0 when the lease was lost). The table
/// form runs three statements: `conn` should be in a transaction, committed only when 1.
pub(crate) async fn move_dead<DB: Dialect>(
    conn: &mut DB::Connection,
    stmts: &Statements,
    v: &Vals,
    table: Option<&(String, Arc<Statements>)>,
) -> Result<u64, BrokerError> {
    let Some((target, dead)) = table else {
        return run_in::<DB>(conn, &stmts.dead_group, v, &stmts.table).await;
    };
    let copy = stmts.copy_into(target, true);
    let n = run_in::<DB>(&mut *conn, &copy, v, &stmts.table).await?;
    if n == 1 {
        run_in::<DB>(&mut *conn, &dead.mark_dead, v, &dead.table).await?;
        run_in::<DB>(&mut *conn, &stmts.delete_by_id, v, &stmts.table).await?;
    }
    Ok(n)
}
