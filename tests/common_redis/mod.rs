//! What the Redis test files share: the servers' URLs, fresh namespaces, and a plain
//! connection, standalone or Cluster, for inspecting and editing keys by hand next to the
//! broker under test.

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A plain connection, standalone or Cluster.
#[derive(Clone)]
pub(crate) enum Raw {
    /// A standalone server.
    Single(redis::aio::MultiplexedConnection),
    /// A Redis Cluster.
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Raw {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Raw::Single(c) => c.req_packed_command(cmd),
            Raw::Cluster(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Raw::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Raw::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            Raw::Single(c) => c.get_db(),
            Raw::Cluster(c) => c.get_db(),
        }
    }
}

/// The URL in `var`; a missing one fails the test (a plain `cargo test` lists the tests that
/// need it as ignored; `scripts/test-all` runs them with the servers up).
pub(crate) fn env_url(var: &str) -> String {
    match std::env::var(var) {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "{var} is not set: run the tests with `scripts/test-all -- cargo test --workspace --test <name> -- --include-ignored`, which starts Redis and exports it"
        ),
    }
}

/// The Cluster's masters, from `REDIS_CLUSTER_URLS` (comma-separated).
pub(crate) fn cluster_urls() -> Vec<String> {
    env_url("REDIS_CLUSTER_URLS")
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A namespace (`<prefix><pid>-<time>-<n>:`) no other test or run uses.
pub(crate) fn fresh_namespace(prefix: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{prefix}{}-{}-{}:",
        std::process::id(),
        nanos % 1_000_000_000_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}
