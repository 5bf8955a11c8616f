//! What the service does once as it starts: connect (the server's version, and whether its
//! scripts may run on a full server), check the mounts (their dead letters' names), prepare
//! each queue (its stream and group).

use std::sync::atomic::Ordering;

use redis::{Value, cmd};
use stagedoor_jobs::broker::{BrokerError, MountInfo, Problem};

use crate::broker::{GROUP, RedisBroker};
use crate::entry;
use crate::errors::is_oom;
use crate::keys::{DEAD_SUFFIX, Keys};
use crate::value;

impl RedisBroker {
    /// [`Inspect::connect`](stagedoor_jobs::broker::Inspect::connect) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_connect(&self) -> Result<(), BrokerError> {
        if self.namespace.contains(['{', '}']) {
            // Every key is `{<namespace><queue>}...`: a brace in the namespace ends the hash
            // tag early (on a Cluster a queue's keys land in other slots: CROSSSLOT).
            return Err(BrokerError::Invalid(format!(
                "the Redis namespace `{}` holds a `{{` or `}}`, which Redis keys use for a queue's hash tag: use a namespace without braces, such as `{}`",
                self.namespace,
                self.namespace.replace(['{', '}'], "")
            )));
        }
        let target = self
            .inner
            .target
            .as_ref()
            .map_err(|e| BrokerError::Connection(e.clone()))?;
        let conn = self
            .inner
            .conn
            .get_or_try_init(|| async {
                target.connect().await.map_err(|e| match self.err(e) {
                    BrokerError::Connection(e) => BrokerError::Connection(format!(
                        "cannot reach Redis at `{}`: {e}: check the URL and that the server is running",
                        self.inner.url_for_messages
                    )),
                    other => other,
                })
            })
            .await?;
        let mut c = conn.clone();
        // A cluster answers with every node's INFO: the oldest node decides.
        let info: Value = cmd("INFO")
            .arg("server")
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        let texts: Vec<String> = match &info {
            Value::Map(m) => m.iter().filter_map(|(_, v)| value::string(v)).collect(),
            other => value::string(other).into_iter().collect(),
        };
        let versions: Vec<(u32, u32, String)> = texts
            .iter()
            .map(|t| {
                let v = t
                    .lines()
                    .find_map(|l| l.strip_prefix("redis_version:"))
                    .unwrap_or("0")
                    .trim()
                    .to_owned();
                let p: Vec<u32> = v.split('.').filter_map(|x| x.parse().ok()).collect();
                (
                    p.first().copied().unwrap_or(0),
                    p.get(1).copied().unwrap_or(0),
                    v,
                )
            })
            .collect();
        let (major, minor, version) =
            versions
                .into_iter()
                .min()
                .unwrap_or((0, 0, "unknown".to_owned()));
        if (major, minor) < (6, 2) {
            return Err(BrokerError::Connection(format!(
                "Redis {version} at `{}` is too old: stagedoor-jobs needs 6.2 or later (XAUTOCLAIM, ZRANGE BYSCORE)",
                self.inner.url_for_messages
            )));
        }
        // Script flags (`#!lua flags=allow-oom`) came with Redis 7.
        self.inner.allow_oom.store(major >= 7, Ordering::Relaxed);
        Ok(())
    }

    /// [`Broker::check`](stagedoor_jobs::broker::Broker::check) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_check(&self, mounts: &[MountInfo]) -> Vec<Problem> {
        let mut problems = Vec::new();
        for m in mounts {
            if let Some(dead) = &m.dead_letter {
                let expected = format!("{}{DEAD_SUFFIX}", m.queue);
                if *dead != expected {
                    problems.push(Problem {
                        mount: format!("mount `{}` on queue `{}`", m.subscriber, m.queue),
                        message: format!(
                            "on Redis a dead letter is its stream's dead stream, which shares the stream's hash tag so that the move is one atomic step: write `.dead_letter(\"{expected}\")`"
                        ),
                    });
                }
            }
        }
        problems
    }

    /// [`Broker::prepare`](stagedoor_jobs::broker::Broker::prepare) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_prepare(&self, queue: &str) -> Result<(), BrokerError> {
        let keys = self.keys(queue);
        self.prepare_stream(&keys).await?;
        // The streams of the priority levels in use (not at all for a queue without any).
        let hk = self.housekeeping(queue);
        for level in crate::broker::levels_of(hk.levels) {
            if level != stagedoor_jobs::Priority::NORMAL {
                self.prepare_stream(&keys.at(level)).await?;
            }
        }
        Ok(())
    }

    /// Makes `keys`' stream and its consumer group, if they are not there.
    pub(crate) async fn prepare_stream(&self, keys: &Keys) -> Result<(), BrokerError> {
        let mut c = self.conn()?;
        let r: redis::RedisResult<Value> = cmd("XGROUP")
            .arg("CREATE")
            .arg(&keys.stream)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("BUSYGROUP") => Ok(()),
            // A full server refuses `XGROUP CREATE` even when the group exists (the command may
            // grow its memory, so it is refused before it looks): a group that exists is all a
            // worker needs, and it drains the full server like any other.
            Err(e) if is_oom(&e) && self.group_exists(keys).await => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Whether `keys`' stream has the consumer group (`XINFO GROUPS`, which a full server
    /// answers); `false` when that cannot be told.
    pub(crate) async fn group_exists(&self, keys: &Keys) -> bool {
        let Ok(mut c) = self.conn() else {
            return false;
        };
        let groups: Value = match cmd("XINFO")
            .arg("GROUPS")
            .arg(&keys.stream)
            .query_async(&mut c)
            .await
        {
            Ok(v) => v,
            Err(_) => return false,
        };
        value::array(&groups)
            .iter()
            .any(|g| entry::text(&value::fields(g), "name").as_deref() == Some(GROUP))
    }
}
