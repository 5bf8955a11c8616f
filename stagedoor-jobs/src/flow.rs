//! Jobs that work together: flows of dependent jobs and batches with callbacks, on every
//! backend (kept in its [`Records`](crate::broker::Records)).
//!
//! A [`Flow`] is a tree or a DAG of ordinary jobs (each with its own queue, mount, cap and dead
//! letter), published in one step ([`Flows::publish_flow`]): the flow is stored whole or not at
//! all, then the jobs without parents are published. A job becomes due when every parent's
//! handler has succeeded (each parent is marked done before its acknowledgement, and its
//! children are published before it too). What a parent's failure (dead letter, drop,
//! cancellation) does to a child is the child's [`OnParentFailure`]: skip it (the default), run
//! it anyway, or hold it until the parent is replayed from its dead letter and succeeds.
//!
//! A [`Batch`] is a flow that grows: open it with its callbacks ([`Flows::open_batch`]), add jobs
//! ([`Flows::add_to_batch`], published at once), then seal it ([`Flows::seal_batch`]). Its
//! `on_success` job is published once every job of the batch succeeded, its `on_complete` job
//! once every one finished; each exactly once, however many workers settle the last jobs at once.
//! A callback's handler reads the batch's counts and failed ids with the [`FlowInfo`](crate::FlowInfo) argument.
//!
//! Bounds: at most [`MAX_FLOW_NODES`] jobs a flow or batch (callbacks included); a flow's record
//! is kept until every node is final, then for its `keep` (default 24 hours).

mod doc;
mod engine;

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

pub use doc::{FLOW_HEADER, NodeState, OnParentFailure};
pub use engine::flow_key;
pub(crate) use engine::{node_state, release, update};

use crate::broker::{Broker, BrokerError};
use crate::envelope::{Job, JobId};
use doc::{FlowDoc, Node, StoredJob};

/// The most jobs a flow or a batch holds, its callbacks included.
pub const MAX_FLOW_NODES: usize = 1000;

/// How long a finished flow's record is kept when it does not say.
pub const DEFAULT_FLOW_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// A tree or DAG of jobs to publish together ([`Flows::publish_flow`]). A job is added after the
/// jobs it depends on, so a flow has no cycle.
///
/// ```
/// use stagedoor_jobs::{Job, flow::{Flow, OnParentFailure}};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut flow = Flow::new();
/// let fetch = flow.add(Job::new("fetch", &"https://example.com/a.csv")?);
/// let parse = flow.add_after(Job::new("parse", &1)?, [&fetch])?;
/// let chart = flow.add_after(Job::new("chart", &1)?, [&parse])?;
/// let table = flow.add_after(Job::new("table", &1)?, [&parse])?;
/// // The report runs once both are done; if either failed, it runs anyway.
/// flow.add_after_with(Job::new("report", &1)?, [&chart, &table], OnParentFailure::RunAnyway)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Flow {
    id: String,
    nodes: Vec<(Job, Vec<JobId>, OnParentFailure, bool)>,
    keep: Duration,
}

impl Default for Flow {
    fn default() -> Self {
        Self::new()
    }
}

