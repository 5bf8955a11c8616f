//! [`Records`]: small values by key, each with a version and an expiry, in the table
//! `stagedoor_records` (created with its index at the first use of records, as the bookkeeping
//! tables are; its statements are in `sql/records.rs`).
//!
//! A call of `write_records` is one transaction: it holds the rows of the keys it names
//! (Postgres: `SELECT .. FOR UPDATE`, in the keys' byte order; SQLite: the database's write
//! lock, taken at `BEGIN IMMEDIATE`), reads the time, checks every expected version (a record
//! that ran out counts as none, version 0), then writes in the keys' order: an update of a row
//! it holds, a delete, or an insert that changes nothing when another writer created the key
//! meanwhile (`ON CONFLICT DO NOTHING`: a mismatch when the write expected no record, else the
//! whole call starts again). A mismatch rolls everything back: `Ok(None)`.
//!
//! Times are the database's (see `locks::database_now`), stored as every bookkeeping time is.
//! Records that ran out are deleted a few at a time: in every write's transaction on SQLite,
//! on its own after every [`CLEAN_EVERY`]-th write on Postgres. A row edited by hand that this
//! backend would never write (a NULL value, a version below 1, an expiry that is not a time) is
//! an error naming the key and the fix; the other keys are not affected.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::{
    BrokerError, Record, RecordWrite, Records, check_record_writes, chrono_duration,
};
use stagedoor_jobs::{Clock, Inbox};

use super::SqlxRoute;
use crate::dialect::sealed::Value;
use crate::dialect::{Dialect, acquire, db_err};
use crate::locks::{database_now, ensure_tables};
use crate::rows::{shown, time_at};
use crate::sql::Flavor;
use crate::sql::records::{self as stmt, TABLE};

/// How many times a write starts again when a key it found absent was created meanwhile by
/// another writer and the write expected no particular version (it then finds the row).
const RACES: usize = 10;

/// On Postgres, every this many writes of a broker, one deletes records that ran out.
const CLEAN_EVERY: u64 = 8;

impl<DB: Dialect, Row: Inbox> Records for SqlxRoute<DB, Row> {
    async fn read_record(&self, key: &str) -> Result<Option<Record>, BrokerError> {
        let read = self.read_one(key).await;
        self.broker.noted(read)
    }

    async fn write_records(&self, writes: &[RecordWrite]) -> Result<Option<Vec<u64>>, BrokerError> {
        check_record_writes(writes)?;
        if writes.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let written = self.write_all(writes).await;
        self.broker.noted(written)
    }
}

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    /// The pool, once the records' table and index exist (created where they are missing).
    async fn records_pool(&self) -> Result<&sqlx::Pool<DB>, BrokerError> {
        let pool = self.pool()?;
        let objects = stmt::objects(DB::FLAVOR);
        ensure_tables(&self.broker.shared.records, pool, &objects).await?;
        Ok(pool)
    }

    /// [`Records::read_record`].
    async fn read_one(&self, key: &str) -> Result<Option<Record>, BrokerError> {
        if key.contains('\0') {
            // No record has such a key (`check_record_writes` refuses it), and Postgres would
            // refuse it as a bind.
            return Ok(None);
        }
        let pool = self.records_pool().await?;
        let mut conn = acquire(pool).await?;
        let rows = DB::fetch(&mut conn, stmt::read(DB::FLAVOR), vec![text(key)])
            .await
            .map_err(db_err)?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let clock = self.broker.clock();
        let now = if DB::FLAVOR == Flavor::Postgres && !clock.is_manual() {
            DB::time(row, 3)
                .map_err(db_err)?
                .ok_or_else(|| BrokerError::Backend("the database's now() was NULL".to_owned()))?
        } else {
            self.broker.now()
        };
        let version = match Stored::read::<DB>(row, 1, 2).current(key, now)? {
            0 => return Ok(None),
            v => v,
        };
        let value = match DB::bytes(row, 0) {
            Ok(Some(v)) => v,
            _ => return Err(bad_row(key, "value", &shown::<DB>(row, 0), "bytes")),
        };
        Ok(Some(Record {
            value: value.into(),
            version,
        }))
    }

    /// [`Records::write_records`] of checked writes: [`try_write`] until it is not raced.
    async fn write_all(&self, writes: &[RecordWrite]) -> Result<Option<Vec<u64>>, BrokerError> {
        let pool = self.records_pool().await?;
        let clock = self.broker.clock();
        let mut order: Vec<usize> = (0..writes.len()).collect();
        order.sort_by(|&a, &b| writes[a].key.cmp(&writes[b].key));
        for _ in 0..RACES {
            let mut conn = acquire(pool).await?;
            match try_write::<DB>(&mut conn, writes, &order, &clock).await? {
                Outcome::Written(versions, now) => {
                    self.clean_now_and_then(&mut conn, now).await;
                    return Ok(Some(versions));
                }
                Outcome::Refused => return Ok(None),
                Outcome::Raced => {}
            }
        }
        Err(BrokerError::Backend(format!(
            "other writers created records this write found absent, and deleted them again, {RACES} times in a row (in `{TABLE}`): write again"
        )))
    }

    /// Postgres: every [`CLEAN_EVERY`]-th write deletes a few records that ran out by `now`,
    /// on its own (SQLite does it in every write's transaction). The write is done: a failure
    /// here is only logged.
    async fn clean_now_and_then(&self, conn: &mut DB::Connection, now: DateTime<Utc>) {
        if DB::FLAVOR != Flavor::Postgres {
            return;
        }
        let n = self.broker.shared.record_writes.fetch_add(1, Relaxed);
        if !n.is_multiple_of(CLEAN_EVERY) {
            return;
        }
        let drop = stmt::drop_expired(DB::FLAVOR);
        if let Err(e) = DB::run(conn, drop, vec![Value::Time(Some(now))]).await {
            tracing::warn!(error = %e, "cannot delete the records that ran out (the write is done): trying again at a later write");
        }
    }
}

