//! Dead letters: dead-lettering an entry this worker holds (one script), reading a dead
//! stream ([`DeadLetters::dead_letters`](stagedoor_jobs::broker::DeadLetters::dead_letters) and every
//! stored field, [`RedisBroker::dead_letter_fields`]), replaying and purging.

use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use redis::{Value, cmd};
use stagedoor_jobs::Envelope;
use stagedoor_jobs::broker::{BrokerError, DeadLetter, DeadSelector, ReplayReport};

use crate::broker::{DEAD_MAXLEN, GROUP, RedisBroker};
use crate::entry::{self, Fields};
use crate::keys::{DEAD_SUFFIX, Keys};
use crate::scripts;
use crate::value;

impl RedisBroker {
    /// [`DeadLetters::dead_letters`](stagedoor_jobs::broker::DeadLetters::dead_letters) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        let reply: Value = match selector {
            DeadSelector::All => {
                cmd("XREVRANGE")
                    .arg(&keys.dead)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(limit.min(1_000_000))
                    .query_async(&mut c)
                    .await
            }
            _ => {
                cmd("XREVRANGE")
                    .arg(&keys.dead)
                    .arg("+")
                    .arg("-")
                    .query_async(&mut c)
                    .await
            }
        }
        .map_err(|e| self.err(e))?;
        Ok(value::entries(&reply)
            .into_iter()
            .map(|(id, f)| self.dead_letter_of(dead, id, &f))
            .filter(|d| selector.matches(d))
            .take(limit)
            .collect())
    }

    /// [`DeadLetters::replay`](stagedoor_jobs::broker::DeadLetters::replay) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<ReplayReport, BrokerError> {
        let letters = self.dead_letters(dead, selector, usize::MAX).await?;
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        let mut report = ReplayReport::default();
        let mut all: Vec<(String, Fields)> = Vec::new();
        if !letters.is_empty() {
            let reply: Value = cmd("XRANGE")
                .arg(&keys.dead)
                .arg("-")
                .arg("+")
                .query_async(&mut c)
                .await
                .map_err(|e| self.err(e))?;
            all = value::entries(&reply);
        }
        for d in letters {
            let Some((_, fields)) = all.iter().find(|(id, _)| *id == d.id) else {
                report.skipped += 1;
                continue;
            };
            let origin = self.keys(&d.origin);
            let f = entry::with(
                &entry::without(fields, &["error", "traceback", "failed_at", "origin"]),
                "attempts",
                "0",
            );
            // A dead letter without a job id is shown with its entry's id: the job keeps it.
            let f = if entry::get(&f, "job_id").is_none_or(<[u8]>::is_empty) {
                entry::with(&f, "job_id", d.envelope.id().as_str())
            } else {
                f
            };
            // Back to the stream of its priority level.
            let level = entry::level(&f);
            let r: redis::RedisResult<i64> = scripts::REPLAY
                .key(&keys.dead)
                .key(&origin.at(level).stream)
                .key(&origin.ids)
                .arg(&d.id)
                .arg(d.envelope.id().as_str())
                .arg(entry::flat(&f))
                .invoke_async(&mut c)
                .await;
            match r {
                Ok(1) => report.replayed += 1,
                Ok(_) => report.skipped += 1,
                Err(e) => {
                    tracing::error!(dead_letter = %d.id, error = %e, "replay failed");
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }

    /// [`DeadLetters::purge`](stagedoor_jobs::broker::DeadLetters::purge) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn purge(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<u64, BrokerError> {
        let letters = self.dead_letters(dead, selector, usize::MAX).await?;
        if letters.is_empty() {
            return Ok(0);
        }
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        let mut n = 0;
        for chunk in letters.chunks(500) {
            let mut x = cmd("XDEL");
            x.arg(&keys.dead);
            for d in chunk {
                x.arg(&d.id);
            }
            let deleted: i64 = x.query_async(&mut c).await.map_err(|e| self.err(e))?;
            n += deleted as u64;
        }
        Ok(n)
    }

    /// The fields of the dead letters `ids` of dead stream `dead` (`jobs:dead`) exactly as
    /// stored: names and values as bytes, in order; `None` for an id with no such entry. One
    /// round trip per 500 ids. For tools that show every field of a dead letter (a
    /// [`DeadLetter`] decodes only the known ones).
    pub async fn dead_letter_fields(
        &self,
        dead: &str,
        ids: &[String],
    ) -> Result<Vec<Option<Vec<(Vec<u8>, Vec<u8>)>>>, BrokerError> {
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.cmd("XRANGE").arg(&keys.dead).arg(id).arg(id);
            }
            let replies: Vec<Value> = pipe.query_async(&mut c).await.map_err(|e| self.err(e))?;
            for (id, reply) in chunk
                .iter()
                .zip(replies.iter().chain(std::iter::repeat(&Value::Nil)))
            {
                out.push(
                    value::entries(reply)
                        .into_iter()
                        .find(|(i, _)| i == id)
                        .map(|(_, f)| f),
                );
            }
        }
        Ok(out)
    }

    /// A dead letter from its entry, keeping what is stored and making nothing up: without a
    /// `job_id` its job id is the entry's id (the same on every read, and `dead show` finds
    /// it); without a `kind` its kind is empty; without `enqueued_at` or `failed_at` the time
    /// is the entry's own (when it was added to the dead stream). An `attempts` field that is
    /// not a number reports 0 (the field is kept as it is).
    pub(crate) fn dead_letter_of(&self, dead: &str, id: String, fields: &Fields) -> DeadLetter {
        let attempts = entry::attempts_or_zero(fields);
        let origin = entry::text(fields, "origin")
            .unwrap_or_else(|| dead.trim_end_matches(DEAD_SUFFIX).to_owned());
        let added = entry::id_time(&id);
        let envelope = entry::decode(fields, attempts, added).unwrap_or_else(|_| {
            Envelope::new(
                entry::text(fields, "kind").unwrap_or_default(),
                entry::get(fields, "payload").unwrap_or_default().to_vec(),
                entry::enqueued_at(fields).unwrap_or(added),
            )
            .with_attempt(attempts)
        });
        let job_id = entry::text(fields, "job_id")
            .filter(|j| !j.is_empty())
            .unwrap_or_else(|| id.clone());
        let envelope = envelope.with_id(stagedoor_jobs::JobId::from_string(job_id));
        DeadLetter {
            id,
            envelope,
            origin,
            error: entry::text(fields, "error").unwrap_or_default(),
            traceback: entry::text(fields, "traceback").unwrap_or_default(),
            attempts,
            failed_at: entry::text(fields, "failed_at")
                .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
                .map_or(added, |t| t.with_timezone(&Utc)),
        }
    }

    /// The fields of the dead letter of an entry with `fields`: every field it had, then its
    /// `attempts` (spent; `None` keeps the entry's own field as it was, a malformed one
    /// included), `error`, `traceback`, `failed_at` and `origin`.
    pub(crate) fn dead_fields(
        &self,
        fields: &Fields,
        attempts: Option<u32>,
        error: &str,
        traceback: &str,
        origin: &str,
    ) -> Fields {
        let mut f = match attempts {
            Some(n) => entry::with(fields, "attempts", n.to_string()),
            None => fields.clone(),
        };
        f = entry::without(&f, &["error", "traceback", "failed_at", "origin"]);
        f.push(("error".into(), error.as_bytes().to_vec()));
        f.push(("traceback".into(), traceback.as_bytes().to_vec()));
        f.push(("failed_at".into(), self.now().to_rfc3339().into_bytes()));
        f.push(("origin".into(), origin.as_bytes().to_vec()));
        f
    }

    /// Dead-letters an entry this worker holds, in one step; returns whether it was still ours.
    /// `attempts`: the attempts spent it reports (`None`: its own field, kept as it was).
    pub(crate) async fn dead_letter_held(
        &self,
        keys: &Keys,
        (id, deliveries, fields): (&str, u64, &Fields),
        attempts: Option<u32>,
        error: &str,
        traceback: &str,
    ) -> Result<bool, BrokerError> {
        let f = self.dead_fields(fields, attempts, error, traceback, &keys.name);
        let job = entry::text(fields, "job_id").unwrap_or_default();
        let mut c = self.conn()?;
        let reply: Vec<i64> = scripts::DEAD
            .pick(self.allow_oom())
            .key(&keys.stream)
            .key(&keys.dead)
            .key(&keys.ids)
            .arg(GROUP)
            .arg(&self.inner.consumer)
            .arg(id)
            .arg(deliveries)
            .arg(&job)
            .arg(DEAD_MAXLEN)
            // Redis 7: the settled entries at the stream's head are trimmed (see SETTLE_MANY).
            .arg(if self.trims(keys) { "1" } else { "0" })
            .arg(entry::flat(&f))
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        self.note_trimmed(&keys.dead, reply.get(1).copied().unwrap_or(0));
        Ok(reply.first() == Some(&1))
    }

    pub(crate) fn note_trimmed(&self, dead: &str, n: i64) {
        if n > 0 {
            self.inner.trimmed.fetch_add(n as u64, Ordering::Relaxed);
            metrics::counter!("stagedoor_jobs_dead_trimmed_total", "dead_letter" => dead.to_owned()).increment(n as u64);
            tracing::warn!(
                dead_stream = dead,
                trimmed = n,
                "the dead stream reached about {DEAD_MAXLEN} entries: its oldest were trimmed"
            );
        }
    }
}
