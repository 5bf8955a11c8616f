//! [`BrokerError`]: what a broker's call can fail with, and whether trying again can help.

/// An error of a broker: the server could not be reached, a statement failed, a stored entry
/// is malformed.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The server is unreachable or the connection broke; the runtime retries with backoff.
    #[error("connection: {0}")]
    Connection(String),
    /// The broker was used before [`Inspect::connect`](super::Inspect::connect).
    #[error("the broker is not connected: the service connects it at start")]
    NotConnected,
    /// The queue (or dead letter) is not known to this broker.
    #[error("unknown queue `{0}`")]
    UnknownQueue(String),
    /// A stored entry could not be read.
    #[error("malformed entry {id}: {reason}")]
    Malformed {
        /// The entry's id in the backend.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server refused to store more (Redis at `maxmemory` with `noeviction`). Reading,
    /// acknowledging and deleting keep working, so a draining worker frees memory; publishing
    /// waits for room. The message names the limit and the fix.
    #[error("the server is full: {0}")]
    Full(String),
    /// Anything else the backend reported.
    #[error("{0}")]
    Backend(String),
    /// The call was refused before it reached the backend: a value it cannot take (an empty
    /// queue name). The message names the value and the fix.
    #[error("refused: {0}")]
    Invalid(String),
}

impl BrokerError {
    /// Whether the error is about reaching or using the server (a broken or refused
    /// connection, a server restarting or full), so that the same call can succeed later
    /// unchanged; not about the call itself (an unknown queue, a malformed entry, a statement
    /// the database refuses).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Connection(_) | Self::Full(_))
    }
}
