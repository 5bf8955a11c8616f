//! The bookkeeping tables of the scheduler's locks and ticks (and `publish_once`'s guards), of
//! the workers' reports and per-minute counts, and taking a lock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::Permits;
use stagedoor_jobs::{BrokerError, Clock};

use crate::dialect::sealed::{Driver, Value};
use crate::dialect::{Dialect, acquire, db_err};
use crate::sql::Flavor;

/// The bookkeeping tables of this backend, created on first use where they are missing: each
/// one's name, the features that need it (for messages) and its DDL. `stagedoor_locks` (a row
/// per lock: scheduler ticks, unique jobs' keys, running jobs' cancellations, with its owner's
/// token and expiry), `stagedoor_schedules` (each schedule's latest enqueued tick),
/// `stagedoor_workers` (each worker's last report, JSON, until it expires),
/// `stagedoor_minutes` (each queue's counts per minute; see `route/activity.rs`) and
/// `stagedoor_permits` (the permit pools of the global limits: a row per permit held, until it
/// runs out; see [`take_permits`]).
pub(crate) const BOOKKEEPING: [(&str, &str, &str); 5] = [
    (
        "stagedoor_locks",
        "cancelling running jobs, unique jobs, the scheduler's locks",
        "CREATE TABLE IF NOT EXISTS stagedoor_locks (lock_key TEXT PRIMARY KEY, token TEXT NOT NULL, until_at TIMESTAMPTZ NOT NULL)",
    ),
    (
        "stagedoor_schedules",
        "schedules",
        "CREATE TABLE IF NOT EXISTS stagedoor_schedules (schedule TEXT PRIMARY KEY, last_tick TIMESTAMPTZ NOT NULL)",
    ),
    (
        "stagedoor_workers",
        "the workers' reports",
        "CREATE TABLE IF NOT EXISTS stagedoor_workers (worker_id TEXT PRIMARY KEY, report TEXT NOT NULL, until_at TIMESTAMPTZ NOT NULL)",
    ),
    (
        "stagedoor_minutes",
        "the per-minute counts",
        "CREATE TABLE IF NOT EXISTS stagedoor_minutes (queue TEXT NOT NULL, minute TIMESTAMPTZ NOT NULL, processed BIGINT NOT NULL, failed BIGINT NOT NULL, dead BIGINT NOT NULL, PRIMARY KEY (queue, minute))",
    ),
    (
        "stagedoor_permits",
        "global concurrency and rate limits",
        "CREATE TABLE IF NOT EXISTS stagedoor_permits (pool TEXT NOT NULL, token TEXT NOT NULL, until_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (pool, token))",
    ),
];

/// Whether the bookkeeping table (or index) `name` exists where the statements find it
/// (Postgres: on the search path; SQLite: in the main database).
pub(crate) async fn bookkeeping_exists<DB: Dialect>(
    conn: &mut DB::Connection,
    name: &str,
) -> Result<bool, BrokerError> {
    let sql = match DB::FLAVOR {
        Flavor::Postgres => "SELECT CAST(to_regclass($1) AS TEXT)",
        Flavor::Sqlite => {
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'index') AND name = $1"
        }
    };
    let rows = DB::fetch(
        conn,
        sql.to_owned(),
        vec![Value::Text(Some(name.to_owned()))],
    )
    .await
    .map_err(db_err)?;
    Ok(match rows.first() {
        Some(row) => DB::text(row, 0).map_err(db_err)?.is_some(),
        None => false,
    })
}

/// Creates the bookkeeping tables that are missing, once per broker (`done`). A table that
/// exists is not created again: a role without `CREATE` on the schema works with tables made
/// for it (Postgres checks that privilege even for `CREATE TABLE IF NOT EXISTS` of a table
/// that exists).
pub(crate) async fn ensure_bookkeeping<DB: Dialect>(
    done: &tokio::sync::OnceCell<()>,
    pool: &sqlx::Pool<DB>,
) -> Result<(), BrokerError> {
    ensure_tables(done, pool, &BOOKKEEPING).await
}

/// Creates the tables (and indexes) of `objects` that are missing (each: its name, the
/// features that need it, its DDL), once per broker (`done`), as [`ensure_bookkeeping`] does
/// (the records' table, `stagedoor_records`, is created this way at its first use).
pub(crate) async fn ensure_tables<DB: Dialect>(
    done: &tokio::sync::OnceCell<()>,
    pool: &sqlx::Pool<DB>,
    objects: &[(&str, &str, &str)],
) -> Result<(), BrokerError> {
    done.get_or_try_init(|| async {
        for (name, what, ddl) in objects {
            create_missing(pool, name, what, ddl).await?;
        }
        Ok::<(), BrokerError>(())
    })
    .await?;
    Ok(())
}

