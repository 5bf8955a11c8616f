//! Every misuse of the row is reported at once.
#![allow(dead_code)]
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(table = "1mail", colour = "red")]
struct SendMail {
    #[field(id)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(attempt)]
    retries: i16,
    #[field(payload, fifo)]
    payload: Vec<u8>,
    #[field(lease)]
    lease: Option<DateTime<Utc>>,
}

fn main() {}
