//! The minimal loop of each server: a hand-written loop doing only the protocol work a job
//! needs, batched the way stagedoor-jobs batches. One connection, no fence on the
//! acknowledgement, no id set, no attempt count, no envelope, no retry policy, no lease renewal,
//! no dead letters: what is left when neither a framework nor its guarantees cost anything.
//! [`super::raw_guarded`] is the same loop with stagedoor-jobs' guarantees.
//!
//! - Redis: pipelined `XADD`; `XREADGROUP COUNT 100`; one `XACK`+`XDEL` per batch.
//! - SQL: a multi-row `INSERT`; one claim statement leasing and returning up to 100 rows; one
//!   `DELETE` per batch.

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

/// Pipelined `XADD`, multi-row `INSERT`.
pub fn has_bulk(_b: Backend) -> bool {
    true
}

/// Redis: the group's pending entries and lag; SQL: the queue's rows.
pub fn remaining(t: &Target) -> super::probe::Remaining {
    use super::probe::{RedisPlace, Remaining, lit};
    match t.backend {
        Backend::Redis => Remaining::Redis(vec![RedisPlace::Group {
            stream: t.queue.clone(),
            group: GROUP.to_owned(),
        }]),
        _ => Remaining::Sql(format!(
            "SELECT count(*) FROM raw_jobs WHERE queue = {}",
            lit(&t.queue)
        )),
    }
}

/// What it does, exactly.
pub fn legend(b: Backend) -> String {
    let what = match b {
        Backend::Redis => {
            "one multiplexed connection: `XREADGROUP COUNT 100 BLOCK 50` (the \
            server wakes it), the batch's jobs in turn, then one pipeline of `XACK` + `XDEL` \
            (a failed job: `XADD` of a copy); publish: pipelined `XADD`"
        }
        Backend::Postgres => {
            "one connection: a claim `UPDATE ... RETURNING` of up to 100 rows \
            (`FOR UPDATE SKIP LOCKED`, 30 s lease), the jobs in turn, one `DELETE ... = ANY` \
            per batch; sleeps 10 ms when a claim finds nothing; publish: multi-row `INSERT`"
        }
        Backend::Sqlite => {
            "one connection (WAL, `synchronous = NORMAL`): a claim `UPDATE ... \
            RETURNING` of up to 100 rows (30 s lease), the jobs in turn, one `DELETE` per \
            batch; sleeps 10 ms when a claim finds nothing; publish: multi-row `INSERT`"
        }
    };
    format!("minimal loop, {what}; no fence, no id set, no attempt count")
}

const GROUP: &str = "raw";

const SQLITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS raw_jobs (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    locked_until INTEGER,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS raw_jobs_queue ON raw_jobs (queue, id);";

const POSTGRES_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS raw_jobs (
    id BIGSERIAL PRIMARY KEY,
    queue TEXT NOT NULL,
    locked_until TIMESTAMPTZ,
    payload BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS raw_jobs_queue ON raw_jobs (queue, id);";

/// Creates the table and empties it (Redis: the harness flushes the server).
pub async fn reset(t: &Target) -> anyhow::Result<()> {
    match t.backend {
        Backend::Redis => {}
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&t.url).await?;
            sqlx::raw_sql(POSTGRES_SCHEMA).execute(&mut c).await?;
            sqlx::raw_sql("TRUNCATE raw_jobs").execute(&mut c).await?;
        }
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&t.url).await?;
            sqlx::raw_sql("PRAGMA journal_mode = WAL")
                .execute(&mut c)
                .await?;
            sqlx::raw_sql(SQLITE_SCHEMA).execute(&mut c).await?;
            sqlx::raw_sql("DELETE FROM raw_jobs")
                .execute(&mut c)
                .await?;
        }
    }
    Ok(())
}

