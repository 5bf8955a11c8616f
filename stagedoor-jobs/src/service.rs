//! The service: an application's subscribers mounted on its brokers, started, run until a
//! signal, and stopped gracefully.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backoff::{Backoff, UNCAPPED_FLOOR};
use crate::broker::{Broker, BrokerError, MAX_ATTEMPT, Problem};
use crate::clock::{Clock, SYNC_EVERY};
use crate::envelope::Job;
use crate::extract::State;
use crate::handler::BoxFuture;
use crate::health::{Board, Health};
use crate::monitor::{self, AlertHook, DeadLetterAlert};
use crate::mount::{OnDecodeError, RouteBuilder};
use crate::outcome::BoxError;
use crate::report::{Reporter, ScheduleInfo};
use crate::runtime::{ErasedRoute, Observer, RouteRuntime, RunCtx};
use crate::schedule::{self, Bound, Progress, Schedule};
use crate::supervise::{RestartLimit, supervise};

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

/// Why a service did not start or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The configuration has problems; every one is listed, each naming its mount and the fix.
    #[error("the service `{app}` refuses to start:\n{}", list(.problems))]
    Refused {
        /// The application.
        app: String,
        /// Every problem found.
        problems: Vec<Problem>,
    },
    /// An `on_startup` hook failed.
    #[error("an on_startup hook of `{app}` failed: {source}")]
    Startup {
        /// The application.
        app: String,
        /// The hook's error.
        source: BoxError,
    },
    /// A broker could not connect, or its server refused to prepare the queues (a full Redis
    /// says it is full, not that it could not connect).
    #[error("the {backend} broker {}: {source}", connect_failure(.source))]
    Connect {
        /// The backend.
        backend: &'static str,
        /// Its error.
        source: BrokerError,
    },
    /// The test harness cannot run this service as asked.
    #[error("{0}")]
    Harness(String),
    /// A task of the running service (a queue's claim loop, the monitor, the scheduler) failed
    /// more often than [`Service::restart_limit`] allows: the service stopped.
    #[error("the service `{app}` stopped: its task `{task}` kept failing; last error: {error}")]
    Failed {
        /// The application.
        app: String,
        /// The task: `claim:<queue>`, `monitor` or `scheduler`.
        task: String,
        /// Its last error.
        error: String,
    },
}

/// What a [`ServiceError::Connect`] says happened: a server that answered but is full is
/// reached, and says so.
fn connect_failure(e: &BrokerError) -> &'static str {
    match e {
        BrokerError::Full(_) => "cannot start",
        _ => "could not connect",
    }
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {}: {}", p.mount, p.message))
        .collect::<Vec<_>>()
        .join("\n")
}

type Hook = Box<dyn FnOnce() -> BoxFuture<'static, Result<(), BoxError>> + Send>;

