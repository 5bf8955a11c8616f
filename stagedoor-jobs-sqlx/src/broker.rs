//! `SqlxBroker<DB>`: a connection pool (built when the service starts) and its settings.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::pool::PoolOptions;
use sqlx::{Database, Pool};
use stagedoor_jobs::kit::lock;
use stagedoor_jobs::{BrokerError, Clock};
use tokio::sync::{Notify, OnceCell};

pub(crate) enum Source<DB: Database> {
    Url(String, PoolOptions<DB>),
    Pool(Pool<DB>),
}

pub(crate) struct Shared<DB: Database> {
    pub(crate) source: Mutex<Option<Source<DB>>>,
    pub(crate) pool: OnceCell<Pool<DB>>,
    /// Woken when this process publishes or settles, and on Postgres notifications.
    pub(crate) wake: Notify,
    /// Counts wake-ups, so an idle claim knows whether anything happened since it last looked.
    pub(crate) wakes: std::sync::atomic::AtomicU64,
    /// How many claims wait for a wake-up now (see [`SqlxBroker::idle_claim`]): SQLite's
    /// watcher of the database files looks only meanwhile.
    pub(crate) idle_claims: std::sync::atomic::AtomicUsize,
    pub(crate) clock: Mutex<Clock>,
    /// The task that wakes idle claims on other connections' changes runs (Postgres `LISTEN`,
    /// SQLite's change watcher).
    pub(crate) listening: std::sync::atomic::AtomicBool,
    pub(crate) url_for_messages: String,
    /// The bookkeeping tables exist (created on first use).
    pub(crate) bookkeeping: OnceCell<()>,
    /// The records' table and index exist (created at the first use of records).
    pub(crate) records: OnceCell<()>,
    /// Writes of records so far: every so many, one deletes records that ran out (Postgres).
    pub(crate) record_writes: std::sync::atomic::AtomicU64,
    /// When a statement last failed on the connection (see [`SqlxBroker::cautious`]).
    pub(crate) last_connection_error: Mutex<Option<std::time::Instant>>,
}

/// A claim waiting for a wake-up (see [`SqlxBroker::idle_claim`]).
pub(crate) struct IdleClaim<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for IdleClaim<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A job database: SQLite (embedded) or Postgres. Cheap to clone. Make a route per job table
/// with [`route`](Self::route).
pub struct SqlxBroker<DB: Database> {
    pub(crate) shared: Arc<Shared<DB>>,
    pub(crate) lease: Duration,
    pub(crate) poll: Duration,
}

impl<DB: Database> Clone for SqlxBroker<DB> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            lease: self.lease,
            poll: self.poll,
        }
    }
}

impl<DB: Database> fmt::Debug for SqlxBroker<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxBroker")
            .field("database", &DB::NAME)
            .field("url", &self.shared.url_for_messages)
            .field("lease", &self.lease)
            .field("poll", &self.poll)
            .finish()
    }
}

impl<DB: Database> SqlxBroker<DB> {
    fn with_source(source: Source<DB>, url_for_messages: String) -> Self {
        Self {
            shared: Arc::new(Shared {
                source: Mutex::new(Some(source)),
                pool: OnceCell::new(),
                wake: Notify::new(),
                wakes: std::sync::atomic::AtomicU64::new(0),
                idle_claims: std::sync::atomic::AtomicUsize::new(0),
                clock: Mutex::new(Clock::system()),
                listening: std::sync::atomic::AtomicBool::new(false),
                url_for_messages,
                bookkeeping: OnceCell::new(),
                records: OnceCell::new(),
                record_writes: std::sync::atomic::AtomicU64::new(0),
                last_connection_error: Mutex::new(None),
            }),
            lease: stagedoor_jobs::broker::DEFAULT_LEASE,
            poll: Duration::from_millis(200),
        }
    }

