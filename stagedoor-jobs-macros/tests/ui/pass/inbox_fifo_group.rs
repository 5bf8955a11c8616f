//! A group whose rows are worked one at a time, in order.
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(table = "orders")]
struct Order {
    #[field(id, generated)]
    id: i64,
    #[field(group, fifo)]
    customer: String,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

fn main() {
    assert!(Order::TABLE.fifo);
    assert_eq!(Order::TABLE.group.unwrap().name, "customer");
}
