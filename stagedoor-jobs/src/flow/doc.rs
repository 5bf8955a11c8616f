//! A flow as stored: one record per flow (`flow:<id>`) holding every node, its parents, its
//! state and, until it is published, its job. Every change is a pure function of the document
//! (here, unit-tested), written back by compare-and-set (`engine.rs`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::envelope::{Envelope, Headers, JobId, Priority};

/// The header naming the flow a job belongs to.
pub const FLOW_HEADER: &str = "stagedoor-flow";

/// What a node does when one of its parents fails (its job is dead-lettered, dropped or
/// cancelled, or the parent was itself skipped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnParentFailure {
    /// The node never runs: it is skipped, and so are its own children that fail with it.
    #[default]
    Fail,
    /// The node runs once every parent has finished, whether it succeeded or not.
    RunAnyway,
    /// The node waits: it runs when the failed parent is replayed from its dead letter and
    /// succeeds (shown as held, naming the parent).
    Hold,
}

/// Where a node of a flow stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Waiting for its parents (or, for a batch's callback, for the batch to be sealed).
    Waiting,
    /// Its parents are done: it is being published.
    Ready,
    /// Published to its queue: waiting there, or running.
    Released,
    /// Its handler succeeded (its children may run).
    Done,
    /// Its job was dead-lettered, dropped or cancelled.
    Failed,
    /// A parent failed and the node's policy is [`OnParentFailure::Fail`]: it never runs.
    Skipped,
    /// A parent failed and the node's policy is [`OnParentFailure::Hold`]: it waits for that
    /// parent to be replayed and succeed.
    Held,
}

impl NodeState {
    /// Whether nothing more happens to the node (unless a failed one is replayed).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Done | Self::Failed | Self::Skipped)
    }
    fn failed(self) -> bool {
        matches!(self, Self::Failed | Self::Skipped)
    }
}

/// A node's job until it is published.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredJob {
    pub(crate) payload: String,
    /// The payload is hex (it was not UTF-8).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) hex: bool,
    #[serde(default)]
    pub(crate) priority: i8,
    #[serde(default)]
    pub(crate) headers: Headers,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) at: Option<DateTime<Utc>>,
}

impl StoredJob {
    pub(crate) fn of(envelope: &Envelope, at: Option<DateTime<Utc>>) -> Self {
        let (payload, hex) = match std::str::from_utf8(envelope.payload()) {
            Ok(s) => (s.to_owned(), false),
            Err(_) => (
                envelope
                    .payload()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect(),
                true,
            ),
        };
        Self {
            payload,
            hex,
            priority: envelope.priority().get(),
            headers: envelope.headers().clone(),
            at,
        }
    }

    /// The envelope to publish, stamped `now`; `None` when the stored payload does not read.
    pub(crate) fn envelope(
        &self,
        id: &str,
        kind: &str,
        now: DateTime<Utc>,
    ) -> Option<(Envelope, Option<DateTime<Utc>>)> {
        let payload = if self.hex {
            (0..self.payload.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(self.payload.get(i..i + 2)?, 16).ok())
                .collect::<Option<Vec<u8>>>()?
        } else {
            self.payload.clone().into_bytes()
        };
        let env = Envelope::new(kind, payload, now)
            .with_id(JobId::from_string(id))
            .with_headers(self.headers.clone())
            .with_priority(Priority::new(self.priority).unwrap_or_default());
        Some((env, self.at))
    }
}

/// One node of a flow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Node {
    pub(crate) queue: String,
    pub(crate) kind: String,
    pub(crate) parents: Vec<String>,
    pub(crate) policy: OnParentFailure,
    pub(crate) state: NodeState,
    /// Waits for the flow to be sealed too (a batch's callbacks).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) after_seal: bool,
    /// The job, until it is published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) job: Option<StoredJob>,
    /// Why it failed, was skipped or is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) why: Option<String>,
}

