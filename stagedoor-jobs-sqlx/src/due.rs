//! When a row published or retried "now" is due.

/// A row due "now" (a publish without a delay, a retry at once) is written as due a second
/// earlier: another worker's clock, or a stats query that read its time just before the row
/// was committed, never sees it as delayed. Rows due now keep their order among themselves.
pub(crate) const BACKDATE: chrono::Duration = chrono::Duration::seconds(1);
