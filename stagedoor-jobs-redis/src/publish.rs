//! Publishing: [`Broker::publish`](stagedoor_jobs::broker::Broker::publish) (one script
//! call, or several in one transaction, for a batch) and
//! [`Broker::publish_once`](stagedoor_jobs::broker::Broker::publish_once) (a scheduler tick's
//! job behind its guard).

use std::time::Duration;

use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::{BrokerError, Published};
use stagedoor_jobs::{Envelope, JobId, Priority};

use crate::broker::{RedisBroker, ms};
use crate::conn::Conn;
use crate::entry;
use crate::keys::Keys;
use crate::scripts;

/// Jobs per call of the publish script: each call is one step on the server, short enough
/// (about a millisecond) not to hold up other clients for long.
const PUBLISH_CHUNK: usize = 500;

/// Arguments per call of the publish script, about (a call holds one job at least).
const PUBLISH_CHUNK_BYTES: usize = 4 << 20;

/// One call of the publish script: the position of its first job, the priority level of
/// its jobs (whose stream it adds to) and its ARGV.
type Chunk = (usize, Priority, Vec<Vec<u8>>);

/// The publish script's calls for `jobs`: for each, the position of its first job, its jobs'
/// priority level and its ARGV (`job_id, due_ms, n` and `n` items per job, see
/// [`scripts::PUBLISH`]). A call holds at most [`PUBLISH_CHUNK`] jobs and about
/// [`PUBLISH_CHUNK_BYTES`], all of one level (a batch of mixed levels is cut where the level
/// changes).
fn publish_chunks(jobs: &[(Envelope, Option<DateTime<Utc>>)], now: DateTime<Utc>) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    let mut args = Vec::new();
    let (mut first, mut count, mut bytes) = (0, 0, 0);
    let mut level = jobs.first().map(|(e, _)| e.priority()).unwrap_or_default();
    for (i, (envelope, at)) in jobs.iter().enumerate() {
        if count == PUBLISH_CHUNK
            || (count > 0 && bytes >= PUBLISH_CHUNK_BYTES)
            || (count > 0 && envelope.priority() != level)
        {
            chunks.push((first, level, std::mem::take(&mut args)));
            (first, count, bytes) = (i, 0, 0);
        }
        level = envelope.priority();
        let fields = entry::encode(envelope, 0);
        let due = match at {
            Some(t) if *t > now => ms(*t),
            _ => 0,
        };
        let items = if due > 0 {
            vec![entry::member(&fields)]
        } else {
            entry::flat(&fields)
        };
        bytes += items.iter().map(Vec::len).sum::<usize>();
        args.push(envelope.id().as_str().as_bytes().to_vec());
        args.push(due.to_string().into_bytes());
        args.push(items.len().to_string().into_bytes());
        args.extend(items);
        count += 1;
    }
    if count > 0 {
        chunks.push((first, level, args));
    }
    chunks
}

/// Which of the `jobs` jobs of a publish to `queue` were stored, from the answers of its
/// script calls (`skipped`, one per chunk of `chunks`): every job but those a call reported
/// skipped (already in the queue, or earlier in the batch).
fn stored_of(
    queue: &str,
    jobs: usize,
    chunks: &[Chunk],
    skipped: &[Vec<i64>],
) -> Result<Vec<bool>, BrokerError> {
    // The script reports the 1-based positions (within its call) of the jobs whose id was
    // already in the queue or earlier in the batch; every other job was stored.
    let mut stored = vec![true; jobs];
    if skipped.len() != chunks.len() {
        return Err(BrokerError::Backend(format!(
            "the publish of {} jobs to `{queue}` returned {} answers for {} script calls",
            jobs,
            skipped.len(),
            chunks.len()
        )));
    }
    for ((first, _, _), positions) in chunks.iter().zip(skipped) {
        for p in positions {
            let at = usize::try_from(*p - 1).ok().map(|p| first + p);
            match at.and_then(|i| stored.get_mut(i)) {
                Some(s) => *s = false,
                None => {
                    return Err(BrokerError::Backend(format!(
                        "the publish script reported job {p} of a call as skipped, a position outside the call (queue `{queue}`)"
                    )));
                }
            }
        }
    }
    Ok(stored)
}

