//! A tuple struct has no column names.
#![allow(dead_code)]
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(table = "mail_jobs")]
struct SendMail(i64, Option<DateTime<Utc>>, Vec<u8>);

fn main() {}
