//! Flows and batches: a 3-level flow with fan-out and fan-in runs in dependency order, each
//! job once, the fan-in reading its parents' results; a dead-lettered parent skips, runs or
//! holds its children as each declares (held until the parent is replayed and succeeds); a
//! job delivered again after its node was marked done (a worker killed between the mark and
//! the acknowledgement) is not run again and its children still run; a batch calls back once
//! with its counts and failed ids; publishing a flow is all or nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::fixture::Fixture;
use super::support::*;
use crate::broker::{DeadLetters, DeadSelector, Inspect};
use crate::flow::{Batch, Flow, Flows, NodeState, OnParentFailure};
use crate::{Data, FlowInfo, HandlerOutcome, Job, JobId, Subscriber};

/// One run: job id, flow id, parents that succeeded, parents that failed, parents' results.
type Ran = (String, String, Vec<String>, Vec<String>, usize);

/// What the flow handlers saw, in the order they finished.
#[derive(Default)]
struct Ledger {
    ran: Mutex<Vec<Ran>>,
    /// The parent of the hold row fails until this is set.
    healed: std::sync::atomic::AtomicBool,
}

impl Ledger {
    fn order(&self) -> Vec<String> {
        self.ran
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.0.clone())
            .collect()
    }
    fn runs_of(&self, id: &JobId) -> usize {
        self.order().iter().filter(|r| *r == id.as_str()).count()
    }
}

/// Records its run; fails (n == 99, until healed) so that the job is dead-lettered.
async fn node(
    msg: &Msg,
    flow: FlowInfo,
    Data(l): Data<Arc<Ledger>>,
    Data(id): Data<Arc<Mutex<BTreeMap<u64, String>>>>,
) -> HandlerOutcome {
    if msg.n == 99 && !l.healed.load(std::sync::atomic::Ordering::SeqCst) {
        return HandlerOutcome::retry();
    }
    let results = flow.parent_results().await.map_or(0, |r| r.len());
    let me = id.lock().unwrap().get(&msg.n).cloned().unwrap_or_default();
    l.ran.lock().unwrap().push((
        me,
        flow.flow_id().to_owned(),
        flow.succeeded().to_vec(),
        flow.failed().to_vec(),
        results,
    ));
    HandlerOutcome::ack_with(&msg.n)
}

const QA: &str = "cf_flow_a";
const QB: &str = "cf_flow_b";

/// The ledger and the job ids by number the flow handler reads.
#[derive(Default)]
struct Kit {
    ledger: Arc<Ledger>,
    ids: Arc<Mutex<BTreeMap<u64, String>>>,
}

impl Kit {
    /// A job of the flow handler numbered `n`, on queue A (odd) or B (even).
    fn job(&self, n: u64) -> Job {
        let j = job(if n % 2 == 1 { QA } else { QB }, n);
        self.ids
            .lock()
            .unwrap()
            .insert(n, j.job_id().as_str().to_owned());
        j
    }

    /// Starts an app with the flow handler on both queues (a cap of 1: a failure dead-letters
    /// at once); returns it with queue A's dead letter.
    async fn start<F: Fixture>(
        &self,
        fixture: &F,
        broker: F::Broker,
    ) -> (crate::testing::TestApp, String) {
        let probe = Probe::new();
        let dl = broker.default_dead_letter(QA);
        let dlb = broker.default_dead_letter(QB);
        let app = start(
            fixture,
            service(&probe)
                .state(Arc::clone(&self.ledger))
                .state(Arc::clone(&self.ids))
                .with_broker(broker, |b| {
                    b.include(Subscriber::new(QA, node).name("node_a"))
                        .max_attempts(crate::nonzero!(1u32))
                        .dead_letter(dl.clone())
                        .concurrency(4);
                    b.include(Subscriber::new(QB, node).name("node_b"))
                        .max_attempts(crate::nonzero!(1u32))
                        .dead_letter(dlb)
                        .concurrency(4);
                }),
        )
        .await;
        (app, dl)
    }
}

