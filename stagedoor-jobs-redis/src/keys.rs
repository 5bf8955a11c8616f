//! The keys of a queue. Every key of one stream shares its hash tag (`{jobs}`), so every
//! multi-key step (a script moving a job between them) runs on Redis Cluster.
//!
//! | name | key | what |
//! |---|---|---|
//! | `jobs` | `{jobs}` | the stream, consumer group `stagedoor` |
//! | `jobs:dead` | `{jobs}:dead` | the dead stream, trimmed at about 10,000 |
//! | | `{jobs}:delayed` | delayed jobs and retries, scored by due time (ms) |
//! | | `{jobs}:ids` | the ids of the jobs in the queue, so one is not added twice |
//! | | `{jobs}:mover` | the lock of the delayed mover |
//! | | `{jobs}:once:<guard>` | a scheduler tick's guard ([`Broker::publish_once`](stagedoor_jobs::Broker::publish_once)) |

/// The keys of one queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Keys {
    pub(crate) name: String,
    pub(crate) stream: String,
    pub(crate) dead: String,
    pub(crate) delayed: String,
    pub(crate) ids: String,
    pub(crate) mover: String,
    /// The hash tag every key above starts with (`{jobs}`).
    tag: String,
}

/// The suffix of a dead stream's name.
pub(crate) const DEAD_SUFFIX: &str = ":dead";

impl Keys {
    /// The keys of the queue `name` (`jobs`), or of the queue whose dead stream `name` is
    /// (`jobs:dead` reads `{jobs}:dead`), in namespace `ns` (`app1:` gives `{app1:jobs}`).
    pub(crate) fn of(ns: &str, name: &str) -> Self {
        let base = name.strip_suffix(DEAD_SUFFIX).unwrap_or(name);
        let tag = format!("{{{ns}{base}}}");
        let stream = if name.ends_with(DEAD_SUFFIX) {
            format!("{tag}{DEAD_SUFFIX}")
        } else {
            tag.clone()
        };
        Self {
            name: name.to_owned(),
            stream,
            dead: format!("{tag}{DEAD_SUFFIX}"),
            delayed: format!("{tag}:delayed"),
            ids: format!("{tag}:ids"),
            mover: format!("{tag}:mover"),
            tag,
        }
    }

    /// The key of guard `guard` of [`Broker::publish_once`](stagedoor_jobs::Broker::publish_once)
    /// on this queue: in the queue's hash slot, so the guard and the job it publishes are one
    /// script on one node of a Redis Cluster.
    pub(crate) fn once(&self, guard: &str) -> String {
        format!("{}:once:{guard}", self.tag)
    }

    /// The sorted set of this queue's running jobs marked cancelled (scored by when each mark
    /// lapses, ms).
    pub(crate) fn cancelled(&self) -> String {
        format!("{}:cancelled", self.tag)
    }

    /// Whether `name` is a dead stream.
    pub(crate) fn is_dead(name: &str) -> bool {
        name.ends_with(DEAD_SUFFIX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_hash_tag() {
        let k = Keys::of("", "jobs");
        assert_eq!(k.stream, "{jobs}");
        assert_eq!(k.dead, "{jobs}:dead");
        assert_eq!(k.delayed, "{jobs}:delayed");
        let d = Keys::of("", "jobs:dead");
        assert_eq!(Keys::of("t1:", "jobs").dead, "{t1:jobs}:dead");
        assert_eq!(d.stream, "{jobs}:dead");
        assert_eq!(d.dead, "{jobs}:dead");
        assert!(Keys::is_dead("jobs:dead") && !Keys::is_dead("jobs"));
        assert_eq!(
            Keys::of("t1:", "jobs").once("sched:a:{b}:1"),
            "{t1:jobs}:once:sched:a:{b}:1",
            "a guard shares the queue's tag, whatever braces it holds"
        );
    }
}
