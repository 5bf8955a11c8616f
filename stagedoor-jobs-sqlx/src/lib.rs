//! The SQL backend of stagedoor-jobs: `#[derive(Inbox)]` tables on SQLite and Postgres through sqlx. Built in a later issue.
