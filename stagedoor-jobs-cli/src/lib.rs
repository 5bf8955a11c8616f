//! # stagedoor-jobs-cli
//!
//! `stagedoor-jobs`: the operator's command for a stagedoor-jobs backend (Redis Streams,
//! Postgres or SQLite). It lists the queues with their depths, reads the dead letters, replays
//! or purges them after a fix, and serves the dashboard, without writing code.
//!
//! ```text
//! cargo install stagedoor-jobs-cli            # or, from a clone: cargo install --path stagedoor-jobs-cli
//! stagedoor-jobs --url redis://127.0.0.1:6379/ queues
//! stagedoor-jobs --url sqlite://mail.db --table mail_jobs dead list emails
//! stagedoor-jobs --url postgres://app@db/app --table mail_jobs dead replay emails --kind send
//! stagedoor-jobs --url redis://127.0.0.1:6379/ dashboard --listen 127.0.0.1:8787
//! stagedoor-jobs --url redis://127.0.0.1:6379/ cancel emails 0190c6d5e7a97b0c9f3e4a3b2c1d0e9f
//! stagedoor-jobs --url sqlite://mail.db --table mail_jobs result 0190c6d5e7a97b0c9f3e4a3b2c1d0e9f
//! stagedoor-jobs --url sqlite://mail.db --table mail_jobs flow nightly-report
//! ```
//!
//! Exit codes: 0 ok, 1 the operation failed (or partly), 2 usage error, 3 cannot connect (a
//! bad URL, a server that is down, a table that is not a job table), 4 unknown queue, dead
//! letter, table, job, result or flow. `stagedoor-jobs --help` lists every command and option.
//!
//! The binary speaks every backend: Redis (a Redis Cluster when `--url` lists several
//! `redis://` URLs separated by commas, `rediss://` for TLS), Postgres and SQLite.
//!
//! This library is the command itself ([`run`]), for embedding it in a binary of your own
//! (`fn main() -> ExitCode { stagedoor_jobs_cli::run() }`); its parts are not a public API.
//!
//! ## Inside
//! The commands are written once, generic over [`Broker`](stagedoor_jobs::Broker)
//! (`commands.rs`); `backend.rs` turns `--url` (and for SQL `--table`, whose layout it reads
//! from the database) into a connected broker; `output.rs` prints tables or JSON.

mod args;
mod backend;
mod commands;
mod ctx;
mod dashboard;
mod error;
mod introspect;
mod output;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use args::{Cli, Command};
use error::Failure;

/// Parses the process's arguments, runs the command, and returns its exit code; errors are one
/// line on stderr. It installs a panic hook (one line, never a backtrace) and a tracing
/// subscriber for the command's own logs.
pub fn run() -> ExitCode {
    // A bug must not print a backtrace at an operator either: one line, then exit 101.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_owned());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "error: internal error: {}{at} (a bug of stagedoor-jobs: please report it)",
            error::one_line(&msg)
        );
    }));
    let cli = Cli::parse();
    if cli.url.as_deref().is_none_or(str::is_empty) {
        Cli::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "no backend given: pass --url <URL> or set STAGEDOOR_URL (redis://…, postgres://…, sqlite://…)",
            )
            .exit();
    }
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(error::FAILED);
        }
    };
    let result = runtime.block_on(execute(cli));
    // Background tasks (a Postgres LISTEN connection) are not waited for.
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("error: {}", error::one_line(&f.message));
            ExitCode::from(f.code)
        }
    }
}

/// Backend errors the brokers log (a replay of one dead letter that failed) go to stderr;
/// `RUST_LOG` shows more.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

async fn execute(cli: Cli) -> Result<u8, Failure> {
    // The dashboard's address and secret are checked before connecting.
    let plan = match &cli.command {
        Command::Dashboard(args) => Some(dashboard::plan(args).await?),
        _ => None,
    };
    let target = backend::open(&cli).await?;
    if let Some(plan) = plan {
        return match target {
            backend::Opened::Redis(b, ctx) => dashboard::serve(b, &ctx, plan).await,
            backend::Opened::Sqlite(b, ctx) => dashboard::serve(b, &ctx, plan).await,
            backend::Opened::Postgres(b, ctx) => dashboard::serve(b, &ctx, plan).await,
        };
    }
    let out = output::Out::new(cli.json);
    match target {
        backend::Opened::Redis(b, ctx) => commands::run(&b, &ctx, &out, cli.command).await,
        backend::Opened::Sqlite(b, ctx) => commands::run(&b, &ctx, &out, cli.command).await,
        backend::Opened::Postgres(b, ctx) => commands::run(&b, &ctx, &out, cli.command).await,
    }
}