impl RedisBroker {
    /// [`Broker::publish`](stagedoor_jobs::broker::Broker::publish) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_publish(
        &self,
        queue: &str,
        jobs: Vec<(Envelope, Option<DateTime<Utc>>)>,
    ) -> Result<Vec<Published>, BrokerError> {
        let mut c = self.conn()?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let keys = self.keys(queue);
        let now = self.now();
        let chunks = publish_chunks(&jobs, now);
        let skipped = self.run_chunks(&mut c, &keys, &chunks).await?;
        if chunks.iter().any(|c| c.1 != Priority::NORMAL) {
            // This process's claims look for the levels' streams at once, not within a second.
            self.update_housekeeping(queue, |h| h.levels_read = None);
        }
        let stored = stored_of(queue, jobs.len(), &chunks, &skipped)?;
        let published: Vec<Published> = jobs
            .iter()
            .zip(stored)
            .map(|((envelope, _), stored)| {
                if !stored {
                    stagedoor_jobs::broker::log_not_stored(queue, envelope.id());
                }
                Published::new(envelope.id().clone(), stored)
            })
            .collect();
        if let Some(soonest) = jobs
            .iter()
            .filter_map(|(_, at)| *at)
            .filter(|t| *t > now)
            .min()
        {
            self.look_for_due_by(queue, soonest, now);
        }
        Ok(published)
    }

    /// Runs the publish script's `chunks` on `keys`: the one call alone, or the calls in one
    /// transaction. Returns each call's answer (the 1-based positions of the jobs it skipped).
    async fn run_chunks(
        &self,
        c: &mut Conn,
        keys: &Keys,
        chunks: &[Chunk],
    ) -> Result<Vec<Vec<i64>>, BrokerError> {
        let skipped: Vec<Vec<i64>> = if let [(_, Priority::NORMAL, args)] = chunks {
            // One call: atomic by itself, one round trip once the script is loaded.
            vec![
                scripts::PUBLISH
                    .key(&keys.stream)
                    .key(&keys.delayed)
                    .key(&keys.ids)
                    .arg(args)
                    .invoke_async(c)
                    .await
                    .map_err(|e| self.err(e))?,
            ]
        } else {
            // Several calls in one transaction (`MULTI` ... `EXEC`), sent in one round trip:
            // the server runs them one after the other with nothing in between, or none if
            // the connection fails before `EXEC` arrives. A call failing while it runs (a key
            // of the wrong type) is not undone by `EXEC`, but it fails the publish. `EVAL`
            // with the text rather than `EVALSHA`: a script missing from the cache inside
            // `EXEC` could not be loaded and retried. A retry of the whole batch after an
            // error is safe: ids already in the queue are not added twice.
            let mut pipe = redis::pipe();
            pipe.atomic();
            for (_, level, args) in chunks {
                pipe.cmd("EVAL")
                    .arg(scripts::PUBLISH_BODY.as_str())
                    .arg(3)
                    .arg(&keys.at(*level).stream)
                    .arg(&keys.delayed)
                    .arg(&keys.ids)
                    .arg(args);
            }
            pipe.query_async(c).await.map_err(|e| self.err(e))?
        };
        Ok(skipped)
    }

    /// One script: when the guard's key (`{<queue>}:once:<guard>`,
    /// in the queue's hash slot) exists nothing is stored; otherwise the guard is set for
    /// `ttl` and the job published as [`publish`](stagedoor_jobs::broker::Broker::publish)
    /// does (its id once, to the delayed set when it is due later), in the same step. A full
    /// server refuses it whole.
    pub(crate) async fn redis_publish_once(
        &self,
        queue: &str,
        job: (Envelope, Option<DateTime<Utc>>),
        guard: &str,
        ttl: Duration,
    ) -> Result<Published, BrokerError> {
        let mut c = self.conn()?;
        let keys = self.keys(queue);
        let now = self.now();
        let id = job.0.id().clone();
        let at = job.1;
        let jobs = [job];
        let Some((_, level, args)) = publish_chunks(&jobs, now).pop() else {
            return Err(BrokerError::Backend(format!(
                "publish_once to `{queue}`: the job made no script arguments"
            )));
        };
        let (n, holder): (i64, String) = scripts::PUBLISH_ONCE
            .key(&keys.at(level).stream)
            .key(&keys.delayed)
            .key(&keys.ids)
            .key(keys.once(guard))
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1))
            .arg(args)
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        if level != Priority::NORMAL {
            // This process's claims look for the level's stream at once.
            self.update_housekeeping(queue, |h| h.levels_read = None);
        }
        match n {
            1 => {
                if let Some(t) = at.filter(|t| *t > now) {
                    self.look_for_due_by(queue, t, now);
                }
                Ok(Published::stored(id))
            }
            0 => {
                stagedoor_jobs::broker::log_not_stored(queue, &id);
                Ok(Published::already_there(id))
            }
            // A guard set by an earlier version holds `1`, not a job id.
            _ if holder.is_empty() || holder == "1" => Ok(Published::already_there(id)),
            _ => Ok(Published::already_there(JobId::from_string(holder))),
        }
    }

    /// [`Broker::finish_guard`](stagedoor_jobs::broker::Broker::finish_guard): one script
    /// (the guard keeps its value; its time to live becomes `ttl`).
    pub(crate) async fn redis_finish_guard(
        &self,
        queue: &str,
        guard: &str,
        job_id: &JobId,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        let mut c = self.conn()?;
        let keys = self.keys(queue);
        let done: i64 = scripts::FINISH_GUARD
            .pick(self.allow_oom())
            .key(keys.once(guard))
            .arg(job_id.as_str())
            // 0 deletes the guard (a job cancelled before it ran frees its key at once).
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(done == 1)
    }
}

