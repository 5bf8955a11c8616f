//! Fields without `#[field]` are plain columns, listed in order with the others; other
//! attributes (doc comments, another derive's) are left alone.
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

/// A row with columns of its own.
#[derive(Inbox, Debug, Clone)]
#[inbox(table = "reports")]
struct Report {
    /// The tenant.
    tenant_id: i64,
    #[field(id, generated)]
    id: i64,
    title: String,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
    created_by: Option<String>,
    _internal: u8,
}

fn main() {
    assert_eq!(
        Report::TABLE.columns,
        [
            "tenant_id",
            "id",
            "title",
            "locked_until",
            "payload",
            "created_by",
            "_internal"
        ]
    );
    assert_eq!(Report::TABLE.id.name, "id");
}
