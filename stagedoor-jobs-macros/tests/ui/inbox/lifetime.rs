//! A row that borrows.
#![allow(dead_code)]
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(table = "mail_jobs")]
struct SendMail<'a> {
    #[field(id, generated)]
    id: i64,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: &'a [u8],
}

fn main() {}
