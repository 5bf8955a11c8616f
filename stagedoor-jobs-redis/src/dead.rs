//! Dead letters: dead-lettering an entry this worker holds (one script; an unreadable one
//! with its fields as they were), reading a dead
//! stream ([`DeadLetters::dead_letters`](stagedoor_jobs::broker::DeadLetters::dead_letters) and every
//! stored field, [`RedisBroker::dead_letter_fields`]), replaying and purging.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use redis::{Value, cmd};
use stagedoor_jobs::Envelope;
use stagedoor_jobs::broker::{
    BrokerError, DeadLetter, DeadSelector, ReplayReport, Settled, Unreadable,
};

use crate::broker::{DEAD_MAXLEN, GROUP, RedisBroker, RedisReceipt};
use crate::conn::Conn;
use crate::entry::{self, Fields};
use crate::keys::{DEAD_SUFFIX, Keys};
use crate::scripts;
use crate::value;

/// How many entries one read of a dead stream asks for: a listing, a replay or a purge holds at
/// most this many (and what it selected of them) at a time, whatever the stream holds.
const PAGE: usize = 500;

/// One read of a dead stream, newest first.
struct Page {
    /// The entries read: (id, fields).
    entries: Vec<(String, Fields)>,
    /// Where the next read starts (`(<oldest id read>`, exclusive); `None` after the last page.
    next: Option<String>,
}

