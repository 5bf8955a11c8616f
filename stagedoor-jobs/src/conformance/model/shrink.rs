//! Shrinking a failing sequence: delta debugging over its steps.

use std::future::Future;
use std::time::{Duration, Instant};

use super::exec::{Failed, Ran};
use super::ops::Op;

/// The most re-runs one shrink may take, and its time.
const MAX_RUNS: usize = 200;
const MAX_TIME: Duration = Duration::from_secs(120);

/// Removes chunks of `ops` (halves, then quarters, ... single steps) while what is left still
/// fails with the same kind as `failed`, each try run by `run_once` (on a fresh broker).
/// Returns the smallest failing sequence found and its failure.
pub(super) async fn shrink<R, Fut>(
    mut run_once: R,
    mut ops: Vec<Op>,
    failed: &Failed,
) -> (Vec<Op>, Failed)
where
    R: FnMut(Vec<Op>) -> Fut,
    Fut: Future<Output = Result<Ran, Failed>>,
{
    let started = Instant::now();
    let mut last = failed.clone();
    // Everything after the failing step is not needed to fail there (the end's drain is).
    if let Some(step) = failed.step {
        let cut = ops[..=step].to_vec();
        if let Err(f) = run_once(cut.clone()).await
            && f.kind == failed.kind
        {
            ops = cut;
            last = f;
        }
    }
    let mut runs = 0;
    let mut parts = 2usize;
    while ops.len() > 1 && runs < MAX_RUNS && started.elapsed() < MAX_TIME {
        let chunk = ops.len().div_ceil(parts);
        let mut removed = false;
        let mut start = 0;
        while start < ops.len() && runs < MAX_RUNS && started.elapsed() < MAX_TIME {
            let end = (start + chunk).min(ops.len());
            let mut candidate = ops[..start].to_vec();
            candidate.extend_from_slice(&ops[end..]);
            runs += 1;
            match run_once(candidate.clone()).await {
                Err(f) if f.kind == failed.kind => {
                    ops = candidate;
                    last = f;
                    removed = true;
                }
                _ => start = end,
            }
        }
        if removed {
            parts = parts.saturating_sub(1).max(2);
        } else if chunk == 1 {
            break;
        } else {
            parts = (parts * 2).min(ops.len());
        }
    }
    (ops, last)
}