/// A kit, a broker for the app and a connected one for the test.
async fn kit<F: Fixture>(fixture: &F) -> (Kit, F::Broker, F::Broker) {
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    (Kit::default(), broker, direct)
}

fn states(view: &crate::flow::FlowView) -> BTreeMap<String, NodeState> {
    view.nodes.iter().map(|n| (n.id.clone(), n.state)).collect()
}

/// a -> (b, c, d) -> e -> f: each job runs once, after every parent; the fan-in `e` sees its
/// three parents succeeded and reads their three results; the flow reads back all done.
pub async fn a_flow_runs_in_dependency_order_with_fan_out_and_fan_in<F: Fixture>(fixture: F) {
    let (rig, broker, direct) = kit(&fixture).await;
    let (app, _) = rig.start(&fixture, broker).await;
    let mut flow = Flow::new();
    let a = flow.add(rig.job(1));
    let b = flow.add_after(rig.job(2), [&a]).unwrap();
    let c = flow.add_after(rig.job(3), [&a]).unwrap();
    let d = flow.add_after(rig.job(4), [&a]).unwrap();
    let e = flow.add_after(rig.job(5), [&b, &c, &d]).unwrap();
    let f = flow.add_after(rig.job(6), [&e]).unwrap();
    let id = direct.publish_flow(flow).await.expect("publish the flow");
    for _ in 0..6 {
        app.drain().await;
    }
    let order = rig.ledger.order();
    assert_eq!(order.len(), 6, "each job ran once: {order:?}");
    let pos = |j: &JobId| order.iter().position(|o| o == j.as_str()).unwrap();
    assert_eq!(pos(&a), 0);
    assert!(
        [&b, &c, &d].iter().all(|x| pos(x) < pos(&e)),
        "fan-in after its parents"
    );
    assert_eq!(pos(&f), 5);
    let ran = rig.ledger.ran.lock().unwrap().clone();
    let e_run = ran.iter().find(|r| r.0 == e.as_str()).unwrap();
    assert_eq!(e_run.1, id);
    assert_eq!(e_run.2.len(), 3, "e saw its three parents succeed");
    assert_eq!(e_run.4, 3, "and read their three results");
    let view = direct
        .flow(&id)
        .await
        .expect("read")
        .expect("the flow is kept");
    assert!(
        view.nodes.iter().all(|n| n.state == NodeState::Done),
        "{view:?}"
    );
    app.stop().await;
}

/// A parent dead-lettered under each policy: its `Fail` child is skipped (never runs), its
/// `RunAnyway` child runs (seeing the failed parent), its `Hold` child is held until the parent
/// is replayed from its dead letter and succeeds, then runs.
pub async fn a_dead_lettered_parent_skips_runs_or_holds_its_children<F: Fixture>(fixture: F) {
    let (rig, broker, direct) = kit(&fixture).await;
    let (app, dl) = rig.start(&fixture, broker).await;
    let mut flow = Flow::new();
    let p = flow.add(rig.job(99));
    let skip = flow.add_after(rig.job(2), [&p]).unwrap();
    let grandchild = flow.add_after(rig.job(3), [&skip]).unwrap();
    let anyway = flow
        .add_after_with(rig.job(4), [&p], OnParentFailure::RunAnyway)
        .unwrap();
    let hold = flow
        .add_after_with(rig.job(6), [&p], OnParentFailure::Hold)
        .unwrap();
    let id = direct.publish_flow(flow).await.expect("publish");
    for _ in 0..3 {
        app.drain().await;
    }
    assert_eq!(
        rig.ledger.order(),
        [anyway.as_str()],
        "only the RunAnyway child ran"
    );
    let ran = rig.ledger.ran.lock().unwrap()[0].clone();
    assert_eq!(ran.3, [p.as_str()], "it saw its parent failed");
    let s = states(&direct.flow(&id).await.unwrap().unwrap());
    assert_eq!(s[p.as_str()], NodeState::Failed);
    assert_eq!(s[skip.as_str()], NodeState::Skipped);
    assert_eq!(
        s[grandchild.as_str()],
        NodeState::Skipped,
        "skipped in turn"
    );
    assert_eq!(s[hold.as_str()], NodeState::Held);

    rig.ledger
        .healed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let replayed = app.replay(&dl, DeadSelector::All).await;
    assert_eq!(replayed.replayed, 1, "{replayed:?}");
    for _ in 0..3 {
        app.drain().await;
    }
    assert_eq!(
        rig.ledger.runs_of(&hold),
        1,
        "the held child ran after the replay"
    );
    assert_eq!(
        rig.ledger.runs_of(&skip),
        0,
        "a skipped child stays skipped"
    );
    let s = states(&direct.flow(&id).await.unwrap().unwrap());
    assert_eq!(
        (s[p.as_str()], s[hold.as_str()]),
        (NodeState::Done, NodeState::Done)
    );
    app.stop().await;
}

