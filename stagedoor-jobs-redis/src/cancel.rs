//! Cancelling a job ([`DeadLetters::cancel`](stagedoor_jobs::DeadLetters::cancel)): found by
//! its id in the delayed set or the stream (scanned newest first, a page at a time: an
//! operator's step, not a job path's), then removed by a script that checks it is still
//! there and not being run; a job being run is marked in `{<queue>}:cancelled` (a sorted set of
//! job ids scored by when the mark lapses), which its worker reads
//! ([`Broker::cancelled`](stagedoor_jobs::Broker::cancelled)).

use redis::{Value, cmd};
use stagedoor_jobs::JobId;
use stagedoor_jobs::broker::{BrokerError, Cancelled};

use crate::broker::{GROUP, RedisBroker, ms};
use crate::conn::Conn;
use crate::keys::Keys;
use crate::{entry, scripts, value};

/// Entries or members read per round trip while looking for a job.
const PAGE: usize = 1000;

impl RedisBroker {
    /// [`DeadLetters::cancel`](stagedoor_jobs::DeadLetters::cancel) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_cancel(
        &self,
        queue: &str,
        id: &JobId,
    ) -> Result<Cancelled, BrokerError> {
        let keys = self.keys(queue);
        let mut c = self.conn()?;
        // Twice: a job the delayed mover moves to the stream while we look is found the
        // second time.
        for _ in 0..2 {
            let known: bool = cmd("SISMEMBER")
                .arg(&keys.ids)
                .arg(id.as_str())
                .query_async(&mut c)
                .await
                .map_err(|e| self.err(e))?;
            if !known {
                return Ok(Cancelled::NotFound);
            }
            if let Some(member) = self.find_delayed(&mut c, &keys, id).await? {
                let removed: i64 = scripts::CANCEL_DELAYED
                    .key(&keys.delayed)
                    .key(&keys.ids)
                    .arg(&member)
                    .arg(id.as_str())
                    .invoke_async(&mut c)
                    .await
                    .map_err(|e| self.err(e))?;
                if removed == 1 {
                    self.release_unique_of(queue, &entry::unmember(&member), id)
                        .await?;
                    return Ok(Cancelled::Removed);
                }
                continue;
            }
            // In the queue's stream, or one of its priority levels'.
            let levels = crate::broker::levels_of(self.levels_present(&keys).await?);
            let mut found = None;
            for level in levels {
                let at = keys.at(level);
                if let Some(e) = self.find_entry(&mut c, &at, id).await? {
                    found = Some((at, e));
                    break;
                }
            }
            if let Some((keys, (entry_id, fields))) = found {
                let now = ms(self.now());
                let until =
                    now + stagedoor_jobs::broker::cancel_mark_ttl(self.lease).as_millis() as i64;
                let r: i64 = scripts::CANCEL_ENTRY
                    .pick(self.allow_oom())
                    .key(&keys.stream)
                    .key(&keys.ids)
                    .key(keys.cancelled())
                    .arg(entry_id)
                    .arg(id.as_str())
                    .arg(GROUP)
                    .arg(now)
                    .arg(until)
                    .invoke_async(&mut c)
                    .await
                    .map_err(|e| self.err(e))?;
                match r {
                    1 => {
                        self.release_unique_of(queue, &Some(fields), id).await?;
                        return Ok(Cancelled::Removed);
                    }
                    2 => return Ok(Cancelled::Running),
                    _ => continue,
                }
            }
        }
        Ok(Cancelled::NotFound)
    }

    /// The delayed set's member of job `id`, if it is there.
    async fn find_delayed(
        &self,
        c: &mut Conn,
        keys: &Keys,
        id: &JobId,
    ) -> Result<Option<Vec<u8>>, BrokerError> {
        let mut start = 0usize;
        loop {
            let members: Vec<Vec<u8>> = cmd("ZRANGE")
                .arg(&keys.delayed)
                .arg(start)
                .arg(start + PAGE - 1)
                .query_async(c)
                .await
                .map_err(|e| self.err(e))?;
            for m in &members {
                if entry::unmember(m)
                    .and_then(|f| entry::text(&f, "job_id"))
                    .is_some_and(|j| j == id.as_str())
                {
                    return Ok(Some(m.clone()));
                }
            }
            if members.len() < PAGE {
                return Ok(None);
            }
            start += PAGE;
        }
    }

    /// The newest stream entry of job `id`, if there is one.
    async fn find_entry(
        &self,
        c: &mut Conn,
        keys: &Keys,
        id: &JobId,
    ) -> Result<Option<(String, entry::Fields)>, BrokerError> {
        let mut end = "+".to_owned();
        loop {
            let reply: Value = cmd("XREVRANGE")
                .arg(&keys.stream)
                .arg(&end)
                .arg("-")
                .arg("COUNT")
                .arg(PAGE)
                .query_async(c)
                .await
                .map_err(|e| self.err(e))?;
            let entries = value::entries(&reply);
            for (entry_id, f) in &entries {
                if entry::text(f, "job_id").is_some_and(|j| j == id.as_str()) {
                    return Ok(Some((entry_id.clone(), f.clone())));
                }
            }
            match entries.last() {
                Some((last, _)) if entries.len() == PAGE => end = format!("({last}"),
                _ => return Ok(None),
            }
        }
    }

    /// Frees the unique key of a job removed before it ran (its fields `fields`).
    async fn release_unique_of(
        &self,
        queue: &str,
        fields: &Option<entry::Fields>,
        id: &JobId,
    ) -> Result<(), BrokerError> {
        let Some(unique) = fields
            .as_ref()
            .and_then(|f| entry::text(f, &format!("h.{}", stagedoor_jobs::UNIQUE_HEADER)))
        else {
            return Ok(());
        };
        let mut headers = stagedoor_jobs::Headers::default();
        headers
            .extra
            .insert(stagedoor_jobs::UNIQUE_HEADER.to_owned(), unique);
        stagedoor_jobs::broker::release_unique(self, queue, &headers, id).await
    }

    /// [`Broker::cancelled`](stagedoor_jobs::Broker::cancelled) on Redis: one `ZMSCORE`.
    pub(crate) async fn redis_cancelled(
        &self,
        queue: &str,
        ids: &[JobId],
    ) -> Result<Vec<JobId>, BrokerError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys = self.keys(queue);
        let mut c = self.conn()?;
        let scores: Vec<Option<f64>> = cmd("ZMSCORE")
            .arg(keys.cancelled())
            .arg(ids.iter().map(JobId::as_str).collect::<Vec<_>>())
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        let now = ms(self.now()) as f64;
        Ok(ids
            .iter()
            .zip(scores)
            .filter(|(_, s)| s.is_some_and(|s| s > now))
            .map(|(id, _)| id.clone())
            .collect())
    }
}
