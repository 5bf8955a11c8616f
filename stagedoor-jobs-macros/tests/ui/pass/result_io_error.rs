//! `Result<(), E>` is a handler's result: `Ok(())` acks, `Err(e)` is a failed attempt.
use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Upload {
    path: String,
}

#[subscriber("uploads")]
async fn store(upload: &Upload) -> Result<(), std::io::Error> {
    std::fs::metadata(&upload.path)?;
    Ok(())
}

fn main() {
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(store);
    });
}
