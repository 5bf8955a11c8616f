//! Many extractors after the message, the state one included.
use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[derive(Clone)]
struct Provider;

#[subscriber("emails")]
async fn send(
    mail: &Mail,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(id): Ctx<keys::JobId>,
    Ctx(kind): Ctx<keys::Kind>,
    Ctx(enqueued_at): Ctx<keys::EnqueuedAt>,
    Ctx(request_id): Ctx<keys::RequestId>,
    Data(provider): Data<Provider>,
) -> HandlerOutcome {
    let _ = (
        &mail.to,
        attempt,
        id,
        kind,
        enqueued_at,
        request_id,
        provider,
    );
    HandlerOutcome::ack()
}

fn main() {
    let _ = Service::new(AppInfo::new("t", "0"))
        .state(Provider)
        .with_broker(MemoryBroker::new(), |b| {
            b.include(send);
        });
}