/// What one try of a write came to.
enum Outcome {
    /// Committed: each write's new version, in the call's order, and the time it was made at.
    Written(Vec<u64>, DateTime<Utc>),
    /// An expected version did not match: rolled back.
    Refused,
    /// A key found absent was created meanwhile by another writer, and the write expected no
    /// particular version: rolled back, to be tried again.
    Raced,
}

/// One try of `writes` in one transaction on `conn`, applied in `order` (the keys' byte order).
async fn try_write<DB: Dialect>(
    conn: &mut DB::Connection,
    writes: &[RecordWrite],
    order: &[usize],
    clock: &Clock,
) -> Result<Outcome, BrokerError> {
    let mut tx = sqlx::Connection::begin_with(&mut *conn, stmt::begin(DB::FLAVOR))
        .await
        .map_err(db_err)?;
    let mut now = None;
    if DB::FLAVOR == Flavor::Sqlite {
        // The write lock is held: the time, and a few records that ran out deleted.
        let t = database_now::<DB>(&mut tx, clock).await?;
        DB::run(
            &mut tx,
            stmt::drop_expired(DB::FLAVOR),
            vec![Value::Time(Some(t))],
        )
        .await
        .map_err(db_err)?;
        now = Some(t);
    }
    let found = lock_rows::<DB>(&mut tx, writes, order).await?;
    // Postgres: the time once the rows are held (a write that waited for them counts from
    // when it got them).
    let now = match now {
        Some(t) => t,
        None => database_now::<DB>(&mut tx, clock).await?,
    };
    let Some(current) = check_versions(writes, &found, now)? else {
        tx.rollback().await.map_err(db_err)?;
        return Ok(Outcome::Refused);
    };
    match apply::<DB>(&mut tx, writes, order, &found, &current, now).await? {
        Outcome::Written(versions, now) => {
            tx.commit().await.map_err(db_err)?;
            Ok(Outcome::Written(versions, now))
        }
        other => {
            tx.rollback().await.map_err(db_err)?;
            Ok(other)
        }
    }
}

/// The rows of the keys of `writes` (each as stored), held until the transaction ends:
/// taken in `order`, at most [`stmt::KEYS_PER_STATEMENT`] keys per statement.
async fn lock_rows<DB: Dialect>(
    conn: &mut DB::Connection,
    writes: &[RecordWrite],
    order: &[usize],
) -> Result<HashMap<String, Stored>, BrokerError> {
    let keys: Vec<&str> = order.iter().map(|&i| writes[i].key.as_str()).collect();
    let mut found = HashMap::new();
    for chunk in keys.chunks(stmt::KEYS_PER_STATEMENT) {
        let sql = stmt::lock_rows(DB::FLAVOR, chunk.len());
        let binds = chunk.iter().map(|k| text(k)).collect();
        let rows = DB::fetch(&mut *conn, sql, binds).await.map_err(db_err)?;
        for row in &rows {
            // A row matched one of the keys bound, so its key is one of them.
            let Some(key) = DB::text(row, 0).map_err(db_err)? else {
                continue;
            };
            found.insert(key, Stored::read::<DB>(row, 1, 2));
        }
    }
    Ok(found)
}

