//! What the pages read from the backend: every call bounded by the dashboard's timeout, every
//! error turned into a message (with URL passwords masked) that the page shows.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use stagedoor_jobs::activity::{MinuteCounts, WorkerReport, minute_of};
use stagedoor_jobs::broker::{Records, mask_url, named_dead_letter};
use stagedoor_jobs::flow::{FlowView, read_flow};
use stagedoor_jobs::results::{JobResult, Progress, Results};
use stagedoor_jobs::{Activity, BrokerError, DeadLetter, DeadLetters, DeadSelector, QueueStats};

use crate::builder::Dashboard;
use crate::security::{Keys, Sessions, Throttle};

tokio::task_local! {
    /// When the request being answered must be done: every backend call it makes shares it.
    pub(crate) static DEADLINE: Instant;
}

/// How long what the polling pages read (the queues' names and counts, the chart, the
/// workers) is shared between requests: N open tabs cost one backend read per second.
pub(crate) const POLL_TTL: Duration = Duration::from_secs(1);

/// A value shared between requests for [`POLL_TTL`]; one request reads it while the others
/// wait for its answer.
pub(crate) struct Cached<T>(tokio::sync::Mutex<Option<(Instant, Arc<T>)>>);

impl<T> Default for Cached<T> {
    fn default() -> Self {
        Self(tokio::sync::Mutex::new(None))
    }
}

impl<T> Cached<T> {
    /// The value read less than [`POLL_TTL`] ago, else `read`'s.
    pub(crate) async fn get<F: std::future::Future<Output = T>>(
        &self,
        read: impl FnOnce() -> F,
    ) -> Arc<T> {
        let mut slot = self.0.lock().await;
        if let Some((at, v)) = &*slot
            && at.elapsed() < POLL_TTL
        {
            return v.clone();
        }
        let v = Arc::new(read().await);
        *slot = Some((Instant::now(), v.clone()));
        v
    }

    /// Forgets the value (after an action changed what it shows).
    pub(crate) async fn clear(&self) {
        *self.0.lock().await = None;
    }
}

/// What the queues page and its JSON show, read once for every tab polling it.
pub(crate) struct Polled {
    pub(crate) rows: Shown<Vec<QueueRow>>,
    pub(crate) minutes: Vec<MinuteCounts>,
    pub(crate) chart_error: Option<String>,
    pub(crate) now: DateTime<Utc>,
}

/// What a backend must be for the dashboard.
pub(crate) trait Backend:
    DeadLetters + Activity + Records + Clone + Send + Sync + 'static
{
}
impl<T: DeadLetters + Activity + Records + Clone + Send + Sync + 'static> Backend for T {}

/// A backend call's result: the value, or the message the page shows.
pub(crate) type Shown<T> = Result<T, String>;

/// The router's state.
pub(crate) struct App<B> {
    pub(crate) dashboard: Dashboard<B>,
    pub(crate) sessions: Sessions,
    pub(crate) keys: Keys,
    pub(crate) throttle: Throttle,
    /// The queues page's reads, shared for [`POLL_TTL`].
    pub(crate) polled: Cached<Polled>,
    /// The workers page's read, shared for [`POLL_TTL`].
    pub(crate) polled_workers: Cached<Shown<Vec<WorkerReport>>>,
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

/// Text with each URL's password masked (each word holding `://`, words split at any
/// whitespace, which is kept).
pub(crate) fn mask_text(text: &str) -> String {
    if !text.contains("://") {
        return text.to_owned();
    }
    text.split_inclusive(char::is_whitespace)
        .map(|w| {
            if w.contains("://") {
                let word = w.trim_end_matches(char::is_whitespace);
                format!("{}{}", mask_url(word), &w[word.len()..])
            } else {
                w.to_owned()
            }
        })
        .collect()
}

impl<B: Backend> App<B> {
    pub(crate) fn new(mut dashboard: Dashboard<B>) -> Self {
        dashboard.title = mask_text(&dashboard.title);
        Self {
            dashboard,
            sessions: Sessions::default(),
            keys: Keys::new(),
            throttle: Throttle::default(),
            polled: Cached::default(),
            polled_workers: Cached::default(),
            connected: AtomicBool::new(false),
        }
    }

    pub(crate) fn broker(&self) -> &B {
        &self.dashboard.broker
    }

    pub(crate) fn read_only(&self) -> bool {
        self.dashboard.read_only
    }

    /// How long the next backend call may take: the timeout, or less when the request's
    /// deadline is nearer; `None` once the deadline has passed.
    fn budget(&self) -> Option<Duration> {
        let timeout = self.dashboard.timeout;
        match DEADLINE.try_with(|d| d.checked_duration_since(Instant::now())) {
            Ok(Some(left)) if !left.is_zero() => Some(left.min(timeout)),
            Ok(_) => None,
            Err(_) => Some(timeout),
        }
    }