/// A flow (or a batch) as stored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct FlowDoc {
    /// Nodes by job id.
    pub(crate) nodes: BTreeMap<String, Node>,
    /// No node may be added any more; a batch's callbacks wait for it.
    pub(crate) sealed: bool,
    /// How long the record is kept once every node is final, in seconds.
    pub(crate) keep_secs: u64,
}

impl FlowDoc {
    /// Decides every node that waits, until nothing changes: ready when every parent is done
    /// (or failed, under `RunAnyway`), skipped when a parent failed under `Fail`, held under
    /// `Hold`, waiting while a parent has not finished. A node made ready keeps its job until
    /// it is published.
    pub(crate) fn settle(&mut self) {
        loop {
            let mut changed = false;
            let ids: Vec<String> = self.nodes.keys().cloned().collect();
            for id in ids {
                let node = &self.nodes[&id];
                if !matches!(node.state, NodeState::Waiting | NodeState::Held) {
                    continue;
                }
                let (next, why) = self.verdict(node);
                let node = self.nodes.get_mut(&id).expect("listed above");
                if node.state != next {
                    node.state = next;
                    node.why = why;
                    changed = true;
                }
            }
            if !changed {
                return;
            }
        }
    }

    fn verdict(&self, node: &Node) -> (NodeState, Option<String>) {
        let (mut pending, mut held_by) = (false, None);
        for p in &node.parents {
            let state = self.nodes.get(p).map_or(NodeState::Failed, |n| n.state);
            if state == NodeState::Done {
                continue;
            }
            if !state.failed() {
                pending = true;
                continue;
            }
            match node.policy {
                OnParentFailure::RunAnyway => {}
                OnParentFailure::Fail => {
                    return (NodeState::Skipped, Some(format!("parent {p} failed")));
                }
                OnParentFailure::Hold => held_by = held_by.or(Some(p.clone())),
            }
        }
        if pending || (node.after_seal && !self.sealed) {
            (NodeState::Waiting, None)
        } else if let Some(p) = held_by {
            (
                NodeState::Held,
                Some(format!("held until parent {p} succeeds")),
            )
        } else {
            (NodeState::Ready, None)
        }
    }

    /// The node `id` succeeded. `false` when it is not a node of this flow.
    pub(crate) fn complete(&mut self, id: &str) -> bool {
        let Some(node) = self.nodes.get_mut(id) else {
            return false;
        };
        node.state = NodeState::Done;
        node.why = None;
        node.job = None;
        self.settle();
        true
    }

    /// The node `id` failed (`why`: dead-lettered, dropped, cancelled).
    pub(crate) fn fail(&mut self, id: &str, why: &str) -> bool {
        let Some(node) = self.nodes.get_mut(id) else {
            return false;
        };
        if node.state == NodeState::Done {
            return true;
        }
        node.state = NodeState::Failed;
        node.why = Some(why.to_owned());
        node.job = None;
        self.settle();
        true
    }

