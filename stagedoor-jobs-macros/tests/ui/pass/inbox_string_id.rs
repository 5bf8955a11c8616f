//! An id the publisher mints: a `String` (or an alias of one), not `generated`.
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;
use stagedoor_jobs::inbox::ColumnType;

type JobId = String;

#[derive(Inbox)]
#[inbox(table = "mail_jobs")]
struct SendMail {
    #[field(id)]
    id: String,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

#[derive(Inbox)]
#[inbox(table = "aliased")]
struct Aliased {
    #[field(id)]
    job_id: JobId,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

fn main() {
    for id in [SendMail::TABLE.id, Aliased::TABLE.id] {
        assert_eq!(id.ty, ColumnType::Text);
        assert!(!id.generated);
    }
    assert_eq!(Aliased::TABLE.id.name, "job_id");
    assert!(SendMail::TABLE.group.is_none() && SendMail::TABLE.attempt.is_none());
}
