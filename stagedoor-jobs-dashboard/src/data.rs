//! What the pages read from the backend: every call bounded by the dashboard's timeout, every
//! error turned into a message (with URL passwords masked) that the page shows.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, Utc};
use stagedoor_jobs::activity::{MinuteCounts, WorkerReport, minute_of};
use stagedoor_jobs::broker::mask_url;
use stagedoor_jobs::{Activity, BrokerError, DeadLetter, DeadLetters, DeadSelector, QueueStats};

use crate::Dashboard;
use crate::security::Sessions;

/// What a backend must be for the dashboard.
pub(crate) trait Backend: DeadLetters + Activity + Clone + Send + Sync + 'static {}
impl<T: DeadLetters + Activity + Clone + Send + Sync + 'static> Backend for T {}

/// A backend call's result: the value, or the message the page shows.
pub(crate) type Shown<T> = Result<T, String>;

/// The router's state.
pub(crate) struct App<B> {
    pub(crate) dashboard: Dashboard<B>,
    pub(crate) sessions: Sessions,
    connected: AtomicBool,
}

/// A queue's row on the queues page.
#[derive(Clone, Debug)]
pub(crate) struct QueueRow {
    pub(crate) queue: String,
    pub(crate) dead_letter: String,
    pub(crate) stats: Shown<QueueStats>,
    pub(crate) dead: Shown<u64>,
}

/// A dead letter (the place) and how many it holds.
#[derive(Clone, Debug)]
pub(crate) struct DeadRow {
    pub(crate) name: String,
    pub(crate) source: Option<String>,
    pub(crate) len: Shown<u64>,
}

/// The queues and dead letters the backend holds.
#[derive(Clone, Debug, Default)]
pub(crate) struct Names {
    /// Queues (a dead letter's queue counts even when the queue itself is not listed).
    pub(crate) queues: Vec<String>,
    /// Dead letters: listed ones, and the default dead letter of each queue.
    pub(crate) dead: Vec<(String, Option<String>, bool)>,
}

