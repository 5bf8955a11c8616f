//! A row with an error, used as an `Inbox`: the only error is the derive's.
#![allow(dead_code)]
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(table = "mail-jobs")]
struct SendMail {
    #[field(id, generated)]
    id: i64,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

fn table_of<R: Inbox>() -> &'static str {
    R::TABLE.name
}

fn main() {
    let _ = table_of::<SendMail>();
    let _ = SendMail::TABLE.columns;
}