impl Flow {
    /// An empty flow with a fresh id.
    pub fn new() -> Self {
        Self {
            id: JobId::new().as_str().to_owned(),
            nodes: Vec::new(),
            keep: DEFAULT_FLOW_RETENTION,
        }
    }
    /// The flow's id (publishing it again with the same id is refused, unless it is the same
    /// flow: then what was left unpublished is published).
    pub fn id(&self) -> &str {
        &self.id
    }
    /// Names the flow `id` instead of a fresh one.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }
    /// How long the flow's record is kept once every job is final (default 24 hours).
    pub fn keep(mut self, d: Duration) -> Self {
        self.keep = d;
        self
    }
    /// Adds a job with no parent: it is published with the flow.
    pub fn add(&mut self, job: Job) -> JobId {
        let id = job.job_id().clone();
        self.nodes
            .push((job, Vec::new(), OnParentFailure::Fail, false));
        id
    }
    /// Adds a job that runs once every one of `parents` succeeded (skipped if one fails).
    pub fn add_after<'a>(
        &mut self,
        job: Job,
        parents: impl IntoIterator<Item = &'a JobId>,
    ) -> Result<JobId, BrokerError> {
        self.add_after_with(job, parents, OnParentFailure::Fail)
    }
    /// Adds a job after `parents`, with `policy` for a parent that fails.
    pub fn add_after_with<'a>(
        &mut self,
        job: Job,
        parents: impl IntoIterator<Item = &'a JobId>,
        policy: OnParentFailure,
    ) -> Result<JobId, BrokerError> {
        let parents: Vec<JobId> = parents.into_iter().cloned().collect();
        let known: HashSet<&str> = self.nodes.iter().map(|n| n.0.job_id().as_str()).collect();
        if let Some(p) = parents.iter().find(|p| !known.contains(p.as_str())) {
            return Err(BrokerError::Invalid(format!(
                "parent `{p}` is not a job of this flow yet: add a job after the jobs it depends on"
            )));
        }
        let id = job.job_id().clone();
        self.nodes.push((job, parents, policy, false));
        Ok(id)
    }

    /// The flow as stored, every node checked (ids unique, no unique job, names the backend
    /// takes), the jobs without parents ready.
    fn into_doc<B: Broker>(self, broker: &B, sealed: bool) -> Result<FlowDoc, BrokerError> {
        if self.id.is_empty() || self.nodes.len() > MAX_FLOW_NODES {
            return Err(BrokerError::Invalid(format!(
                "a flow has an id and 1 to {MAX_FLOW_NODES} jobs; this one has {}: split it",
                self.nodes.len()
            )));
        }
        let now = broker.clock().now();
        let mut doc = FlowDoc {
            sealed,
            keep_secs: self.keep.as_secs().max(1),
            ..Default::default()
        };
        for (job, parents, policy, after_seal) in self.nodes {
            let problem = broker.queue_name_problem(job.queue());
            if let Some(p) = problem
                .or_else(|| job.problem())
                .or_else(|| broker.flow_problem(job.queue()))
            {
                return Err(BrokerError::Invalid(p));
            }
            if job.is_unique() {
                return Err(BrokerError::Invalid(format!(
                    "job `{}` of flow `{}` is unique: a flow's jobs cannot be (the flow runs each once already)",
                    job.job_id(),
                    self.id
                )));
            }
            let (queue, env, at) = job.into_parts(now);
            let node = Node {
                queue,
                kind: env.kind().to_owned(),
                parents: parents.iter().map(|p| p.as_str().to_owned()).collect(),
                policy,
                state: NodeState::Waiting,
                after_seal,
                job: Some(StoredJob::of(&env, at)),
                why: None,
            };
            if doc
                .nodes
                .insert(env.id().as_str().to_owned(), node)
                .is_some()
            {
                return Err(BrokerError::Invalid(format!(
                    "job id `{}` is in flow `{}` twice: give each job its own id",
                    env.id(),
                    self.id
                )));
            }
        }
        doc.settle();
        Ok(doc)
    }
}

/// A batch: jobs added over time, then sealed; its callbacks run once ([`Flows::open_batch`]).
#[derive(Clone, Debug)]
pub struct Batch {
    flow: Flow,
    on_success: Option<Job>,
    on_complete: Option<Job>,
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl Batch {
    /// A batch with a fresh id and no callback.
    pub fn new() -> Self {
        Self {
            flow: Flow::new(),
            on_success: None,
            on_complete: None,
        }
    }
    /// The batch's id.
    pub fn id(&self) -> &str {
        self.flow.id()
    }
    /// Names the batch `id` instead of a fresh one.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.flow = self.flow.with_id(id);
        self
    }
    /// Published once, when the batch is sealed and every job of it succeeded.
    pub fn on_success(mut self, job: Job) -> Self {
        self.on_success = Some(job);
        self
    }
    /// Published once, when the batch is sealed and every job of it finished (succeeded, or
    /// was dead-lettered, dropped or cancelled).
    pub fn on_complete(mut self, job: Job) -> Self {
        self.on_complete = Some(job);
        self
    }
    /// How long the batch's record is kept once it finished (default 24 hours).
    pub fn keep(mut self, d: Duration) -> Self {
        self.flow = self.flow.keep(d);
        self
    }
}

