//! The harness's own look at a backend: how many of a system's jobs are left in the queue
//! (ready, in flight, or delayed), so that a measurement ends when the queue is verified empty
//! rather than when the last handler returned. Read on a connection of its own, in the harness
//! process; on Redis it also counts its own commands, so that the command profile of a
//! measurement can leave them out.

use std::collections::{BTreeMap, HashMap};

use sqlx::Connection;

use crate::common::{Backend, Target};

/// One place on Redis where a system keeps unfinished jobs.
#[derive(Debug, Clone)]
pub enum RedisPlace {
    /// A stream read through a consumer group: the group's pending entries plus its lag
    /// (entries not yet delivered); the stream's length while the group does not exist yet.
    Group {
        /// The stream's key.
        stream: String,
        /// The consumer group.
        group: String,
    },
    /// A sorted set (delayed jobs, retries): its cardinality.
    Zset(String),
    /// A list (ready ids): its length.
    List(String),
    /// Every set whose key matches the pattern (in-flight ids per worker): their cardinalities.
    Sets(String),
}

/// Where a system's unfinished jobs are.
#[derive(Debug, Clone)]
pub enum Remaining {
    /// On Redis: the sum over these places.
    Redis(Vec<RedisPlace>),
    /// On Postgres or SQLite: a query returning one count (BIGINT / INTEGER).
    Sql(String),
}

/// A connection that reads [`Remaining`].
pub struct Probe {
    what: Remaining,
    conn: Conn,
    /// Commands this probe sent to Redis, by lower-case name (`xinfo|groups` counts as
    /// `xinfo|groups`, as `INFO commandstats` names it).
    pub calls: BTreeMap<String, u64>,
}

enum Conn {
    Redis(redis::aio::MultiplexedConnection),
    Postgres(sqlx::PgConnection),
    Sqlite(sqlx::SqliteConnection),
}

impl Probe {
    /// Connects to the target's backend.
    pub async fn connect(t: &Target, what: Remaining) -> anyhow::Result<Self> {
        let conn = match t.backend {
            Backend::Redis => Conn::Redis(
                redis::Client::open(t.url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            ),
            Backend::Postgres => Conn::Postgres(sqlx::PgConnection::connect(&t.url).await?),
            Backend::Sqlite => Conn::Sqlite(sqlx::SqliteConnection::connect(&t.url).await?),
        };
        Ok(Probe {
            what,
            conn,
            calls: BTreeMap::new(),
        })
    }

    fn count(&mut self, cmd: &str) {
        *self.calls.entry(cmd.to_owned()).or_default() += 1;
    }

    /// Jobs left: ready, in flight, or delayed.
    pub async fn remaining(&mut self) -> anyhow::Result<u64> {
        let what = self.what.clone();
        match (&mut self.conn, what) {
            (Conn::Postgres(c), Remaining::Sql(q)) => {
                let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(q))
                    .fetch_one(c)
                    .await?;
                Ok(n.max(0) as u64)
            }
            (Conn::Sqlite(c), Remaining::Sql(q)) => {
                let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(q))
                    .fetch_one(c)
                    .await?;
                Ok(n.max(0) as u64)
            }
            (Conn::Redis(_), Remaining::Redis(places)) => {
                let mut total = 0;
                for p in &places {
                    total += self.redis_place(p).await?;
                }
                Ok(total)
            }
            _ => anyhow::bail!("the probe's query does not fit its backend"),
        }
    }

    async fn redis_place(&mut self, p: &RedisPlace) -> anyhow::Result<u64> {
        let Conn::Redis(c) = &mut self.conn else {
            anyhow::bail!("not Redis");
        };
        let mut c = c.clone();
        match p {
            RedisPlace::Zset(k) => {
                self.count("zcard");
                Ok(redis::cmd("ZCARD").arg(k).query_async(&mut c).await?)
            }
            RedisPlace::List(k) => {
                self.count("llen");
                Ok(redis::cmd("LLEN").arg(k).query_async(&mut c).await?)
            }
            RedisPlace::Sets(pattern) => {
                self.count("keys");
                let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query_async(&mut c).await?;
                let mut n = 0;
                for k in keys {
                    self.count("scard");
                    // A key of another type under the pattern counts nothing.
                    let v: redis::RedisResult<u64> =
                        redis::cmd("SCARD").arg(&k).query_async(&mut c).await;
                    n += v.unwrap_or(0);
                }
                Ok(n)
            }
            RedisPlace::Group { stream, group } => {
                self.count("xinfo|groups");
                let groups: redis::RedisResult<Vec<HashMap<String, redis::Value>>> =
                    redis::cmd("XINFO")
                        .arg("GROUPS")
                        .arg(stream)
                        .query_async(&mut c)
                        .await;
                let groups = match groups {
                    Ok(g) => g,
                    // No stream yet: nothing published.
                    Err(e) if e.to_string().contains("no such key") => return Ok(0),
                    Err(e) => return Err(e.into()),
                };
                let int = |v: Option<&redis::Value>| -> Option<u64> {
                    v.and_then(|v| redis::from_redis_value::<Option<u64>>(v.clone()).ok())
                        .flatten()
                };
                let name = |g: &HashMap<String, redis::Value>| {
                    g.get("name")
                        .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                };
                let Some(g) = groups.iter().find(|g| name(g).as_deref() == Some(group)) else {
                    self.count("xlen");
                    return Ok(redis::cmd("XLEN").arg(stream).query_async(&mut c).await?);
                };
                let pending = int(g.get("pending")).unwrap_or(0);
                let lag = match int(g.get("lag")) {
                    Some(l) => l,
                    None => {
                        // Redis cannot tell the lag (entries deleted past the group's last
                        // delivery): count the entries after it.
                        let last = g
                            .get("last-delivered-id")
                            .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                            .unwrap_or_else(|| "0-0".to_owned());
                        self.count("xrange");
                        let ids: Vec<redis::Value> = redis::cmd("XRANGE")
                            .arg(stream)
                            .arg(format!("({last}"))
                            .arg("+")
                            .query_async(&mut c)
                            .await?;
                        ids.len() as u64
                    }
                };
                Ok(pending + lag)
            }
        }
    }
}

/// `s` as an SQL string literal.
pub fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}
