//! `#[derive(Inbox)]` describes the table the SQL backend reads: the values of `TABLE` for the
//! row of the seed and for one with a schema, a minted id and every optional role.

use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;
use stagedoor_jobs::inbox::{Column, ColumnType, Table, is_plain_identifier};

/// The row of the seed.
#[derive(Inbox)]
#[inbox(table = "mail_jobs")]
#[allow(dead_code)]
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

/// A schema, a minted id, a fifo group, every optional role and plain columns.
#[derive(Inbox)]
#[inbox(table = "report_jobs", schema = "jobs")]
#[allow(dead_code)]
struct Report {
    tenant: String,
    #[field(id)]
    id: String,
    #[field(group, fifo)]
    queue: String,
    #[field(attempt)]
    attempt: i32,
    #[field(retry_after)]
    retry_after: Option<DateTime<Utc>>,
    #[field(locked_until)]
    locked_until: DateTime<Utc>,
    #[field(payload)]
    payload: String,
    #[field(enqueued_at)]
    enqueued_at: DateTime<Utc>,
    #[field(last_error)]
    last_error: Option<String>,
    #[field(headers)]
    headers: String,
    r#type: Option<String>,
}

fn column(name: &'static str, generated: bool, ty: ColumnType) -> Column {
    Column {
        name,
        generated,
        ty,
    }
}

#[test]
fn the_seed_row() {
    assert_eq!(
        SendMail::TABLE,
        Table {
            schema: None,
            name: "mail_jobs",
            id: column("id", true, ColumnType::Integer),
            group: Some(column("name", false, ColumnType::Text)),
            fifo: false,
            attempt: Some(column("attempt", true, ColumnType::Integer)),
            retry_after: Some(column("retry_after", false, ColumnType::Timestamp)),
            locked_until: Some(column("locked_until", false, ColumnType::Timestamp)),
            payload: column("payload", false, ColumnType::Bytes),
            enqueued_at: None,
            last_error: None,
            headers: None,
            priority: None,
            columns: &[
                "id",
                "name",
                "attempt",
                "retry_after",
                "locked_until",
                "payload"
            ],
        }
    );
    assert_eq!(SendMail::TABLE.qualified(), "\"mail_jobs\"");
}

#[test]
fn schema_minted_id_fifo_and_every_role() {
    assert_eq!(
        Report::TABLE,
        Table {
            schema: Some("jobs"),
            name: "report_jobs",
            id: column("id", false, ColumnType::Text),
            group: Some(column("queue", false, ColumnType::Text)),
            fifo: true,
            attempt: Some(column("attempt", false, ColumnType::Integer)),
            retry_after: Some(column("retry_after", false, ColumnType::Timestamp)),
            locked_until: Some(column("locked_until", false, ColumnType::Timestamp)),
            payload: column("payload", false, ColumnType::Text),
            enqueued_at: Some(column("enqueued_at", false, ColumnType::Timestamp)),
            last_error: Some(column("last_error", false, ColumnType::Text)),
            headers: Some(column("headers", false, ColumnType::Text)),
            priority: None,
            columns: &[
                "tenant",
                "id",
                "queue",
                "attempt",
                "retry_after",
                "locked_until",
                "payload",
                "enqueued_at",
                "last_error",
                "headers",
                "type",
            ],
        }
    );
    assert_eq!(Report::TABLE.qualified(), "\"jobs\".\"report_jobs\"");
}

#[test]
fn every_name_is_a_plain_identifier() {
    for table in [SendMail::TABLE, Report::TABLE] {
        assert!(is_plain_identifier(table.name));
        assert!(table.schema.is_none_or(is_plain_identifier));
        assert!(table.columns.iter().all(|c| is_plain_identifier(c)));
    }
}

/// The table is a constant: a backend can build its statements at compile time.
const _: () = assert!(SendMail::TABLE.id.generated && !Report::TABLE.id.generated);
