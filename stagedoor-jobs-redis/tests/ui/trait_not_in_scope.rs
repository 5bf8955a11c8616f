// A program that calls the broker's trait methods without importing the traits: rustc must say
// which trait to import (not "method is private"), for each of them.
use stagedoor_jobs_redis::RedisBroker;

async fn probe(broker: &RedisBroker) {
    let _ = broker.connect().await;
    let _ = broker.stats("jobs").await;
    let _ = broker.dead_len("jobs:dead").await;
    let _ = broker
        .take_permits("pool", 3, &[], std::time::Duration::from_secs(1))
        .await;
    let _ = broker.workers().await;
}

fn main() {
    let broker = RedisBroker::from_url("redis://127.0.0.1/");
    let _ = probe(&broker);
}