/// An application's jobs: brokers, the subscribers mounted on them, startup hooks and state.
///
/// ```no_run
/// # use stagedoor_jobs::prelude::*;
/// # async fn send(_: &String) -> HandlerOutcome { HandlerOutcome::ack() }
/// # async fn main_() -> Result<(), stagedoor_jobs::ServiceError> {
/// Service::new(AppInfo::new("mailer", "0.1.0"))
///     .with_broker(MemoryBroker::new(), |b| {
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
    hooks: Vec<Hook>,
    pub(crate) routes: Vec<Arc<dyn ErasedRoute>>,
    state: State,
    shutdown_timeout: Duration,
    pub(crate) clock: Clock,
    pub(crate) observers: Vec<Arc<dyn Observer>>,
    schedules: Vec<Schedule>,
    alert: Option<AlertHook>,
    metrics_interval: Duration,
    restart_limit: RestartLimit,
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

    /// Problems visible without any I/O: caps and dead letters, duplicates.
    fn static_problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut seen: Vec<(usize, &str, Option<&str>, &str)> = Vec::new();
        for (r, route) in self.routes.iter().enumerate() {
            for m in route.mounts() {
                let who = format!("mount `{}` on queue `{}`", m.subscriber, m.queue);
                let mut add = |message: String| {
                    problems.push(Problem {
                        mount: who.clone(),
                        message,
                    })
                };
                match (&m.max_attempts, &m.dead_letter) {
                    (Some(n), None) => add(format!(
                        "max_attempts({n}) is declared without a dead letter, so a job failing its last attempt would have nowhere to go: add `.dead_letter(\"{}\")`",
                        route.default_dead_letter(&m.queue)
                    )),
                    (None, Some(d)) => add(format!(
                        "dead_letter(\"{d}\") is declared without max_attempts, so nothing would ever reach it: add `.max_attempts(nonzero!(5u32))`"
                    )),
                    _ => {}
                }
                if let Some(n) = m.max_attempts
                    && n.get() > MAX_ATTEMPT
                {
                    add(format!(
                        "max_attempts({n}) can never be reached: every backend's attempt counter stops at {MAX_ATTEMPT} (stagedoor_jobs::broker::MAX_ATTEMPT), so a failing job would be retried forever: declare a cap of at most {MAX_ATTEMPT}, such as `.max_attempts(nonzero!(25u32))`"
                    ));
                }
                if m.dead_letter.as_deref() == Some(m.queue.as_str()) {
                    add(format!(
                        "the dead letter is the queue itself (`{}`), so a dead job would run again: name another, such as `{}`",
                        m.queue,
                        route.default_dead_letter(&m.queue)
                    ));
                }
                if m.on_decode_error == OnDecodeError::DeadLetter && m.dead_letter.is_none() {
                    add("on_decode_error(OnDecodeError::DeadLetter) needs a dead letter: add `.max_attempts(..)` and `.dead_letter(..)`".to_owned());
                }
                if m.concurrency == 0 {
                    add("concurrency(0) would never run a handler: use 1 or more".to_owned());
                }
                let kind = m.kind.as_deref();
                if let Some((_, _, _, other)) = seen
                    .iter()
                    .find(|(r2, q, k, _)| *r2 == r && *q == m.queue && *k == kind)
                {
                    add(format!(
                        "`{other}` already subscribes to {} on this queue: a job must have one handler; give one of them another queue or `kind = \"..\"`",
                        match kind {
                            Some(k) => format!("kind `{k}`"),
                            None => "every kind".to_owned(),
                        }
                    ));
                }
                seen.push((r, &m.queue, kind, &m.subscriber));
            }
        }
        problems
    }

    /// Starts the service: runs the startup hooks, connects every broker, checks every mount
    /// (refusing to start with the full list of problems), then starts claiming.
    pub async fn start(mut self) -> Result<Running, ServiceError> {
        let mut problems = self.static_problems();
        let mut names: Vec<&str> = Vec::new();
        for s in &self.schedules {
            problems.extend(s.problems());
            if names.contains(&s.name()) {
                problems.push(Problem {
                    mount: format!("schedule `{}`", s.name()),
                    message:
                        "two schedules share this name, and the name keys its ticks: rename one"
                            .to_owned(),
                });
            }
            names.push(s.name());
        }
        if !self.schedules.is_empty() && self.routes.is_empty() {
            problems.push(Problem {
                mount: "*".to_owned(),
                message: "the service has schedules but no broker to enqueue them on: add `.with_broker(..)`".to_owned(),
            });
        }
        for hook in std::mem::take(&mut self.hooks) {
            hook().await.map_err(|source| ServiceError::Startup {
                app: self.app.name.clone(),
                source,
            })?;
        }
        for route in &self.routes {
            route
                .connect()
                .await
                .map_err(|source| ServiceError::Connect {
                    backend: route.backend(),
                    source,
                })?;
        }
        for route in &self.routes {
            problems.extend(route.check().await);
            // Due times, leases and ticks follow the backend's clock from the start.
            if let Err(e) = route.sync_clock().await {
                tracing::warn!(backend = route.backend(), error = %e, "cannot read the backend's clock: using this machine's until the next try");
            }
        }
        if !problems.is_empty() {
            return Err(ServiceError::Refused {
                app: self.app.name.clone(),
                problems,
            });
        }
        for route in &self.routes {
            for m in route.mounts() {
                if m.max_attempts.is_none() {
                    tracing::warn!(
                        subscriber = %m.subscriber,
                        queue = %m.queue,
                        "no max_attempts on this mount: a job that always fails is retried forever, at least {:?} apart (doubling to {:?}: UNCAPPED_FLOOR); declare `.max_attempts(..)` with a `.dead_letter(..)`",
                        UNCAPPED_FLOOR.delay(1),
                        UNCAPPED_FLOOR.delay(u32::MAX)
                    );
                }
            }
        }
        let board = Arc::new(Board::new(self.app.name.clone()));
        let stop_rx = board.stop_signal();
        let limit = self.restart_limit;
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let dead_lettered = Arc::new(tokio::sync::Notify::new());
        let ctx = RunCtx {
            dead_lettered: Arc::clone(&dead_lettered),
            in_flight: Arc::clone(&in_flight),
            state: Arc::new(std::mem::take(&mut self.state)),
            stop: stop_rx.clone(),
            shutdown_timeout: self.shutdown_timeout,
            observers: Arc::from(self.observers.clone()),
            board: Arc::clone(&board),
            restart_limit: limit,
        };
        let mut tasks = Vec::new();
        for route in &self.routes {
            tasks.extend(Arc::clone(route).spawn(&ctx).await.map_err(|source| {
                ServiceError::Connect {
                    backend: route.backend(),
                    source,
                }
            })?);
        }
        if !self.routes.is_empty() {
            let (routes, every, alert, stop) = (
                self.routes.clone(),
                self.metrics_interval,
                self.alert.take(),
                stop_rx.clone(),
            );
            tasks.push(tokio::spawn(supervise(
                board.task("monitor"),
                Arc::clone(&board),
                limit,
                move || {
                    monitor::run(
                        routes.clone(),
                        every,
                        Arc::clone(&dead_lettered),
                        alert.clone(),
                        stop.clone(),
                    )
                },
            )));
        }
        if !self.routes.is_empty() {
            let (routes, stop) = (self.routes.clone(), stop_rx.clone());
            tasks.push(tokio::spawn(supervise(
                board.task("clock"),
                Arc::clone(&board),
                limit,
                move || sync_clocks(routes.clone(), stop.clone()),
            )));
        }
        let mut progress = None;
        // Each schedule as the worker reports of its route show it.
        let mut reported: Vec<(usize, ScheduleInfo)> = Vec::new();
        if !self.schedules.is_empty() {
            let bound: Vec<Bound> = std::mem::take(&mut self.schedules)
                .into_iter()
                .enumerate()
                .map(|(index, schedule)| {
                    let at = self
                        .routes
                        .iter()
                        .position(|r| {
                            r.mounts()
                                .iter()
                                .any(|m| Some(m.queue.as_str()) == schedule.queue())
                        })
                        .unwrap_or(0);
                    let route = self
                        .routes
                        .get(at)
                        .map(Arc::clone)
                        .expect("checked: the service has a broker");
                    let (when, missed) = schedule.described();
                    reported.push((
                        at,
                        ScheduleInfo {
                            index,
                            name: schedule.name().to_owned(),
                            queue: schedule.queue().unwrap_or_default().to_owned(),
                            when,
                            missed,
                        },
                    ));
                    Bound { schedule, route }
                })
                .collect();
            let (tx, rx) = watch::channel(Progress::default());
            progress = Some(rx);
            let (clock, stop, tx) = (self.clock.clone(), stop_rx.clone(), Arc::new(tx));
            tasks.push(tokio::spawn(supervise(
                board.task("scheduler"),
                Arc::clone(&board),
                limit,
                move || schedule::run(bound.clone(), clock.clone(), stop.clone(), Arc::clone(&tx)),
            )));
        }
        if !self.routes.is_empty() {
            let reporter = Arc::new(Reporter::new(
                &self.app,
                &self.routes,
                reported,
                progress.clone(),
                Arc::clone(&in_flight),
                self.shutdown_timeout,
            ));
            let stop = stop_rx.clone();
            tasks.push(tokio::spawn(supervise(
                board.task("activity"),
                Arc::clone(&board),
                limit,
                move || Arc::clone(&reporter).run(stop.clone()),
            )));
        }
        tracing::info!(app = %self.app.name, version = %self.app.version, "service started");
        Ok(Running {
            app: self.app,
            board,
            tasks,
            shutdown_timeout: self.shutdown_timeout,
            routes: self.routes,
            in_flight,
            progress,
        })
    }

    /// Runs until SIGINT or SIGTERM, then shuts down gracefully: stops claiming and lets running
    /// handlers finish within the shutdown timeout. Returns [`ServiceError::Failed`] (after the
    /// same graceful stop) if a task of the service fails beyond its
    /// [`restart_limit`](Self::restart_limit) first.
    pub async fn run(self) -> Result<(), ServiceError> {
        self.run_until(shutdown_signal()).await
    }

    /// Runs until `signal` completes, then shuts down gracefully; or until the service fails
    /// (see [`run`](Self::run)), then returns its error.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> Result<(), ServiceError> {
        let running = self.start().await?;
        let board = Arc::clone(&running.board);
        tokio::select! {
            () = signal => {}
            _ = board.wait_failed() => {}
        }
        running.shutdown().await;
        match board.failure() {
            Some((task, error)) => Err(ServiceError::Failed {
                app: board.app.clone(),
                task,
                error,
            }),
            None => Ok(()),
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT: shutting down"),
        _ = term => tracing::info!("SIGTERM: shutting down"),
    }
}

