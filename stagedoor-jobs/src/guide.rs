//! The guide: how to write, mount, publish, schedule, test and operate jobs, chapter by
//! chapter, with examples that compile (they are this crate's doctests).
//!
//! | chapter | what it covers |
//! |---|---|
//! | [`handlers`] | the message, extractors (`Ctx`, `Data<T>`), return types, `#[subscriber]` and `Subscriber::new`, mounts, a mount function generic over backends |
//! | [`outcomes`] | ack, retry, retry after, drop, errors and panics; caps, dead letters, backoff |
//! | [`publishing`] | publishing from a running service and from a producer without one (`connect()`, `Publish`); request ids and traces |
//! | [`scheduler`] | schedules every N, by cron in a time zone, hourly, daily; missed ticks; the keys and tables it writes |
//! | [`testing`] | `MemoryBroker` and `TestApp` (feature `testing`) |
//! | [`operations`] | health and readiness, metrics, the dead-letter alert, dead letters from code and from the command line |
//!
//! The backends have their own guides on their crates' front pages: `stagedoor-jobs-sqlx` (job
//! tables, `#[derive(Inbox)]`, the index, SQLite and Postgres, dead-letter tables) and
//! `stagedoor-jobs-redis` (keys, Redis Cluster, TLS, namespaces).

pub mod handlers {
    #![doc = include_str!("guide/handlers.md")]
}

pub mod outcomes {
    #![doc = include_str!("guide/outcomes.md")]
}

pub mod publishing {
    #![doc = include_str!("guide/publishing.md")]
}

pub mod scheduler {
    #![doc = include_str!("guide/scheduler.md")]
}

pub mod testing {
    #![cfg_attr(feature = "testing", doc = include_str!("guide/testing.md"))]
    #![cfg_attr(
        not(feature = "testing"),
        doc = "# Testing\n\nThis chapter is built with the `testing` feature (`cargo doc --features testing`; docs.rs builds it): `MemoryBroker` and `TestApp` exist only there."
    )]
}

pub mod operations {
    #![doc = include_str!("guide/operations.md")]
}
