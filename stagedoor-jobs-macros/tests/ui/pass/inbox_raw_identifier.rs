//! A raw identifier names its column without `r#`; the derive also works from `macro_rules!`.
use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;

#[derive(Inbox)]
#[inbox(table = "typed_jobs")]
struct Typed {
    #[field(id, generated)]
    id: i64,
    r#type: String,
    #[field(group)]
    r#match: String,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

macro_rules! row {
    ($name:ident, $table:literal, $schema:expr) => {
        #[derive(Inbox)]
        #[inbox(table = $table, schema = $schema)]
        struct $name {
            #[field(id)]
            id: String,
            #[field(locked_until)]
            locked_until: Option<DateTime<Utc>>,
            #[field(payload)]
            payload: String,
        }
    };
}

row!(FromMacro, "macro_jobs", "jobs");

fn main() {
    assert_eq!(
        Typed::TABLE.columns,
        ["id", "type", "match", "locked_until", "payload"]
    );
    assert_eq!(Typed::TABLE.group.unwrap().name, "match");
    assert_eq!(FromMacro::TABLE.qualified(), "\"jobs\".\"macro_jobs\"");
}