    /// The nodes ready to publish, with their jobs.
    pub(crate) fn ready(&self) -> impl Iterator<Item = (&String, &Node)> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.state == NodeState::Ready)
    }

    /// Marks `ids` published (those still ready).
    pub(crate) fn released(&mut self, ids: &[String]) {
        for id in ids {
            if let Some(n) = self.nodes.get_mut(id)
                && n.state == NodeState::Ready
            {
                n.state = NodeState::Released;
                n.job = None;
            }
        }
    }

    /// Whether every node is final and the flow sealed: the record may run out.
    pub(crate) fn finished(&self) -> bool {
        self.sealed && self.nodes.values().all(|n| n.state.is_final())
    }

    /// Ids of the nodes that succeeded and of those that failed or were skipped, among `of`.
    pub(crate) fn outcomes_of(&self, of: &[String]) -> (Vec<String>, Vec<String>) {
        let (mut ok, mut failed) = (Vec::new(), Vec::new());
        for id in of {
            match self.nodes.get(id).map(|n| n.state) {
                Some(NodeState::Done) => ok.push(id.clone()),
                Some(s) if s.failed() => failed.push(id.clone()),
                _ => {}
            }
        }
        (ok, failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(parents: &[&str], policy: OnParentFailure) -> Node {
        Node {
            queue: "q".into(),
            kind: "k".into(),
            parents: parents.iter().map(|p| p.to_string()).collect(),
            policy,
            state: NodeState::Waiting,
            after_seal: false,
            job: None,
            why: None,
        }
    }

    /// a -> (b, c) -> d, each child under `policy`.
    fn diamond(policy: OnParentFailure) -> FlowDoc {
        let mut doc = FlowDoc {
            sealed: true,
            ..Default::default()
        };
        doc.nodes.insert("a".into(), node(&[], policy));
        doc.nodes.insert("b".into(), node(&["a"], policy));
        doc.nodes.insert("c".into(), node(&["a"], policy));
        doc.nodes.insert("d".into(), node(&["b", "c"], policy));
        doc.settle();
        doc
    }

    fn states(doc: &FlowDoc) -> Vec<NodeState> {
        doc.nodes.values().map(|n| n.state).collect()
    }

    use NodeState::*;

    #[test]
    fn a_child_is_ready_once_every_parent_is_done() {
        let mut doc = diamond(OnParentFailure::Fail);
        assert_eq!(states(&doc), [Ready, Waiting, Waiting, Waiting]);
        doc.released(&["a".into()]);
        doc.complete("a");
        assert_eq!(states(&doc), [Done, Ready, Ready, Waiting]);
        doc.complete("b");
        assert_eq!(states(&doc), [Done, Done, Ready, Waiting], "d waits for c");
        doc.complete("c");
        assert_eq!(states(&doc), [Done, Done, Done, Ready]);
        doc.complete("d");
        assert!(doc.finished());
    }

    #[test]
    fn a_failed_parent_skips_runs_or_holds_its_children() {
        let mut doc = diamond(OnParentFailure::Fail);
        doc.fail("a", "dead-lettered");
        assert_eq!(states(&doc), [Failed, Skipped, Skipped, Skipped]);
        assert!(doc.finished());

        let mut doc = diamond(OnParentFailure::RunAnyway);
        doc.fail("a", "dropped");
        assert_eq!(states(&doc), [Failed, Ready, Ready, Waiting]);

        let mut doc = diamond(OnParentFailure::Hold);
        doc.complete("a");
        doc.fail("b", "dead-lettered");
        assert_eq!(states(&doc), [Done, Failed, Ready, Waiting]);
        doc.complete("c");
        assert_eq!(states(&doc), [Done, Failed, Done, Held]);
        assert!(!doc.finished(), "a held node keeps the flow open");
        // b replayed from its dead letter, and it succeeds.
        doc.complete("b");
        assert_eq!(states(&doc), [Done, Done, Done, Ready]);
    }

    #[test]
    fn a_callback_after_the_seal_waits_for_it() {
        let mut doc = FlowDoc::default();
        doc.nodes
            .insert("m1".into(), node(&[], OnParentFailure::Fail));
        let mut cb = node(&["m1"], OnParentFailure::RunAnyway);
        cb.after_seal = true;
        doc.nodes.insert("z".into(), cb);
        doc.settle();
        doc.complete("m1");
        assert_eq!(doc.nodes["z"].state, Waiting, "not sealed yet");
        doc.sealed = true;
        doc.settle();
        assert_eq!(doc.nodes["z"].state, Ready);
    }

    #[test]
    fn a_stored_job_round_trips_also_when_not_utf8() {
        let now = Utc::now();
        for payload in [b"{\"n\":1}".to_vec(), vec![0, 255, 10, 128]] {
            let env = Envelope::new("k", payload.clone(), now);
            let stored = StoredJob::of(&env, None);
            let (back, at) = stored.envelope("id-1", "k", now).expect("reads");
            assert_eq!(back.payload(), &payload[..]);
            assert_eq!(back.id().as_str(), "id-1");
            assert_eq!(at, None);
        }
        let junk = StoredJob {
            payload: "zz".into(),
            hex: true,
            priority: 0,
            headers: Headers::default(),
            at: None,
        };
        assert!(junk.envelope("i", "k", now).is_none());
    }
}
