//! The row of the seed: an auto-increment id, a group, a generated attempt, the times, bytes.
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;
use stagedoor_jobs::inbox::{ColumnType, Table};

#[derive(Inbox)]
#[inbox(table = "mail_jobs")]
struct SendMail {
    #[field(id, generated)]
    id: i64,
    #[field(group)]
    name: String,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

const TABLE: Table = SendMail::TABLE;

fn main() {
    assert_eq!(TABLE.qualified(), "\"mail_jobs\"");
    assert_eq!((TABLE.id.name, TABLE.id.ty), ("id", ColumnType::Integer));
    assert!(TABLE.id.generated);
    assert_eq!(TABLE.group.unwrap().name, "name");
    assert!(!TABLE.fifo);
    assert_eq!(TABLE.payload.ty, ColumnType::Bytes);
    assert_eq!(
        TABLE.columns,
        [
            "id",
            "name",
            "attempt",
            "retry_after",
            "locked_until",
            "payload"
        ]
    );
}
