//! The service builder: the application's name, its brokers and the subscribers mounted on
//! them, schedules, hooks, state and the settings of a running service. Starting it is in
//! `start.rs`.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;
use crate::clock::Clock;
use crate::extract::State;
use crate::handler::BoxFuture;
use crate::monitor::{AlertHook, DeadLetterAlert};
use crate::mount::RouteBuilder;
use crate::outcome::BoxError;
use crate::runtime::{ErasedRoute, Observer, RouteRuntime};
use crate::schedule::Schedule;
use crate::supervise::RestartLimit;

/// The application's name and version, for logs and the workers' names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppInfo {
    /// The application's name.
    pub name: String,
    /// Its version.
    pub version: String,
}

impl AppInfo {
    /// `AppInfo::new("mailer", "0.1.0")`
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
        }
    }
}

type Hook = Box<dyn FnOnce() -> BoxFuture<'static, Result<(), BoxError>> + Send>;

/// An application's jobs: brokers, the subscribers mounted on them, startup hooks and state.
///
/// ```no_run
/// # use stagedoor_jobs::prelude::*;
/// # async fn send(_: &String) -> HandlerOutcome { HandlerOutcome::ack() }
/// # async fn main_<B: stagedoor_jobs::Broker>(broker: B) -> Result<(), stagedoor_jobs::ServiceError> {
/// Service::new(AppInfo::new("mailer", "0.1.0"))
///     .with_broker(broker, |b| {
///         b.include(Subscriber::new("emails", send))
///             .max_attempts(nonzero!(5u32))
///             .dead_letter("emails.dead");
///     })
///     .run()
///     .await
/// # }
/// ```
pub struct Service {
    pub(crate) app: AppInfo,
    pub(super) hooks: Vec<Hook>,
    pub(crate) routes: Vec<Arc<dyn ErasedRoute>>,
    pub(super) state: State,
    pub(super) shutdown_timeout: Duration,
    pub(crate) clock: Clock,
    pub(crate) observers: Vec<Arc<dyn Observer>>,
    pub(super) schedules: Vec<Schedule>,
    pub(super) alert: Option<AlertHook>,
    pub(super) metrics_interval: Duration,
    pub(super) restart_limit: RestartLimit,
}

impl fmt::Debug for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Service")
            .field("app", &self.app)
            .field("routes", &self.routes.len())
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// A service with nothing mounted.
    pub fn new(app: AppInfo) -> Self {
        Self {
            app,
            hooks: Vec::new(),
            routes: Vec::new(),
            state: State::default(),
            shutdown_timeout: Duration::from_secs(30),
            clock: Clock::system(),
            observers: Vec::new(),
            schedules: Vec::new(),
            alert: None,
            metrics_interval: Duration::from_secs(5),
            restart_limit: RestartLimit::default(),
        }
    }

    /// Runs `hook` when the service starts, before any broker connects (create a table, run
    /// migrations). A hook's error stops the start.
    pub fn on_startup<F, Fut, E>(mut self, hook: F) -> Self
    where
        F: FnOnce(()) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.hooks.push(Box::new(move || {
            let fut = hook(());
            Box::pin(async move { fut.await.map_err(Into::into) })
        }));
        self
    }

    /// Mounts subscribers on `broker` (a broker, or a route of one such as an SQL table).
    pub fn with_broker<B: Broker>(
        mut self,
        broker: B,
        mount: impl FnOnce(&mut RouteBuilder<B>),
    ) -> Self {
        let mut builder = RouteBuilder::new(broker);
        mount(&mut builder);
        self.routes.push(Arc::new(RouteRuntime::new(builder)));
        self
    }

    /// Enqueues a job at times: every N, a cron expression in a time zone, hourly, daily at a
    /// time. The scheduler runs in every worker; each tick is enqueued once across all of them.
    ///
    /// ```no_run
    /// # use stagedoor_jobs::prelude::*;
    /// # use std::time::Duration;
    /// # fn f(s: Service) -> Service {
    /// s.schedule(Schedule::every("expire_holds", Duration::from_secs(60)).on("jobs"))
    ///     .schedule(Schedule::cron("reconcile_payments", cron!("0 3 * * *")).on("jobs").missed(Missed::Skip))
    /// # }
    /// ```
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Calls `hook` when a dead letter of this service goes from empty to not empty (an error
    /// is logged either way): wire it to your pager. Seen at once when this worker
    /// dead-letters a job, and within the metrics interval otherwise.
    ///
    /// One incident pages once, however many workers run the service: every worker's monitor
    /// sees the transition, and only the one that takes the broker lock
    /// `dead-alert:<dead letter>:<id of its oldest entry>:<its failed_at>` (24 h) calls its hook
    /// and logs the ERROR; the others log at INFO that another worker paged. The lock lives on
    /// the backend (Redis `SET NX`, an SQL row, the memory broker), so workers need no other
    /// coordination. If the backend cannot answer (listing the dead letter or taking the lock
    /// fails), the monitor pages anyway: it fails open, so an incident may then page twice but
    /// is never missed. Emptied (purged or replayed) and filled again, it pages again.
    pub fn on_dead_letter(
        mut self,
        hook: impl Fn(&DeadLetterAlert) + Send + Sync + 'static,
    ) -> Self {
        self.alert = Some(Arc::new(hook));
        self
    }

    /// How often queue and dead-letter gauges are sampled (default 5 s).
    pub fn metrics_interval(mut self, every: Duration) -> Self {
        self.metrics_interval = every;
        self
    }

    /// Shares `value` with every handler: take it with the [`Data<T>`](crate::Data) extractor.
    pub fn state<T: Any + Send + Sync>(mut self, value: T) -> Self {
        self.state.insert(value);
        self
    }

    /// How long a shutdown waits for running handlers (default 30 s). A handler still running
    /// then is abandoned; its job comes back after its lease.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// When a long-running task that keeps failing stops the service (default: more than 5
    /// failures within 60 s). Each queue's claim loop, the metrics monitor and the scheduler run
    /// supervised: a panic is logged at ERROR and the task restarted after a backoff (100 ms,
    /// doubling, at most 10 s). A task that fails more than `max_restarts` times within
    /// `within` is not restarted: the service stops claiming, [`Running::failed`] resolves and
    /// [`run`](Self::run) returns [`ServiceError::Failed`]. `restart_limit(0, ..)` fails the
    /// service at the first panic.
    ///
    /// [`Running::failed`]: crate::Running::failed
    /// [`ServiceError::Failed`]: crate::ServiceError::Failed
    pub fn restart_limit(mut self, max_restarts: u32, within: Duration) -> Self {
        self.restart_limit = RestartLimit {
            max_restarts,
            within,
        };
        self
    }

    /// The application.
    pub fn app(&self) -> &AppInfo {
        &self.app
    }
}
