//! A union is not a row.
#![allow(dead_code)]
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(table = "mail_jobs")]
union SendMail {
    id: i64,
    attempt: i32,
}

fn main() {}
