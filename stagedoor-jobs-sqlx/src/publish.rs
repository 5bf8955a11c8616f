//! What a publish reports: the ids its inserts returned, matched to the jobs, and the sizes of
//! its multi-row inserts.

use stagedoor_jobs::broker::{BrokerError, Published};
use stagedoor_jobs::inbox::Table;
use stagedoor_jobs::{Envelope, JobId};

/// `n` rows as chunks whose sizes are powers of two of at most `MAX_ROWS` (few distinct
/// statements, each prepared once per connection).
pub(crate) fn chunks(n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut left = n;
    while left > 0 {
        let c = (1usize << left.ilog2()).min(crate::sql::MAX_ROWS);
        out.push(c);
        left -= c;
    }
    out
}

/// Whether a row of `table` is known by its generated row id: the database generates the id
/// and the table has no headers column to keep the envelope's. Such a job's id is its row id
/// (what its handler, its dead letter and the CLI show), so a publish returns that.
pub(crate) fn keyed_by_row(table: &Table) -> bool {
    table.id.generated && table.headers.is_none()
}

/// What a publish of `envelopes` into `queue` did, from the ids (as text) of the rows its
/// inserts returned: one per stored row, in the jobs' order when [`keyed_by_row`] (rows
/// inserted in the jobs' order, their ids checked to be in it: see `route/publish.rs`), in
/// any order otherwise. A job whose id is already in
/// the table, or earlier in the batch, returned nothing: it is reported as not stored (and
/// logged). A table whose id the database generates stores every job.
pub(crate) fn reports(
    table: &Table,
    queue: &str,
    envelopes: &[&Envelope],
    returned: Vec<String>,
) -> Result<Vec<Published>, BrokerError> {
    if keyed_by_row(table) {
        if returned.len() != envelopes.len() {
            return Err(BrokerError::Backend(format!(
                "table `{}`: the insert of {} jobs returned {} generated ids (column `{}`)",
                table.name,
                envelopes.len(),
                returned.len(),
                table.id.name
            )));
        }
        return Ok(returned
            .into_iter()
            .map(|id| Published::stored(JobId::from_string(id)))
            .collect());
    }
    if table.id.generated {
        return Ok(envelopes
            .iter()
            .map(|e| Published::stored(e.id().clone()))
            .collect());
    }
    let mut fresh: std::collections::HashSet<String> = returned.into_iter().collect();
    Ok(envelopes
        .iter()
        .map(|e| {
            // The first job of an id takes the row; a later one of the batch finds it taken.
            if fresh.remove(e.id().as_str()) {
                Published::stored(e.id().clone())
            } else {
                stagedoor_jobs::broker::log_not_stored(queue, e.id());
                Published::already_there(e.id().clone())
            }
        })
        .collect())
}
