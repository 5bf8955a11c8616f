//! Starting a service: the checks that refuse a bad configuration, the startup hooks, the
//! brokers connected and their clocks measured, then the queue workers, the monitor, the clock
//! sync and the scheduler started, each supervised. Also running until a signal.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

use super::builder::Service;
use super::error::ServiceError;
use super::running::{Running, sync_clocks};
use crate::backoff::{Backoff, UNCAPPED_FLOOR};
use crate::broker::{MAX_ATTEMPT, MAX_LEASE, MIN_LEASE, Problem};
use crate::health::Board;
use crate::monitor;
use crate::mount::OnDecodeError;
use crate::report::{Reporter, ScheduleInfo};
use crate::runtime::RunCtx;
use crate::runtime::limits::QueueLimits;
use crate::schedule::scheduler::{self, Bound, Progress};
use crate::supervise::supervise;

impl Service {
    /// Problems visible without any I/O: caps and dead letters, duplicates.
    fn static_problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut seen: Vec<(usize, &str, Option<&str>, &str)> = Vec::new();
        let mut reported_limits: Vec<(usize, &str)> = Vec::new();
        for (r, route) in self.routes.iter().enumerate() {
            let lease = route.lease();
            if !(MIN_LEASE..=MAX_LEASE).contains(&lease) {
                problems.push(Problem {
                    mount: "*".to_owned(),
                    message: format!(
                        "the {} broker's lease is {lease:?}, outside {MIN_LEASE:?} (MIN_LEASE) to {MAX_LEASE:?} (MAX_LEASE): a shorter one has a job claimed again while its handler runs, a longer one holds a dead worker's jobs that long (the runtime renews a lease every third of it, so a long handler needs no long lease): set `.lease(Duration::from_secs(3))`, the default",
                        route.backend()
                    ),
                });
            }
            for m in route.mounts() {
                let who = format!("mount `{}` on queue `{}`", m.subscriber, m.queue);
                let mut add = |message: String| {
                    problems.push(Problem {
                        mount: who.clone(),
                        message,
                    })
                };
                if let Some(p) = route.queue_name_problem(&m.queue) {
                    add(p);
                }
                if let Some(p) = m
                    .dead_letter
                    .as_deref()
                    .and_then(|d| route.queue_name_problem(d))
                {
                    add(format!("its dead letter: {p}"));
                }
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
                for p in QueueLimits::problems(m) {
                    add(p);
                }
                if let Err(p) = QueueLimits::of(&m.queue, route.mounts().iter())
                    && (m.global_concurrency.is_some() || m.rate_limit.is_some())
                    && !reported_limits.contains(&(r, m.queue.as_str()))
                {
                    reported_limits.push((r, &m.queue));
                    add(p);
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
            held_back: crate::runtime::HeldBack::default(),
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
                move || scheduler::run(bound.clone(), clock.clone(), stop.clone(), Arc::clone(&tx)),
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
            held_back: ctx.held_back.clone(),
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
