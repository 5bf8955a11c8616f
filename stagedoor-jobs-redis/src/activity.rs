//! [`Activity`](stagedoor_jobs::Activity) on Redis: workers' reports, per-minute counts, the
//! delayed jobs of a queue.
//!
//! Every key of the reports and counts shares one hash tag, `{<namespace>stagedoor:activity}`
//! (`{stagedoor:activity}` without a namespace), so that a report is one script on one node of
//! a Redis Cluster:
//!
//! | key | what |
//! |---|---|
//! | `{stagedoor:activity}:worker:<id>` | a worker's last report (JSON), expiring after its ttl |
//! | `{stagedoor:activity}:workers` | the worker ids, scored by when their report expires (ms); pruned on every report |
//! | `{stagedoor:activity}:minutes:<queue>` | a queue's counts: fields `<minute ms>:p` (processed), `:f` (failed), `:d` (dead); fields older than [`COUNTS_KEPT`] are deleted on every report |
//!
//! The delayed jobs are read from the queue's own delayed set (`{jobs}:delayed`).

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::{Script, cmd};
use stagedoor_jobs::activity::{
    COUNTS_KEPT, DelayedJob, MinuteCounts, QueueCounts, WorkerReport, minute_of,
};
use stagedoor_jobs::broker::BrokerError;
use stagedoor_jobs::kit::{counts_kept_from, decode_report, encode_report};

use crate::broker::{RedisBroker, ms};
use crate::entry;
use crate::keys::Keys;

/// KEYS: the worker's key, the index of workers, then one counts hash per queue. ARGV: worker
/// id, report JSON, ttl_ms, now_ms, keep_from_ms, kept_ms, then per queue (in the order of its
/// key) `n` and `n` groups of `minute_ms, processed, failed, dead`. Stores the report, renews
/// it in the index (dropping those that ran out), adds the counts and deletes minutes older
/// than `keep_from_ms`.
static REPORT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ttl = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
local keep_from = tonumber(ARGV[5])
local a = 7
for k = 3, #KEYS do
  local n = tonumber(ARGV[a])
  a = a + 1
  for i = 1, n do
    local m = ARGV[a]
    if tonumber(m) >= keep_from then
      local names = {':p', ':f', ':d'}
      for j = 1, 3 do
        local c = tonumber(ARGV[a + j])
        if c > 0 then redis.call('HINCRBY', KEYS[k], m .. names[j], c) end
      end
    end
    a = a + 4
  end
  for _, f in ipairs(redis.call('HKEYS', KEYS[k])) do
    local m = tonumber(string.match(f, '^(%-?%d+):'))
    if m == nil or m < keep_from then redis.call('HDEL', KEYS[k], f) end
  end
  if redis.call('EXISTS', KEYS[k]) == 1 then redis.call('PEXPIRE', KEYS[k], ARGV[6]) end
end
return 1
",
    )
});

impl RedisBroker {
    /// An activity key: `{<namespace>stagedoor:activity}:<rest>`.
    fn activity_key(&self, rest: &str) -> String {
        format!("{{{}stagedoor:activity}}:{rest}", self.namespace)
    }

