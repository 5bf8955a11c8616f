//! What the settle batcher of a stream is sent: one settlement per request, with where its
//! answer goes.

/// A settlement to make in its stream's next [`SETTLE_MANY`](crate::scripts::SETTLE_MANY)
/// call. The answer is 0 when the lease was lost, else 1 plus the dead-stream entries its dead
/// letter trimmed.
pub(crate) struct SettleReq {
    pub(crate) id: String,
    pub(crate) deliveries: u64,
    pub(crate) op: SettleOp,
    pub(crate) reply: stagedoor_jobs::kit::Reply<i64>,
}

/// What a batched settlement does with its delivery.
pub(crate) enum SettleOp {
    /// Acknowledged (and its job id forgotten).
    Ack { job: stagedoor_jobs::JobId },
    /// Added again: to the stream (`due` 0, `items` the entry's flat fields) or to the delayed
    /// set (`due` in ms, `items` its one member).
    Retry { due: u64, items: Vec<Vec<u8>> },
    /// Added to the dead stream (`items` the dead entry's flat fields), its job id forgotten.
    Dead {
        job: stagedoor_jobs::JobId,
        items: Vec<Vec<u8>>,
    },
}
