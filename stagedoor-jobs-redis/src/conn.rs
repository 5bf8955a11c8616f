//! One connection type over a standalone server (a multiplexed connection that reconnects with
//! backoff) and a Redis Cluster.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Where the broker connects.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    Single(redis::Client),
    Cluster(Box<ClusterClient>),
}

/// A connection to either.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// How long a command may take: longer than the longest blocking read.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

impl Target {
    /// Opens a connection; `Err` is the server's or the network's answer.
    pub(crate) async fn connect(&self) -> redis::RedisResult<Conn> {
        match self {
            Target::Single(c) => {
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_connection_timeout(Some(Duration::from_secs(5)))
                    // Few retries per attempt: a start against a server that is down fails fast with
                    // its one line, and a running worker retries its claims with backoff anyway.
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(5));
                Ok(Conn::Single(
                    ConnectionManager::new_with_config(c.clone(), config).await?,
                ))
            }
            Target::Cluster(c) => Ok(Conn::Cluster(c.get_async_connection().await?)),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The cluster client, with a response timeout above the longest blocking read.
pub(crate) fn cluster_client(urls: &[String]) -> redis::RedisResult<ClusterClient> {
    ClusterClient::builder(urls.iter().map(String::as_str))
        .response_timeout(RESPONSE_TIMEOUT)
        .connection_timeout(Duration::from_secs(5))
        .build()
}
