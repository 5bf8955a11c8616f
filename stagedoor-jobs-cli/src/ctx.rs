//! What the commands know about a backend besides its broker: how its dead letters are named,
//! how to name it in messages, and what it stores.

use stagedoor_jobs::DeadLetters;
use stagedoor_jobs_redis::RedisBroker;

/// How a backend names dead letters.
#[derive(Clone, Debug)]
pub(crate) enum Naming {
    /// A dead letter is its queue's name plus a suffix: `jobs:dead` (Redis), `emails.dead`
    /// (an SQL table with a group column).
    Suffix(&'static str),
    /// An SQL table without a group column is one queue, named as the table; its dead letters
    /// are other tables (`<table>_dead` by default). `tables` are the database's tables.
    Tables {
        /// The job table (and its one queue).
        table: String,
        /// The tables of its schema.
        tables: Vec<String>,
    },
}

/// What the commands know about the backend besides the broker.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    /// The backend in messages: "Redis at `redis://…`", "table `mail_jobs` of `sqlite://…`".
    pub(crate) place: String,
    /// How its dead letters are named.
    pub(crate) naming: Naming,
    /// The queues, when the broker cannot list them itself (a Redis Cluster: each node given
    /// was asked for its own).
    pub(crate) listed: Option<Vec<String>>,
    /// Whether the backend stores when a job was enqueued (an SQL table may have no
    /// `enqueued_at` column: its dead letters' enqueued time is then unknown, not shown).
    pub(crate) stores_enqueued: bool,
    /// Redis: the broker, to read a dead letter's fields exactly as stored.
    pub(crate) redis: Option<RedisBroker>,
}

impl Ctx {
    /// Whether `name` is a dead letter (rather than a queue).
    pub(crate) fn is_dead(&self, name: &str) -> bool {
        match &self.naming {
            Naming::Suffix(s) => name.ends_with(s),
            Naming::Tables { table, .. } => name != table,
        }
    }

    /// The queue whose dead letter `dead` is, by its name.
    pub(crate) fn source_of(&self, dead: &str) -> String {
        match &self.naming {
            Naming::Suffix(s) => dead.strip_suffix(s).unwrap_or(dead).to_owned(),
            Naming::Tables { table, .. } => table.clone(),
        }
    }

    /// The names of the queues and dead letters there are.
    pub(crate) async fn queues<B: DeadLetters>(
        &self,
        b: &B,
    ) -> Result<Vec<String>, stagedoor_jobs::BrokerError> {
        match &self.listed {
            Some(names) => Ok(names.clone()),
            None => b.queues().await,
        }
    }

    /// Whether dead letter `dead` can be read at all: an SQL dead-letter table must exist.
    pub(crate) fn dead_exists(&self, dead: &str) -> bool {
        match &self.naming {
            Naming::Suffix(_) => true,
            Naming::Tables { tables, .. } => tables.iter().any(|t| t == dead),
        }
    }
}
