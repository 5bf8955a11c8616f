//! ruststream: not measured yet.

use std::sync::Arc;

use crate::common::{Backend, BenchJob, Hook, Target};

/// Where it runs.
pub fn supports(_b: Backend) -> bool {
    false
}

/// Has a bulk enqueue.
pub const HAS_BULK: bool = false;

/// Schema and no jobs.
pub async fn reset(_t: &Target) -> anyhow::Result<()> {
    anyhow::bail!("not written")
}

/// Enqueues.
pub struct Producer;

impl Producer {
    /// Connects.
    pub async fn connect(_t: &Target) -> anyhow::Result<Self> {
        anyhow::bail!("not written")
    }
    /// One job.
    pub async fn one(&mut self, _job: BenchJob) -> anyhow::Result<()> {
        anyhow::bail!("not written")
    }
    /// Many jobs.
    pub async fn bulk(&mut self, _jobs: &[BenchJob]) -> anyhow::Result<()> {
        anyhow::bail!("not written")
    }
}

/// Works until killed.
pub async fn work(_t: &Target, _hook: Arc<Hook>) -> anyhow::Result<()> {
    anyhow::bail!("not written")
}
