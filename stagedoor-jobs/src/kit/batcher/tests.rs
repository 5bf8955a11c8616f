use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;

/// A request: its key, and where to answer.
struct Req {
    key: u32,
    reply: Reply<u32>,
}

/// The batches `run_batches` made, as keys.
type Seen = Arc<Mutex<Vec<Vec<u32>>>>;

/// Queues `keys` on a channel, closes it, and runs `run_batches` over it.
async fn batches_of(keys: &[u32], max: usize, keyed: bool) -> (Vec<Vec<u32>>, Vec<u32>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut answers = Vec::new();
    for &key in keys {
        let (reply, answer) = oneshot::channel();
        let _ = tx.send(Req { key, reply });
        answers.push(answer);
    }
    drop(tx);
    let seen: Seen = Arc::default();
    let s = Arc::clone(&seen);
    let rx: SharedReceiver<Req> = Arc::new(tokio::sync::Mutex::new(rx));
    let once_per = move |r: &Req| keyed.then_some(r.key);
    run_batches(rx, max, 1, once_per, |batch: Vec<Req>| {
        lock(&s).push(batch.iter().map(|r| r.key).collect());
        async move {
            for r in batch {
                let _ = r.reply.send(Ok(r.key * 10));
            }
        }
    })
    .await;
    let mut got = Vec::new();
    for a in answers {
        got.push(a.await.ok().and_then(Result::ok).unwrap_or(0));
    }
    let seen = lock(&seen).clone();
    (seen, got)
}

#[tokio::test]
async fn what_queued_goes_in_batches_of_at_most_max_each_answered() {
    let (seen, got) = batches_of(&[1, 2, 3, 4, 5], 2, false).await;
    assert_eq!(seen, [vec![1, 2], vec![3, 4], vec![5]]);
    assert_eq!(got, [10, 20, 30, 40, 50]);
}

#[tokio::test]
async fn requests_of_one_key_go_in_successive_batches_in_order() {
    let (seen, got) = batches_of(&[1, 2, 1, 3, 1, 2], 8, true).await;
    assert_eq!(seen, [vec![1, 2, 3], vec![1, 2], vec![1]]);
    assert_eq!(got, [10, 20, 10, 30, 10, 20]);
}

#[tokio::test]
async fn two_batches_run_at_once_when_two_may_be_in_flight() {
    let (tx, rx) = mpsc::unbounded_channel::<Req>();
    let rx: SharedReceiver<Req> = Arc::new(tokio::sync::Mutex::new(rx));
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (r, m) = (Arc::clone(&running), Arc::clone(&most));
    let task = tokio::spawn(run_batches(
        rx,
        1,
        2,
        |_: &Req| None::<u32>,
        move |batch: Vec<Req>| {
            let (r, m) = (Arc::clone(&r), Arc::clone(&m));
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                r.fetch_sub(1, Ordering::SeqCst);
                for q in batch {
                    let _ = q.reply.send(Ok(q.key));
                }
            }
        },
    ));
    let mut answers = Vec::new();
    for key in 0..4 {
        let (reply, answer) = oneshot::channel();
        let _ = tx.send(Req { key, reply });
        answers.push(answer);
    }
    for a in answers {
        assert!(matches!(a.await, Ok(Ok(_))));
    }
    drop(tx);
    let _ = task.await;
    assert_eq!(most.load(Ordering::SeqCst), 2);
}

/// A task that answers one request, then returns (as one does whose runtime shut down).
async fn answer_one(rx: SharedReceiver<Req>) {
    let mut rx = rx.lock().await;
    if let Some(r) = rx.recv().await {
        let _ = r.reply.send(Ok(r.key + 1));
    }
}

#[tokio::test]
async fn a_task_found_stopped_is_started_again() {
    let tasks: Batchers<Req> = Batchers::new();
    let starts = AtomicUsize::new(0);
    for key in 0..3 {
        let start = || {
            starts.fetch_add(1, Ordering::SeqCst);
            Ok(("test answers".to_owned(), answer_one))
        };
        let mut got = tasks.call("q", start, |reply| Req { key, reply }).await;
        // The task may not have dropped its channel yet when the next call looks: that call
        // is answered by no one, and told so.
        while got.is_err() {
            tokio::task::yield_now().await;
            got = tasks.call("q", start, |reply| Req { key, reply }).await;
        }
        assert_eq!(got.ok(), Some(key + 1));
    }
    assert!(
        starts.load(Ordering::SeqCst) >= 3,
        "one start per stopped task"
    );
}

#[tokio::test]
async fn a_task_that_fails_to_start_fails_the_request() {
    let tasks: Batchers<Req> = Batchers::new();
    let start = || {
        Err::<(String, fn(SharedReceiver<Req>) -> std::future::Ready<()>), _>(
            BrokerError::NotConnected,
        )
    };
    let got = tasks.call("q", start, |reply| Req { key: 1, reply }).await;
    assert!(matches!(got, Err(BrokerError::NotConnected)), "{got:?}");
}

#[tokio::test(start_paused = true)]
async fn a_panic_fails_its_batch_and_the_task_goes_on() {
    let tasks: Batchers<Req> = Batchers::new();
    let start = || {
        Ok(("test panics".to_owned(), |rx: SharedReceiver<Req>| {
            run_batches(
                rx,
                8,
                1,
                |_: &Req| None::<u32>,
                |batch: Vec<Req>| async move {
                    for r in batch {
                        assert_ne!(r.key, 0, "injected");
                        let _ = r.reply.send(Ok(r.key));
                    }
                },
            )
        }))
    };
    let failed = tasks.call("q", start, |reply| Req { key: 0, reply }).await;
    assert!(
        matches!(failed, Err(BrokerError::Connection(_))),
        "{failed:?}"
    );
    let ok = tasks.call("q", start, |reply| Req { key: 7, reply }).await;
    assert_eq!(ok.ok(), Some(7), "restarted on the same channel");
}