#[cfg(test)]
mod publish_chunks_tests {
    use super::*;

    fn job(payload: usize, at: Option<DateTime<Utc>>) -> (Envelope, Option<DateTime<Utc>>) {
        (Envelope::new("k", vec![b'x'; payload], Utc::now()), at)
    }

    /// Walks one call's ARGV as the script does: the number of jobs in it.
    fn jobs_in(args: &[Vec<u8>]) -> usize {
        let (mut i, mut k) = (0, 0);
        while i < args.len() {
            let n: usize = std::str::from_utf8(&args[i + 2]).unwrap().parse().unwrap();
            i += 3 + n;
            k += 1;
        }
        assert_eq!(i, args.len(), "the groups end with the ARGV");
        k
    }

    #[test]
    fn calls_hold_at_most_a_chunk_of_jobs() {
        let now = Utc::now();
        let at = now + chrono::Duration::minutes(1);
        let later = Some(at);
        let jobs: Vec<_> = (0..1_201)
            .map(|n| job(10, if n % 2 == 0 { later } else { None }))
            .collect();
        let chunks = publish_chunks(&jobs, now);
        let firsts: Vec<usize> = chunks.iter().map(|(f, _, _)| *f).collect();
        assert_eq!(firsts, [0, 500, 1_000]);
        let sizes: Vec<usize> = chunks.iter().map(|(_, _, a)| jobs_in(a)).collect();
        assert_eq!(sizes, [500, 500, 201]);
        // A delayed job carries its member, one due now its fields.
        let a = &chunks[0].2;
        assert_eq!(a[0], jobs[0].0.id().as_str().as_bytes());
        assert_eq!(a[1], ms(at).to_string().into_bytes());
        assert_eq!(a[2], b"1");
        assert_eq!(a[4], jobs[1].0.id().as_str().as_bytes());
        assert_eq!(a[5], b"0");
        assert_eq!(a[6], b"10");
        assert_eq!(a[7], b"kind");
        assert!(publish_chunks(&[], now).is_empty());
    }

    #[test]
    fn a_call_holds_jobs_of_one_level() {
        let now = Utc::now();
        let at = |p: Priority| {
            let (e, t) = job(1, None);
            (e.with_priority(p), t)
        };
        let jobs = [
            at(Priority::NORMAL),
            at(Priority::NORMAL),
            at(Priority::HIGH),
            at(Priority::NORMAL),
        ];
        let chunks = publish_chunks(&jobs, now);
        let cut: Vec<(usize, Priority, usize)> = chunks
            .iter()
            .map(|(f, l, a)| (*f, *l, jobs_in(a)))
            .collect();
        assert_eq!(
            cut,
            [
                (0, Priority::NORMAL, 2),
                (2, Priority::HIGH, 1),
                (3, Priority::NORMAL, 1)
            ]
        );
    }

    #[test]
    fn calls_hold_about_a_chunk_of_bytes() {
        let big = PUBLISH_CHUNK_BYTES / 2 + 1;
        let jobs = vec![
            job(big, None),
            job(big, None),
            job(big, None),
            job(10, None),
        ];
        let chunks = publish_chunks(&jobs, Utc::now());
        let firsts: Vec<usize> = chunks.iter().map(|(f, _, _)| *f).collect();
        assert_eq!(firsts, [0, 2]);
        let huge = vec![job(2 * PUBLISH_CHUNK_BYTES, None)];
        assert_eq!(
            publish_chunks(&huge, Utc::now()).len(),
            1,
            "one job at least"
        );
    }
}
