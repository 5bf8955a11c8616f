//! The raw loop with stagedoor-jobs' guarantees: the minimal loop of [`super::raw`] (one
//! connection, one batch at a time, the same batch size and the same waits), plus what a job
//! framework promises and the minimal loop does not:
//!
//! - a fenced acknowledgement: a job is deleted (or put back for its retry) only while the lease
//!   of the claim that ran it still holds, so a job whose lease expired and was claimed again is
//!   not settled twice;
//! - an attempt counted at claim, which the retry cap reads;
//! - on Redis, a set of the ids in the queue, so that a job published twice while waiting is
//!   stored once (stagedoor's `{q}:ids`).
//!
//! Redis: publish is one Lua script per call (`SADD` of the id, `XADD` where it was new);
//! `XREADGROUP COUNT 100 BLOCK 50`; one `XPENDING` range of the batch reads each entry's
//! delivery count (the attempt, counted by the server at claim); one Lua script per batch acks:
//! one `XPENDING` range of the batch for this consumer (the fence: an entry still ours, with
//! the delivery count it ran with), then one `XACK`, `XDEL` and `SREM` of the entries that
//! passed. SQL: the claim `UPDATE` also writes a lease token and counts the
//! attempt; the batch's `DELETE` (and a retry's release) matches the token.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use redis::streams::{StreamReadOptions, StreamReadReply};
use sqlx::{Connection, QueryBuilder};

use crate::common::{BATCH, Backend, BenchJob, Hook, Target};

/// Every backend.
pub fn supports(_b: Backend) -> bool {
    true
}

/// One script per call on Redis, multi-row `INSERT` on SQL.
pub fn has_bulk(_b: Backend) -> bool {
    true
}

const GROUP: &str = "raw";

/// Attempts a job gets.
const MAX_ATTEMPTS: i64 = 3;

/// Redis: the group's pending entries and lag; SQL: the queue's rows.
pub fn remaining(t: &Target) -> super::probe::Remaining {
    use super::probe::{RedisPlace, Remaining, lit};
    match t.backend {
        Backend::Redis => Remaining::Redis(vec![RedisPlace::Group {
            stream: t.queue.clone(),
            group: GROUP.to_owned(),
        }]),
        _ => Remaining::Sql(format!(
            "SELECT count(*) FROM raw_guarded_jobs WHERE queue = {}",
            lit(&t.queue)
        )),
    }
}

/// What it does, exactly.
pub fn legend(b: Backend) -> String {
    match b {
        Backend::Redis => "the minimal loop plus: publish through a script adding the id to an \
            id set (`SADD`, a duplicate is not stored); one `XPENDING` range per batch reads the \
            attempt; the ack is one script per batch: one `XPENDING` range for this consumer \
            (fence: an entry still ours with the delivery count it ran with), then one `XACK`, \
            `XDEL` and `SREM` of the entries that passed"
            .to_owned(),
        Backend::Postgres | Backend::Sqlite => "the minimal loop plus: the claim writes a lease \
            token and counts the attempt (`attempt = attempt + 1`); the batch's `DELETE` and a \
            retry's release match the token (fenced); one connection, 10 ms sleep when a claim \
            finds nothing"
            .to_owned(),
    }
}

const SQLITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS raw_guarded_jobs (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    locked_until INTEGER,
    lease INTEGER,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS raw_guarded_jobs_queue ON raw_guarded_jobs (queue, id);";

const POSTGRES_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS raw_guarded_jobs (
    id BIGSERIAL PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    locked_until TIMESTAMPTZ,
    lease BIGINT,
    payload BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS raw_guarded_jobs_queue ON raw_guarded_jobs (queue, id);";

/// Publish: per (id, payload) pair, `SADD` to the id set and `XADD` where the id was new.
const PUBLISH: &str = r"
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    redis.call('XADD', KEYS[1], '*', 'id', ARGV[i], 'p', ARGV[i + 1])
    n = n + 1
  end
end
return n";

/// Ack, fenced: ARGV group, consumer, the batch's first and last entry ids, then per entry
/// (entry id, job id, delivery count). One `XPENDING` range of the batch for this consumer
/// reads what is still ours; an entry is settled only while it is pending to this consumer with
/// that delivery count; then one `XACK`, one `XDEL` and one `SREM` for the batch.
const ACK: &str = r"
local pend = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[4], (#ARGV - 4) / 3, ARGV[2])
local times = {}
for _, e in ipairs(pend) do times[e[1]] = tostring(e[4]) end
local ids, jobs = {}, {}
for i = 5, #ARGV, 3 do
  if times[ARGV[i]] == ARGV[i + 2] then
    ids[#ids + 1] = ARGV[i]
    jobs[#jobs + 1] = ARGV[i + 1]
  end
end
if #ids > 0 then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
  redis.call('XDEL', KEYS[1], unpack(ids))
  redis.call('SREM', KEYS[2], unpack(jobs))
end
return #ids";

/// Retry, fenced like [`ACK`]: ARGV group, consumer, first and last entry ids, then per entry
/// (entry id, job id, delivery count, payload, attempts so far): each entry still ours is
/// replaced by a copy carrying the attempts; the id stays in the id set.
const RETRY: &str = r"
local pend = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[4], (#ARGV - 4) / 5, ARGV[2])
local times = {}
for _, e in ipairs(pend) do times[e[1]] = tostring(e[4]) end
local ids = {}
for i = 5, #ARGV, 5 do
  if times[ARGV[i]] == ARGV[i + 2] then
    ids[#ids + 1] = ARGV[i]
    redis.call('XADD', KEYS[1], '*', 'id', ARGV[i + 1], 'p', ARGV[i + 3], 'a', ARGV[i + 4])
  end
end
if #ids > 0 then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
  redis.call('XDEL', KEYS[1], unpack(ids))
end
return #ids";

/// Creates the table and empties it (Redis: the harness flushes the server).
pub async fn reset(t: &Target) -> anyhow::Result<()> {
    match t.backend {
        Backend::Redis => {}
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&t.url).await?;
            sqlx::raw_sql(POSTGRES_SCHEMA).execute(&mut c).await?;
            sqlx::raw_sql("TRUNCATE raw_guarded_jobs")
                .execute(&mut c)
                .await?;
        }
        Backend::Sqlite => {
            let mut c = sqlite(&t.url).await?;
            sqlx::raw_sql(SQLITE_SCHEMA).execute(&mut c).await?;
            sqlx::raw_sql("DELETE FROM raw_guarded_jobs")
                .execute(&mut c)
                .await?;
        }
    }
    Ok(())
}

async fn sqlite(url: &str) -> anyhow::Result<sqlx::SqliteConnection> {
    let mut c = sqlx::SqliteConnection::connect(url).await?;
    sqlx::raw_sql(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000",
    )
    .execute(&mut c)
    .await?;
    Ok(c)
}

/// One connection.
pub enum Producer {
    /// Redis: the connection, the stream, the id set, the publish script.
    Redis(
        redis::aio::MultiplexedConnection,
        String,
        String,
        redis::Script,
    ),
    /// Postgres.
    Postgres(sqlx::PgConnection, String),
    /// SQLite.
    Sqlite(sqlx::SqliteConnection, String),
}

impl Producer {
    /// Connects.
    pub async fn connect(t: &Target) -> anyhow::Result<Self> {
        Ok(match t.backend {
            Backend::Redis => {
                let c = redis::Client::open(t.url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                Producer::Redis(
                    c,
                    t.queue.clone(),
                    format!("{}:ids", t.queue),
                    redis::Script::new(PUBLISH),
                )
            }
            Backend::Postgres => {
                Producer::Postgres(sqlx::PgConnection::connect(&t.url).await?, t.queue.clone())
            }
            Backend::Sqlite => Producer::Sqlite(sqlite(&t.url).await?, t.queue.clone()),
        })
    }

    /// One job: one script call / one `INSERT`.
    pub async fn one(&mut self, job: BenchJob) -> anyhow::Result<()> {
        self.bulk(&[job]).await
    }

    /// One script call / one multi-row `INSERT`.
    pub async fn bulk(&mut self, jobs: &[BenchJob]) -> anyhow::Result<()> {
        match self {
            Producer::Redis(c, q, ids, script) => {
                let mut inv = script.key(&*q);
                inv.key(&*ids);
                for j in jobs {
                    inv.arg(j.i).arg(serde_json::to_vec(j)?);
                }
                let _stored: i64 = inv.invoke_async(c).await?;
            }
            Producer::Postgres(c, q) => {
                let mut b = QueryBuilder::<sqlx::Postgres>::new(
                    "INSERT INTO raw_guarded_jobs (queue, payload) ",
                );
                b.push_values(jobs, |mut row, j| {
                    row.push_bind(q.clone())
                        .push_bind(serde_json::to_vec(j).unwrap_or_default());
                });
                b.build().execute(c).await?;
            }
            Producer::Sqlite(c, q) => {
                let mut b = QueryBuilder::<sqlx::Sqlite>::new(
                    "INSERT INTO raw_guarded_jobs (queue, payload) ",
                );
                b.push_values(jobs, |mut row, j| {
                    row.push_bind(q.clone())
                        .push_bind(serde_json::to_vec(j).unwrap_or_default());
                });
                b.build().execute(c).await?;
            }
        }
        Ok(())
    }
}

/// One loop on one connection: claim a batch (counting its attempts), run it, settle it fenced.
pub async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
    match t.backend {
        Backend::Redis => work_redis(t, &hook).await,
        Backend::Postgres => work_postgres(t, &hook).await,
        Backend::Sqlite => work_sqlite(t, &hook).await,
    }
}

/// A lease token no other claim has (the time, the process and a counter).
fn token() -> i64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    ((crate::common::now_ns() ^ (u64::from(std::process::id()) << 40)).wrapping_add(n << 20)
        & (i64::MAX as u64)) as i64
}

async fn work_redis(t: &Target, hook: &Hook) -> anyhow::Result<()> {
    let mut c = redis::Client::open(t.url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let q = t.queue.as_str();
    let ids = format!("{q}:ids");
    let consumer = format!("c-{}", std::process::id());
    let created: redis::RedisResult<()> = c.xgroup_create_mkstream(q, GROUP, "0").await;
    if let Err(e) = created
        && e.code() != Some("BUSYGROUP")
    {
        return Err(e.into());
    }
    let (ack, retry) = (redis::Script::new(ACK), redis::Script::new(RETRY));
    let opts = StreamReadOptions::default()
        .group(GROUP, &consumer)
        .count(BATCH)
        .block(50);
    loop {
        let reply: Option<StreamReadReply> = c.xread_options(&[q], &[">"], &opts).await?;
        let Some(reply) = reply else { continue };
        let entries: Vec<redis::streams::StreamId> =
            reply.keys.into_iter().flat_map(|k| k.ids).collect();
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            continue;
        };
        // The attempt: each entry's delivery count, counted by the server at the claim.
        let pending: redis::streams::StreamPendingCountReply = redis::cmd("XPENDING")
            .arg(q)
            .arg(GROUP)
            .arg(&first.id)
            .arg(&last.id)
            .arg(entries.len())
            .arg(&consumer)
            .query_async(&mut c)
            .await?;
        let times: std::collections::HashMap<String, usize> = pending
            .ids
            .into_iter()
            .map(|p| (p.id, p.times_delivered))
            .collect();
        let (from, to) = (first.id.clone(), last.id.clone());
        let mut acks = ack.prepare_invoke();
        acks.key(q)
            .key(&ids)
            .arg(GROUP)
            .arg(&consumer)
            .arg(&from)
            .arg(&to);
        let mut retries = retry.prepare_invoke();
        retries
            .key(q)
            .key(&ids)
            .arg(GROUP)
            .arg(&consumer)
            .arg(&from)
            .arg(&to);
        let (mut n_ack, mut n_retry) = (0, 0);
        for e in entries {
            // Not pending to us any more (claimed by another consumer): not ours to run.
            let Some(&delivered) = times.get(&e.id) else {
                continue;
            };
            let payload: Vec<u8> = match e.map.get("p") {
                Some(v) => redis::from_redis_value(v.clone())?,
                None => anyhow::bail!("entry {} has no payload", e.id),
            };
            let id: String = match e.map.get("id") {
                Some(v) => redis::from_redis_value(v.clone())?,
                None => anyhow::bail!("entry {} has no id", e.id),
            };
            let before: i64 = match e.map.get("a") {
                Some(v) => redis::from_redis_value(v.clone())?,
                None => 0,
            };
            let attempt = before + delivered as i64;
            let job: BenchJob = serde_json::from_slice(&payload)?;
            if hook.run(&job) || attempt >= MAX_ATTEMPTS {
                acks.arg(&e.id).arg(&id).arg(delivered);
                n_ack += 1;
            } else {
                retries
                    .arg(&e.id)
                    .arg(&id)
                    .arg(delivered)
                    .arg(payload)
                    .arg(attempt);
                n_retry += 1;
            }
        }
        if n_ack > 0 {
            let _settled: i64 = acks.invoke_async(&mut c).await?;
        }
        if n_retry > 0 {
            let _settled: i64 = retries.invoke_async(&mut c).await?;
        }
    }
}

async fn work_postgres(t: &Target, hook: &Hook) -> anyhow::Result<()> {
    let mut c = sqlx::PgConnection::connect(&t.url).await?;
    let claim = "UPDATE raw_guarded_jobs SET locked_until = now() + interval '30 seconds', \
        lease = $3, attempt = attempt + 1 \
        WHERE id IN (SELECT id FROM raw_guarded_jobs WHERE queue = $1 \
        AND (locked_until IS NULL OR locked_until < now()) \
        ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING id, attempt, payload";
    loop {
        let lease = token();
        let rows: Vec<(i64, i32, Vec<u8>)> = sqlx::query_as(claim)
            .bind(&t.queue)
            .bind(BATCH as i64)
            .bind(lease)
            .fetch_all(&mut c)
            .await?;
        if rows.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let (mut done, mut again) = (Vec::new(), Vec::new());
        for (id, attempt, payload) in rows {
            let job: BenchJob = serde_json::from_slice(&payload)?;
            if hook.run(&job) || i64::from(attempt) >= MAX_ATTEMPTS {
                done.push(id)
            } else {
                again.push(id)
            }
        }
        sqlx::query("DELETE FROM raw_guarded_jobs WHERE id = ANY($1) AND lease = $2")
            .bind(&done)
            .bind(lease)
            .execute(&mut c)
            .await?;
        if !again.is_empty() {
            sqlx::query(
                "UPDATE raw_guarded_jobs SET locked_until = NULL, lease = NULL \
                 WHERE id = ANY($1) AND lease = $2",
            )
            .bind(&again)
            .bind(lease)
            .execute(&mut c)
            .await?;
        }
    }
}

fn id_list(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

async fn work_sqlite(t: &Target, hook: &Hook) -> anyhow::Result<()> {
    let mut c = sqlite(&t.url).await?;
    let claim = "UPDATE raw_guarded_jobs SET locked_until = ?1, lease = ?5, \
        attempt = attempt + 1 \
        WHERE id IN (SELECT id FROM raw_guarded_jobs WHERE queue = ?2 \
        AND (locked_until IS NULL OR locked_until < ?3) \
        ORDER BY id LIMIT ?4) RETURNING id, attempt, payload";
    loop {
        let now = crate::common::now_ns() as i64 / 1_000_000;
        let lease = token();
        let rows: Vec<(i64, i64, Vec<u8>)> = sqlx::query_as(claim)
            .bind(now + 30_000)
            .bind(&t.queue)
            .bind(now)
            .bind(BATCH as i64)
            .bind(lease)
            .fetch_all(&mut c)
            .await?;
        if rows.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let (mut done, mut again) = (Vec::new(), Vec::new());
        for (id, attempt, payload) in rows {
            let job: BenchJob = serde_json::from_slice(&payload)?;
            if hook.run(&job) || attempt >= MAX_ATTEMPTS {
                done.push(id)
            } else {
                again.push(id)
            }
        }
        let sql = format!(
            "DELETE FROM raw_guarded_jobs WHERE id IN ({}) AND lease = {lease}",
            id_list(&done)
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut c)
            .await?;
        if !again.is_empty() {
            let sql = format!(
                "UPDATE raw_guarded_jobs SET locked_until = NULL, lease = NULL \
                 WHERE id IN ({}) AND lease = {lease}",
                id_list(&again)
            );
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut c)
                .await?;
        }
    }
}
