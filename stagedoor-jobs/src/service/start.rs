//! Starting a service: the startup hooks, the brokers connected, checked (with the checks of
//! `checks.rs`) and their clocks measured, then the queue workers, the monitor, the clock sync,
//! the scheduler and the activity reporter started, each supervised. Also running until a
//! signal.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::builder::Service;
use super::error::ServiceError;
use super::running::{Running, sync_clocks};
use crate::broker::Problem;
use crate::health::Board;
use crate::monitor;
use crate::report::{Reporter, ScheduleInfo};
use crate::runtime::RunCtx;
use crate::schedule::scheduler::{self, Bound, Progress};
use crate::supervise::supervise;

/// Where each schedule went, for the worker reports: its route's index and what it shows.
type Reported = Vec<(usize, ScheduleInfo)>;

impl Service {
    /// Starts the service: runs the startup hooks, connects every broker, checks every mount
    /// (refusing to start with the full list of problems), then starts claiming.
    pub async fn start(mut self) -> Result<Running, ServiceError> {
        let problems = self.connect_and_check().await?;
        if !problems.is_empty() {
            return Err(ServiceError::Refused {
                app: self.app.name.clone(),
                problems,
            });
        }
        self.warn_uncapped();
        let board = Arc::new(Board::new(self.app.name.clone()));
        let ctx = self.run_ctx(&board);
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
            tasks.push(self.spawn_monitor(&ctx));
            let (routes, stop) = (self.routes.clone(), ctx.stop.clone());
            tasks.push(supervised(&ctx, "clock", move || {
                sync_clocks(routes.clone(), stop.clone())
            }));
        }
        let (progress, reported) = match self.spawn_scheduler(&ctx) {
            Some((task, progress, reported)) => {
                tasks.push(task);
                (Some(progress), reported)
            }
            None => (None, Vec::new()),
        };
        if !self.routes.is_empty() {
            tasks.push(self.spawn_reporter(&ctx, reported, progress.clone()));
        }
        tracing::info!(app = %self.app.name, version = %self.app.version, "service started");
        Ok(Running {
            app: self.app,
            board,
            tasks,
            shutdown_timeout: self.shutdown_timeout,
            routes: self.routes,
            in_flight: ctx.in_flight,
            progress,
            held_back: ctx.held_back.clone(),
        })
    }

    /// Collects the problems visible without I/O, runs the startup hooks, connects every
    /// broker, then adds each broker's own checks and measures its clock. Returns every
    /// problem found; a hook or a connection that fails ends the start.
    async fn connect_and_check(&mut self) -> Result<Vec<Problem>, ServiceError> {
        let mut problems = self.static_problems();
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
        Ok(problems)
    }

    /// What every worker shares, on `board`; the application state moves into it.
    fn run_ctx(&mut self, board: &Arc<Board>) -> RunCtx {
        RunCtx {
            dead_lettered: Arc::new(tokio::sync::Notify::new()),
            in_flight: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            state: Arc::new(std::mem::take(&mut self.state)),
            stop: board.stop_signal(),
            shutdown_timeout: self.shutdown_timeout,
            observers: Arc::from(self.observers.clone()),
            board: Arc::clone(board),
            restart_limit: self.restart_limit,
            held_back: crate::runtime::HeldBack::default(),
        }
    }

    /// The monitor's task: gauges and the dead-letter alert (the alert hook moves into it).
    fn spawn_monitor(&mut self, ctx: &RunCtx) -> JoinHandle<()> {
        let (routes, every, alert, stop) = (
            self.routes.clone(),
            self.metrics_interval,
            self.alert.take(),
            ctx.stop.clone(),
        );
        let dead_lettered = Arc::clone(&ctx.dead_lettered);
        supervised(ctx, "monitor", move || {
            monitor::run(
                routes.clone(),
                every,
                Arc::clone(&dead_lettered),
                alert.clone(),
                stop.clone(),
            )
        })
    }

    /// The scheduler's task, when the service has schedules (they move into it), with the
    /// receiver of its progress and where each schedule went.
    fn spawn_scheduler(
        &mut self,
        ctx: &RunCtx,
    ) -> Option<(JoinHandle<()>, watch::Receiver<Progress>, Reported)> {
        if self.schedules.is_empty() {
            return None;
        }
        let mut reported: Reported = Vec::new();
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
        let (clock, stop, tx) = (self.clock.clone(), ctx.stop.clone(), Arc::new(tx));
        let task = supervised(ctx, "scheduler", move || {
            scheduler::run(bound.clone(), clock.clone(), stop.clone(), Arc::clone(&tx))
        });
        Some((task, rx, reported))
    }

    /// The task that sends this worker's report every few seconds.
    fn spawn_reporter(
        &self,
        ctx: &RunCtx,
        reported: Reported,
        progress: Option<watch::Receiver<Progress>>,
    ) -> JoinHandle<()> {
        let reporter = Arc::new(Reporter::new(
            &self.app,
            &self.routes,
            reported,
            progress,
            Arc::clone(&ctx.in_flight),
            self.shutdown_timeout,
        ));
        let stop = ctx.stop.clone();
        supervised(ctx, "activity", move || {
            Arc::clone(&reporter).run(stop.clone())
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

/// Spawns the task `name`, supervised: `make` starts it again when it fails, within the
/// service's restart limit.
fn supervised<F, Fut>(ctx: &RunCtx, name: &'static str, make: F) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(supervise(
        ctx.board.task(name),
        Arc::clone(&ctx.board),
        ctx.restart_limit,
        make,
    ))
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