/// A flow as it stands, for tools (the CLI, the dashboard): each node and what holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowView {
    /// The flow's id.
    pub id: String,
    /// No job may be added any more.
    pub sealed: bool,
    /// Its nodes, by job id.
    pub nodes: Vec<NodeView>,
}

/// One node of a [`FlowView`].
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    /// The job's id.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// The jobs it waits for.
    pub parents: Vec<String>,
    /// What a parent's failure does to it.
    pub policy: OnParentFailure,
    /// Where it stands.
    pub state: NodeState,
    /// Why it failed, was skipped or is held.
    pub why: Option<String>,
}

fn view(id: &str, doc: FlowDoc) -> FlowView {
    FlowView {
        id: id.to_owned(),
        sealed: doc.sealed,
        nodes: doc
            .nodes
            .into_iter()
            .map(|(id, n)| NodeView {
                id,
                queue: n.queue,
                kind: n.kind,
                parents: n.parents,
                policy: n.policy,
                state: n.state,
                why: n.why,
            })
            .collect(),
    }
}

/// Publishing flows and batches, and reading them back: every [`Broker`] has it.
pub trait Flows: Broker {
    /// Stores `flow` whole (or not at all: an error stores nothing), then publishes its jobs
    /// without parents; returns the flow's id. After an error past the store (the server went
    /// away), publishing the same flow again publishes what was left.
    fn publish_flow(&self, flow: Flow) -> impl Future<Output = Result<String, BrokerError>> + Send {
        async move {
            let id = flow.id.clone();
            let doc = flow.into_doc(self, true)?;
            store_new(self, &id, &doc).await?;
            release(self, &id, &doc, None).await?;
            Ok(id)
        }
    }

    /// Stores `batch` open, with its callbacks and no job yet; returns its id.
    fn open_batch(&self, batch: Batch) -> impl Future<Output = Result<String, BrokerError>> + Send {
        async move {
            let id = batch.flow.id.clone();
            let mut flow = batch.flow;
            let callbacks = [
                (batch.on_success, OnParentFailure::Fail),
                (batch.on_complete, OnParentFailure::RunAnyway),
            ];
            for (job, policy) in callbacks {
                if let Some(job) = job {
                    flow.nodes.push((job, Vec::new(), policy, true));
                }
            }
            let doc = flow.into_doc(self, false)?;
            store_new(self, &id, &doc).await?;
            Ok(id)
        }
    }

    /// Adds `jobs` to the open batch `batch` and publishes them; their ids, in order. Refused
    /// when the batch is sealed or unknown.
    fn add_to_batch(
        &self,
        batch: &str,
        jobs: Vec<Job>,
    ) -> impl Future<Output = Result<Vec<JobId>, BrokerError>> + Send {
        async move {
            let ids: Vec<JobId> = jobs.iter().map(|j| j.job_id().clone()).collect();
            let mut part = Flow::new().with_id(batch);
            for job in jobs {
                part.add(job);
            }
            let added = part.into_doc(self, false)?;
            let changed = update(self, batch, |doc| {
                if doc.sealed {
                    return Err(BrokerError::Invalid(format!(
                        "batch `{batch}` is sealed: open another batch for more jobs"
                    )));
                }
                if doc.nodes.len() + added.nodes.len() > MAX_FLOW_NODES {
                    return Err(BrokerError::Invalid(format!(
                        "batch `{batch}` would hold more than {MAX_FLOW_NODES} jobs: open another batch"
                    )));
                }
                for (id, node) in &added.nodes {
                    if doc.nodes.contains_key(id) {
                        return Err(BrokerError::Invalid(format!(
                            "job id `{id}` is in batch `{batch}` already"
                        )));
                    }
                    doc.nodes.insert(id.clone(), node.clone());
                }
                let callbacks: Vec<String> = (doc.nodes.iter())
                    .filter(|(_, n)| n.after_seal)
                    .map(|(id, _)| id.clone())
                    .collect();
                for c in callbacks {
                    let node = doc.nodes.get_mut(&c).expect("listed above");
                    node.parents.extend(added.nodes.keys().cloned());
                }
                doc.settle();
                Ok(())
            })
            .await?;
            let Some((doc, ())) = changed else {
                return Err(unknown(batch));
            };
            release(self, batch, &doc, None).await?;
            Ok(ids)
        }
    }

