//! The job envelope: what travels through a broker for every job.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The id of a job, minted by the publisher (a UUIDv7, so ids sort by creation time).
///
/// A job keeps its id through retries, dead-lettering and replay, so logs and traces of every
/// attempt of one job share it.
///
/// Shared text: cloning an id (every delivery's log span, cancellation and settlement does)
/// allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(Arc<str>);

impl Serialize for JobId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for JobId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self::from_string)
    }
}

impl JobId {
    /// A new, unique id.
    pub fn new() -> Self {
        let mut buf = uuid::Uuid::encode_buffer();
        Self(Arc::from(
            &*uuid::Uuid::now_v7().simple().encode_lower(&mut buf),
        ))
    }

    /// An id given by the caller, e.g. derived from a schedule and its tick so that a duplicate
    /// enqueue can be recognised.
    pub fn from_string(id: impl Into<String>) -> Self {
        Self(Arc::from(id.into()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for JobId {
    fn default() -> Self {
        Self::new()
    }
}

/// An id read as text (one allocation, where [`JobId::from_string`] of a `&str` makes two).
impl From<&str> for JobId {
    fn from(id: &str) -> Self {
        Self(Arc::from(id))
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A job's priority within its queue: of the jobs due, a higher priority is claimed first,
/// and jobs of equal priority in the order they became due. Five levels, from
/// [`LOWEST`](Self::LOWEST) (-2) to [`HIGHEST`](Self::HIGHEST) (2); [`NORMAL`](Self::NORMAL)
/// (0) is the default.
///
/// **No level starves.** Every [`FAIR_CLAIM_EVERY`]th claim of a worker on a queue (counting
/// the claims that take jobs) ignores priority and takes the jobs that have waited longest (on Redis: from the level whose
/// oldest waiting job is the oldest), so a steady flood of high-priority jobs still lets the
/// others through, at least one claim in eight.
///
/// Where it is kept: a SQL table with a `#[field(priority)]` column (the claim orders by
/// it); on Redis, one stream per level (`{jobs}` for normal, `{jobs}:p<level>` for the
/// others, in the queue's hash slot), read from the highest level down; a retried or
/// dead-lettered job keeps its level, and so does its replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(i8);

/// Every this many claims of a worker on a queue, one ignores [`Priority`] and takes the jobs
/// that have waited longest.
pub const FAIR_CLAIM_EVERY: u64 = 8;

impl Priority {
    /// The lowest level, -2.
    pub const LOWEST: Self = Self(-2);
    /// -1.
    pub const LOW: Self = Self(-1);
    /// The default, 0.
    pub const NORMAL: Self = Self(0);
    /// 1.
    pub const HIGH: Self = Self(1);
    /// The highest level, 2.
    pub const HIGHEST: Self = Self(2);
    /// Every level, highest first.
    pub const ALL: [Self; 5] = [
        Self::HIGHEST,
        Self::HIGH,
        Self::NORMAL,
        Self::LOW,
        Self::LOWEST,
    ];

    /// The level `level`, or `None` outside `-2..=2`.
    pub const fn new(level: i8) -> Option<Self> {
        if level >= Self::LOWEST.0 && level <= Self::HIGHEST.0 {
            Some(Self(level))
        } else {
            None
        }
    }

    /// The level as a number, `-2..=2`.
    pub const fn get(self) -> i8 {
        self.0
    }

    /// Reads a level as a backend stores it (`"-2"` to `"2"`), naming the range when it is
    /// not one.
    pub fn parse(text: &str) -> Result<Self, String> {
        text.trim()
            .parse::<i8>()
            .ok()
            .and_then(Self::new)
            .ok_or_else(|| format!("priority `{text}` is not a whole number from -2 to 2"))
    }
}

impl TryFrom<i64> for Priority {
    type Error = String;
    fn try_from(level: i64) -> Result<Self, String> {
        i8::try_from(level)
            .ok()
            .and_then(Self::new)
            .ok_or_else(|| format!("priority {level} is not a whole number from -2 to 2"))
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Headers a job carries from its publisher to its handler and into its dead letter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headers {
    /// The request that queued the job (seed: `request_id`), for finding it in the logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The trace the publisher ran in (seed: `trace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// Any other header, kept as given.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, String>,
}

/// One job as a broker stores and delivers it.
///
/// The payload is opaque bytes (JSON through serde by default); everything else is what the
/// runtime needs to route, count and trace the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    id: JobId,
    /// Shared, as the id and the payload: a clone of an envelope (the handler's context gets
    /// one per delivery) allocates nothing for them.
    kind: Arc<str>,
    attempt: u32,
    payload: Bytes,
    headers: Headers,
    enqueued_at: DateTime<Utc>,
    priority: Priority,
}

impl Envelope {
    /// An envelope for a new job of `kind` with an already encoded payload, a fresh id, attempt 0
    /// (not yet delivered) and the given enqueue time.
    pub fn new(kind: impl Into<String>, payload: Vec<u8>, enqueued_at: DateTime<Utc>) -> Self {
        Self {
            id: JobId::new(),
            kind: Arc::from(kind.into()),
            attempt: 0,
            payload: Bytes::from(payload),
            headers: Headers::default(),
            enqueued_at,
            priority: Priority::NORMAL,
        }
    }

    /// An envelope read back from a backend: the job stored under `id`, of `kind`, with its
    /// payload and enqueue time, attempt 0 and default headers until set. Unlike
    /// [`new`](Self::new) it mints no id (a backend decoding a delivery has one already).
    pub fn stored(
        id: JobId,
        kind: impl Into<Arc<str>>,
        payload: impl Into<Bytes>,
        enqueued_at: DateTime<Utc>,
    ) -> Self {
        Self {
            id,
            kind: kind.into(),
            attempt: 0,
            payload: payload.into(),
            headers: Headers::default(),
            enqueued_at,
            priority: Priority::NORMAL,
        }
    }

    /// The job's id.
    pub fn id(&self) -> &JobId {
        &self.id
    }
    /// The job's kind: which handler of its queue runs it.
    pub fn kind(&self) -> &str {
        &self.kind
    }
    /// On a delivery, the number of this delivery, 1 for the first; on a stored job, the
    /// deliveries made so far.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// The encoded payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }
    /// When the publisher enqueued the job.
    pub fn enqueued_at(&self) -> DateTime<Utc> {
        self.enqueued_at
    }

    /// The job's priority within its queue.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Replaces the id.
    pub fn with_id(mut self, id: JobId) -> Self {
        self.id = id;
        self
    }
    /// Replaces the attempt number.
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }
    /// Replaces the headers.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }
    /// Replaces the priority.
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }
    /// Mutable access to the headers.
    pub fn headers_mut(&mut self) -> &mut Headers {
        &mut self.headers
    }
    /// Takes the payload out.
    pub fn into_payload(self) -> Vec<u8> {
        // No copy unless a clone of this envelope still shares it.
        Vec::from(self.payload)
    }
}

/// When a published job becomes due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RunAt {
    /// At once.
    #[default]
    Now,
    /// No earlier than this long after it is published.
    After(Duration),
    /// No earlier than this time.
    At(DateTime<Utc>),
}

impl RunAt {
    /// The due time given the broker's `now`, or `None` for at once. A due time later than
    /// [`MAX_DELAY`](crate::MAX_DELAY) from `now` is `now + MAX_DELAY`.
    pub fn resolve(self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let latest = crate::clock::later(now, crate::clock::MAX_DELAY);
        match self {
            RunAt::Now => None,
            RunAt::After(d) => Some(crate::clock::later(now, d)),
            RunAt::At(t) => Some(t.min(latest)),
        }
    }
}

/// A job to publish: a queue, a kind, an encoded payload and when it should run.
///
/// ```
/// # use stagedoor_jobs::Job;
/// # use std::time::Duration;
/// #[derive(serde::Serialize)]
/// struct Reminder { event_id: u64 }
/// let job = Job::new("jobs", &Reminder { event_id: 7 })
///     .unwrap()
///     .kind("send_reminder")
///     .after(Duration::from_secs(24 * 3600))
///     .request_id("7f3a9c2e");
/// assert_eq!(job.queue(), "jobs");
/// ```
#[derive(Clone, Debug)]
pub struct Job {
    queue: String,
    envelope: Envelope,
    run_at: RunAt,
    /// `Job::unique`: the key (`None`: by kind and payload) and the window.
    unique: Option<(Option<String>, Duration)>,
}

/// The header that carries a unique job's key and window (`<window ms> <key>`) from its publish
/// to its settlement, where the runtime starts the window.
pub const UNIQUE_HEADER: &str = "stagedoor-unique";

/// How long a unique job's key is held while the job has not finished, beyond its window and
/// its delay: its settlement ends the hold (the window starts then), so this bounds only a
/// job that disappears without one (a row deleted by hand, a worker killed between the
/// settlement and the step that starts the window).
pub const UNIQUE_PENDING_MAX: Duration = Duration::from_secs(24 * 3600);

/// The guard of unique key `key` on `queue` (see [`Job::unique`]).
pub(crate) fn unique_guard(queue: &str, key: &str) -> String {
    format!("unique:{queue}:{key}")
}

/// A unique job's key and window, from its headers.
pub(crate) fn unique_of(headers: &Headers) -> Option<(&str, Duration)> {
    let (ms, key) = headers.extra.get(UNIQUE_HEADER)?.split_once(' ')?;
    Some((key, Duration::from_millis(ms.parse().ok()?)))
}

impl Job {
    /// A job on `queue` whose payload is `payload` encoded as JSON. Its kind is the queue's name
    /// until [`Job::kind`] names another.
    pub fn new<T: Serialize + ?Sized>(
        queue: impl Into<String>,
        payload: &T,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self::from_bytes(queue, serde_json::to_vec(payload)?))
    }

    /// A job with an already encoded payload.
    pub fn from_bytes(queue: impl Into<String>, payload: Vec<u8>) -> Self {
        let queue = queue.into();
        Self {
            envelope: Envelope::new(queue.clone(), payload, Utc::now()),
            queue,
            run_at: RunAt::Now,
            unique: None,
        }
    }

    /// Sets the kind: which handler of the queue runs it.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.envelope.kind = Arc::from(kind.into());
        self
    }
    /// Sets the id (by default a fresh UUIDv7).
    pub fn id(mut self, id: JobId) -> Self {
        self.envelope.id = id;
        self
    }
    /// Runs the job no earlier than `delay` after it is published. A delay longer than
    /// [`MAX_DELAY`](crate::MAX_DELAY) (ten years) is kept at it.
    pub fn after(mut self, delay: Duration) -> Self {
        self.run_at = RunAt::After(delay);
        self
    }
    /// Runs the job no earlier than `at`. A time further ahead than
    /// [`MAX_DELAY`](crate::MAX_DELAY) (ten years) from its publish is kept at that bound.
    pub fn at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = RunAt::At(at);
        self
    }
    /// Makes the job unique by `key` on its queue for `window`: while a job of that key is
    /// waiting, delayed, running, or finished less than `window` ago (acknowledged, dropped or
    /// dead-lettered), publishing another of the same key stores nothing and returns the
    /// existing job's id ([`Published::is_stored`](crate::Published::is_stored) is `false`).
    /// Atomic on every backend: of two publishes at once, one stores its job. A job that fails
    /// and is retried keeps its key. The window starts at the settlement; a job that
    /// disappears without one (a row deleted by hand) holds its key at most
    /// [`UNIQUE_PENDING_MAX`] beyond its delay and window.
    ///
    /// A window longer than [`MAX_DELAY`](crate::MAX_DELAY) (ten years) is kept at it.
    ///
    /// The key travels in the job's headers ([`UNIQUE_HEADER`]); a SQL table without a headers
    /// column cannot carry it, so there the window starts with the hold above.
    pub fn unique(mut self, key: impl Into<String>, window: Duration) -> Self {
        self.unique = Some((Some(key.into()), window));
        self
    }
    /// [`unique`](Self::unique) with the key made of the job's kind and a hash (SHA-256) of
    /// its payload: the same message published twice is stored once.
    pub fn unique_by_payload(mut self, window: Duration) -> Self {
        self.unique = Some((None, window));
        self
    }
    /// Sets the job's priority within its queue (see [`Priority`]: higher first, FIFO among
    /// equals, no level starved). On a SQL table it needs a `#[field(priority)]` column: a
    /// table without one refuses a job whose priority is not [`Priority::NORMAL`], naming the
    /// column to add.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.envelope.priority = priority;
        self
    }
    /// Sets the request id header.
    pub fn request_id(mut self, id: impl Into<String>) -> Self {
        self.envelope.headers.request_id = Some(id.into());
        self
    }
    /// Sets the trace header.
    pub fn trace(mut self, trace: impl Into<String>) -> Self {
        self.envelope.headers.trace = Some(trace.into());
        self
    }
    /// Sets another header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.envelope
            .headers
            .extra
            .insert(name.into(), value.into());
        self
    }

    /// Whether [`unique`](Self::unique) or [`unique_by_payload`](Self::unique_by_payload) was
    /// called.
    pub fn is_unique(&self) -> bool {
        self.unique.is_some()
    }
    /// The queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }
    /// The job id.
    pub fn job_id(&self) -> &JobId {
        &self.envelope.id
    }
    /// When it runs.
    pub fn run_at(&self) -> RunAt {
        self.run_at
    }
    /// The envelope.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// What makes this job one no backend can store as given: an empty kind (a claim could
    /// not tell it from a missing one) or an empty id (a backend would give it another, so the
    /// publisher's id would be lost). Found by the fuzzer (fuzz/README.md, findings 1 and 2).
    pub(crate) fn problem(&self) -> Option<String> {
        if self.envelope.kind.is_empty() {
            Some("the job's kind is empty: give it a kind with `Job::kind(\"...\")`, or leave the default (the payload's type name)".to_owned())
        } else if self.envelope.id.as_str().is_empty() {
            Some("the job's id is empty: give it a non-empty `JobId`, or leave the default (a fresh one)".to_owned())
        } else {
            None
        }
    }

    /// Splits the job for a broker, stamping the enqueue time with the broker's clock. With
    /// the `opentelemetry` feature it also writes the current span's trace context into the
    /// headers (`traceparent`, `tracestate`; see [`otel`](crate::otel)), unless they hold one.
    pub fn into_parts(mut self, now: DateTime<Utc>) -> (String, Envelope, Option<DateTime<Utc>>) {
        self.envelope.enqueued_at = now;
        if let Some((key, window)) = self.unique.take() {
            let key = key.unwrap_or_else(|| {
                use sha2::Digest;
                let digest = sha2::Sha256::digest(&self.envelope.payload);
                let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
                format!("{}:{hex}", self.envelope.kind)
            });
            // Kept at MAX_DELAY, so that it fits the header's number (2^64 ms did not, and the
            // job was silently not unique).
            let window = window.min(crate::clock::MAX_DELAY);
            self.envelope.headers.extra.insert(
                UNIQUE_HEADER.to_owned(),
                format!("{} {key}", window.as_millis()),
            );
        }
        #[cfg(feature = "opentelemetry")]
        crate::otel::inject(&mut self.envelope.headers.extra);
        let at = self.run_at.resolve(now);
        (self.queue, self.envelope, at)
    }
}
