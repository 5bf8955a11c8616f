//! How the broker reads the server's errors: a connection-level one (recorded, so that
//! reclaiming waits a whole lease after it), a full server, or anything else.

use std::sync::Mutex;
use std::time::Duration;

use redis::{ErrorKind, ServerErrorKind};
use stagedoor_jobs::broker::BrokerError;
use stagedoor_jobs::kit::lock;

/// The server's errors as the broker reports them, and when the last connection-level one
/// was seen (shared by the broker's clones and its settlement tasks).
pub(crate) struct Errors {
    /// The server's URL, password masked, for messages.
    url: String,
    /// When a connection-level error was last seen: reclaiming waits a whole lease after it.
    last_connection_error: Mutex<Option<tokio::time::Instant>>,
}

/// Whether `e` is about reaching the server rather than about the command: the connection
/// failed, was refused, dropped or timed out, or the server is not serving yet (`LOADING` its
/// data after a restart, a Cluster `TRYAGAIN`, `CLUSTERDOWN` or `MASTERDOWN`).
fn is_connection_level(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                )
        )
        || matches!(
            e.code(),
            Some("LOADING" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN")
        )
}

/// Whether `e` is the refusal of a full server (`OOM command not allowed when used memory >
/// 'maxmemory'`), from a command or from inside a script or a transaction.
pub(crate) fn is_oom(e: &redis::RedisError) -> bool {
    e.code() == Some("OOM") || e.to_string().contains("OOM command not allowed")
}

/// The message of [`BrokerError::Full`] for the server at `url`, refusing with `e`.
fn full_message(url: &str, e: &redis::RedisError) -> String {
    format!(
        "Redis at `{url}` reached its `maxmemory` limit and, with the `noeviction` policy, refuses to store more ({e}). Workers keep draining it (reading, acknowledging, retrying and dead-lettering work while it is full), which frees memory; to publish again, free memory (delete or trim what is not needed), raise `maxmemory` (`CONFIG SET maxmemory ...` and in redis.conf), or let the workers drain the queues"
    )
}

impl Errors {
    /// The errors of the server at `url` (password masked), none seen yet.
    pub(crate) fn new(url: String) -> Self {
        Self {
            url,
            last_connection_error: Mutex::new(None),
        }
    }

    /// The broker's error for `e`: [`BrokerError::Connection`] for a connection-level error
    /// (recorded: see [`quiet_for`](Self::quiet_for)), [`BrokerError::Full`] for a full server,
    /// [`BrokerError::Backend`] for anything else.
    pub(crate) fn of(&self, e: redis::RedisError) -> BrokerError {
        if is_connection_level(&e) {
            *lock(&self.last_connection_error) = Some(tokio::time::Instant::now());
            BrokerError::Connection(e.to_string())
        } else if is_oom(&e) {
            BrokerError::Full(full_message(&self.url, &e))
        } else {
            BrokerError::Backend(e.to_string())
        }
    }

    /// Whether no connection-level error was seen for `d` (or ever).
    pub(crate) fn quiet_for(&self, d: Duration) -> bool {
        lock(&self.last_connection_error).is_none_or(|t| t.elapsed() >= d)
    }
}

#[cfg(test)]
mod error_tests {
    use redis::Value;

    use super::*;

    fn errors() -> Errors {
        Errors {
            url: "redis://127.0.0.1:6379/".to_owned(),
            last_connection_error: Mutex::new(None),
        }
    }

    /// The error the server answers with `line` (`-LOADING ...`).
    fn server(line: &str) -> redis::RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .and_then(Value::extract_error)
        {
            Err(e) => e,
            Ok(v) => panic!("{line} parsed as {v:?}"),
        }
    }

    #[test]
    fn a_server_that_is_not_serving_yet_is_a_connection_error_and_recorded() {
        for line in [
            "LOADING Redis is loading the dataset in memory",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        ] {
            let errors = errors();
            assert!(errors.quiet_for(Duration::from_secs(3)), "nothing seen yet");
            let e = errors.of(server(line));
            assert!(matches!(e, BrokerError::Connection(_)), "{line}: {e:?}");
            assert!(e.is_transient());
            assert!(
                !errors.quiet_for(Duration::from_secs(3)),
                "{line}: recorded as a connection error"
            );
        }
        let errors = errors();
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(errors.of(refused), BrokerError::Connection(_)));
        assert!(!errors.quiet_for(Duration::from_secs(3)));
    }

    #[test]
    fn a_full_server_is_full_and_its_message_names_the_limit_and_the_fix() {
        let errors = errors();
        for line in [
            "OOM command not allowed when used memory > 'maxmemory'.",
            "OOM command not allowed when used memory > 'maxmemory'. script: f3e1806f0d221e3a5ee5b01a76c9452670f10024, on @user_script:1.",
        ] {
            let e = errors.of(server(line));
            let BrokerError::Full(text) = &e else {
                panic!("{line}: {e:?}")
            };
            for word in [
                "maxmemory",
                "noeviction",
                "free memory",
                "drain",
                "127.0.0.1:6379",
            ] {
                assert!(text.contains(word), "names {word}: {text}");
            }
            assert!(e.is_transient());
            assert!(e.to_string().starts_with("the server is full"), "{e}");
        }
        assert!(
            errors.quiet_for(Duration::from_secs(3)),
            "a full server is no connection error"
        );
    }

    #[test]
    fn other_errors_are_the_backends() {
        let errors = errors();
        for line in [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "NOGROUP No such key 'x' or consumer group 'g'",
            "ERR unknown command",
        ] {
            let e = errors.of(server(line));
            assert!(matches!(e, BrokerError::Backend(_)), "{line}: {e:?}");
        }
        assert!(errors.quiet_for(Duration::from_secs(3)));
    }
}
