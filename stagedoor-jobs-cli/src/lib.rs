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
//! ```
//!
//! Exit codes: 0 ok, 1 the operation failed (or partly), 2 usage error, 3 cannot connect (a
//! bad URL, a server that is down, a table that is not a job table), 4 unknown queue, dead
//! letter, table or job. `stagedoor-jobs --help` lists every command and option.
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

mod backend;
mod commands;
mod dashboard;
mod error;
mod introspect;
mod output;

use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};

pub(crate) use error::Failure;

/// The operator's command for stagedoor-jobs: see the queues, read the dead letters, replay or
/// purge them after a fix.
#[derive(Debug, Parser)]
#[command(
    name = "stagedoor-jobs",
    version,
    about = "See every queue of a stagedoor-jobs backend, read its dead letters, replay or purge them.",
    after_help = "Exit codes: 0 ok, 1 the operation failed (or partly), 2 usage error, \
3 cannot connect (bad URL, server down, not a job table), 4 unknown queue, dead letter, table or job.\n\n\
Examples:\n  \
stagedoor-jobs --url redis://127.0.0.1:6379/ queues\n  \
stagedoor-jobs --url sqlite://mail.db --table mail_jobs dead list emails\n  \
stagedoor-jobs --url postgres://app@db/app --table mail_jobs dead replay emails --all --dry-run\n  \
JOBS_TOKEN=... stagedoor-jobs --url redis://127.0.0.1:6379/ dashboard --listen 0.0.0.0:8787 --auth-token-env JOBS_TOKEN"
)]
pub(crate) struct Cli {
    /// Where the jobs are: redis://host:port/db, rediss://…, postgres://user@host/db,
    /// sqlite://path/to/file.db; several redis:// URLs separated by commas are a Redis Cluster.
    #[arg(
        long,
        env = "STAGEDOOR_URL",
        global = true,
        value_name = "URL",
        hide_env_values = true,
        help_heading = "Backend"
    )]
    pub(crate) url: Option<String>,

    /// Redis: the namespace the service's broker was given (`RedisBroker::namespace`).
    #[arg(
        long,
        env = "STAGEDOOR_NAMESPACE",
        global = true,
        value_name = "NS",
        help_heading = "Backend"
    )]
    pub(crate) namespace: Option<String>,

    /// SQL: the job table (required with a SQL URL); its columns are read from the database.
    #[arg(
        long,
        env = "STAGEDOOR_TABLE",
        global = true,
        value_name = "NAME",
        help_heading = "Backend"
    )]
    pub(crate) table: Option<String>,

    /// SQL: the table's schema (default: the connection's own).
    #[arg(
        long,
        env = "STAGEDOOR_SCHEMA",
        global = true,
        value_name = "NAME",
        help_heading = "Backend"
    )]
    pub(crate) schema: Option<String>,

    /// SQL: the column that names a row's queue (default: `name`, else `queue`; without
    /// either the table is one queue and its dead letters are the table `<table>_dead`).
    #[arg(long, global = true, value_name = "COLUMN", help_heading = "Backend")]
    pub(crate) group_column: Option<String>,

    /// Print JSON (for scripts) instead of tables.
    #[arg(long, global = true, help_heading = "Output")]
    pub(crate) json: bool,

    /// How long to wait for the server, in seconds.
    #[arg(
        long,
        global = true,
        value_name = "SECONDS",
        default_value_t = 10,
        help_heading = "Backend"
    )]
    pub(crate) timeout: u64,

    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Every queue: jobs ready, pending (claimed, not settled), delayed, dead letters, and how
    /// long the oldest ready job has waited.
    Queues,
    /// Read, replay and purge the dead letters of a queue.
    #[command(subcommand)]
    Dead(Dead),
    /// Cancel job ID of QUEUE: a waiting or delayed job is removed (it will not run); a
    /// running one is told to stop (its handler's `Cancellation` fires within about a third
    /// of the lease) and is dropped when its handler returns. Exit 4 when no such job is in
    /// the queue (it finished, or never was).
    Cancel {
        /// The queue the job is in.
        queue: String,
        /// The job's id (as `publish` returned it, or as the handler's logs show it).
        id: String,
    },
    /// Serve the web dashboard of this backend (queues, dead letters, schedules, workers)
    /// until Ctrl-C.
    Dashboard(DashboardArgs),
}

