//! Jobs' results and progress, kept in the backend's [`Records`] and read back by job id from
//! any process.
//!
//! A handler returns a value with [`HandlerOutcome::ack_with`](crate::HandlerOutcome::ack_with)
//! or as `Ok(value)` (any `Serialize` type; `Ok(())` stores nothing). The runtime stores it as
//! JSON before the job is acknowledged, kept for the mount's
//! [`keep_results`](crate::mount::Mount::keep_results) (default
//! [`DEFAULT_RESULT_RETENTION`], 24 hours). A value past [`MAX_RESULT_BYTES`] (1 MiB of JSON) is
//! not stored: the job is still acknowledged, and its result reads as
//! [`ResultError::TooLarge`], saying how large it was (keep large outputs elsewhere and return a
//! reference).
//!
//! A handler reports progress with the [`JobProgress`](crate::JobProgress) argument: a fraction and a short message,
//! the latest kept under the job's id for the same retention. [`Results`] reads both
//! ([`result`](Results::result), [`progress`](Results::progress)) and waits for a result with a
//! timeout ([`wait_result`](Results::wait_result)).
//!
//! Results are kept by job id: ids you choose yourself must be unique across queues for their
//! results to stay apart (generated ids always are).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::broker::{Broker, BrokerError, RecordWrite, Records};

/// The largest result kept, in bytes of JSON. A larger value is not stored: the job is still
/// acknowledged and its result reads as [`ResultError::TooLarge`].
pub const MAX_RESULT_BYTES: usize = 1024 * 1024;

/// How long a result (and the last progress) is kept when its mount does not say
/// ([`keep_results`](crate::mount::Mount::keep_results)).
pub const DEFAULT_RESULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The longest progress message kept, in characters; a longer one is cut there.
pub const MAX_PROGRESS_MESSAGE: usize = 1024;

/// The record key of a job's result.
pub fn result_key(job_id: &str) -> String {
    format!("result:{job_id}")
}

/// The record key of a job's last progress.
pub fn progress_key(job_id: &str) -> String {
    format!("progress:{job_id}")
}

/// A job's result as stored: when the job finished, and the value its handler returned.
#[derive(Clone, Debug, PartialEq)]
pub struct JobResult {
    job_id: String,
    finished_at: DateTime<Utc>,
    value: StoredValue,
}

#[derive(Clone, Debug, PartialEq)]
enum StoredValue {
    Json(Bytes),
    TooLarge { bytes: usize, limit: usize },
}

/// The first line of a result record, before its JSON value.
#[derive(Serialize, Deserialize)]
struct ResultMeta {
    at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    too_large: Option<(usize, usize)>,
}

impl JobResult {
    /// The job's id.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }
    /// When the job's handler finished (the backend's clock).
    pub fn finished_at(&self) -> DateTime<Utc> {
        self.finished_at
    }
    /// The value as JSON text, or why it was not kept.
    pub fn json(&self) -> Result<&[u8], ResultError> {
        match &self.value {
            StoredValue::Json(b) => Ok(b),
            StoredValue::TooLarge { bytes, limit } => Err(ResultError::TooLarge {
                job_id: self.job_id.clone(),
                bytes: *bytes,
                limit: *limit,
            }),
        }
    }
    /// The value, decoded as `T`.
    pub fn get<T: DeserializeOwned>(&self) -> Result<T, ResultError> {
        serde_json::from_slice(self.json()?).map_err(|e| ResultError::Decode {
            job_id: self.job_id.clone(),
            error: e.to_string(),
        })
    }

    /// The record of a result: its meta line, a newline, its JSON (none when too large).
    pub(crate) fn encode(at: DateTime<Utc>, json: &[u8]) -> Bytes {
        let too_large = (json.len() > MAX_RESULT_BYTES).then_some((json.len(), MAX_RESULT_BYTES));
        let meta = ResultMeta { at, too_large };
        let mut out = serde_json::to_vec(&meta).unwrap_or_default();
        out.push(b'\n');
        if too_large.is_none() {
            out.extend_from_slice(json);
        }
        out.into()
    }

    fn decode(job_id: &str, record: &Bytes) -> Result<Self, BrokerError> {
        let malformed = |reason: String| BrokerError::Malformed {
            id: result_key(job_id),
            reason: format!("{reason}: delete the record, or let it run out"),
        };
        let nl = record
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| malformed("no line of its own before the value".into()))?;
        let meta: ResultMeta = serde_json::from_slice(&record[..nl])
            .map_err(|e| malformed(format!("its first line does not read: {e}")))?;
        let value = match meta.too_large {
            Some((bytes, limit)) => StoredValue::TooLarge { bytes, limit },
            None => StoredValue::Json(record.slice(nl + 1..)),
        };
        Ok(Self {
            job_id: job_id.to_owned(),
            finished_at: meta.at,
            value,
        })
    }
}

/// Why a job's result cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    /// The handler returned a value past [`MAX_RESULT_BYTES`]; it was not kept.
    #[error(
        "the result of job {job_id} was {bytes} bytes of JSON, past the limit of {limit}: it was not kept (return a reference to where the data is instead)"
    )]
    TooLarge {
        /// The job.
        job_id: String,
        /// How large the value was.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The stored JSON is not a `T`.
    #[error("the result of job {job_id} does not decode as the type asked for: {error}")]
    Decode {
        /// The job.
        job_id: String,
        /// What serde said.
        error: String,
    },
    /// [`Results::wait_result`] waited its whole timeout.
    #[error(
        "no result for job {job_id} within {waited:?}: it has not finished, finished without a value, or its result ran out"
    )]
    TimedOut {
        /// The job.
        job_id: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The backend failed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// A job's last progress report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// From 0.0 to 1.0.
    pub fraction: f32,
    /// What the handler said (at most [`MAX_PROGRESS_MESSAGE`] characters).
    pub message: String,
    /// When it was reported (the backend's clock).
    pub at: DateTime<Utc>,
}

