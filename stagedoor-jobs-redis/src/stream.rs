//! `Stream`: the typed queue descriptor of a Redis stream.

use stagedoor_jobs::{QueueDescriptor, QueueFor};

use crate::RedisBroker;

/// A stream (queue) of a Redis broker, optionally one kind of the jobs on it:
/// `#[subscriber(Stream::new("jobs").kind("send_email"))]`. A subscriber on it mounts on a
/// [`RedisBroker`] only; mounting it on another backend does not compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stream {
    name: String,
    kind: Option<String>,
}

impl Stream {
    /// The stream `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            kind: None,
        }
    }

    /// Only the jobs of `kind` on this stream.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }
}

impl QueueDescriptor for Stream {
    fn queue_name(&self) -> String {
        self.name.clone()
    }
    fn queue_kind(&self) -> Option<String> {
        self.kind.clone()
    }
    fn backend(&self) -> Option<&'static str> {
        Some("redis")
    }
}

impl QueueFor<RedisBroker> for Stream {}