    /// [`Activity::report`](stagedoor_jobs::Activity::report) on Redis (the trait's impl in
    /// `broker.rs` calls this): one script.
    pub(crate) async fn redis_report(
        &self,
        worker: &WorkerReport,
        counts: &[QueueCounts],
        ttl: Duration,
    ) -> Result<(), BrokerError> {
        let now = self.now();
        let (json, keep_from) = (encode_report(worker)?, counts_kept_from(now));
        let mut inv = REPORT.prepare_invoke();
        inv.key(self.activity_key(&format!("worker:{}", worker.id)))
            .key(self.activity_key("workers"))
            .arg(&worker.id)
            .arg(json)
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1))
            .arg(ms(now))
            .arg(ms(keep_from))
            .arg(u64::try_from(COUNTS_KEPT.as_millis()).unwrap_or(u64::MAX));
        for q in counts {
            inv.key(self.activity_key(&format!("minutes:{}", q.queue)))
                .arg(q.minutes.len());
            for m in &q.minutes {
                inv.arg(ms(minute_of(m.minute)))
                    .arg(m.processed)
                    .arg(m.failed)
                    .arg(m.dead);
            }
        }
        let mut c = self.conn()?;
        let _: i64 = inv.invoke_async(&mut c).await.map_err(|e| self.err(e))?;
        Ok(())
    }

    /// [`Activity::workers`](stagedoor_jobs::Activity::workers) on Redis (the trait's impl in
    /// `broker.rs` calls this). A report that does not read as one (edited by hand) is left out,
    /// logged.
    pub(crate) async fn redis_workers(&self) -> Result<Vec<WorkerReport>, BrokerError> {
        let mut c = self.conn()?;
        let ids: Vec<String> = cmd("ZRANGE")
            .arg(self.activity_key("workers"))
            .arg(format!("({}", ms(self.now())))
            .arg("+inf")
            .arg("BYSCORE")
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut get = cmd("MGET");
        for id in &ids {
            get.arg(self.activity_key(&format!("worker:{id}")));
        }
        let reports: Vec<Option<String>> =
            get.query_async(&mut c).await.map_err(|e| self.err(e))?;
        let mut out: Vec<WorkerReport> = ids
            .iter()
            .zip(reports)
            .filter_map(|(id, json)| {
                // No key: the report ran out since the index was read.
                decode_report(id, &json?, "redis")
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// [`Activity::throughput`](stagedoor_jobs::Activity::throughput) on Redis (the trait's
    /// impl in `broker.rs` calls this).
    pub(crate) async fn redis_throughput(
        &self,
        queue: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteCounts>, BrokerError> {
        let mut c = self.conn()?;
        let fields: Vec<(String, String)> = cmd("HGETALL")
            .arg(self.activity_key(&format!("minutes:{queue}")))
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(minutes_of(&fields, minute_of(since)))
    }

    /// [`Activity::delayed`](stagedoor_jobs::Activity::delayed) on Redis (the trait's impl in
    /// `broker.rs` calls this): the queue's delayed set from now on. A member that cannot be
    /// read (added by hand) is listed with what could be read.
    pub(crate) async fn redis_delayed(
        &self,
        queue: &str,
        limit: usize,
    ) -> Result<Vec<DelayedJob>, BrokerError> {
        // A dead stream has no delayed set (its name's keys are its origin's).
        if limit == 0 || Keys::is_dead(queue) {
            return Ok(Vec::new());
        }
        let keys = self.keys(queue);
        let mut c = self.conn()?;
        let members: Vec<(Vec<u8>, f64)> = cmd("ZRANGE")
            .arg(&keys.delayed)
            .arg(format!("({}", ms(self.now())))
            .arg("+inf")
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .arg("WITHSCORES")
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(members
            .iter()
            .map(|(member, score)| {
                let due = DateTime::<Utc>::from_timestamp_millis(*score as i64)
                    .unwrap_or(DateTime::<Utc>::MAX_UTC);
                match entry::unmember(member) {
                    Some(fields) => {
                        let spent = entry::attempts(&fields).unwrap_or(0);
                        DelayedJob::new(
                            entry::text(&fields, "job_id").unwrap_or_default(),
                            entry::text(&fields, "kind").unwrap_or_default(),
                            due,
                            entry::attempt_of(spent, 1, false),
                        )
                    }
                    None => DelayedJob::new(entry::shown(member), String::new(), due, 1),
                }
            })
            .collect())
    }
}

/// The counts in a queue's hash (`<minute ms>:p|f|d` fields) from minute `from` on, oldest
/// first, without empty minutes. Fields that do not read as counts are skipped.
fn minutes_of(fields: &[(String, String)], from: DateTime<Utc>) -> Vec<MinuteCounts> {
    let mut by_minute: BTreeMap<i64, MinuteCounts> = BTreeMap::new();
    for (name, value) in fields {
        let Some((minute, which)) = name.split_once(':') else {
            continue;
        };
        let (Ok(minute), Ok(n)) = (minute.parse::<i64>(), value.parse::<u64>()) else {
            continue;
        };
        let Some(at) = DateTime::<Utc>::from_timestamp_millis(minute) else {
            continue;
        };
        if at < from {
            continue;
        }
        let slot = by_minute
            .entry(minute)
            .or_insert_with(|| MinuteCounts::new(at, 0, 0, 0));
        match which {
            "p" => slot.processed += n,
            "f" => slot.failed += n,
            "d" => slot.dead += n,
            _ => {}
        }
    }
    by_minute.into_values().filter(|m| !m.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_back_by_minute_from_the_first_asked() {
        let m = |n: i64| n * 60_000;
        let fields: Vec<(String, String)> = [
            (format!("{}:p", m(1)), "4"),
            (format!("{}:f", m(1)), "2"),
            (format!("{}:p", m(3)), "1"),
            (format!("{}:d", m(2)), "5"),
            (format!("{}:p", m(0)), "9"),
            (format!("{}:p", m(4)), "0"),
            ("junk".to_owned(), "1"),
            (format!("{}:p", m(5)), "x"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
        let at = |n: i64| DateTime::<Utc>::from_timestamp_millis(m(n)).unwrap_or_default();
        assert_eq!(
            minutes_of(&fields, at(1)),
            [
                MinuteCounts::new(at(1), 4, 2, 0),
                MinuteCounts::new(at(2), 0, 0, 5),
                MinuteCounts::new(at(3), 1, 0, 0),
            ]
        );
    }
}
