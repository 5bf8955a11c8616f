//! `rediss://` end to end (feature `tls` of stagedoor-jobs-redis), against the Redis that
//! `scripts/test-all` starts serving TLS only (`REDIS_TLS_URL`), with a certificate authority
//! of its own (`STAGEDOOR_REDIS_TLS_CA`, a PEM file) and requiring a client certificate signed
//! by it (`STAGEDOOR_REDIS_TLS_CLIENT_CERT`, `_KEY`): a broker trusting that authority and
//! presenting that certificate runs jobs; one trusting only the machine's store, and one
//! presenting no certificate, are refused at start, in one line. (Certificates given for a
//! plain `redis://` URL are refused naming `rediss://`: a unit test of the crate.)

#[allow(dead_code)]
mod common_redis;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common_redis::{env_url, fresh_namespace};
use serde::{Deserialize, Serialize};
use stagedoor_jobs::ServiceError;
use stagedoor_jobs::prelude::*;
use stagedoor_jobs_redis::{RedisBroker, Tls};

#[derive(Debug, Serialize, Deserialize)]
struct Mail {
    n: u32,
}

type Seen = Arc<Mutex<Vec<u32>>>;

async fn send(mail: &Mail, Data(seen): Data<Seen>) -> HandlerOutcome {
    seen.lock().expect("lock").push(mail.n);
    HandlerOutcome::ack()
}

/// The PEM file whose path is in `var`.
fn pem(var: &str) -> Vec<u8> {
    let path = env_url(var);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{var} = {path}: {e}"))
}

/// The test authority and the client certificate the server requires.
fn tls() -> Tls {
    Tls::new()
        .root_cert(pem("STAGEDOOR_REDIS_TLS_CA"))
        .client_cert(
            pem("STAGEDOOR_REDIS_TLS_CLIENT_CERT"),
            pem("STAGEDOOR_REDIS_TLS_CLIENT_KEY"),
        )
}

/// Starting `broker`'s service fails; the error, which must be one line.
async fn refused(broker: RedisBroker) -> String {
    let seen = Seen::default();
    let err =
        match tokio::time::timeout(Duration::from_secs(60), service(broker, &seen).start()).await {
            Ok(Ok(_)) => panic!("the server must refuse this broker"),
            Ok(Err(e)) => e,
            Err(_) => panic!("start neither failed nor succeeded within 60 s"),
        };
    let text = err.to_string();
    assert!(matches!(err, ServiceError::Connect { .. }), "{err:?}");
    assert!(!text.contains('\n'), "one line: {text:?}");
    text
}

fn service(broker: RedisBroker, seen: &Seen) -> Service {
    Service::new(AppInfo::new("tls", "0.1.0"))
        .state(Arc::clone(seen))
        .with_broker(broker, |b| {
            b.include(Subscriber::new("emails", send).name("send"))
                .max_attempts(nonzero!(3u32))
                .dead_letter("emails:dead");
        })
}

#[ignore = "needs a Redis with TLS: run scripts/test-all"]
#[tokio::test]
async fn jobs_run_over_tls_with_a_private_authority() {
    let broker = RedisBroker::from_url_with_tls(env_url("REDIS_TLS_URL"), tls())
        .namespace(fresh_namespace("tls-"));
    let seen = Seen::default();
    let running = service(broker, &seen)
        .start()
        .await
        .expect("starts over TLS");
    for n in 0..20 {
        running
            .publish(Job::new("emails", &Mail { n }).expect("encodes"))
            .await
            .expect("publish over TLS");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.lock().expect("lock").len() < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "20 jobs within 30 s: {:?}",
            seen.lock()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut got = seen.lock().expect("lock").clone();
    got.sort_unstable();
    assert_eq!(got, (0..20).collect::<Vec<_>>(), "each job once");
    running.shutdown().await;
}

#[ignore = "needs a Redis with TLS: run scripts/test-all"]
#[tokio::test]
async fn an_untrusted_server_certificate_fails_start_in_one_line() {
    // The machine's store does not hold the test authority.
    let text =
        refused(RedisBroker::from_url(env_url("REDIS_TLS_URL")).namespace(fresh_namespace("tls-")))
            .await;
    assert!(
        text.to_lowercase().contains("certificate"),
        "says why: {text}"
    );
}

#[ignore = "needs a Redis with TLS: run scripts/test-all"]
#[tokio::test]
async fn no_client_certificate_fails_start_in_one_line() {
    let trusting = Tls::new().root_cert(pem("STAGEDOOR_REDIS_TLS_CA"));
    let text = refused(
        RedisBroker::from_url_with_tls(env_url("REDIS_TLS_URL"), trusting)
            .namespace(fresh_namespace("tls-")),
    )
    .await;
    assert!(
        text.contains("rediss://127.0.0.1"),
        "names the server: {text}"
    );
}
