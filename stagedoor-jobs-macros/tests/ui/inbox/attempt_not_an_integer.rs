//! A role on a type that cannot hold it: the role trait says which types can.
#![allow(dead_code)]
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(table = "mail_jobs")]
struct SendMail {
    #[field(id, generated)]
    id: i64,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
    #[field(attempt)]
    attempt: String,
}

fn main() {}