/// Creates `name` with `ddl` unless it exists.
async fn create_missing<DB: Dialect>(
    pool: &sqlx::Pool<DB>,
    name: &str,
    what: &str,
    ddl: &str,
) -> Result<(), BrokerError> {
    // Postgres races concurrent `CREATE TABLE IF NOT EXISTS` of one table (workers starting
    // together on a fresh database): the loser sees "already exists" or a duplicate catalog
    // key, and the table is there once the winner commits.
    let mut tries: u64 = 0;
    loop {
        let mut conn = acquire(pool).await?;
        if bookkeeping_exists::<DB>(&mut conn, name).await? {
            return Ok(());
        }
        match DB::run(&mut conn, ddl.to_owned(), Vec::new()).await {
            Ok(_) => return Ok(()),
            Err(e)
                if tries < 5 && {
                    let m = e.to_string();
                    m.contains("already exists") || m.contains("duplicate key")
                } =>
            {
                tries += 1;
                drop(conn);
                tokio::time::sleep(Duration::from_millis(20 * tries)).await;
            }
            // An index only makes its statements faster: without it they still work.
            Err(e) if ddl.starts_with("CREATE INDEX") && is_refused(&e) => {
                tracing::warn!(error = %e, "cannot create the bookkeeping index `{name}` ({what}), which makes it faster: as the table's owner run `{ddl}`");
                return Ok(());
            }
            Err(e) if is_refused(&e) => {
                return Err(BrokerError::Backend(format!(
                    "cannot create the bookkeeping table `{name}` ({what}): {e}: as the schema's owner run `{ddl}` and `GRANT SELECT, INSERT, UPDATE, DELETE ON {name} TO <this role>`, or `GRANT CREATE ON SCHEMA <schema> TO <this role>` (see the README, \"Database privileges\")"
                )));
            }
            Err(e) => return Err(db_err(e)),
        }
    }
}

/// Whether `e` says the role may not create an object (no `CREATE` on the schema; an index
/// of a table it does not own).
fn is_refused(e: &sqlx::Error) -> bool {
    let m = e.to_string();
    m.contains("permission denied") || m.contains("must be owner")
}

/// Takes lock `$1` for token `$2` until `$3`: a new row, or one whose `until_at` has passed
/// (`$4` is now). Changes one row when taken.
const TAKE_LOCK: &str = "INSERT INTO stagedoor_locks (lock_key, token, until_at) VALUES ($1, $2, $3) ON CONFLICT (lock_key) DO UPDATE SET token = excluded.token, until_at = excluded.until_at WHERE stagedoor_locks.until_at <= $4";

/// Deletes the locks that ran out before `$1`.
pub(crate) const DROP_OLD_LOCKS: &str = "DELETE FROM stagedoor_locks WHERE until_at < $1";

/// Releases lock `$1` if token `$2` holds it.
pub(crate) const UNLOCK: &str = "DELETE FROM stagedoor_locks WHERE lock_key = $1 AND token = $2";

/// The last tick of schedule `$1`.
pub(crate) const LAST_TICK: &str = "SELECT last_tick FROM stagedoor_schedules WHERE schedule = $1";

/// Records tick `$2` of schedule `$1`, unless a later one is recorded.
pub(crate) const MARK_TICK: &str = "INSERT INTO stagedoor_schedules (schedule, last_tick) VALUES ($1, $2) ON CONFLICT (schedule) DO UPDATE SET last_tick = excluded.last_tick WHERE stagedoor_schedules.last_tick < excluded.last_tick";

/// Creates the bookkeeping tables that are missing on `conn` (the caller's transaction of
/// [`SqlxRoute::publish_in`](crate::SqlxRoute::publish_in) on SQLite, which may hold the
/// database's one write lock).
pub(crate) async fn create_bookkeeping_in<DB: Dialect>(
    conn: &mut DB::Connection,
) -> Result<(), BrokerError> {
    for (name, _, ddl) in BOOKKEEPING {
        if !bookkeeping_exists::<DB>(conn, name).await? {
            DB::run(conn, ddl.to_owned(), Vec::new())
                .await
                .map_err(db_err)?;
        }
    }
    Ok(())
}