/// Each write's record's version now (0: none, or it ran out), where the write needs it (a
/// write, or an expected version); `None` when an expected version does not match.
fn check_versions(
    writes: &[RecordWrite],
    found: &HashMap<String, Stored>,
    now: DateTime<Utc>,
) -> Result<Option<Vec<u64>>, BrokerError> {
    let mut current = vec![0; writes.len()];
    for (i, w) in writes.iter().enumerate() {
        // A delete without an expected version reads nothing of the row (so it also clears a
        // row this backend cannot read).
        if w.value.is_none() && w.expected.is_none() {
            continue;
        }
        let v = match found.get(&w.key) {
            Some(stored) => stored.current(&w.key, now)?,
            None => 0,
        };
        if w.expected.is_some_and(|e| e != v) {
            return Ok(None);
        }
        current[i] = v;
    }
    Ok(Some(current))
}

/// Writes each of `writes` in `order` (a row of `found` updated or deleted, a missing one
/// inserted), `current` being each record's version before; `now` dates the expiries.
async fn apply<DB: Dialect>(
    conn: &mut DB::Connection,
    writes: &[RecordWrite],
    order: &[usize],
    found: &HashMap<String, Stored>,
    current: &[u64],
    now: DateTime<Utc>,
) -> Result<Outcome, BrokerError> {
    let mut versions = vec![0; writes.len()];
    for &i in order {
        let w = &writes[i];
        let held = found.contains_key(&w.key);
        let Some(value) = &w.value else {
            if held {
                DB::run(&mut *conn, stmt::DELETE, vec![text(&w.key)])
                    .await
                    .map_err(db_err)?;
            }
            continue;
        };
        let next = current[i]
            .checked_add(1)
            .and_then(|n| i64::try_from(n).ok())
            .ok_or_else(|| {
                bad_row(
                    &w.key,
                    "version",
                    &current[i].to_string(),
                    "versions below 2^63 - 1 (it has none left to give)",
                )
            })?;
        let until = w.ttl.map(|ttl| {
            now.checked_add_signed(chrono_duration(ttl))
                .unwrap_or(DateTime::<Utc>::MAX_UTC)
        });
        let (key, value, until) = (
            text(&w.key),
            Value::Bytes(value.to_vec()),
            Value::Time(until),
        );
        if held {
            let binds = vec![key, value, Value::Int(Some(next)), until];
            DB::run(&mut *conn, stmt::UPDATE, binds)
                .await
                .map_err(db_err)?;
        } else if DB::run(&mut *conn, stmt::INSERT, vec![key, value, until])
            .await
            .map_err(db_err)?
            == 0
        {
            // Created meanwhile by another writer, which committed first.
            return Ok(if w.expected.is_some() {
                Outcome::Refused
            } else {
                Outcome::Raced
            });
        }
        versions[i] = next.unsigned_abs();
    }
    Ok(Outcome::Written(versions, now))
}

/// A key bound as text.
fn text(key: &str) -> Value {
    Value::Text(Some(key.to_owned()))
}

/// A record's row as stored: its version and expiry, or what they show when they cannot be
/// read as this backend writes them.
struct Stored {
    version: Result<i64, String>,
    expires: Result<Option<DateTime<Utc>>, String>,
}

impl Stored {
    /// The version at column `version` and the expiry at column `expires` of `row`.
    fn read<DB: Dialect>(row: &DB::Row, version: usize, expires: usize) -> Self {
        Self {
            version: match DB::int(row, version) {
                Ok(Some(v)) => Ok(v),
                _ => Err(shown::<DB>(row, version)),
            },
            expires: time_at::<DB>(row, expires),
        }
    }

    /// The record's version at `now`: 0 when it ran out; an error naming `key` when the row
    /// cannot be read.
    fn current(&self, key: &str, now: DateTime<Utc>) -> Result<u64, BrokerError> {
        match &self.expires {
            Err(shown) => return Err(bad_row(key, "expires_at", shown, "a time or NULL")),
            Ok(Some(t)) if *t <= now => return Ok(0),
            Ok(_) => {}
        }
        match &self.version {
            Ok(v) if *v >= 1 => Ok(v.unsigned_abs()),
            Ok(v) => Err(bad_row(
                key,
                "version",
                &v.to_string(),
                "versions from 1 up",
            )),
            Err(shown) => Err(bad_row(key, "version", shown, "versions from 1 up")),
        }
    }
}

/// The error of a record whose row holds what this backend never writes: names the table, the
/// key, the column and its value, and the fix.
fn bad_row(key: &str, column: &str, shown: &str, wanted: &str) -> BrokerError {
    BrokerError::Backend(format!(
        "the record `{}` cannot be used: its row in `{TABLE}` has {shown} in column `{column}`, where this backend writes {wanted} (edited by hand?): delete the record (`RecordWrite::delete` without an expected version, or `DELETE FROM {TABLE} WHERE record_key = '<the key>'`) and write it again",
        key.escape_debug()
    ))
}
