//! `stagedoor-jobs`: the operator's command for a stagedoor-jobs backend (Redis Streams,
//! Postgres or SQLite). It lists the queues with their depths, reads the dead letters, and
//! replays or purges them after a fix, without writing code.
//!
//! ```text
//! stagedoor-jobs --url redis://127.0.0.1:6379/ queues
//! stagedoor-jobs --url sqlite://mail.db --table mail_jobs dead list emails
//! stagedoor-jobs --url postgres://app@db/app --table mail_jobs dead replay emails --kind send
//! ```
//!
//! Exit codes: 0 ok, 1 the operation failed (or partly), 2 usage error, 3 cannot connect (a
//! bad URL, a server that is down, a table that is not a job table), 4 unknown queue, dead
//! letter or table. `stagedoor-jobs --help` lists every command and option.

#[path = "../cli/mod.rs"]
mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