/// Takes lock `key` for `token` until `until` on `conn` (a transaction, or a pooled
/// connection): `true` when it was free or its holder's time had passed at `now`.
pub(crate) async fn take_lock<DB: Driver>(
    conn: &mut DB::Connection,
    key: &str,
    token: &str,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<bool, BrokerError> {
    let binds = vec![
        Value::Text(Some(key.to_owned())),
        Value::Text(Some(token.to_owned())),
        Value::Time(Some(until)),
        Value::Time(Some(now)),
    ];
    let n = DB::run(conn, TAKE_LOCK.to_owned(), binds)
        .await
        .map_err(db_err)?;
    Ok(n == 1)
}

/// Drops pool `$1`'s permits past their time (`$2` is now). The first statement of a take: on
/// SQLite it takes the write lock, so the count below cannot change before the insert.
const DROP_OLD_PERMITS: &str = "DELETE FROM stagedoor_permits WHERE pool = $1 AND until_at <= $2";

/// How many permits pool `$1` holds.
const COUNT_PERMITS: &str = "SELECT count(*) FROM stagedoor_permits WHERE pool = $1";

/// When pool `$1`'s first permit runs out.
const FIRST_PERMIT: &str =
    "SELECT until_at FROM stagedoor_permits WHERE pool = $1 ORDER BY until_at LIMIT 1";

/// Adds permits to pool `$1` until `$2`: followed by one `($1, $n, $2)` per token.
const ADD_PERMITS: &str = "INSERT INTO stagedoor_permits (pool, token, until_at) VALUES";

/// The most tokens one renewal or release statement names.
const TOKENS_PER_STATEMENT: usize = 500;

/// Takes SQLite's write lock in the transaction on `conn` (a statement that writes nothing):
/// what Postgres' advisory lock does for a pool of permits.
const WRITE_LOCK: &str = "DELETE FROM stagedoor_permits WHERE 1 = 0";

/// The time a take of permits counts from, read once the take holds its pool's lock (a time
/// read before, while the take waited for a connection and the lock, would start its permits'
/// windows early, and more than the limit would start in one window): Postgres'
/// `clock_timestamp()`; on SQLite, whose database's clock is this machine's, the broker's clock
/// once the write lock is held; the harness's paused clock when the broker follows one.
async fn time_under_lock<DB: Dialect>(
    conn: &mut DB::Connection,
    clock: &Clock,
) -> Result<DateTime<Utc>, BrokerError> {
    if DB::FLAVOR == Flavor::Sqlite {
        DB::run(conn, WRITE_LOCK.to_owned(), Vec::new())
            .await
            .map_err(db_err)?;
    }
    database_now::<DB>(conn, clock).await
}

/// The time now by the database's clock, read on `conn` (in microseconds): Postgres'
/// `clock_timestamp()`; on SQLite, whose database's clock is this machine's, the broker's
/// clock; the harness's paused clock when the broker follows one.
pub(crate) async fn database_now<DB: Dialect>(
    conn: &mut DB::Connection,
    clock: &Clock,
) -> Result<DateTime<Utc>, BrokerError> {
    if clock.is_manual() || DB::FLAVOR == Flavor::Sqlite {
        let t = clock.now();
        return Ok(DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t));
    }
    let rows = DB::fetch(conn, "SELECT clock_timestamp()".to_owned(), Vec::new())
        .await
        .map_err(db_err)?;
    match rows.first() {
        Some(row) => match DB::time(row, 0).map_err(db_err)? {
            Some(t) => Ok(t),
            None => Err(BrokerError::Backend(
                "the database's clock_timestamp() was NULL".to_owned(),
            )),
        },
        None => Err(BrokerError::Backend(
            "the database's clock_timestamp() returned no row".to_owned(),
        )),
    }
}

/// [`Locks::take_permits`](stagedoor_jobs::broker::Locks::take_permits) on SQL: in one
/// transaction serialised per pool (Postgres: an advisory lock on the pool's name; SQLite: the
/// write lock), reads the time ([`time_under_lock`]), drops the permits past their time,
/// counts the rest and adds as many of `tokens` as the limit leaves room for, each held `ttl`.
pub(crate) async fn take_permits<DB: Dialect>(
    pool: &sqlx::Pool<DB>,
    key: &str,
    limit: u32,
    tokens: &[String],
    clock: &Clock,
    ttl: Duration,
) -> Result<Permits, BrokerError> {
    let mut conn = acquire(pool).await?;
    let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(db_err)?;
    DB::lock_fifo_group(&mut tx, format!("stagedoor_permits:{key}")).await?;
    let now = time_under_lock::<DB>(&mut tx, clock).await?;
    let until = now + stagedoor_jobs::broker::chrono_duration(ttl);
    let name = || Value::Text(Some(key.to_owned()));
    DB::run(
        &mut tx,
        DROP_OLD_PERMITS.to_owned(),
        vec![name(), Value::Time(Some(now))],
    )
    .await
    .map_err(db_err)?;
    let rows = DB::fetch(&mut tx, COUNT_PERMITS.to_owned(), vec![name()])
        .await
        .map_err(db_err)?;
    let held = match rows.first() {
        Some(row) => DB::int(row, 0).map_err(db_err)?.unwrap_or(0),
        None => 0,
    };
    let free = usize::try_from(i64::from(limit) - held).unwrap_or(0);
    let taken = free.min(tokens.len());
    // One statement for every permit taken: `($1, $3, $2), ($1, $4, $2), ...`.
    if taken > 0 {
        let rows: Vec<String> = (0..taken)
            .map(|i| format!("($1, ${}, $2)", i + 3))
            .collect();
        let sql = format!("{ADD_PERMITS} {}", rows.join(", "));
        let mut binds = vec![name(), Value::Time(Some(until))];
        binds.extend(tokens[..taken].iter().map(|t| Value::Text(Some(t.clone()))));
        DB::run(&mut tx, sql, binds).await.map_err(db_err)?;
    }
    let mut next_free = None;
    if taken == 0 && !tokens.is_empty() {
        let rows = DB::fetch(&mut tx, FIRST_PERMIT.to_owned(), vec![name()])
            .await
            .map_err(db_err)?;
        if let Some(row) = rows.first()
            && let Some(first) = DB::time(row, 0).map_err(db_err)?
        {
            next_free = Some((first - now).to_std().unwrap_or_default());
        }
    }
    tx.commit().await.map_err(db_err)?;
    Ok(Permits { taken, next_free })
}

