//! What the Redis test files share: a plain connection, standalone or Cluster, for inspecting
//! and editing keys by hand next to the broker under test.

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
