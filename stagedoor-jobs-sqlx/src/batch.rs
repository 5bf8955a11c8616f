//! Batched settlements: the request a settlement queues (an acknowledgement, a retry or a dead
//! letter), the batch sizes, and the route's task that applies whatever queued while its
//! previous batch ran, in one transaction.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use stagedoor_jobs::BrokerError;
use stagedoor_jobs::kit::{Reply, SharedReceiver, run_batches};

use crate::dead_move::move_dead;
use crate::dialect::sealed::{Driver, Value};
use crate::dialect::{Dialect, acquire, db_err};
use crate::receipt::IdValue;
use crate::rows::Vals;
use crate::sql::{FENCES, Flavor, Many, Statements};

/// What a settlement does to its row.
pub(crate) enum Op {
    /// Deletes it (an acknowledgement, a drop).
    Ack,
    /// Releases it with its last error, due at `due`; `None` keeps its due time (a FIFO row
    /// retried at once keeps its place).
    Retry {
        due: Option<DateTime<Utc>>,
        error: String,
    },
    /// Moves it to its dead letter: `v` holds the values of the move (see
    /// `Statements::dead_group`); `table` is the dead-letter table's name and statements when
    /// dead letters are another table (the row is copied there, the copy marked, the row
    /// deleted), `None` when they are a group of this one.
    Dead {
        v: Box<Vals>,
        table: Option<(String, Arc<Statements>)>,
    },
}

/// A settled delivery's row, waiting for the route's next batch.
pub(crate) struct SettleReq {
    pub(crate) id: IdValue,
    pub(crate) leases: [DateTime<Utc>; FENCES],
    pub(crate) op: Op,
    /// Where the row's version is, if the delivery knows (see `SqlReceipt::ctid`).
    pub(crate) ctid: Option<String>,
    /// `true` when the row was still leased to this delivery (and is settled now).
    pub(crate) reply: Reply<bool>,
}

/// Most settlements one batch carries (and one multi-row statement).
pub(crate) const BATCH: usize = 256;

/// The batch sizes statements are built for: powers of two, so that a connection's statement
/// cache holds them all.
pub(crate) fn bucket(n: usize) -> usize {
    n.next_power_of_two().min(BATCH)
}

/// Settles rows in batches: whatever queued while the previous batch ran goes in the next one,
/// acknowledgements as one fenced delete, retries as one fenced update (on Postgres both in one
/// statement), dead letters one by one, all in one transaction (one commit for many jobs).
/// Each row stays fenced on its lease and each reply tells about its own row; a row with two
/// settlements queued (two deliveries of it, one of which lost its lease) has the second in the
/// next batch.
///
/// A batch whose statement fails is applied again one settlement at a time, so that one that
/// cannot succeed (a dead-letter table that is missing) fails alone; a connection error or a
/// failed commit fails the batch's replies (the runtime settles them again). The batching
/// (one batch at a time, one settlement per row in each) is the kit's `run_batches`, under
/// the kit's `Batchers` (`route/settle.rs`): a panic fails only the batch it interrupted.
pub(crate) async fn settle_loop<DB: Dialect>(
    pool: sqlx::Pool<DB>,
    stmts: Arc<Statements>,
    rx: SharedReceiver<SettleReq>,
) {
    let (pool, stmts) = (&pool, &*stmts);
    let row = |r: &SettleReq| Some(r.id.text());
    run_batches(rx, BATCH, 1, row, |batch| apply::<DB>(pool, stmts, batch)).await;
}

/// Why a batch failed: before its commit (nothing took effect), or at it (it may have).
enum Failed {
    Before(BrokerError),
    AtCommit(BrokerError),
}

