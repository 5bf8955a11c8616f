//! `#[inbox(..)]` with a schema but no table.
#![allow(dead_code)]
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(schema = "jobs")]
struct SendMail {
    #[field(id, generated)]
    id: i64,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

fn main() {}
