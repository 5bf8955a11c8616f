//! `--url redis://…`: a standalone Redis, or a Redis Cluster when several URLs are given.

use std::time::Duration;

use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs_redis::RedisBroker;

use crate::ctx::{Ctx, Naming};
use crate::error::{Failure, connect_error, mask};

/// Connects to the Redis (or Redis Cluster, URLs separated by commas) at `url`, in
/// `namespace` (empty: none).
pub(super) async fn open(
    url: &str,
    namespace: &str,
    timeout: Duration,
) -> Result<(RedisBroker, Ctx), Failure> {
    let cluster = url.contains(',');
    let mut broker = if cluster {
        RedisBroker::cluster(url.split(',').map(str::trim))
    } else {
        RedisBroker::from_url(url)
    };
    if !namespace.is_empty() {
        broker = broker.namespace(namespace);
    }
    let what = if cluster { "Redis Cluster" } else { "Redis" };
    let place = if namespace.is_empty() {
        format!("{what} at `{}`", mask(url))
    } else {
        format!("namespace `{namespace}` of {what} at `{}`", mask(url))
    };
    // A server that refuses connections is said at once; the broker's own connection
    // retries for a while first.
    for u in url.split(',').map(str::trim) {
        probe(u, timeout).await?;
    }
    match tokio::time::timeout(timeout, broker.connect()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(connect_error(e)),
        Err(_) => {
            return Err(Failure::connect(format!(
                "no answer from {what} at `{}` within {}s: check the URL and that the server is running (or raise --timeout)",
                mask(url),
                timeout.as_secs()
            )));
        }
    }
    let listed = if cluster {
        Some(cluster_queues(url, namespace, timeout).await?)
    } else {
        None
    };
    let ctx = Ctx {
        place,
        naming: Naming::Suffix(":dead"),
        listed,
        stores_enqueued: true,
        redis: Some(broker.clone()),
    };
    Ok((broker, ctx))
}

/// The queues of a Redis Cluster: a cluster connection's SCAN answers for one node, so each
/// node given is asked.
async fn cluster_queues(
    url: &str,
    namespace: &str,
    timeout: Duration,
) -> Result<Vec<String>, Failure> {
    let mut names = Vec::new();
    for u in url.split(',').map(str::trim) {
        let mut node = RedisBroker::from_url(u);
        if !namespace.is_empty() {
            node = node.namespace(namespace);
        }
        let found = async {
            node.connect().await?;
            node.queues().await
        };
        match tokio::time::timeout(timeout, found).await {
            Ok(Ok(n)) => names.extend(n),
            Ok(Err(e)) => return Err(connect_error(e)),
            Err(_) => {
                return Err(Failure::connect(format!(
                    "no answer from the Redis Cluster node `{}` within {}s",
                    mask(u),
                    timeout.as_secs()
                )));
            }
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// Host and port of a `redis://` URL (`None` for a Unix socket).
fn redis_addr(url: &str) -> Option<(String, u16)> {
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) = v6.split_once(']')?;
        (h.to_owned(), after.strip_prefix(':').unwrap_or_default())
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p),
            None => (hostport.to_owned(), ""),
        }
    };
    let port = if port.is_empty() {
        6379
    } else {
        port.parse().ok()?
    };
    let host = if host.is_empty() {
        "127.0.0.1".to_owned()
    } else {
        host
    };
    Some((host, port))
}

/// Fails at once when nothing listens at a Redis URL's address.
async fn probe(url: &str, timeout: Duration) -> Result<(), Failure> {
    let Some((host, port)) = redis_addr(url) else {
        return Ok(());
    };
    match tokio::time::timeout(
        timeout,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Failure::connect(format!(
            "cannot reach Redis at `{}`: {e}: check the URL and that the server is running",
            mask(url)
        ))),
        Err(_) => Err(Failure::connect(format!(
            "no answer from Redis at `{}` within {}s: check the URL and that the server is running (or raise --timeout)",
            mask(url),
            timeout.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_addresses() {
        assert_eq!(redis_addr("redis://h:7/"), Some(("h".into(), 7)));
        assert_eq!(redis_addr("redis://:pw@h/0"), Some(("h".into(), 6379)));
        assert_eq!(
            redis_addr("redis://u:p@[::1]:7000"),
            Some(("::1".into(), 7000))
        );
        assert_eq!(redis_addr("redis+unix:///tmp/r.sock"), None);
    }
}