/// Applies `batch` and answers each request.
async fn apply<DB: Dialect>(pool: &sqlx::Pool<DB>, stmts: &Statements, batch: Vec<SettleReq>) {
    match run_batch::<DB>(pool, stmts, &batch).await {
        Ok(done) => {
            for (r, d) in batch.into_iter().zip(done) {
                let _ = r.reply.send(Ok(d));
            }
        }
        // A statement was refused (not the connection): nothing took effect; apply each
        // alone, so that only the one that cannot succeed fails.
        Err(Failed::Before(BrokerError::Backend(_))) if batch.len() > 1 => {
            for r in batch {
                let one = std::slice::from_ref(&r);
                let answer = match run_batch::<DB>(pool, stmts, one).await {
                    Ok(done) => Ok(done.first().copied().unwrap_or(false)),
                    Err(Failed::Before(e) | Failed::AtCommit(e)) => Err(e),
                };
                let _ = r.reply.send(answer);
            }
        }
        Err(Failed::Before(e) | Failed::AtCommit(e)) => {
            for r in batch {
                let _ = r.reply.send(Err(e.clone()));
            }
        }
    }
}

/// Runs the statements of `batch` (in one transaction when there are several); whether each
/// row was still leased to its delivery.
async fn run_batch<DB: Dialect>(
    pool: &sqlx::Pool<DB>,
    stmts: &Statements,
    batch: &[SettleReq],
) -> Result<Vec<bool>, Failed> {
    let acks: Vec<usize> = (0..batch.len())
        .filter(|&i| matches!(batch[i].op, Op::Ack))
        .collect();
    let retries: Vec<usize> = (0..batch.len())
        .filter(|&i| matches!(batch[i].op, Op::Retry { .. }))
        .collect();
    let deads = batch.len() - acks.len() - retries.len();
    // Postgres settles acknowledgements and retries in one statement.
    let both = !acks.is_empty() && !retries.is_empty() && DB::FLAVOR != Flavor::Postgres;
    let mut conn = acquire(pool).await.map_err(Failed::Before)?;
    if !both && deads == 0 {
        // One statement (two when rows are not found at their place): each its own
        // transaction.
        return settle_in::<DB>(&mut conn, stmts, batch, &acks, &retries, false).await;
    }
    let mut tx = sqlx::Connection::begin(&mut *conn)
        .await
        .map_err(|e| Failed::Before(db_err(e)))?;
    let done = settle_in::<DB>(&mut tx, stmts, batch, &acks, &retries, true).await?;
    tx.commit().await.map_err(|e| Failed::AtCommit(db_err(e)))?;
    Ok(done)
}

/// The statements of `batch` on `conn`: the acknowledgements' delete, the retries' update, each
/// dead letter's move; `in_tx`: in one transaction (else a failure after a first statement
/// that settled rows is one that may have taken effect).
async fn settle_in<DB: Dialect>(
    conn: &mut DB::Connection,
    stmts: &Statements,
    batch: &[SettleReq],
    acks: &[usize],
    retries: &[usize],
    in_tx: bool,
) -> Result<Vec<bool>, Failed> {
    let mut done = vec![false; batch.len()];
    // Postgres: first the rows whose place is known, found there (see
    // `Statements::delete_many`); then by id the others and any not found at their place
    // (moved, or no longer leased to the delivery: then not found by id either).
    let known = |w: &[usize]| -> (Vec<usize>, Vec<usize>) {
        w.iter()
            .partition(|&&i| DB::FLAVOR == Flavor::Postgres && batch[i].ctid.is_some())
    };
    let (acks_at, mut acks_by_id) = known(acks);
    let (retries_at, mut retries_by_id) = known(retries);
    if !acks_at.is_empty() || !retries_at.is_empty() {
        settle_pass::<DB>(conn, stmts, batch, &acks_at, &retries_at, true, &mut done).await?;
        acks_by_id.extend(acks_at.iter().filter(|&&i| !done[i]));
        retries_by_id.extend(retries_at.iter().filter(|&&i| !done[i]));
    }
    let settled = done.iter().any(|d| *d);
    settle_pass::<DB>(
        conn,
        stmts,
        batch,
        &acks_by_id,
        &retries_by_id,
        false,
        &mut done,
    )
    .await
    .map_err(|e| match e {
        Failed::Before(e) if settled && !in_tx => Failed::AtCommit(e),
        e => e,
    })?;
    for (i, r) in batch.iter().enumerate() {
        let Op::Dead { v, table } = &r.op else {
            continue;
        };
        let n = move_dead::<DB>(&mut *conn, stmts, v, table.as_ref())
            .await
            .map_err(Failed::Before)?;
        done[i] = n == 1;
    }
    Ok(done)
}