    /// Seals `batch`: no job may be added; its callbacks are published once its jobs are done
    /// (at once, if they are). Sealing a sealed batch again publishes what was left.
    fn seal_batch(&self, batch: &str) -> impl Future<Output = Result<(), BrokerError>> + Send {
        async move {
            let changed = update(self, batch, |doc| {
                doc.sealed = true;
                doc.settle();
                Ok(())
            })
            .await?;
            let Some((doc, ())) = changed else {
                return Err(unknown(batch));
            };
            release(self, batch, &doc, None).await
        }
    }

    /// Cancels job `job` of flow `flow`: one waiting in its queue is removed, one running is told
    /// to stop (and is dropped when its handler returns), one not yet published will not be;
    /// each then counts as failed for its children, by their policy (skipped by default). Use
    /// this rather than [`DeadLetters::cancel`](crate::DeadLetters::cancel) for a flow's job:
    /// a job removed from its queue behind its flow's back leaves its children waiting.
    fn cancel_in_flow(
        &self,
        flow: &str,
        job: &JobId,
    ) -> impl Future<Output = Result<crate::Cancelled, BrokerError>> + Send {
        async move {
            let Some((doc, _)) = engine::read(self, flow).await? else {
                return Err(unknown(flow));
            };
            let Some(node) = doc.nodes.get(job.as_str()) else {
                return Ok(crate::Cancelled::NotFound);
            };
            let answer = match node.state {
                NodeState::Released => self.cancel(&node.queue, job).await?,
                NodeState::Waiting | NodeState::Ready | NodeState::Held => {
                    crate::Cancelled::Removed
                }
                _ => return Ok(crate::Cancelled::NotFound),
            };
            if answer == crate::Cancelled::Removed {
                let changed = update(self, flow, |doc| {
                    // A job published meanwhile (it was ready) is in its queue now: removed too.
                    let was = doc.nodes.get(job.as_str()).map(|n| n.state);
                    if !was.is_some_and(NodeState::is_final) {
                        doc.fail(job.as_str(), "cancelled");
                    }
                    Ok(was)
                })
                .await?;
                if let Some((doc, was)) = changed {
                    if was == Some(NodeState::Released) {
                        self.cancel(&node.queue, job).await?;
                    }
                    release(self, flow, &doc, None).await?;
                }
            }
            Ok(answer)
        }
    }

    /// Flow (or batch) `id` as it stands; `None` when there is none (or it ran out).
    fn flow(&self, id: &str) -> impl Future<Output = Result<Option<FlowView>, BrokerError>> + Send {
        read_flow(self, id)
    }
}

impl<B: Broker> Flows for B {}

/// Flow (or batch) `id` as it stands, read from any [`Records`](crate::broker::Records) backend
/// (a tool that moves no job: the CLI, the dashboard); `None` when there is none (or it ran out).
pub async fn read_flow<B: crate::broker::Records>(
    broker: &B,
    id: &str,
) -> Result<Option<FlowView>, BrokerError> {
    Ok(engine::read(broker, id)
        .await?
        .map(|(doc, _)| view(id, doc)))
}

fn unknown(id: &str) -> BrokerError {
    BrokerError::Invalid(format!(
        "no flow or batch `{id}`: open it first (or it finished and its record ran out)"
    ))
}

/// Stores a new flow; the same flow stored already is fine (a publish tried again), another one
/// under its id is refused.
async fn store_new<B: Broker>(broker: &B, id: &str, doc: &FlowDoc) -> Result<(), BrokerError> {
    if engine::write(broker, id, doc, 0).await? {
        return Ok(());
    }
    match engine::read(broker, id).await? {
        Some((stored, _)) if same_jobs(&stored, doc) => Ok(()),
        _ => Err(BrokerError::Invalid(format!(
            "a flow or batch `{id}` exists already: give this one another id"
        ))),
    }
}

fn same_jobs(a: &FlowDoc, b: &FlowDoc) -> bool {
    a.nodes.len() == b.nodes.len()
        && a.nodes.iter().zip(&b.nodes).all(|((ia, na), (ib, nb))| {
            ia == ib && na.parents == nb.parents && na.queue == nb.queue
        })
}
