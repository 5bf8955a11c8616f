//! One claimed delivery: dispatch by kind to its mount, the cap checked before it runs, the
//! handler run under `CatchPanic` in the delivery's task with its lease renewed by the worker, and the outcome-to-settlement rules
//! (`failed`, with `outcome.rs`).

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::worker::{MountRt, Worker};
use crate::broker::{Broker, Delivery, Settlement};
use crate::envelope::Envelope;
use crate::extract::{Cancellation, JobContext};
use crate::handler::Ran;
use crate::mount::{MountSpec, OnDecodeError};
use crate::outcome::{Failure, FailureCause, Verdict};
use crate::panic::CatchPanic;

impl<B: Broker> Worker<B> {
    fn mount_for(&self, kind: &str) -> Option<&MountRt> {
        let i = self
            .queue
            .by_kind
            .get(kind)
            .copied()
            .or(self.queue.every_kind)?;
        Some(&self.mounts[i])
    }

    /// The `kind` label of `kind` in the metrics: the kind a mount names; a kind no mount
    /// handles is [`UNKNOWN_KIND_LABEL`](crate::counters::UNKNOWN_KIND_LABEL), and one the mount
    /// for every kind runs keeps its name among the queue's first
    /// [`KIND_LABELS_MAX`](crate::counters::KIND_LABELS_MAX) (see `KindLabels`).
    pub(super) fn kind_label<'a>(&self, kind: &'a str) -> &'a str {
        if self.queue.by_kind.contains_key(kind) {
            kind
        } else if self.queue.every_kind.is_some() {
            self.queue.kind_labels.label(kind)
        } else {
            crate::counters::UNKNOWN_KIND_LABEL
        }
    }

    /// The settlement of a delivery that must not run (`arrival::refused`), its envelope
    /// given the attempts its dead letter reports (it never ran here).
    fn refusal(&self, delivery: &mut Delivery<B::Receipt>) -> Option<Settlement> {
        let spec = &self.mount_for(delivery.envelope.kind())?.spec;
        let default_dl = || self.broker.default_dead_letter(&self.queue.name);
        let poison_count = self.broker.poison_count();
        let (s, spent) = super::arrival::refused(spec, delivery, poison_count, default_dl)?;
        if let Some(n) = spent {
            delivery.envelope = delivery.envelope.clone().with_attempt(n);
        }
        Some(s)
    }

    pub(super) async fn process(&self, mut delivery: Delivery<B::Receipt>, cancel: Cancellation) {
        let refusal = self.refusal(&mut delivery);
        // Shared with the worker's renewals while it is held.
        let delivery = Arc::new(delivery);
        let env = &delivery.envelope;
        let span = tracing::info_span!(
            "job",
            queue = %self.queue.name,
            kind = %env.kind(),
            job_id = %env.id(),
            attempt = env.attempt(),
            request_id = env.headers().request_id.as_deref().unwrap_or(""),
            trace = env.headers().trace.as_deref().unwrap_or(""),
            subscriber = tracing::field::Empty,
        );
        #[cfg(feature = "opentelemetry")]
        crate::otel::set_parent(&span, &env.headers().extra);
        async {
            let Some(mount) = self.mount_for(env.kind()) else {
                self.unknown_kind(&delivery).await;
                return;
            };
            let spec = &mount.spec;
            tracing::Span::current().record("subscriber", spec.subscriber.as_str());
            if let Some(s) = refusal {
                self.settle(&spec.subscriber, &delivery, s).await;
                return;
            }
            // The lease is renewed from here on, while the delivery waits for a slot of its
            // mount and while its handler runs, by the worker (`renewals.rs`).
            let held = self.renewals.hold(&delivery, &cancel);
            let flow = match self.flow_before(env).await {
                super::flows::Before::Run(flow) => flow,
                before => {
                    held.release().await;
                    let s = if matches!(before, super::flows::Before::Done) {
                        tracing::info!(
                            "its flow has it done already: acknowledged without running again"
                        );
                        Settlement::Ack
                    } else {
                        tracing::info!(
                            "skipped by its flow (a parent failed): dropped without running"
                        );
                        Settlement::Drop
                    };
                    self.settle(&spec.subscriber, &delivery, s).await;
                    return;
                }
            };
            let ran = self.run_handler(mount, env, &cancel, flow).await;
            // A job cancelled while it ran (or waited for its slot) is dropped, whatever its
            // handler answered.
            let ran = ran.filter(|_| !cancel.is_cancelled());
            // A result is kept before the job is acknowledged, its lease still renewed.
            if let Some(Ok(Ran::Verdict(Verdict::Ack(Some(json))))) = &ran {
                self.keep_result(spec, env, json).await;
            }
            held.release().await;
            let Some(ran) = ran else {
                tracing::info!("cancelled: dropped");
                for o in self.ctx.observers.iter() {
                    o.cancelled(&self.queue.name, env);
                }
                self.settle(&spec.subscriber, &delivery, Settlement::Drop)
                    .await;
                return;
            };
            let settlement = self.settlement(spec, env, ran);
            self.settle(&spec.subscriber, &delivery, settlement).await;
        }
        .instrument(span)
        .await
    }

    /// Waits for a slot of `mount`, then runs its handler on `env` (in the delivery's task).
    /// `None` when the job was cancelled before its slot came.
    async fn run_handler(
        &self,
        mount: &MountRt,
        env: &Envelope,
        cancel: &Cancellation,
        flow: Option<Arc<crate::extract::FlowInfo>>,
    ) -> Option<Result<Ran, Failure>> {
        let spec = &mount.spec;
        // A mount's permits are never closed: nothing calls `close` on them.
        let _slot = mount
            .permits
            .acquire()
            .await
            .expect("semaphore never closed");
        if cancel.is_cancelled() {
            return None;
        }
        let ctx = Arc::new(JobContext::of_delivery(
            Arc::clone(&self.queue.name),
            env.clone(),
            Arc::clone(&self.ctx.state),
            cancel.clone(),
            crate::results::Keeper {
                sink: Arc::clone(&self.records),
                retention: spec.keep_results,
            },
            flow,
        ));
        let started = std::time::Instant::now();
        // In the delivery's task: a handler that blocks its thread (blocking code without
        // `spawn_blocking`) holds up this task only, and the worker renews the lease meanwhile
        // from a task of its own.
        let ran = CatchPanic::boxed(spec.handler.run(ctx)).await;
        self.queue.metrics.handler_duration(
            &self.queue.name,
            self.kind_label(env.kind()),
            started.elapsed(),
        );
        Some(ran)
    }

    /// A job whose kind no mount of the queue handles: to the default dead letter.
    async fn unknown_kind(&self, delivery: &Delivery<B::Receipt>) {
        let env = &delivery.envelope;
        let target = self.broker.default_dead_letter(&self.queue.name);
        let failure = Failure::new(
            FailureCause::UnknownKind,
            format!(
                "no handler for kind `{}` on queue `{}`: mount a subscriber with `kind = \"{}\"` (or one for every kind), then replay this dead letter",
                env.kind(),
                self.queue.name,
                env.kind()
            ),
            String::new(),
        );
        tracing::error!(dead_letter = %target, "{}", failure.error);
        self.settle("", delivery, Settlement::DeadLetter { target, failure })
            .await;
    }

    /// What the handler's run asks for: acknowledged, dropped, retried or dead-lettered.
    fn settlement(
        &self,
        spec: &MountSpec,
        env: &Envelope,
        ran: Result<Ran, Failure>,
    ) -> Settlement {
        match ran {
            Ok(Ran::Verdict(Verdict::Ack(_))) => Settlement::Ack,
            Ok(Ran::Verdict(Verdict::Drop)) => {
                tracing::info!("dropped by its handler");
                Settlement::Drop
            }
            Ok(Ran::Verdict(Verdict::Failed(f, after))) => self.failed(spec, env, f, after),
            Ok(Ran::Undecodable(f)) => match (&spec.on_decode_error, &spec.dead_letter) {
                (OnDecodeError::DeadLetter, Some(target)) => {
                    tracing::error!(dead_letter = %target, error = %f.error, "undecodable payload dead-lettered");
                    Settlement::DeadLetter {
                        target: target.clone(),
                        failure: f,
                    }
                }
                _ => self.failed(spec, env, f, None),
            },
            Err(panic) => self.failed(spec, env, panic, None),
        }
    }

    /// A failed attempt: retried after the backoff (or the handler's delay), or dead-lettered
    /// at the cap.
    fn failed(
        &self,
        spec: &MountSpec,
        env: &Envelope,
        failure: Failure,
        after: Option<Duration>,
    ) -> Settlement {
        match (spec.max_attempts, &spec.dead_letter) {
            (Some(cap), Some(target)) if env.attempt() >= cap.get() => {
                tracing::error!(
                    dead_letter = %target,
                    error = %failure.error,
                    traceback = %failure.traceback,
                    "attempt {} of {cap} failed: dead-lettered",
                    env.attempt()
                );
                Settlement::DeadLetter {
                    target: target.clone(),
                    failure,
                }
            }
            _ => {
                let asked = after.unwrap_or_else(|| spec.backoff.delay(env.attempt()));
                let delay =
                    crate::backoff::retry_delay(spec.max_attempts.is_some(), asked, env.attempt())
                        .min(crate::clock::MAX_DELAY);
                tracing::warn!(error = %failure.error, cause = %failure.cause, "attempt {} failed: retry in {delay:?}", env.attempt());
                Settlement::Retry { delay, failure }
            }
        }
    }
}