    /// A broker for the database at `url`, with a pool built from `options` when the service
    /// starts. No I/O happens here; a wrong URL is reported at start.
    pub fn from_url(url: impl Into<String>, options: PoolOptions<DB>) -> Self {
        let url = url.into();
        let masked = stagedoor_jobs::broker::mask_url(&url);
        Self::with_source(Source::Url(url, options), masked)
    }

    /// A broker over an existing pool.
    pub fn new(pool: Pool<DB>) -> Self {
        Self::with_source(Source::Pool(pool), String::from("(a pool)"))
    }

    /// How long a claim holds a row (default [`DEFAULT_LEASE`](stagedoor_jobs::broker::DEFAULT_LEASE),
    /// 3 s). The runtime renews it every third of it from the claim until the job is settled
    /// (the worker's heartbeat); a row whose worker died is claimed again after it. After a
    /// connection error, rows whose lease ran out are reclaimed only once the broker has been
    /// talking to the database without one for a whole lease (their owners renew first).
    /// A service refuses to start with a lease below [`MIN_LEASE`](stagedoor_jobs::broker::MIN_LEASE)
    /// (100 ms) or above [`MAX_LEASE`](stagedoor_jobs::broker::MAX_LEASE) (one day).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often an idle worker looks for due rows when nothing woke it (default 200 ms).
    /// Postgres workers also wake on `NOTIFY`; SQLite workers on this broker's publishes at
    /// once and on other processes' (or other brokers') commits within a few milliseconds (a
    /// watcher looks at the database files while a worker waits).
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// The pool, once the service has started.
    pub fn pool(&self) -> Option<&Pool<DB>> {
        self.shared.pool.get()
    }

    pub(crate) fn now(&self) -> chrono::DateTime<chrono::Utc> {
        let t = self.clock().now();
        // Microseconds: what Postgres stores, so a value read back compares equal.
        chrono::DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
    }

    /// The broker's one clock: every clone shares its offset, so the runtime's sync of a clone
    /// moves the time every statement of this broker binds.
    pub(crate) fn clock(&self) -> Clock {
        lock(&self.shared.clock).clone()
    }

    pub(crate) fn set_clock(&self, clock: &Clock) {
        *lock(&self.shared.clock) = clock.clone();
        self.wake_all();
    }

    /// Passes `result` through, recording a connection-level error (see
    /// [`cautious`](Self::cautious)).
    pub(crate) fn noted<T>(&self, result: Result<T, BrokerError>) -> Result<T, BrokerError> {
        if let Err(BrokerError::Connection(_)) = &result {
            *lock(&self.shared.last_connection_error) = Some(std::time::Instant::now());
        }
        result
    }

    /// Whether this broker saw a connection-level error less than a lease ago. Meanwhile its
    /// claims take no row whose lease ran out: after an outage the rows' owners (which could
    /// not renew while the database was away) renew first, so a short restart never makes a
    /// job in flight run twice. Fresh rows are claimed at once.
    pub(crate) fn cautious(&self) -> bool {
        lock(&self.shared.last_connection_error).is_some_and(|t| t.elapsed() < self.lease)
    }

    /// Wakes this process's idle claims: something may be due (a publish, a settlement, a
    /// notification, the harness's clock).
    pub(crate) fn wake_all(&self) {
        self.shared
            .wakes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.shared.wake.notify_waiters();
    }

    /// Counts a claim as waiting for a wake-up until the guard is dropped (SQLite watches for
    /// other processes' commits only while one waits).
    pub(crate) fn idle_claim(&self) -> IdleClaim<'_> {
        self.shared
            .idle_claims
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        IdleClaim(&self.shared.idle_claims)
    }

    pub(crate) fn connected_pool(&self) -> Result<&Pool<DB>, BrokerError> {
        self.shared.pool.get().ok_or(BrokerError::NotConnected)
    }

    pub(crate) fn take_source(&self) -> Option<Source<DB>> {
        lock(&self.shared.source).take()
    }
}
