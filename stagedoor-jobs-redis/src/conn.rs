//! One connection type over a standalone server (a multiplexed connection that reconnects with
//! backoff) and a Redis Cluster.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClient;
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Where the broker connects. One per broker: its size does not matter.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Target {
    Single(redis::Client),
    #[cfg(feature = "cluster")]
    Cluster(Box<ClusterClient>),
}

/// A connection to either.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(ClusterConnection),
}

/// How long a command may take: longer than the longest blocking read.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

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
            #[cfg(feature = "cluster")]
            Target::Cluster(c) => Ok(Conn::Cluster(c.get_async_connection().await?)),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
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
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The cluster client, with a response timeout above the longest blocking read, and `tls`'s
/// certificates when given.
#[cfg(feature = "cluster")]
pub(crate) fn cluster_client(
    urls: &[String],
    #[cfg(feature = "tls")] tls: Option<&crate::tls::Tls>,
) -> redis::RedisResult<ClusterClient> {
    let builder = ClusterClient::builder(urls.iter().map(String::as_str))
        .response_timeout(RESPONSE_TIMEOUT)
        .connection_timeout(Duration::from_secs(5));
    #[cfg(feature = "tls")]
    let builder = match tls {
        Some(tls) => {
            crate::tls::install_provider();
            builder.certs(tls.certificates())
        }
        None => {
            if urls.iter().any(|u| u.starts_with("rediss://")) {
                crate::tls::install_provider();
            }
            builder
        }
    };
    builder.build()
}