/// The placeholders of `n` tokens from `$first` on.
fn token_list(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// [`Locks::renew_permits`](stagedoor_jobs::broker::Locks::renew_permits) on SQL.
pub(crate) async fn renew_permits<DB: Dialect>(
    pool: &sqlx::Pool<DB>,
    key: &str,
    tokens: &[String],
    now: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<usize, BrokerError> {
    let mut held = 0;
    for chunk in tokens.chunks(TOKENS_PER_STATEMENT) {
        let sql = format!(
            "UPDATE stagedoor_permits SET until_at = $1 WHERE pool = $2 AND until_at > $3 AND token IN ({})",
            token_list(4, chunk.len())
        );
        let mut binds = vec![
            Value::Time(Some(until)),
            Value::Text(Some(key.to_owned())),
            Value::Time(Some(now)),
        ];
        binds.extend(chunk.iter().map(|t| Value::Text(Some(t.clone()))));
        let mut conn = acquire(pool).await?;
        held += DB::run(&mut conn, sql, binds).await.map_err(db_err)? as usize;
    }
    Ok(held)
}

/// [`Locks::release_permits`](stagedoor_jobs::broker::Locks::release_permits) on SQL.
pub(crate) async fn release_permits<DB: Dialect>(
    pool: &sqlx::Pool<DB>,
    key: &str,
    tokens: &[String],
) -> Result<(), BrokerError> {
    for chunk in tokens.chunks(TOKENS_PER_STATEMENT) {
        let sql = format!(
            "DELETE FROM stagedoor_permits WHERE pool = $1 AND token IN ({})",
            token_list(2, chunk.len())
        );
        let mut binds = vec![Value::Text(Some(key.to_owned()))];
        binds.extend(chunk.iter().map(|t| Value::Text(Some(t.clone()))));
        let mut conn = acquire(pool).await?;
        DB::run(&mut conn, sql, binds).await.map_err(db_err)?;
    }
    Ok(())
}

/// The token holding lock `$1` (the job id of a `publish_once` guard).
const LOCK_HOLDER: &str = "SELECT token FROM stagedoor_locks WHERE lock_key = $1";

/// Lock `$1` held by `$2` (and not past its time, `$4`) runs out at `$3`.
const FINISH_LOCK: &str =
    "UPDATE stagedoor_locks SET until_at = $3 WHERE lock_key = $1 AND token = $2 AND until_at > $4";

/// Who holds lock `key` (read inside the transaction whose take just failed).
pub(crate) async fn lock_holder<DB: Driver>(
    conn: &mut DB::Connection,
    key: &str,
) -> Result<Option<String>, BrokerError> {
    let rows = DB::fetch(
        conn,
        LOCK_HOLDER.to_owned(),
        vec![Value::Text(Some(key.to_owned()))],
    )
    .await
    .map_err(db_err)?;
    match rows.first() {
        Some(row) => DB::text(row, 0).map_err(db_err),
        None => Ok(None),
    }
}

/// Makes lock `key`, if `token` holds it, run out at `until`; `true` when it did.
pub(crate) async fn finish_lock<DB: Driver>(
    conn: &mut DB::Connection,
    key: &str,
    token: &str,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<bool, BrokerError> {
    let binds = vec![
        Value::Text(Some(key.to_owned())),
        Value::Text(Some(token.to_owned())),
        Value::Time(Some(until)),
        Value::Time(Some(now)),
    ];
    let n = DB::run(conn, FINISH_LOCK.to_owned(), binds)
        .await
        .map_err(db_err)?;
    Ok(n == 1)
}