/// A worker killed after marking its job's node done and before acknowledging it: the job is
/// delivered again, is not run again, and its child is published and runs once.
pub async fn a_job_whose_node_is_done_is_not_run_again<F: Fixture>(fixture: F) {
    let (rig, broker, direct) = kit(&fixture).await;
    let mut flow = Flow::new();
    let a = flow.add(rig.job(1));
    let b = flow.add_after(rig.job(3), [&a]).unwrap();
    let id = direct.publish_flow(flow).await.expect("publish");
    // The dead worker's first step, taken by hand before any worker runs: `a` marked done,
    // nothing published.
    crate::flow::update(&direct, &id, |doc| {
        doc.complete(a.as_str());
        Ok(())
    })
    .await
    .expect("mark")
    .expect("the flow exists");
    let (app, _) = rig.start(&fixture, broker).await;
    for _ in 0..3 {
        app.drain().await;
    }
    assert_eq!(rig.ledger.runs_of(&a), 0, "a done job is not run again");
    assert_eq!(rig.ledger.runs_of(&b), 1, "its child runs once");
    assert_eq!(
        app.stats(QA).await,
        Default::default(),
        "a was acknowledged"
    );
    app.stop().await;
}

/// A batch opened with both callbacks, extended twice, sealed: `on_complete` runs once and
/// sees the counts and the failed id; `on_success` is skipped. A batch whose jobs all succeed
/// runs both once. Adding to a sealed batch is refused.
pub async fn a_batch_calls_back_once_with_its_counts<F: Fixture>(fixture: F) {
    let (rig, broker, direct) = kit(&fixture).await;
    let (app, _) = rig.start(&fixture, broker).await;
    let (ok_cb, done_cb) = (rig.job(20), rig.job(21));
    let (ok_id, done_id) = (ok_cb.job_id().clone(), done_cb.job_id().clone());
    let batch = Batch::new().on_success(ok_cb).on_complete(done_cb);
    let bid = direct.open_batch(batch).await.expect("open");
    direct
        .add_to_batch(&bid, vec![rig.job(1), rig.job(2), rig.job(99)])
        .await
        .expect("add");
    app.drain().await;
    assert_eq!(
        rig.ledger.order().len(),
        2,
        "the two that succeed ran; no callback yet"
    );
    direct
        .add_to_batch(&bid, vec![rig.job(3), rig.job(4)])
        .await
        .expect("add more before the seal");
    direct.seal_batch(&bid).await.expect("seal");
    for _ in 0..3 {
        app.drain().await;
    }
    assert_eq!(rig.ledger.runs_of(&done_id), 1, "on_complete once");
    assert_eq!(
        rig.ledger.runs_of(&ok_id),
        0,
        "on_success skipped: a job failed"
    );
    let ran = rig.ledger.ran.lock().unwrap().clone();
    let cb = ran.iter().find(|r| r.0 == done_id.as_str()).unwrap();
    assert_eq!(cb.2.len(), 4, "four succeeded");
    assert_eq!(cb.3.len(), 1, "one failed, by id");
    let err = direct.add_to_batch(&bid, vec![rig.job(5)]).await;
    assert!(err.is_err(), "a sealed batch takes no job");
    direct
        .seal_batch(&bid)
        .await
        .expect("sealing again is harmless");
    app.drain().await;
    assert_eq!(rig.ledger.runs_of(&done_id), 1, "still once");

    let (ok2, done2) = (rig.job(30), rig.job(31));
    let (ok2_id, done2_id) = (ok2.job_id().clone(), done2.job_id().clone());
    let bid = direct
        .open_batch(Batch::new().on_success(ok2).on_complete(done2))
        .await
        .expect("open");
    let members: Vec<Job> = (40..48).map(|n| rig.job(n)).collect();
    direct.add_to_batch(&bid, members).await.expect("add");
    direct.seal_batch(&bid).await.expect("seal");
    for _ in 0..3 {
        app.drain().await;
    }
    assert_eq!(
        (rig.ledger.runs_of(&ok2_id), rig.ledger.runs_of(&done2_id)),
        (1, 1)
    );
    app.stop().await;
}

