//! A schema name that is SQL.
#![allow(dead_code)]
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(table = "mail_jobs", schema = "x; DROP TABLE y")]
struct SendMail {
    #[field(id, generated)]
    id: i64,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

fn main() {}