/// One connection.
pub enum Producer {
    /// Redis.
    Redis(redis::aio::MultiplexedConnection, String),
    /// Postgres.
    Postgres(sqlx::PgConnection, String),
    /// SQLite.
    Sqlite(sqlx::SqliteConnection, String),
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

impl Producer {
    /// Connects.
    pub async fn connect(t: &Target) -> anyhow::Result<Self> {
        Ok(match t.backend {
            Backend::Redis => {
                let c = redis::Client::open(t.url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                Producer::Redis(c, t.queue.clone())
            }
            Backend::Postgres => {
                Producer::Postgres(sqlx::PgConnection::connect(&t.url).await?, t.queue.clone())
            }
            Backend::Sqlite => Producer::Sqlite(sqlite(&t.url).await?, t.queue.clone()),
        })
    }

    /// One `XADD` / `INSERT`.
    pub async fn one(&mut self, job: BenchJob) -> anyhow::Result<()> {
        self.bulk(&[job]).await
    }

    /// A pipeline of `XADD`s / one multi-row `INSERT`.
    pub async fn bulk(&mut self, jobs: &[BenchJob]) -> anyhow::Result<()> {
        match self {
            Producer::Redis(c, q) => {
                let mut p = redis::pipe();
                for j in jobs {
                    p.xadd(&*q, "*", &[("p", serde_json::to_vec(j)?)]).ignore();
                }
                let () = p.query_async(c).await?;
            }
            Producer::Postgres(c, q) => {
                let mut b =
                    QueryBuilder::<sqlx::Postgres>::new("INSERT INTO raw_jobs (queue, payload) ");
                b.push_values(jobs, |mut row, j| {
                    row.push_bind(q.clone())
                        .push_bind(serde_json::to_vec(j).unwrap_or_default());
                });
                b.build().execute(c).await?;
            }
            Producer::Sqlite(c, q) => {
                let mut b =
                    QueryBuilder::<sqlx::Sqlite>::new("INSERT INTO raw_jobs (queue, payload) ");
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

/// One loop on one connection: claim a batch, run it, settle it in one statement.
pub async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
    match t.backend {
        Backend::Redis => work_redis(t, &hook).await,
        Backend::Postgres => work_postgres(t, &hook).await,
        Backend::Sqlite => work_sqlite(t, &hook).await,
    }
}

async fn work_redis(t: &Target, hook: &Hook) -> anyhow::Result<()> {
    let mut c = redis::Client::open(t.url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let q = t.queue.as_str();
    let created: redis::RedisResult<()> = c.xgroup_create_mkstream(q, GROUP, "0").await;
    if let Err(e) = created
        && e.code() != Some("BUSYGROUP")
    {
        return Err(e.into());
    }
    let opts = StreamReadOptions::default()
        .group(GROUP, "c1")
        .count(BATCH)
        .block(50);
    loop {
        let reply: Option<StreamReadReply> = c.xread_options(&[q], &[">"], &opts).await?;
        let Some(reply) = reply else { continue };
        let mut done = Vec::new();
        let mut p = redis::pipe();
        for key in reply.keys {
            for e in key.ids {
                let job: BenchJob = match e.map.get("p") {
                    Some(v) => {
                        serde_json::from_slice(&redis::from_redis_value::<Vec<u8>>(v.clone())?)?
                    }
                    None => anyhow::bail!("entry {} has no payload", e.id),
                };
                if !hook.run(&job) {
                    p.xadd(q, "*", &[("p", serde_json::to_vec(&job)?)]).ignore();
                }
                done.push(e.id);
            }
        }
        if !done.is_empty() {
            p.xack(q, GROUP, &done).ignore().xdel(q, &done).ignore();
            let () = p.query_async(&mut c).await?;
        }
    }
}

async fn work_postgres(t: &Target, hook: &Hook) -> anyhow::Result<()> {
    let mut c = sqlx::PgConnection::connect(&t.url).await?;
    let claim = "UPDATE raw_jobs SET locked_until = now() + interval '30 seconds' \
        WHERE id IN (SELECT id FROM raw_jobs WHERE queue = $1 AND (locked_until IS NULL OR locked_until < now()) \
        ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING id, payload";
    loop {
        let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(claim)
            .bind(&t.queue)
            .bind(BATCH as i64)
            .fetch_all(&mut c)
            .await?;
        if rows.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let (mut done, mut again) = (Vec::new(), Vec::new());
        for (id, payload) in rows {
            let job: BenchJob = serde_json::from_slice(&payload)?;
            if hook.run(&job) {
                done.push(id)
            } else {
                again.push(id)
            }
        }
        sqlx::query("DELETE FROM raw_jobs WHERE id = ANY($1)")
            .bind(&done)
            .execute(&mut c)
            .await?;
        if !again.is_empty() {
            sqlx::query("UPDATE raw_jobs SET locked_until = NULL WHERE id = ANY($1)")
                .bind(&again)
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
    let claim = "UPDATE raw_jobs SET locked_until = ?1 \
        WHERE id IN (SELECT id FROM raw_jobs WHERE queue = ?2 AND (locked_until IS NULL OR locked_until < ?3) \
        ORDER BY id LIMIT ?4) RETURNING id, payload";
    loop {
        let now = crate::common::now_ns() as i64 / 1_000_000;
        let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(claim)
            .bind(now + 30_000)
            .bind(&t.queue)
            .bind(now)
            .bind(BATCH as i64)
            .fetch_all(&mut c)
            .await?;
        if rows.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let (mut done, mut again) = (Vec::new(), Vec::new());
        for (id, payload) in rows {
            let job: BenchJob = serde_json::from_slice(&payload)?;
            if hook.run(&job) {
                done.push(id)
            } else {
                again.push(id)
            }
        }
        let sql = format!("DELETE FROM raw_jobs WHERE id IN ({})", id_list(&done));
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut c)
            .await?;
        if !again.is_empty() {
            let sql = format!(
                "UPDATE raw_jobs SET locked_until = NULL WHERE id IN ({})",
                id_list(&again)
            );
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut c)
                .await?;
        }
    }
}