impl RedisBroker {
    /// [`DeadLetters::dead_letters`](stagedoor_jobs::broker::DeadLetters::dead_letters) on Redis (the trait's impl
    /// in `broker.rs` calls this). Reads what the request needs, not the dead stream: one
    /// letter by its entry id reads that entry; otherwise the stream is read newest first a
    /// page at a time (pages no longer than the `limit` letters still wanted, for `All`)
    /// until `limit` letters were selected.
    pub(crate) async fn redis_dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        if let Some((id, f)) = self.by_entry_id(&mut c, &keys.dead, selector).await? {
            out.push(self.dead_letter_of(dead, id, &f));
            return Ok(out);
        }
        let mut from = Some("+".to_owned());
        while let Some(start) = from.take() {
            let count = match selector {
                DeadSelector::All => PAGE.min(limit - out.len()),
                _ => PAGE,
            };
            let page = self.dead_page(&mut c, &keys.dead, &start, count).await?;
            for (id, f) in page.entries {
                let d = self.dead_letter_of(dead, id, &f);
                if selector.matches(&d) {
                    out.push(d);
                    if out.len() == limit {
                        return Ok(out);
                    }
                }
            }
            from = page.next;
        }
        Ok(out)
    }

    /// [`DeadLetters::replay`](stagedoor_jobs::broker::DeadLetters::replay) on Redis (the trait's impl
    /// in `broker.rs` calls this). One letter by its entry id reads and replays that entry;
    /// otherwise the dead stream is walked newest first a page at a time, each selected letter
    /// replayed from the fields of the page it was read in. Each page starts below the last
    /// (exclusive), so no entry is read twice or skipped while letters are replayed, purged or
    /// added meanwhile (added ones are newer than the walk and stay where they are).
    pub(crate) async fn redis_replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<ReplayReport, BrokerError> {
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        let mut report = ReplayReport::default();
        if let Some((id, f)) = self.by_entry_id(&mut c, &keys.dead, selector).await? {
            let d = self.dead_letter_of(dead, id, &f);
            self.replay_one(&mut c, &keys, &d, &f, &mut report).await;
            return Ok(report);
        }
        let mut from = Some("+".to_owned());
        while let Some(start) = from.take() {
            let page = self.dead_page(&mut c, &keys.dead, &start, PAGE).await?;
            for (id, f) in page.entries {
                let d = self.dead_letter_of(dead, id, &f);
                if selector.matches(&d) {
                    self.replay_one(&mut c, &keys, &d, &f, &mut report).await;
                }
            }
            from = page.next;
        }
        Ok(report)
    }

    /// Replays dead letter `d` (its entry's `fields` as read) of the dead stream of `keys`:
    /// back to the stream of its queue's priority level, attempts reset, in one script that
    /// does nothing when the entry is gone (replayed or purged meanwhile: skipped) or its job
    /// id is back in the queue (skipped); a failure is logged and counted.
    async fn replay_one(
        &self,
        c: &mut Conn,
        keys: &Keys,
        d: &DeadLetter,
        fields: &Fields,
        report: &mut ReplayReport,
    ) {
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
            .invoke_async(c)
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

    /// [`DeadLetters::purge`](stagedoor_jobs::broker::DeadLetters::purge) on Redis (the trait's impl
    /// in `broker.rs` calls this). One letter by its entry id is deleted alone; otherwise the
    /// dead stream is walked newest first a page at a time (as [`replay`](Self::replay) walks
    /// it), each page's selected letters deleted before the next is read.
    pub(crate) async fn redis_purge(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<u64, BrokerError> {
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        if let Some((id, _)) = self.by_entry_id(&mut c, &keys.dead, selector).await? {
            return self.delete(&mut c, &keys.dead, &[id]).await;
        }
        let mut n = 0;
        let mut from = Some("+".to_owned());
        while let Some(start) = from.take() {
            let page = self.dead_page(&mut c, &keys.dead, &start, PAGE).await?;
            let selected: Vec<String> = page
                .entries
                .into_iter()
                .filter_map(|(id, f)| {
                    let d = self.dead_letter_of(dead, id, &f);
                    selector.matches(&d).then_some(d.id)
                })
                .collect();
            n += self.delete(&mut c, &keys.dead, &selected).await?;
            from = page.next;
        }
        Ok(n)
    }

    /// `XDEL`s entries `ids` of dead stream `key` (none: no call); how many were there.
    async fn delete(&self, c: &mut Conn, key: &str, ids: &[String]) -> Result<u64, BrokerError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let deleted: i64 = cmd("XDEL")
            .arg(key)
            .arg(ids)
            .query_async(c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(u64::try_from(deleted).unwrap_or(0))
    }

    /// The entry a selector of one letter names by its entry id (`<ms>-<seq>`), read alone;
    /// `None` for another selector, an id that is not an entry id (a job id, kept in a field),
    /// or one of no entry (it may still be a job id: the caller walks the stream).
    async fn by_entry_id(
        &self,
        c: &mut Conn,
        key: &str,
        selector: &DeadSelector,
    ) -> Result<Option<(String, Fields)>, BrokerError> {
        let DeadSelector::Id(id) = selector else {
            return Ok(None);
        };
        if !entry::is_entry_id(id) {
            return Ok(None);
        }
        let reply: Value = cmd("XRANGE")
            .arg(key)
            .arg(id)
            .arg(id)
            .query_async(c)
            .await
            .map_err(|e| self.err(e))?;
        self.note_read(value::array(&reply).len());
        Ok(value::into_entries(reply)
            .into_iter()
            .find(|(i, _)| i == id))
    }

    /// Up to `count` entries of dead stream `key`, newest first, from `start` (`+`, or
    /// `(<id>` for below an entry already read).
    async fn dead_page(
        &self,
        c: &mut Conn,
        key: &str,
        start: &str,
        count: usize,
    ) -> Result<Page, BrokerError> {
        let reply: Value = cmd("XREVRANGE")
            .arg(key)
            .arg(start)
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(c)
            .await
            .map_err(|e| self.err(e))?;
        let items = value::into_array(reply);
        self.note_read(items.len());
        // The next page starts below the oldest entry the server sent, whether or not it
        // could be read (a short page was the last).
        let last = items
            .last()
            .and_then(|e| value::array(e).first())
            .and_then(value::string);
        let next = match last {
            Some(last) if items.len() >= count => Some(format!("({last}")),
            None if !items.is_empty() => {
                tracing::warn!(
                    dead_stream = key,
                    "a dead-stream entry without an id: the read stops there"
                );
                None
            }
            _ => None,
        };
        Ok(Page {
            entries: items.into_iter().filter_map(value::into_entry).collect(),
            next,
        })
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
            for reply in &replies {
                self.note_read(value::array(reply).len());
            }
            for (id, reply) in chunk
                .iter()
                .zip(replies.iter().chain(std::iter::repeat(&Value::Nil)))
            {
                out.push(
                    value::entries(reply)
                        .into_iter()
                        .find(|(i, _)| i == id)
                        .map(|(_, f)| {
                            f.into_iter()
                                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                                .collect()
                        }),
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
        f.push(("error".into(), Bytes::copy_from_slice(error.as_bytes())));
        f.push((
            "traceback".into(),
            Bytes::copy_from_slice(traceback.as_bytes()),
        ));
        f.push(("failed_at".into(), self.now().to_rfc3339().into()));
        f.push(("origin".into(), Bytes::copy_from_slice(origin.as_bytes())));
        f
    }

    /// [`Broker::dead_letter_unreadable`](stagedoor_jobs::broker::Broker::dead_letter_unreadable)
    /// on Redis (the trait's impl in `broker.rs` calls this): the entry goes to `target`, its
    /// queue's dead stream, with every field it had (its `attempts` as it was) and the item's
    /// error, fenced on its delivery count.
    pub(crate) async fn dead_letter_unreadable(
        &self,
        queue: &str,
        item: &Unreadable<RedisReceipt>,
        target: &str,
    ) -> Result<Settled, BrokerError> {
        let r = &item.receipt;
        let keys = self.keys_at(queue, r.level);
        if self.keys(target).dead != keys.dead {
            return Err(BrokerError::Backend(format!(
                "dead letter `{target}` is not the dead stream of `{queue}` (`{queue}{DEAD_SUFFIX}`)"
            )));
        }
        let held = (r.id.as_str(), r.deliveries, &r.fields);
        let done = self
            .dead_letter_held(&keys, held, None, &item.error, "")
            .await?;
        Ok(if done {
            Settled::Done
        } else {
            Settled::LeaseLost
        })
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

    /// Counts one read of a dead stream that sent `n` entries.
    fn note_read(&self, n: usize) {
        let n = n as u64;
        self.inner.dead_read.fetch_add(n, Ordering::Relaxed);
        self.inner.dead_read_largest.fetch_max(n, Ordering::Relaxed);
    }

    /// How many dead-stream entries the server has sent this broker (and its clones) for
    /// listings, replays, purges and [`dead_letter_fields`](Self::dead_letter_fields). For
    /// tests: a read sized by the request, not by the dead stream, shows here.
    #[doc(hidden)]
    pub fn dead_entries_read(&self) -> u64 {
        self.inner.dead_read.load(Ordering::Relaxed)
    }

    /// The most dead-stream entries one read of this broker (and its clones) was sent: what a
    /// listing, replay or purge held in memory at once. For tests.
    #[doc(hidden)]
    pub fn dead_largest_read(&self) -> u64 {
        self.inner.dead_read_largest.load(Ordering::Relaxed)
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