/// A started service. [`shutdown`](Running::shutdown) stops it gracefully.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub struct Running {
    app: AppInfo,
    board: Arc<Board>,
    tasks: Vec<JoinHandle<()>>,
    /// How long running handlers get at shutdown (the other tasks get 5 s more).
    shutdown_timeout: Duration,
    pub(crate) routes: Vec<Arc<dyn ErasedRoute>>,
    pub(crate) in_flight: Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) progress: Option<watch::Receiver<Progress>>,
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("app", &self.app)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// Publishes a job through the broker that serves its queue (the first broker when none
    /// mounts it). Returns its id as stored and whether it was stored (see
    /// [`Published`](crate::broker::Published)): a job whose id is already in its queue is
    /// not added twice.
    pub async fn publish(&self, job: Job) -> Result<crate::broker::Published, BrokerError> {
        let route = self
            .routes
            .iter()
            .find(|r| r.mounts().iter().any(|m| m.queue == job.queue()))
            .or_else(|| self.routes.first())
            .ok_or_else(|| BrokerError::UnknownQueue(job.queue().to_owned()))?;
        route.publish(job).await
    }

    /// The health of every queue's claim loop, of the service's other tasks and of the service
    /// itself: what a readiness probe reads ([`Health::is_healthy`]).
    pub fn health(&self) -> Health {
        self.board.health()
    }

    /// Resolves when the service has failed: a task failed more often than its
    /// [`restart_limit`](Service::restart_limit) allows. The service is stopping by itself
    /// then; [`shutdown`](Self::shutdown) waits for its running handlers. Never resolves for a
    /// service that does not fail.
    pub async fn failed(&self) -> ServiceError {
        let (task, error) = self.board.wait_failed().await;
        ServiceError::Failed {
            app: self.app.name.clone(),
            task,
            error,
        }
    }

    /// Stops claiming, waits for running handlers up to the shutdown timeout, and returns when
    /// every worker loop has ended. (A service that failed is stopped the same way; its error
    /// is logged, and [`failed`](Self::failed) or [`health`](Self::health) tell it.)
    pub async fn shutdown(self) {
        self.board.stop();
        // The queue workers give their handlers the shutdown timeout; a task still running 5 s
        // after that (a backend call that never returns) is stopped, so shutdown always ends.
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout + SHUTDOWN_GRACE;
        for t in self.tasks {
            let abort = t.abort_handle();
            match tokio::time::timeout_at(deadline, t).await {
                Ok(Err(e)) if e.is_panic() => {
                    tracing::error!(app = %self.app.name, "a supervised task panicked outside its supervision: {e}");
                }
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(app = %self.app.name, "a task of the service had not stopped {SHUTDOWN_GRACE:?} after the shutdown deadline (a backend call that does not return?): stopped");
                    abort.abort();
                }
            }
        }
        match self.board.failure() {
            Some((task, error)) => tracing::error!(
                app = %self.app.name,
                task,
                error,
                "service stopped after a task failed"
            ),
            None => tracing::info!(app = %self.app.name, "service stopped"),
        }
    }
}

/// How long after the shutdown timeout a task that has not stopped is stopped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Keeps each route's clock in step with its backend's, every [`SYNC_EVERY`] until the
/// service stops. A failed measurement keeps the last offset and is tried again at the next.
async fn sync_clocks(routes: Vec<Arc<dyn ErasedRoute>>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SYNC_EVERY) => {}
            _ = stop.changed() => return,
        }
        for route in &routes {
            if let Err(e) = route.sync_clock().await {
                tracing::debug!(backend = route.backend(), error = %e, "cannot read the backend's clock: keeping the last offset");
            }
        }
    }
}
