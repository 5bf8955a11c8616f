#![cfg_attr(docsrs, feature(doc_cfg))]
//! # stagedoor-jobs-redis
//!
//! The Redis Streams backend of stagedoor-jobs: one stream per queue read by the consumer group
//! `stagedoor`, several job kinds per stream (each mounted with its own handler, cap, dead letter
//! and backoff), delayed jobs and retries in a sorted set moved to the stream by an atomic
//! script, a dead stream `<stream>:dead` trimmed at about 10,000, and poison entries (their
//! workers died) contained by the group's delivery count. The handler model, outcomes, the
//! scheduler and testing are in the core's guide ([`stagedoor_jobs::guide`]); this page is what is
//! particular to Redis. Redis 6.2 or later; 7 for the trimming and `allow-oom` scripts below.
//!
//! ## Cargo features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `cluster` | no | `RedisBroker::cluster([...])`: a Redis Cluster reached through any of its masters |
//! | `tls` | no | `rediss://` URLs; `RedisBroker::from_url_with_tls(url, Tls::new().root_cert(pem))` for a private certificate authority, `Tls::client_cert(cert_pem, key_pem)` for a client certificate |
//!
//! ## A service
//!
//! ```no_run
//! use stagedoor_jobs_redis::prelude::*;
//!
//! // A message is any `serde::Deserialize` type: a struct of yours, a `String`, JSON.
//! async fn send_email(to: &String) -> HandlerOutcome {
//!     println!("mail to {to}");
//!     HandlerOutcome::ack()
//! }
//!
//! /// Any JSON: a `serde_json::Value` takes what a typed message would.
//! async fn render_tickets(order: &serde_json::Value) -> Result<(), std::io::Error> {
//!     println!("tickets of order {}", order["order_id"]);
//!     Ok(())
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // No I/O here: a wrong URL or an unreachable server is reported when the service starts.
//! let broker = RedisBroker::from_url("redis://127.0.0.1:6379/").namespace("app1:");
//! Service::new(AppInfo::new("stagedoor-worker", "0.1.0"))
//!     .with_broker(broker, |b| {
//!         b.include(Subscriber::new(Stream::new("jobs").kind("send_email"), send_email))
//!             .max_attempts(nonzero!(5u32))
//!             .dead_letter("jobs:dead")
//!             .backoff(FullJitter::new(Duration::from_secs(1), Duration::from_secs(60)));
//!         b.include(Subscriber::new(Stream::new("jobs").kind("render_tickets"), render_tickets))
//!             .max_attempts(nonzero!(2u32))
//!             .dead_letter("jobs:dead");
//!     })
//!     .run()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! A subscriber on a [`Stream`] can only be mounted on a [`RedisBroker`]; subscribers by name
//! (`#[subscriber("jobs", kind = "send_email")]`) run on any backend.
//!
//! ## Publishing without a service
//!
//! The prelude brings the traits a producer calls: [`Inspect`](stagedoor_jobs::Inspect)
//! (`connect()`), [`Publish`](stagedoor_jobs::Publish) (`publish_job`, `publish_jobs`) and
//! [`Broker`](stagedoor_jobs::Broker). A batch is one script call per 500 jobs, all in one
//! `MULTI`/`EXEC` round trip.
//!
//! ```no_run
//! use stagedoor_jobs_redis::prelude::*;
//!
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = RedisBroker::from_url("redis://127.0.0.1:6379/").namespace("app1:");
//! broker.connect().await?;
//! // Any `serde::Serialize` payload; here JSON built in place.
//! let job = Job::new("jobs", &serde_json::json!({ "order_id": 4471 }))?
//!     .kind("render_tickets")
//!     .request_id("7f3a9c2e");
//! let published = broker.publish_job(job).await?;
//! println!("{} stored: {}", published.id(), published.is_stored());
//! # Ok(()) }
//! ```
//!
//! ## Keys
//!
//! Every key of a queue shares the stream's hash tag, so every multi-key step is one script on
//! one node, on a standalone server or a Redis Cluster. For a queue `jobs`:
//!
//! | what | key | in `redis-cli` |
//! |---|---|---|
//! | the stream (group `stagedoor`) | `{jobs}` | `XINFO GROUPS {jobs}` (`lag`: ready), `XPENDING {jobs} stagedoor` |
//! | the dead stream | `{jobs}:dead` | `XRANGE {jobs}:dead - + COUNT 1` |
//! | delayed jobs and retries (score: due, ms) | `{jobs}:delayed` | `ZRANGE {jobs}:delayed 0 -1 WITHSCORES` |
//! | ids of the jobs in the queue | `{jobs}:ids` | `SCARD {jobs}:ids` |
//! | the delayed mover's lock | `{jobs}:mover` | `GET {jobs}:mover` |
//! | a scheduler tick's guard | `{jobs}:once:sched:<schedule>:<tick ms>` | `SCAN 0 MATCH {jobs}:once:*` |
//! | a schedule's last tick | `stagedoor:sched:{<schedule>}` | `GET stagedoor:sched:{expire_holds}` |
//! | a lock (the dead-letter alert's) | `stagedoor:lock:{<key>}` | `SCAN 0 MATCH stagedoor:lock:*` |
//! | a record ([`Records`](stagedoor_jobs::broker::Records): a job's result, progress) | `stagedoor:records:{records}:<key>` (a hash: `value`, `version`) | `HGETALL stagedoor:records:{records}:<key>` |
//!
//! The dead letter of a mount on `jobs` is `jobs:dead`. [`RedisBroker::stream_key`] names a
//! queue's stream key, to add entries by hand (`XADD`) or look at them.
//!
//! Settled entries leave the stream by `XTRIM MINID` below the group's oldest pending entry
//! (Redis 7 and later; on 6.2 each is deleted): the stream may hold up to about a second of
//! settled entries above a delivery still running, so `XLEN` counts those too, and the ready
//! count is the group's lag.
//!
//! Workers' reports and per-minute counts ([`Activity`](stagedoor_jobs::Activity)) share the
//! tag `{stagedoor:activity}`: `{stagedoor:activity}:worker:<id>` (a report, expiring),
//! `{stagedoor:activity}:workers` (the ids by expiry), `{stagedoor:activity}:minutes:<queue>`
//! (fields `<minute ms>:p|f|d`, kept two hours).
//!
//! ## Namespaces
//!
//! [`RedisBroker::namespace`] puts every key of a broker inside its own tag: with
//! `.namespace("app1:")` the queue `jobs` is `{app1:jobs}`, its dead stream `{app1:jobs}:dead`, a
//! schedule's last tick `stagedoor:sched:{app1:expire_holds}`, a record
//! `stagedoor:records:{app1:records}:<key>` ([`RedisBroker::record_key`] names it), and the activity keys
//! `{app1:stagedoor:activity}:..`. Queue names are unchanged: mounts, jobs and the CLI
//! (`--namespace app1:`) still say `jobs`. Several applications, or test runs, share a server
//! without meeting.
//!
//! ## Redis Cluster
//!
//! With the `cluster` feature, `RedisBroker::cluster(urls)` reaches a cluster through any of its
//! masters (one URL each; the CLI takes them comma-separated). Since every key of a queue has the
//! queue's hash tag, each queue lives on one slot and every step stays one script; different
//! queues spread over the masters. `MOVED`/`ASK` redirections are followed by the client;
//! `TRYAGAIN` and `CLUSTERDOWN` count as connection errors (retried, and no lease taken over
//! until the broker has talked to the cluster for a whole lease).
//!
//! ```no_run
//! # #[cfg(feature = "cluster")]
//! # fn f() {
//! use stagedoor_jobs_redis::RedisBroker;
//! let broker = RedisBroker::cluster([
//!     "redis://10.0.0.1:7000/",
//!     "redis://10.0.0.2:7000/",
//!     "redis://10.0.0.3:7000/",
//! ]);
//! # let _ = broker;
//! # }
//! ```
//!
//! ## TLS
//!
//! With the `tls` feature (rustls; no OpenSSL), a `rediss://` URL connects over TLS trusting the
//! machine's certificate store. Without the feature such a URL is refused at start with an error
//! naming the feature. For a private certificate authority or a client certificate (a server
//! with `tls-auth-clients yes`), build the broker with `Tls` (all PEM):
//!
//! ```no_run
//! # #[cfg(feature = "tls")]
//! # fn f() -> std::io::Result<()> {
//! use stagedoor_jobs_redis::{RedisBroker, Tls};
//!
//! let tls = Tls::new()
//!     .root_cert(std::fs::read("/etc/redis/ca.crt")?)
//!     .client_cert(std::fs::read("/etc/app/redis.crt")?, std::fs::read("/etc/app/redis.key")?);
//! let broker = RedisBroker::from_url_with_tls("rediss://redis.internal:6380/", tls);
//! # let _ = broker;
//! # Ok(()) }
//! ```
//!
//! With both features, `RedisBroker::cluster_with_tls(urls, tls)` does the same for a cluster.
//!
//! ## Leases, outages, a full server
//!
//! A claim holds an entry for a lease of 3 s by default
//! ([`DEFAULT_LEASE`](stagedoor_jobs::broker::DEFAULT_LEASE); [`RedisBroker::lease`] sets
//! another), renewed by the runtime every second until the delivery is settled; entries idle past
//! it are reclaimed (XAUTOCLAIM), except after a connection error, until the broker has talked to
//! the server for a whole lease without one (the holders renew first), and except after a
//! failover or restart (a new server process serving the queue's slot, which the server
//! itself notes in `{q}:serving`), until that process has served the queue for a whole lease. Each delivery reports
//! the entry's delivery count, and the runtime sends an entry delivered more than
//! [`max_deliveries`](RedisBroker::max_deliveries) times (the broker's poison count, default 3)
//! without being settled to the dead stream without running it again. A full server (`maxmemory`, `noeviction`)
//! refuses publishing with [`BrokerError::Full`](stagedoor_jobs::BrokerError::Full) while
//! workers go on draining it: on Redis 7 the scripts that settle, reclaim and move jobs run with
//! `allow-oom`.

/// Everything a Redis worker needs: `use stagedoor_jobs_redis::prelude::*;`.
///
/// The core prelude, [`RedisBroker`], [`Stream`], and the traits a producer without a service
/// calls: [`Inspect`](stagedoor_jobs::Inspect) (`connect()`),
/// [`Broker`](stagedoor_jobs::Broker) and [`Publish`](stagedoor_jobs::Publish) (`publish_job`,
/// `publish_jobs`).
pub mod prelude {
    pub use crate::{RedisBroker, Stream};
    pub use stagedoor_jobs::prelude::*;
    pub use stagedoor_jobs::{Broker, Inspect, Publish};
    pub use std::time::Duration;
}

#[doc(hidden)]
pub mod __fuzz;
mod activity;
mod broker;
mod cancel;
mod claim;
mod conn;
mod dead;
mod entry;
mod errors;
mod failover;
mod keys;
mod permits;
mod publish;
mod read_conn;
mod records;
mod schedule;
mod scripts;
mod settle;
mod startup;
mod stats;
mod stream;
#[cfg(feature = "tls")]
mod tls;
mod value;

pub use broker::{RedisBroker, RedisReceipt};
pub use stream::Stream;
#[cfg(feature = "tls")]
pub use tls::Tls;
