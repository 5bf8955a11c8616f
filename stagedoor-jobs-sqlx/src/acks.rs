//! Batched deletes of acknowledged rows: the request a settlement queues, and the batch sizes.

use chrono::{DateTime, Utc};
use stagedoor_jobs::BrokerError;

use crate::receipt::IdValue;

/// A settled delivery's row to delete, waiting for the route's next batched delete.
pub(crate) struct AckReq {
    pub(crate) id: IdValue,
    pub(crate) leases: [DateTime<Utc>; crate::sql::FENCES],
    pub(crate) reply: tokio::sync::oneshot::Sender<Result<bool, BrokerError>>,
}

/// Most acknowledgements one delete carries.
pub(crate) const ACK_BATCH: usize = 256;

/// The batch sizes statements are built for: powers of two, so that a connection's statement
/// cache holds them all.
pub(crate) fn bucket(n: usize) -> usize {
    n.next_power_of_two().min(ACK_BATCH)
}