/// A flow with a job the backend cannot take (a bad queue name), a unique job, or one id twice
/// is refused whole: nothing is stored or published. A job after a parent not in the flow is
/// refused when added. The same flow published twice is stored once.
pub async fn publishing_a_flow_is_all_or_nothing<F: Fixture>(fixture: F) {
    let (rig, broker, direct) = kit(&fixture).await;
    let (app, dl) = rig.start(&fixture, broker).await;
    let bad = [
        Job::new("", &Msg { n: 1 }).unwrap(),
        rig.job(7).unique("k", Duration::from_secs(60)),
        Job::new(QA, &Msg { n: 8 })
            .unwrap()
            .id(JobId::from_string("twice")),
    ];
    for b in bad {
        let mut flow = Flow::new();
        let first = flow.add(rig.job(1));
        if b.job_id().as_str() == "twice" {
            flow.add(
                Job::new(QA, &Msg { n: 9 })
                    .unwrap()
                    .id(JobId::from_string("twice")),
            );
        }
        flow.add_after(b, [&first]).unwrap();
        let id = flow.id().to_owned();
        assert!(direct.publish_flow(flow).await.is_err(), "refused whole");
        assert_eq!(direct.flow(&id).await.unwrap(), None, "nothing stored");
    }
    assert_eq!(
        direct.stats(QA).await.unwrap(),
        Default::default(),
        "nothing published"
    );
    let mut flow = Flow::new();
    let stranger = JobId::new();
    assert!(flow.add_after(rig.job(1), [&stranger]).is_err());
    let a = flow.add(rig.job(1));
    flow.add_after(rig.job(3), [&a]).unwrap();
    let again = flow.clone();
    direct.publish_flow(flow).await.expect("publish");
    direct
        .publish_flow(again)
        .await
        .expect("the same flow again");
    for _ in 0..3 {
        app.drain().await;
    }
    assert_eq!(rig.ledger.order().len(), 2, "each job once");
    assert!(app.dead_letters(&dl).await.is_empty());
    app.stop().await;
}

/// Waits until both members of the batch are in flight (one in each worker: each allows one at
/// a time), then finishes: the batch's last two jobs settle in two workers at once.
async fn meets(
    msg: &Msg,
    Data(l): Data<Arc<Ledger>>,
    Data(b): Data<Arc<tokio::sync::Barrier>>,
) -> HandlerOutcome {
    if msg.n < 100 {
        b.wait().await;
    }
    l.ran
        .lock()
        .unwrap()
        .push((msg.n.to_string(), String::new(), vec![], vec![], 0));
    HandlerOutcome::ack()
}

