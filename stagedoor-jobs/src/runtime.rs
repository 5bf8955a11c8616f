//! The worker: claim loops per queue, dispatch by kind, the outcome-to-settlement rules, lease
//! renewal and graceful shutdown. Generic over the broker; erased per route for the service.
//!
//! The files, by concern:
//! - `context.rs`: what every worker loop of a running service shares (`RunCtx`), and the
//!   observers that see every settlement (`Observer`);
//! - `route.rs`: a route with its broker type erased (`ErasedRoute`), and `RouteRuntime`,
//!   which starts one worker per queue;
//! - `worker.rs`: a queue's worker: its claim loop under supervision, the in-flight count, the
//!   graceful wait for running handlers at shutdown;
//! - `delivery.rs`: one delivery: dispatch by kind, the handler run, the outcome-to-settlement
//!   rules;
//! - `arrival.rs`: the rules a delivery meets before it runs (the poison count, the cap on
//!   arrival), the same for every backend;
//! - `unreadable.rs`: an item a claim could not read, moved to the dead letter the runtime
//!   picks;
//! - `limits.rs`: a queue's global limits (global concurrency, rate), taken as permits of the
//!   backend's pools before each claim;
//! - `settle.rs`: the lease renewed while the handler runs, and the settlement tried again
//!   until it takes effect or is fenced; a handler's result kept before it;
//! - `flows.rs`: a flow's job: its node read before it runs, its outcome recorded and its
//!   children published before its settlement.

mod arrival;
mod context;
mod delivery;
mod flows;
pub(crate) mod limits;
mod renewals;
mod route;
mod settle;
mod unreadable;
mod worker;

pub(crate) use context::{HeldBack, Observer, RunCtx};
pub(crate) use route::{ErasedRoute, RouteRuntime};