/// The acknowledgements `acks` and retries `retries` of `batch` (each found at its place when
/// `at`), marked in `done`.
async fn settle_pass<DB: Dialect>(
    conn: &mut DB::Connection,
    stmts: &Statements,
    batch: &[SettleReq],
    acks: &[usize],
    retries: &[usize],
    at: bool,
    done: &mut [bool],
) -> Result<(), Failed> {
    let before = |e: BrokerError| Failed::Before(e);
    if DB::FLAVOR == Flavor::Postgres && !acks.is_empty() && !retries.is_empty() {
        // Both in one statement. The rows differ (one settlement per row in a batch), so the
        // ids it returns tell both kinds apart.
        let n = bucket(acks.len().max(retries.len()));
        let b = stmts.many(Many::DeleteAndRetry, n, at);
        let mut binds = ack_binds(batch, acks, n, at);
        binds.extend(retry_binds(batch, retries, n, b.has_due, b.has_error, at));
        let rows = DB::fetch(&mut *conn, b.sql, binds)
            .await
            .map_err(|e| before(db_err(e)))?;
        mark::<DB>(&rows, batch, acks, done);
        mark::<DB>(&rows, batch, retries, done);
        return Ok(());
    }
    if !acks.is_empty() {
        let n = bucket(acks.len());
        let binds = ack_binds(batch, acks, n, at);
        let rows = DB::fetch(&mut *conn, stmts.many(Many::Delete, n, at).sql, binds)
            .await
            .map_err(|e| before(db_err(e)))?;
        mark::<DB>(&rows, batch, acks, done);
    }
    if !retries.is_empty() {
        let n = bucket(retries.len());
        let b = stmts.many(Many::Retry, n, at);
        let binds = retry_binds(batch, retries, n, b.has_due, b.has_error, at);
        let rows = DB::fetch(&mut *conn, b.sql, binds)
            .await
            .map_err(|e| before(db_err(e)))?;
        mark::<DB>(&rows, batch, retries, done);
    }
    Ok(())
}

/// The values of [`Statements::delete_many`] of `n` rows for the acknowledgements `acks`.
fn ack_binds(batch: &[SettleReq], acks: &[usize], n: usize, at: bool) -> Vec<Value> {
    let mut binds = Vec::with_capacity(n * (2 + FENCES));
    for i in 0..n {
        // Padding repeats the last row: a duplicate term deletes nothing more.
        let r = &batch[acks[i.min(acks.len() - 1)]];
        binds.push(r.id.value());
        binds.extend(r.leases.iter().map(|l| Value::Time(Some(*l))));
        if at {
            binds.push(Value::Text(r.ctid.clone()));
        }
    }
    binds
}

/// The values of [`Statements::retry_many`] of `n` rows for the retries `retries`.
fn retry_binds(
    batch: &[SettleReq],
    retries: &[usize],
    n: usize,
    has_due: bool,
    has_error: bool,
    at: bool,
) -> Vec<Value> {
    let mut binds = Vec::with_capacity(n * (4 + FENCES));
    for i in 0..n {
        // Padding repeats the last row: the same values again change nothing more.
        let r = &batch[retries[i.min(retries.len() - 1)]];
        binds.push(r.id.value());
        binds.extend(r.leases.iter().map(|l| Value::Time(Some(*l))));
        if let Op::Retry { due, error } = &r.op {
            if has_due {
                binds.push(Value::Time(*due));
            }
            if has_error {
                binds.push(Value::Text(Some(error.clone())));
            }
        }
        if at {
            binds.push(Value::Text(r.ctid.clone()));
        }
    }
    binds
}

/// Marks as done the requests `which` of `batch` whose row id a statement returned.
fn mark<DB: Driver>(rows: &[DB::Row], batch: &[SettleReq], which: &[usize], done: &mut [bool]) {
    let hit: HashSet<String> = rows
        .iter()
        .filter_map(|row| DB::text(row, 0).ok().flatten())
        .collect();
    for &i in which {
        done[i] = hit.contains(&batch[i].id.text());
    }
}