    /// What the backend says of `dl` as a dead letter
    /// ([`DeadLetters::check_dead_letter`](stagedoor_jobs::DeadLetters::check_dead_letter)):
    /// `Some(Ok(()))` it is one, `Some(Err(message))` it is not; `None` when the backend could
    /// not tell (not reachable, no answer in time): the page shows that from its own calls,
    /// and the backend checks again before it replays or purges anything.
    pub(crate) async fn dead_letter_check(&self, dl: &str) -> Option<Result<(), String>> {
        // Connect first, as every call does.
        self.call(async { Ok::<(), BrokerError>(()) }).await.ok()?;
        let budget = self.budget()?;
        match tokio::time::timeout(budget, self.broker().check_dead_letter(dl)).await {
            Ok(Ok(())) => Some(Ok(())),
            Ok(Err(BrokerError::Invalid(m))) => Some(Err(mask_text(&m))),
            _ => None,
        }
    }

    /// What the dashboard's own rule says of `name` as a dead letter
    /// ([`Dashboard::dead_letters_named`](crate::Dashboard::dead_letters_named)), if it has one.
    pub(crate) fn dead_rule_says(&self, name: &str) -> Option<bool> {
        self.dashboard.dead_rule.as_ref().map(|rule| rule(name))
    }

    /// Runs one backend call within the timeout and the request's deadline, connecting the
    /// broker first if needed.
    pub(crate) async fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, BrokerError>>,
    ) -> Shown<T> {
        if !self.connected.load(Ordering::Relaxed) {
            let Some(budget) = self.budget() else {
                return Err(self.past_deadline());
            };
            match tokio::time::timeout(budget, self.broker().connect()).await {
                Ok(Ok(())) => self.connected.store(true, Ordering::Relaxed),
                Ok(Err(e)) => return Err(format!("cannot connect: {}", mask_text(&e.to_string()))),
                Err(_) => return Err(self.no_answer()),
            }
        }
        let Some(budget) = self.budget() else {
            return Err(self.past_deadline());
        };
        match tokio::time::timeout(budget, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(mask_text(&e.to_string())),
            Err(_) if self.budget().is_none() => Err(self.past_deadline()),
            Err(_) => Err(self.no_answer()),
        }
    }

    /// Flow (or batch) `id`, `None` when there is none (within the request's deadline).
    pub(crate) async fn flow(&self, id: &str) -> Shown<Option<FlowView>> {
        self.call(read_flow(self.broker(), id)).await
    }

    /// Job `id`'s result and its last progress (within the request's deadline).
    pub(crate) async fn result(&self, id: &str) -> Shown<(Option<JobResult>, Option<Progress>)> {
        let result = self.call(self.broker().result(id)).await?;
        let progress = self.call(self.broker().progress(id)).await?;
        Ok((result, progress))
    }

    fn past_deadline(&self) -> String {
        format!(
            "stopped at the request's deadline ({}s): the {} backend answered too slowly for everything this page asks, so the rest was not read. Select fewer, act by kind, or raise the dashboard's timeout",
            self.dashboard.timeout.as_secs_f64(),
            self.broker().backend(),
        )
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

    /// Whether `name` is named as a dead letter, without asking the backend: by the
    /// dashboard's rule ([`Dashboard::dead_letters_named`](crate::Dashboard::dead_letters_named))
    /// when it has one, else by the backend's naming (`emails.dead`, `jobs:dead`, the one
    /// dead-letter table `mail_jobs_dead` of a table without groups).
    pub(crate) fn is_dead_letter_name(&self, name: &str) -> bool {
        if let Some(says) = self.dead_rule_says(name) {
            return says;
        }
        let suffixed = self
            .dead_suffix()
            .is_some_and(|s| named_dead_letter(name, &s));
        suffixed || self.broker().default_dead_letter(name) == name
    }

    /// Whether `name` (among `listed`) is a dead letter, and the queue it belongs to.
    fn classify(&self, name: &str, listed: &[String]) -> Option<Option<String>> {
        let suffix = self.dead_suffix();
        let source = suffix
            .as_deref()
            .filter(|s| named_dead_letter(name, s))
            .and_then(|s| name.strip_suffix(s))
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
                        e.0 = e.0.saturating_add(m.processed);
                        e.1 = e.1.saturating_add(m.failed);
                        e.2 = e.2.saturating_add(m.dead);
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

    /// The live workers, by id (read at most once per [`POLL_TTL`] for every tab).
    pub(crate) async fn workers(&self) -> Arc<Shown<Vec<WorkerReport>>> {
        self.polled_workers
            .get(|| async {
                let mut w = self.call(self.broker().workers()).await?;
                w.sort_by(|a, b| a.id.cmp(&b.id));
                Ok(w)
            })
            .await
    }

    /// What the queues page shows (read at most once per [`POLL_TTL`] for every tab).
    pub(crate) async fn polled(
        &self,
        since: impl Fn(DateTime<Utc>) -> DateTime<Utc>,
    ) -> Arc<Polled> {
        self.polled
            .get(|| async {
                let now = Utc::now();
                match self.names().await {
                    Ok(names) => {
                        let rows = self.queue_rows(&names).await;
                        let (minutes, chart_error) =
                            self.throughput(&names.queues, since(now)).await;
                        Polled {
                            rows: Ok(rows),
                            minutes,
                            chart_error,
                            now,
                        }
                    }
                    Err(e) => Polled {
                        rows: Err(e),
                        minutes: Vec::new(),
                        chart_error: None,
                        now,
                    },
                }
            })
            .await
    }

    /// Forgets what the polling pages read: an action changed it.
    pub(crate) async fn changed(&self) {
        self.polled.clear().await;
        self.polled_workers.clear().await;
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
