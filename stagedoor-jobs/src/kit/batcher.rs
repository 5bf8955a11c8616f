//! The restartable settlement batcher: one task per key (a stream, a table) fed by a channel,
//! supervised, started at its first request and again whenever it is found stopped, each
//! request sent twice when its task died under it ([`Batchers`]); and the loop such a task
//! runs, which sends whatever queued as one batch ([`run_batches`]).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Mutex;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use super::lock;
use super::restart::{SharedReceiver, spawn_consumer};
use crate::broker::BrokerError;

/// Where a batching task answers one request: the request carries it, and the task sends the
/// request's own answer (an error of its batch, say) once its batch ran.
pub type Reply<T> = oneshot::Sender<Result<T, BrokerError>>;

/// The channels to a backend's batching tasks, one per key (a Redis stream, an SQL table).
///
/// Each task is started at its key's first request, under
/// [`restart_on_panic`](super::restart_on_panic) on a channel its runs share (a
/// panic fails only the batches it interrupted: their requests are answered with an error,
/// and the runtime settles them again), and started again whenever it is found stopped (it
/// ran on a tokio runtime that has shut down, say): one dead task never makes every later
/// request fail. A request whose task stopped between the look and the send is sent again,
/// once, to the task that look starts.
///
/// ```no_run
/// use stagedoor_jobs::BrokerError;
/// use stagedoor_jobs::kit::{Batchers, Reply, SharedReceiver, run_batches};
///
/// struct Ack {
///     id: u64,
///     reply: Reply<bool>,
/// }
///
/// async fn ack_loop(rx: SharedReceiver<Ack>) {
///     run_batches(rx, 256, 1, |a: &Ack| Some(a.id), |batch: Vec<Ack>| async move {
///         // ... one call to the backend for the whole batch, then each its answer:
///         for a in batch {
///             let _ = a.reply.send(Ok(true));
///         }
///     })
///     .await;
/// }
///
/// async fn ack(tasks: &Batchers<Ack>, queue: &str, id: u64) -> Result<bool, BrokerError> {
///     let start = || Ok((format!("acks of `{queue}`"), ack_loop));
///     tasks.call(queue, start, |reply| Ack { id, reply }).await
/// }
/// ```
pub struct Batchers<Req> {
    senders: Mutex<HashMap<String, mpsc::UnboundedSender<Req>>>,
}

impl<Req> Default for Batchers<Req> {
    fn default() -> Self {
        Self {
            senders: Mutex::new(HashMap::new()),
        }
    }
}

impl<Req> fmt::Debug for Batchers<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<String> = lock(&self.senders).keys().cloned().collect();
        f.debug_struct("Batchers").field("keys", &keys).finish()
    }
}

/// The error of a request whose task stopped before it answered.
fn stopped() -> BrokerError {
    BrokerError::Connection("the settlement task stopped".to_owned())
}

impl<Req: Send + 'static> Batchers<Req> {
    /// No task yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends the request `make` builds around its [`Reply`] to `key`'s task and waits for its
    /// answer. When the key has no running task, `start` names one (its name is the `task`
    /// label of `stagedoor_jobs_task_restarts_total` and of its logs) and gives the loop it
    /// runs on the shared channel (a loop that returns once the channel is closed and
    /// drained, such as [`run_batches`]); `start` is called at most twice, under the lock of
    /// the channels.
    ///
    /// # Errors
    ///
    /// What `start` returned; [`BrokerError::Connection`] when the task stopped before it
    /// answered (or twice before it took the request); else the request's own answer.
    pub async fn call<T, S, F, Fut>(
        &self,
        key: &str,
        mut start: S,
        make: impl FnOnce(Reply<T>) -> Req,
    ) -> Result<T, BrokerError>
    where
        S: FnMut() -> Result<(String, F), BrokerError>,
        F: FnMut(SharedReceiver<Req>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let mut req = make(reply);
        // A send fails only if the task stopped since `sender` looked: the second look starts
        // it again.
        for _ in 0..2 {
            match self.sender(key, &mut start)?.send(req) {
                Ok(()) => return answer.await.map_err(|_| stopped())?,
                Err(e) => req = e.0,
            }
        }
        Err(stopped())
    }

    /// The channel to `key`'s task, started by `start` when there is none or it stopped.
    fn sender<S, F, Fut>(
        &self,
        key: &str,
        start: &mut S,
    ) -> Result<mpsc::UnboundedSender<Req>, BrokerError>
    where
        S: FnMut() -> Result<(String, F), BrokerError>,
        F: FnMut(SharedReceiver<Req>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut senders = lock(&self.senders);
        if let Some(tx) = senders.get(key).filter(|tx| !tx.is_closed()) {
            return Ok(tx.clone());
        }
        let (task, run) = start()?;
        if senders.contains_key(key) {
            tracing::error!(task = %task, "the settlement task had stopped: starting it again");
        }
        let tx = spawn_consumer(task, run);
        senders.insert(key.to_owned(), tx.clone());
        Ok(tx)
    }
}

/// Runs batches of what comes on `rx` until it is closed and every batch ran: whatever queued
/// while the previous batches ran goes in the next one (at most `max` requests), with up to
/// `in_flight` batches running at once (`apply` answers each request of its batch).
///
/// `once_per` keeps apart requests about the same thing (two settlements of one row, one of
/// which lost its lease): a batch holds one request per key, and the others wait, in the order
/// they came, for the batches in flight to finish and go in the next one (with more from the
/// channel); nothing new is read meanwhile. A request whose key is `None` is never held back.
///
/// Runs inside its task: a panic of `apply` ends the loop, the batches in flight with it
/// (their replies dropped), and the supervisor starts it again on the same channel.
pub async fn run_batches<Req, K, F, Fut>(
    rx: SharedReceiver<Req>,
    max: usize,
    in_flight: usize,
    once_per: impl Fn(&Req) -> Option<K>,
    mut apply: F,
) where
    K: Eq + Hash,
    F: FnMut(Vec<Req>) -> Fut,
    Fut: Future<Output = ()>,
{
    let (max, in_flight) = (max.max(1), in_flight.max(1));
    let mut rx = rx.lock().await;
    let mut calls = FuturesUnordered::new();
    let mut later: Vec<Req> = Vec::new();
    let mut open = true;
    loop {
        if !later.is_empty() && calls.is_empty() {
            let mut batch = std::mem::take(&mut later);
            while batch.len() < max {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            let (now, next) = apart(batch, &once_per);
            later = next;
            calls.push(apply(now));
            continue;
        }
        if !open && calls.is_empty() {
            return;
        }
        let read = open && later.is_empty() && calls.len() < in_flight;
        let mut batch = Vec::new();
        tokio::select! {
            n = rx.recv_many(&mut batch, max), if read => {
                if n == 0 {
                    open = false;
                } else {
                    let (now, next) = apart(batch, &once_per);
                    later = next;
                    calls.push(apply(now));
                }
            }
            Some(()) = calls.next(), if !calls.is_empty() => {}
        }
    }
}

/// `batch` split into the first request of each key (and every one without a key), and the
/// others, each in the order they came.
fn apart<Req, K: Eq + Hash>(
    batch: Vec<Req>,
    once_per: &impl Fn(&Req) -> Option<K>,
) -> (Vec<Req>, Vec<Req>) {
    let mut seen = HashSet::with_capacity(batch.len());
    batch
        .into_iter()
        .partition(|r| once_per(r).is_none_or(|k| seen.insert(k)))
}

#[cfg(test)]
mod tests;
