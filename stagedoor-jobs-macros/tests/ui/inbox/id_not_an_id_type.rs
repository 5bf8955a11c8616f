//! An id of a type no id can have (and not generated): the role trait says which types can.
#![allow(dead_code)]
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(table = "mail_jobs")]
struct SendMail {
    #[field(id)]
    id: f64,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

fn main() {}
