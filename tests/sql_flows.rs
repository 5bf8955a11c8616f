//! Flows on SQL tables that cannot carry them (issue 34): a flow is refused whole, naming the
//! fix, when a job's table has ids the database generates (a child published twice by two
//! processes at once would be stored twice: the multi-process test found a job of such a table
//! run twice) or no headers column (the flow's id would be lost, and the flow would stall);
//! nothing is stored. The conformance table (a text id, headers) takes the same flow.
//!
//! Postgres reads `DATABASE_URL` (run under `scripts/test-all`); there a missing URL is a
//! failure; a plain `cargo test` without it lists the test as ignored.

mod common;
#[path = "../examples/hold_expiry.rs"]
#[allow(dead_code)]
mod hold_expiry;

use common::{ConfRow, Db, conf_ddl, on_both};
use stagedoor_jobs::broker::{BrokerError, Inspect};
use stagedoor_jobs::{Flow, Flows, Job};

/// A flow of two jobs on `queue`.
fn flow(queue: &str) -> Flow {
    let mut flow = Flow::new();
    let a = flow.add(Job::new(queue, &1).expect("a job"));
    flow.add_after(Job::new(queue, &2).expect("a job"), [&a])
        .expect("after a");
    flow
}

async fn a_flow_is_refused_on_a_table_that_cannot_carry_it<D: Db>() {
    let jobs = if D::NAME == "sqlite" {
        hold_expiry::SQLITE_JOBS
    } else {
        hold_expiry::POSTGRES_JOBS
    };
    let db = D::fresh("flows_refused", &format!("{}\n{jobs}", conf_ddl::<D>())).await;
    let broker = db.broker();
    let generated = D::route::<hold_expiry::JobRow>(&broker, hold_expiry::QUEUE);
    generated.connect().await.expect("connect");
    let refused = generated.publish_flow(flow(hold_expiry::QUEUE)).await;
    match refused {
        Err(BrokerError::Invalid(m)) => {
            assert!(m.contains("generates") && m.contains("`jobs`"), "{m}");
        }
        other => panic!("a flow on generated ids is refused: {other:?}"),
    }
    let stats = generated.stats(hold_expiry::QUEUE).await.expect("stats");
    assert_eq!((stats.ready, stats.delayed), (0, 0), "nothing published");

    let conf = D::route::<ConfRow>(&broker, "cf_flows");
    conf.connect().await.expect("connect");
    let id = conf
        .publish_flow(flow("cf_flows"))
        .await
        .expect("the conformance table takes a flow");
    let view = conf.flow(&id).await.expect("read").expect("stored");
    assert_eq!(view.nodes.len(), 2);
}

on_both!(a_flow_is_refused_on_a_table_that_cannot_carry_it);