/// Text with each URL's password masked.
pub(crate) fn mask_text(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            if w.contains("://") {
                mask_url(w)
            } else {
                w.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl<B: Backend> App<B> {
    pub(crate) fn new(mut dashboard: Dashboard<B>) -> Self {
        dashboard.title = mask_text(&dashboard.title);
        Self {
            dashboard,
            sessions: Sessions::default(),
            connected: AtomicBool::new(false),
        }
    }

    pub(crate) fn broker(&self) -> &B {
        &self.dashboard.broker
    }

    pub(crate) fn read_only(&self) -> bool {
        self.dashboard.read_only
    }

    /// Runs one backend call within the timeout, connecting the broker first if needed.
    pub(crate) async fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, BrokerError>>,
    ) -> Shown<T> {
        if !self.connected.load(Ordering::Relaxed) {
            match tokio::time::timeout(self.dashboard.timeout, self.broker().connect()).await {
                Ok(Ok(())) => self.connected.store(true, Ordering::Relaxed),
                Ok(Err(e)) => return Err(format!("cannot connect: {}", mask_text(&e.to_string()))),
                Err(_) => return Err(self.no_answer()),
            }
        }
        match tokio::time::timeout(self.dashboard.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(mask_text(&e.to_string())),
            Err(_) => Err(self.no_answer()),
        }
    }

    fn no_answer(&self) -> String {
        format!(
            "no answer from the {} backend within {}s",
            self.broker().backend(),
            self.dashboard.timeout.as_secs_f64()
        )
    }

    /// The suffix every default dead letter has (`:dead`, `.dead`), if the backend names them
    /// so.
    fn dead_suffix(&self) -> Option<String> {
        let a = self.broker().default_dead_letter("a");
        let b = self.broker().default_dead_letter("b");
        match (a.strip_prefix('a'), b.strip_prefix('b')) {
            (Some(x), Some(y)) if x == y && !x.is_empty() => Some(x.to_owned()),
            _ => None,
        }
    }

    /// Whether `name` (among `listed`) is a dead letter, and the queue it belongs to.
    fn classify(&self, name: &str, listed: &[String]) -> Option<Option<String>> {
        let suffix = self.dead_suffix();
        let source = suffix
            .as_deref()
            .and_then(|s| name.strip_suffix(s))
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let dead = match &self.dashboard.dead_rule {
            Some(rule) => rule(name),
            None => {
                source.is_some()
                    || listed
                        .iter()
                        .any(|q| q != name && self.broker().default_dead_letter(q) == name)
            }
        };
        if !dead {
            return None;
        }
        let source = source.or_else(|| {
            listed
                .iter()
                .find(|q| *q != name && self.broker().default_dead_letter(q) == name)
                .cloned()
        });
        Some(source)
    }

    /// The queues and dead letters there are.
    pub(crate) async fn names(&self) -> Shown<Names> {
        let listed = self.call(self.broker().queues()).await?;
        let mut queues = BTreeSet::new();
        let mut dead: BTreeMap<String, (Option<String>, bool)> = BTreeMap::new();
        for n in &listed {
            match self.classify(n, &listed) {
                Some(source) => {
                    if let Some(s) = &source {
                        queues.insert(s.clone());
                    }
                    dead.insert(n.clone(), (source, true));
                }
                None => {
                    queues.insert(n.clone());
                }
            }
        }
        for q in &queues {
            dead.entry(self.broker().default_dead_letter(q))
                .or_insert((Some(q.clone()), false));
        }
        Ok(Names {
            queues: queues.into_iter().collect(),
            dead: dead
                .into_iter()
                .map(|(name, (source, listed))| (name, source, listed))
                .collect(),
        })
    }

    /// Each queue's counts.
    pub(crate) async fn queue_rows(&self, names: &Names) -> Vec<QueueRow> {
        let mut rows = Vec::with_capacity(names.queues.len());
        for q in &names.queues {
            let dead_letter = self.broker().default_dead_letter(q);
            let listed = names
                .dead
                .iter()
                .any(|(n, _, listed)| *n == dead_letter && *listed);
            let stats = self.call(self.broker().stats(q)).await;
            let dead = match self.call(self.broker().dead_len(&dead_letter)).await {
                // A default dead letter the backend does not list may not exist at all (an
                // SQL table never created): it holds nothing.
                Err(_) if !listed => Ok(0),
                other => other,
            };
            rows.push(QueueRow {
                queue: q.clone(),
                dead_letter,
                stats,
                dead,
            });
        }
        rows
    }

    /// Every dead letter that exists, with its length.
    pub(crate) async fn dead_rows(&self, names: &Names) -> Vec<DeadRow> {
        let mut rows = Vec::new();
        for (name, source, listed) in &names.dead {
            let len = self.call(self.broker().dead_len(name)).await;
            if !listed && !matches!(len, Ok(n) if n > 0) {
                continue;
            }
            rows.push(DeadRow {
                name: name.clone(),
                source: source.clone(),
                len,
            });
        }
        rows
    }

    /// The processed, failed and dead counts of every queue per minute since `since`, summed;
    /// the first error, if a queue's counts could not be read.
    pub(crate) async fn throughput(
        &self,
        queues: &[String],
        since: DateTime<Utc>,
    ) -> (Vec<MinuteCounts>, Option<String>) {
        let mut sum: BTreeMap<DateTime<Utc>, (u64, u64, u64)> = BTreeMap::new();
        let mut error = None;
        for q in queues {
            match self.call(self.broker().throughput(q, since)).await {
                Ok(minutes) => {
                    for m in minutes {
                        let e = sum.entry(minute_of(m.minute)).or_default();
                        e.0 += m.processed;
                        e.1 += m.failed;
                        e.2 += m.dead;
                    }
                }
                Err(e) => {
                    error.get_or_insert(format!("the counts of `{q}`: {e}"));
                }
            }
        }
        let minutes = sum
            .into_iter()
            .map(|(at, (p, f, d))| MinuteCounts::new(at, p, f, d))
            .collect();
        (minutes, error)
    }

    /// The live workers, by id.
    pub(crate) async fn workers(&self) -> Shown<Vec<WorkerReport>> {
        let mut w = self.call(self.broker().workers()).await?;
        w.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(w)
    }

    /// Dead letters of `dead` that `selector` takes, newest first, at most `limit`.
    pub(crate) async fn letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> Shown<Vec<DeadLetter>> {
        self.call(self.broker().dead_letters(dead, selector, limit))
            .await
    }
}
