//! A schema and every role, optional ones included, in any order, with full type paths.
use stagedoor_jobs::Inbox;
use stagedoor_jobs::inbox::ColumnType;

#[derive(Inbox)]
#[inbox(schema = "jobs", table = "mail_jobs")]
pub struct SendMail {
    #[field(payload)]
    pub payload: String,
    #[field(headers)]
    pub headers: String,
    #[field(id, generated)]
    pub id: i32,
    #[field(locked_until)]
    pub locked_until: chrono::DateTime<chrono::Utc>,
    #[field(group)]
    pub queue: String,
    #[field(attempt)]
    pub attempt: i64,
    #[field(retry_after)]
    pub retry_after: Option<chrono::DateTime<chrono::Utc>>,
    #[field(enqueued_at)]
    pub enqueued_at: chrono::DateTime<chrono::Utc>,
    #[field(last_error)]
    pub last_error: Option<String>,
}

fn main() {
    let t = SendMail::TABLE;
    assert_eq!(t.schema, Some("jobs"));
    assert_eq!(t.qualified(), "\"jobs\".\"mail_jobs\"");
    assert_eq!(t.payload.ty, ColumnType::Text);
    assert!(!t.attempt.unwrap().generated);
    for (column, name, ty) in [
        (t.group, "queue", ColumnType::Text),
        (t.attempt, "attempt", ColumnType::Integer),
        (t.retry_after, "retry_after", ColumnType::Timestamp),
        (t.locked_until, "locked_until", ColumnType::Timestamp),
        (t.enqueued_at, "enqueued_at", ColumnType::Timestamp),
        (t.last_error, "last_error", ColumnType::Text),
        (t.headers, "headers", ColumnType::Text),
    ] {
        let column = column.unwrap();
        assert_eq!((column.name, column.ty), (name, ty));
    }
    assert_eq!(t.columns.len(), 9);
    assert_eq!(t.columns[0], "payload");
}