/// How to serve the dashboard. Beyond loopback it needs a secret: `--auth-token-env VAR`
/// (the token in the variable VAR) or `--basic-auth-env VAR` (`user:password` in VAR).
#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// Where to listen, host:port (port 0 picks a free one). An address beyond loopback
    /// (0.0.0.0, a LAN address) is refused without --auth-token-env or --basic-auth-env.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8787")]
    pub(crate) listen: String,
    /// No action buttons; replays and purges are refused.
    #[arg(long)]
    pub(crate) read_only: bool,
    /// Require a token: the name of the environment variable that holds it (browsers sign in
    /// with it once; scripts send `Authorization: Bearer <token>`).
    #[arg(long, value_name = "VAR", conflicts_with = "basic_auth_env")]
    pub(crate) auth_token_env: Option<String>,
    /// Require HTTP basic auth: the name of the environment variable that holds
    /// `user:password`.
    #[arg(long, value_name = "VAR")]
    pub(crate) basic_auth_env: Option<String>,
    /// Also answer to this host name (`jobs.example.com`: any port; `name:port`: that port
    /// only), the name browsers or a proxy reach the dashboard by; repeat for several. Without
    /// it only localhost and IP addresses are answered (421 otherwise: DNS rebinding).
    #[arg(long, value_name = "HOST")]
    pub(crate) allowed_host: Vec<String>,
}

/// The dead-letter commands. QUEUE is the queue the jobs failed on (`jobs`, `emails`); its
/// dead letter's own name (`jobs:dead`, `emails.dead`) is accepted too.
#[derive(Debug, Subcommand)]
pub(crate) enum Dead {
    /// The dead letters of QUEUE, newest first.
    List {
        /// The queue the jobs failed on (or its dead letter's name).
        queue: String,
        /// Only dead letters of this kind.
        #[arg(long, value_name = "KIND")]
        kind: Option<String>,
        /// At most this many.
        #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
    },
    /// One dead letter with every field, its error and its traceback.
    Show {
        /// The queue the job failed on (or its dead letter's name).
        queue: String,
        /// The dead letter's id (or its job's id).
        id: String,
        /// Write the payload's exact bytes to FILE (`-`: stdout, and nothing else); the
        /// listing shows a bounded preview of a large payload.
        #[arg(long, value_name = "FILE")]
        payload_to: Option<std::path::PathBuf>,
    },
    #[command(
        override_usage = "stagedoor-jobs dead replay [OPTIONS] <QUEUE> <ID|--kind <KIND>|--all>"
    )]
    /// Moves dead letters back to the queue each failed on, attempts reset, one atomic move
    /// each (an interrupted replay loses and duplicates nothing).
    Replay {
        /// The queue the jobs failed on (or its dead letter's name).
        queue: String,
        #[command(flatten)]
        select: Select,
        /// List what would move, and move nothing.
        #[arg(long)]
        dry_run: bool,
    },
    #[command(
        override_usage = "stagedoor-jobs dead purge [OPTIONS] <QUEUE> <ID|--kind <KIND>|--all>"
    )]
    /// Deletes dead letters for good, after a confirmation.
    Purge {
        /// The queue the jobs failed on (or its dead letter's name).
        queue: String,
        #[command(flatten)]
        select: Select,
        /// List what would be deleted, and delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask for confirmation (needed when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

/// Which dead letters: one id, every one of a kind, or all.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct Select {
    /// One dead letter, by its id (or its job's id).
    #[arg(value_name = "ID")]
    pub(crate) id: Option<String>,
    /// Every dead letter of this kind.
    #[arg(long, value_name = "KIND")]
    pub(crate) kind: Option<String>,
    /// Every dead letter of the queue.
    #[arg(long)]
    pub(crate) all: bool,
}

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