/// Reading jobs' results and progress: every [`Records`] backend has it.
pub trait Results: Records + Sync {
    /// The result of job `job_id`: `None` when it has not finished, finished without a value
    /// (`ack()`, `Ok(())`), or its result ran out.
    fn result(
        &self,
        job_id: &str,
    ) -> impl Future<Output = Result<Option<JobResult>, BrokerError>> + Send {
        async move {
            match self.read_record(&result_key(job_id)).await? {
                Some(r) => JobResult::decode(job_id, &r.value).map(Some),
                None => Ok(None),
            }
        }
    }

    /// The last progress job `job_id` reported, if any (kept as long as its result).
    fn progress(
        &self,
        job_id: &str,
    ) -> impl Future<Output = Result<Option<Progress>, BrokerError>> + Send {
        async move {
            let Some(r) = self.read_record(&progress_key(job_id)).await? else {
                return Ok(None);
            };
            serde_json::from_slice(&r.value)
                .map(Some)
                .map_err(|e| BrokerError::Malformed {
                    id: progress_key(job_id),
                    reason: format!("{e}: delete the record, or let it run out"),
                })
        }
    }

    /// Waits up to `timeout` for job `job_id`'s result, reading it every 20 ms at first and
    /// every 250 ms at most. A backend error ends the wait.
    fn wait_result(
        &self,
        job_id: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<JobResult, ResultError>> + Send {
        async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut every = Duration::from_millis(20);
            loop {
                if let Some(r) = self.result(job_id).await? {
                    return Ok(r);
                }
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return Err(ResultError::TimedOut {
                        job_id: job_id.to_owned(),
                        waited: timeout,
                    });
                }
                tokio::time::sleep(every.min(deadline - now)).await;
                every = (every * 2).min(Duration::from_millis(250));
            }
        }
    }
}

impl<B: Records + Sync> Results for B {}

type ReadFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<JobResult>, BrokerError>> + Send + 'a>>;
type WriteFuture<'a> = Pin<Box<dyn Future<Output = Result<(), BrokerError>> + Send + 'a>>;

/// Where a running job's progress and result go: the broker's records, its type erased so that
/// a handler's context can hold it.
pub(crate) trait RecordSink: Send + Sync {
    fn put(&self, key: String, value: Bytes, ttl: Duration) -> WriteFuture<'_>;
    fn result(&self, job_id: String) -> ReadFuture<'_>;
    fn now(&self) -> DateTime<Utc>;
}

impl<B: Broker> RecordSink for B {
    fn put(&self, key: String, value: Bytes, ttl: Duration) -> WriteFuture<'_> {
        Box::pin(async move {
            let w = [RecordWrite::put(key, value).ttl(ttl)];
            self.write_records(&w).await.map(|_| ())
        })
    }
    fn result(&self, job_id: String) -> ReadFuture<'_> {
        Box::pin(async move { Results::result(self, &job_id).await })
    }
    fn now(&self) -> DateTime<Utc> {
        self.clock().now()
    }
}

/// What a running job's context holds to keep its progress: the sink and the retention.
#[derive(Clone)]
pub(crate) struct Keeper {
    pub(crate) sink: Arc<dyn RecordSink>,
    pub(crate) retention: Duration,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("retention", &self.retention)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_record_reads_back() {
        let at = Utc::now();
        let r = JobResult::encode(at, br#"{"pages":3}"#);
        let back = JobResult::decode("j1", &r).expect("decodes");
        assert_eq!(back.finished_at(), at);
        assert_eq!(back.json().unwrap(), br#"{"pages":3}"#);
        let v: serde_json::Value = back.get().unwrap();
        assert_eq!(v["pages"], 3);
        // A JSON value holding newlines is kept whole.
        let r = JobResult::encode(at, b"\"a\\nb\"\n");
        assert_eq!(
            JobResult::decode("j", &r).unwrap().json().unwrap(),
            b"\"a\\nb\"\n"
        );
    }

    #[test]
    fn a_value_past_the_limit_reads_as_too_large() {
        let big = vec![b'1'; MAX_RESULT_BYTES + 1];
        let r = JobResult::encode(Utc::now(), &big);
        assert!(r.len() < 200, "the value is not stored");
        let back = JobResult::decode("j2", &r).unwrap();
        let err = back.json().unwrap_err();
        assert!(
            matches!(err, ResultError::TooLarge { bytes, limit, .. } if bytes == MAX_RESULT_BYTES + 1 && limit == MAX_RESULT_BYTES)
        );
        assert!(err.to_string().contains("past the limit"), "{err}");
    }

    #[test]
    fn junk_records_are_errors_naming_the_key() {
        for junk in [&b""[..], b"no newline", b"{not json}\n1", b"{}\n1"] {
            let err = JobResult::decode("j3", &Bytes::copy_from_slice(junk)).unwrap_err();
            assert!(err.to_string().contains("result:j3"), "{err}");
        }
    }
}
