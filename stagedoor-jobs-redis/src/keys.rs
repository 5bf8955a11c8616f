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
//! | | `{jobs}:serving` | the process serving the queue and since when: no reclaim until a lease after a failover or restart |
//! | | `{jobs}:p<level>` | the stream of the jobs of priority `level` (`-2`, `-1`, `1`, `2`); normal ones are in `{jobs}` |

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

use stagedoor_jobs::Priority;

/// What is wrong with `name` as a Redis queue or dead letter name, with the fix: what no
/// backend takes ([`queue_name_problem`](stagedoor_jobs::broker::queue_name_problem)), and a
/// `{` or `}`, which would end the queue's hash tag early (on a Cluster the queue's keys would
/// land in different slots, and `queues()` would misread the name).
pub(crate) fn name_problem(name: &str) -> Option<String> {
    stagedoor_jobs::broker::queue_name_problem(name).or_else(|| {
        name.contains(['{', '}']).then(|| {
            format!(
                "the queue name `{name}` holds a `{{` or `}}`, which Redis keys use for the queue's hash tag: use a name without braces, such as `{}`",
                name.replace(['{', '}'], "")
            )
        })
    })
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

    /// The hash naming the server process that serves this queue and since when (see
    /// `failover.rs`): no reclaim until it has served for a lease.
    pub(crate) fn serving(&self) -> String {
        format!("{}:serving", self.tag)
    }

    /// The sorted set of this queue's running jobs marked cancelled (scored by when each mark
    /// lapses, ms).
    pub(crate) fn cancelled(&self) -> String {
        format!("{}:cancelled", self.tag)
    }

    /// The keys of this queue with the stream of priority `level` (`{jobs}:p2`; `{jobs}`
    /// for normal): every other key is the queue's (one delayed set, one set of ids, one
    /// dead stream for every level). A dead stream has no levels: its keys are its own.
    pub(crate) fn at(&self, level: Priority) -> Self {
        let mut k = self.clone();
        if !Self::is_dead(&self.name) {
            k.stream = if level == Priority::NORMAL {
                self.tag.clone()
            } else {
                format!("{}:p{level}", self.tag)
            };
        }
        k
    }

    /// Whether `suffix`, what follows a stream key's hash tag, names a priority level's stream
    /// (`:p2`, `:p-1`): not a queue of its own.
    pub(crate) fn is_level_suffix(suffix: &str) -> bool {
        suffix
            .strip_prefix(":p")
            .is_some_and(|l| Priority::parse(l).is_ok())
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
        let high = k.at(Priority::HIGHEST);
        assert_eq!(high.stream, "{jobs}:p2");
        assert_eq!(
            (&high.delayed, &high.ids),
            (&k.delayed, &k.ids),
            "one delayed set, one set of ids"
        );
        assert_eq!(k.at(Priority::LOW).stream, "{jobs}:p-1");
        assert_eq!(k.at(Priority::NORMAL), k);
        assert_eq!(high.at(Priority::NORMAL), k, "back to normal from a level");
        assert_eq!(d.at(Priority::HIGH), d, "a dead stream has no levels");
        assert!(Keys::is_level_suffix(":p-2") && !Keys::is_level_suffix(":p3"));
        assert!(!Keys::is_level_suffix(":dead") && !Keys::is_level_suffix(":p0x"));
        assert_eq!(
            Keys::of("t1:", "jobs").once("sched:a:{b}:1"),
            "{t1:jobs}:once:sched:a:{b}:1",
            "a guard shares the queue's tag, whatever braces it holds"
        );
    }
}
