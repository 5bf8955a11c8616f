//! A flow's changes as the backend sees them: the flow's record read, changed by a pure
//! function of `doc.rs` and written back at the version read (tried again when another process
//! wrote first), and the nodes made ready published, then marked published.
//!
//! Why nothing runs twice and nothing is lost: a node is marked done before its job is
//! acknowledged, and its children are published before that acknowledgement too. A worker that
//! dies anywhere in between leaves the job unacknowledged; its next delivery finds the node done,
//! does not run the handler again, publishes what is still ready and acknowledges. A child
//! published twice (two processes releasing at once) is stored once while it is in its queue,
//! and a copy delivered after the child finished finds its node done and is not run.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::doc::{FLOW_HEADER, FlowDoc, NodeState};
use crate::broker::{Broker, BrokerError, RecordWrite, Records};
use crate::envelope::Envelope;

/// A job to publish, with its due time.
type Due = (Envelope, Option<DateTime<Utc>>);

/// The record key of flow `id`.
pub fn flow_key(id: &str) -> String {
    format!("flow:{id}")
}

/// Reads flow `id`: `None` when there is none (never published, or run out).
pub(crate) async fn read<B: Records>(
    broker: &B,
    id: &str,
) -> Result<Option<(FlowDoc, u64)>, BrokerError> {
    let Some(r) = broker.read_record(&flow_key(id)).await? else {
        return Ok(None);
    };
    let doc = serde_json::from_slice(&r.value).map_err(|e| BrokerError::Malformed {
        id: flow_key(id),
        reason: format!(
            "the flow's record does not read ({e}): delete it; its jobs then run as jobs outside any flow"
        ),
    })?;
    Ok(Some((doc, r.version)))
}

/// Writes `doc` as flow `id` if its record is still at `version` (`0`: there is none).
/// `Ok(false)`: another process wrote first.
pub(crate) async fn write<B: Records>(
    broker: &B,
    id: &str,
    doc: &FlowDoc,
    version: u64,
) -> Result<bool, BrokerError> {
    let value = serde_json::to_vec(doc).map_err(|e| BrokerError::Backend(e.to_string()))?;
    let mut w = RecordWrite::put(flow_key(id), value).if_version(version);
    if doc.finished() {
        w = w.ttl(Duration::from_secs(doc.keep_secs.max(1)));
    }
    Ok(broker.write_records(&[w]).await?.is_some())
}

/// Changes flow `id` with `change` until a write at the version read lands. `Ok(None)`: there is
/// no such flow. `change` may refuse (an error ends the update with nothing written).
pub(crate) async fn update<B, T>(
    broker: &B,
    id: &str,
    mut change: impl FnMut(&mut FlowDoc) -> Result<T, BrokerError>,
) -> Result<Option<(FlowDoc, T)>, BrokerError>
where
    B: Records,
{
    let mut wait = Duration::from_millis(1);
    loop {
        let Some((mut doc, version)) = read(broker, id).await? else {
            return Ok(None);
        };
        let out = change(&mut doc)?;
        if write(broker, id, &doc, version).await? {
            return Ok(Some((doc, out)));
        }
        // Another process wrote first: read again, after a short wait that grows (many workers
        // finishing nodes of one flow at once).
        let jitter = Duration::from_micros(u64::from(rand_u16()) % 1000);
        tokio::time::sleep(wait + jitter).await;
        wait = (wait * 2).min(Duration::from_millis(50));
    }
}

fn rand_u16() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish() as u16
}

/// Publishes the ready nodes of flow `id` (from `doc`, as last read or written; of them only
/// `only` when given: those a change of this process made ready), then marks them published. A
/// node whose stored job does not read is marked failed instead.
pub(crate) async fn release<B: Broker>(
    broker: &B,
    id: &str,
    doc: &FlowDoc,
    only: Option<&[String]>,
) -> Result<(), BrokerError> {
    let now = broker.clock().now();
    let mut by_queue: BTreeMap<&str, Vec<Due>> = BTreeMap::new();
    let (mut published, mut junk) = (Vec::new(), Vec::new());
    for (node_id, node) in doc.ready() {
        if only.is_some_and(|o| !o.contains(node_id)) {
            continue;
        }
        let Some((mut env, at)) = node
            .job
            .as_ref()
            .and_then(|j| j.envelope(node_id, &node.kind, now))
        else {
            junk.push(node_id.clone());
            continue;
        };
        env.headers_mut()
            .extra
            .insert(FLOW_HEADER.to_owned(), id.to_owned());
        by_queue.entry(&node.queue).or_default().push((env, at));
        published.push(node_id.clone());
    }
    if published.is_empty() && junk.is_empty() {
        return Ok(());
    }
    for (queue, jobs) in by_queue {
        broker.publish(queue, jobs).await?;
    }
    update(broker, id, |doc| {
        doc.released(&published);
        for j in &junk {
            tracing::error!(flow = id, job_id = %j, "a node's stored job does not read: marked failed");
            doc.fail(j, "its stored job does not read");
        }
        Ok(())
    })
    .await?;
    if !junk.is_empty() {
        // Failing a node may have made others ready.
        if let Some((doc, _)) = read(broker, id).await? {
            Box::pin(release(broker, id, &doc, None)).await?;
        }
    }
    Ok(())
}

/// Where the node `job` of flow `flow` stands, if the flow and the node exist.
pub(crate) async fn node_state<B: Records>(
    broker: &B,
    flow: &str,
    job: &str,
) -> Result<Option<(FlowDoc, NodeState)>, BrokerError> {
    Ok(read(broker, flow).await?.and_then(|(doc, _)| {
        let s = doc.nodes.get(job)?.state;
        Some((doc, s))
    }))
}
