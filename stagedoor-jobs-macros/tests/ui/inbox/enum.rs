//! An enum is not a row.
#![allow(dead_code)]
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(table = "mail_jobs")]
enum SendMail {
    Queued {
        id: i64,
        payload: Vec<u8>,
    },
    Claimed {
        id: i64,
        locked_until: DateTime<Utc>,
    },
}

fn main() {}
