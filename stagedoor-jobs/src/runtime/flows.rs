//! A delivery of a flow's job (the header `stagedoor-flow`): its node read before it runs (a
//! node done already is not run again, a skipped one is dropped), marked done or failed before
//! its settlement, and the children that makes ready published then too (`flow/engine.rs` says
//! why nothing runs twice and nothing is lost). Jobs outside any flow pass by with one header
//! lookup.

use std::sync::Arc;
use std::time::Duration;

use super::worker::Worker;
use crate::broker::{Broker, BrokerError, Settlement};
use crate::envelope::Envelope;
use crate::extract::FlowInfo;
use crate::flow::{FLOW_HEADER, NodeState};

/// What a flow's job's node says before it runs.
pub(super) enum Before {
    /// Run it (with what its handler may read of the flow).
    Run(Option<Arc<FlowInfo>>),
    /// Done already (a worker died between marking it done and acknowledging it): acknowledge
    /// it without running, publishing what is still ready.
    Done,
    /// Skipped (a parent failed): drop it without running.
    Skipped,
}

/// The flow a job belongs to.
pub(super) fn flow_of(env: &Envelope) -> Option<&str> {
    env.headers().extra.get(FLOW_HEADER).map(String::as_str)
}

/// Tries `f` again while the backend is unreachable (growing waits up to 1 s); `None` after any
/// other error, logged with `what`.
async fn transient_retry<T, F, Fut>(what: &str, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BrokerError>>,
{
    let (mut wait, mut failures) = (Duration::from_millis(50), 0u32);
    loop {
        match f().await {
            Ok(t) => return Some(t),
            Err(e) if e.is_transient() => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(10) {
                    tracing::warn!(error = %e, "could not {what} ({failures} tries): trying again");
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
            Err(e) => {
                tracing::error!(error = %e, "could not {what}");
                return None;
            }
        }
    }
}

impl<B: Broker> Worker<B> {
    /// Reads the node of a flow's job before it runs.
    pub(super) async fn flow_before(&self, env: &Envelope) -> Before {
        let Some(flow) = flow_of(env) else {
            return Before::Run(None);
        };
        let id = env.id().as_str();
        let read = transient_retry("read the job's flow", || {
            crate::flow::node_state(&self.broker, flow, id)
        })
        .await;
        let Some(Some((doc, state))) = read else {
            tracing::warn!(
                flow,
                "the job's flow or its node is gone (run out, or deleted): the job runs as one outside any flow"
            );
            return Before::Run(None);
        };
        match state {
            NodeState::Done => Before::Done,
            NodeState::Skipped => Before::Skipped,
            _ => {
                let parents = doc
                    .nodes
                    .get(id)
                    .map(|n| n.parents.clone())
                    .unwrap_or_default();
                let (succeeded, failed) = doc.outcomes_of(&parents);
                Before::Run(Some(Arc::new(FlowInfo::new(
                    flow.to_owned(),
                    parents,
                    succeeded,
                    failed,
                    Arc::clone(&self.records),
                ))))
            }
        }
    }

    /// Before a flow's job is settled: its node marked done (`Ack`) or failed (dead letter,
    /// drop), and the children that makes ready published. A retry changes nothing.
    pub(super) async fn flow_settling(&self, env: &Envelope, settlement: &Settlement) {
        let Some(flow) = flow_of(env) else {
            return;
        };
        let id = env.id().as_str();
        let why = match settlement {
            Settlement::Ack => None,
            Settlement::DeadLetter { target, .. } => Some(format!("dead-lettered to {target}")),
            Settlement::Drop => Some("dropped (by its handler, or cancelled)".to_owned()),
            _ => return,
        };
        let updated = transient_retry("record the job's outcome in its flow", || {
            crate::flow::update(&self.broker, flow, |doc| {
                let before: Vec<String> = doc.ready().map(|(id, _)| id.clone()).collect();
                let was_final = doc.nodes.get(id).is_some_and(|n| n.state.is_final());
                let known = match &why {
                    None => doc.complete(id),
                    Some(w) => doc.fail(id, w),
                };
                if !known {
                    tracing::warn!(flow, "the job is not a node of its flow: nothing to record");
                }
                let newly: Vec<String> = (doc.ready())
                    .map(|(id, _)| id.clone())
                    .filter(|r| !before.contains(r))
                    .collect();
                Ok((was_final, newly))
            })
        })
        .await;
        let Some(Some((doc, (was_final, newly)))) = updated else {
            return;
        };
        // This change's children only; every one still ready when the node was final already
        // (a delivery again after a worker died between the mark and the publish).
        let only = (!was_final).then_some(newly.as_slice());
        transient_retry("publish the flow's jobs now ready", || {
            crate::flow::release(&self.broker, flow, &doc, only)
        })
        .await;
    }
}