/// A batch whose last two jobs settle in two workers at once (two brokers, one handler slot
/// each, the handlers released together): its callback runs exactly once.
pub async fn a_batch_settled_by_two_workers_at_once_calls_back_once<F: Fixture>(fixture: F) {
    const Q: &str = "cf_flow_meet";
    const CB: &str = "cf_flow_meet_cb";
    for round in 0..3u64 {
        let probe = Probe::new();
        let ledger = Arc::new(Ledger::default());
        let broker = fixture.broker().await;
        let other = broker.clone();
        let direct = connected(&broker).await;
        let app = start(
            &fixture,
            service(&probe)
                .state(Arc::clone(&ledger))
                .state(Arc::new(tokio::sync::Barrier::new(2)))
                .with_broker(broker, |b| {
                    b.include(Subscriber::new(Q, meets).name("meets_1"))
                        .concurrency(1);
                    b.include(Subscriber::new(CB, meets).name("callback"))
                        .concurrency(1);
                })
                .with_broker(other, |b| {
                    b.include(Subscriber::new(Q, meets).name("meets_2"))
                        .concurrency(1);
                }),
        )
        .await;
        let callback = Job::new(CB, &Msg { n: 100 + round }).unwrap();
        let bid = direct
            .open_batch(Batch::new().on_complete(callback))
            .await
            .expect("open");
        let members = vec![job(Q, 1), job(Q, 2)];
        direct.add_to_batch(&bid, members).await.expect("add");
        direct.seal_batch(&bid).await.expect("seal");
        for _ in 0..4 {
            app.drain().await;
        }
        let ran = ledger.order();
        let callbacks = ran
            .iter()
            .filter(|r| **r == (100 + round).to_string())
            .count();
        assert_eq!(callbacks, 1, "round {round}: one callback; ran {ran:?}");
        assert_eq!(
            ran.len(),
            3,
            "round {round}: both members and the callback: {ran:?}"
        );
        app.stop().await;
    }
}

/// Cancelling a flow's job: a delayed one is removed from its queue and counts as failed (its
/// `Fail` child skipped, its `RunAnyway` child run); a job not yet published is cancelled in
/// the flow (it never runs) and its child skipped.
pub async fn a_cancelled_flow_job_counts_as_failed_for_its_children<F: Fixture>(fixture: F) {
    let (rig, broker, direct) = kit(&fixture).await;
    let (app, _) = rig.start(&fixture, broker).await;
    let mut flow = Flow::new();
    let a = flow.add(rig.job(1).after(Duration::from_secs(3600)));
    let skip = flow.add_after(rig.job(2), [&a]).unwrap();
    let anyway = flow
        .add_after_with(rig.job(4), [&a], OnParentFailure::RunAnyway)
        .unwrap();
    let later = flow.add_after(rig.job(5), [&anyway]).unwrap();
    let after_later = flow.add_after(rig.job(7), [&later]).unwrap();
    let id = direct.publish_flow(flow).await.expect("publish");
    // `later` waits for `anyway`: cancelled in the flow before it is published.
    let answer = direct
        .cancel_in_flow(&id, &later)
        .await
        .expect("cancel later");
    assert_eq!(answer, crate::Cancelled::Removed);
    let answer = direct.cancel_in_flow(&id, &a).await.expect("cancel a");
    assert_eq!(answer, crate::Cancelled::Removed);
    assert_eq!(app.stats(QA).await.delayed, 0, "removed from its queue");
    for _ in 0..3 {
        app.drain().await;
    }
    assert_eq!(
        rig.ledger.order(),
        [anyway.as_str()],
        "only the RunAnyway child ran"
    );
    let s = states(&direct.flow(&id).await.unwrap().unwrap());
    assert_eq!(s[a.as_str()], NodeState::Failed);
    assert_eq!(s[skip.as_str()], NodeState::Skipped);
    assert_eq!(
        s[later.as_str()],
        NodeState::Failed,
        "cancelled before it was published"
    );
    assert_eq!(s[after_later.as_str()], NodeState::Skipped);
    assert_eq!(
        direct.cancel_in_flow(&id, &a).await.expect("again"),
        crate::Cancelled::NotFound,
        "a final job is not found"
    );
    app.stop().await;
}
