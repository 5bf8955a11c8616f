//! The command line: the global options, the commands and their arguments (clap's derive).

use clap::{Args, Parser, Subcommand};

/// The operator's command for stagedoor-jobs: see the queues, read the dead letters, replay or
/// purge them after a fix.
#[derive(Debug, Parser)]
#[command(
    name = "stagedoor-jobs",
    version,
    about = "See every queue of a stagedoor-jobs backend, read its dead letters, replay or purge them.",
    after_help = "Exit codes: 0 ok, 1 the operation failed (or partly), 2 usage error, \
3 cannot connect (bad URL, server down, not a job table), 4 unknown queue, dead letter, table, job, result or flow.\n\n\
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
    /// The result job ID's handler returned (pretty JSON), when it finished, and its last
    /// progress. Exit 4 when there is none: the job has not finished, finished without a
    /// value, or its result ran out (kept 24 hours unless its mount says otherwise).
    Result {
        /// The job's id (as `publish` returned it).
        id: String,
    },
    /// Flow or batch ID: each job of it (its queue, kind, state, parents and why it failed,
    /// was skipped or is held), and what holds the flow. Exit 4 when there is no such flow.
    Flow {
        /// The flow's or batch's id (as `publish_flow` or `open_batch` returned it).
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
