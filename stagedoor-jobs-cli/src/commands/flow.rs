//! `flow ID`: a flow's (or batch's) jobs with their states and parents, and what holds it.

use std::collections::BTreeMap;

use stagedoor_jobs::broker::Records;
use stagedoor_jobs::flow::{FlowView, NodeState, NodeView, read_flow};

use crate::error::{Failure, OK, check_id};
use crate::output::{self, Out};

/// `flow ID`.
pub(super) async fn flow<B: Records>(b: &B, out: &Out, id: &str) -> Result<u8, Failure> {
    check_id("flow", id)?;
    let Some(view) = read_flow(b, id).await.map_err(Failure::broker)? else {
        return Err(Failure::not_found(format!(
            "no flow or batch {}: it was never published, or it finished and its record ran out",
            output::escaped(id.as_bytes())
        )));
    };
    if out.json {
        out.json(&json(&view));
        return Ok(OK);
    }
    out.line(format!(
        "flow {} ({})",
        output::escaped(view.id.as_bytes()),
        if view.sealed { "sealed" } else { "open" }
    ));
    let mut t = output::table(&["JOB", "QUEUE", "KIND", "STATE", "PARENTS", "WHY"], &[]);
    for n in &view.nodes {
        t.add_row(vec![
            output::escaped(n.id.as_bytes()),
            output::escaped(n.queue.as_bytes()),
            output::escaped(n.kind.as_bytes()),
            state_name(n.state).to_owned(),
            output::escaped(n.parents.join(", ").as_bytes()),
            n.why
                .as_deref()
                .map(|w| output::first_line(&output::escaped(w.as_bytes()), 120))
                .unwrap_or_default(),
        ]);
    }
    output::print_table(out, &t);
    out.line(summary(&view));
    Ok(OK)
}

/// A node's state as shown (and in `--json`).
pub(crate) fn state_name(s: NodeState) -> &'static str {
    match s {
        NodeState::Waiting => "waiting",
        NodeState::Ready => "ready",
        NodeState::Released => "released",
        NodeState::Done => "done",
        NodeState::Failed => "failed",
        NodeState::Skipped => "skipped",
        NodeState::Held => "held",
    }
}

/// What a waiting or held node waits for: its parents not done yet, or the batch's seal.
fn holder(view: &FlowView, n: &NodeView) -> String {
    if n.state == NodeState::Held {
        return n
            .why
            .clone()
            .unwrap_or_else(|| "a failed parent".to_owned());
    }
    let open: Vec<&str> = n
        .parents
        .iter()
        .filter(|p| {
            view.nodes
                .iter()
                .find(|m| &m.id == *p)
                .is_none_or(|m| m.state != NodeState::Done)
        })
        .map(String::as_str)
        .collect();
    if open.is_empty() {
        "the batch to be sealed".to_owned()
    } else {
        open.join(", ")
    }
}

/// `3 jobs: 1 done, 1 released, 1 waiting; holding it: c waits for a; d held until parent b
/// succeeds`.
pub(crate) fn summary(view: &FlowView) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &view.nodes {
        *counts.entry(state_name(n.state)).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let held: Vec<String> = view
        .nodes
        .iter()
        .filter(|n| matches!(n.state, NodeState::Waiting | NodeState::Held))
        .map(|n| {
            let verb = if n.state == NodeState::Held {
                "held:"
            } else {
                "waits for"
            };
            format!("{} {verb} {}", n.id, holder(view, n))
        })
        .collect();
    let line = format!("{} jobs: {}", view.nodes.len(), counts.join(", "));
    let line = if held.is_empty() {
        format!("{line}; nothing holds it")
    } else {
        format!("{line}; holding it: {}", held.join("; "))
    };
    output::escaped(line.as_bytes())
}

fn json(view: &FlowView) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = view
        .nodes
        .iter()
        .map(|n| {
            serde_json::json!({
                "id": n.id,
                "queue": n.queue,
                "kind": n.kind,
                "state": state_name(n.state),
                "parents": n.parents,
                "policy": n.policy,
                "why": n.why,
                "waits_for": matches!(n.state, NodeState::Waiting | NodeState::Held)
                    .then(|| holder(view, n)),
            })
        })
        .collect();
    serde_json::json!({
        "id": view.id,
        "sealed": view.sealed,
        "nodes": nodes,
        "summary": summary(view),
    })
}
