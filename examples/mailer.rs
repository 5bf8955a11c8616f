//! Seed 002's mailer: emails in an SQL table with `#[derive(Inbox)]`, a subscriber that sends
//! them through a (simulated) provider, retries now or later, a cap of five deliveries and a
//! dead-letter group read by `review`.
//!
//! `cargo run --example mailer` runs it on an SQLite file in a temporary folder, with no server;
//! with `DATABASE_URL=postgres://...` it runs on Postgres.

use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;
use stagedoor_jobs::RouteBuilder;
use stagedoor_jobs::broker::Broker;
use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs_sqlx::SqlxRoute;
use stagedoor_jobs_sqlx::prelude::*;

const SQLITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS mail_jobs (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    locked_until TEXT,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS mail_jobs_due ON mail_jobs (name, retry_after, id);";

const POSTGRES_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS mail_jobs (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL,
    attempt SMALLINT NOT NULL DEFAULT 1,
    retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_until TIMESTAMPTZ,
    payload BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS mail_jobs_due ON mail_jobs (name, retry_after, id);";

/// One row of `mail_jobs`; `name` is the queue the row waits in.
#[derive(Inbox)]
#[inbox(table = "mail_jobs")]
#[allow(dead_code)]
struct SendMail {
    #[field(id, generated)]
    id: i64,
    #[field(group)]
    name: String,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

/// An email to send.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Mail {
    /// The address.
    pub to: String,
    /// The subject.
    pub subject: String,
}

/// How the provider refuses an email.
enum Refusal {
    /// Its rate limit is spent: a retry right now would be refused again.
    Busy,
    /// It did not answer: the next attempt may reach it.
    Unavailable,
    /// The mailbox does not exist: every attempt gets the same answer.
    Rejected,
}

/// The simulated provider: `busy@` is refused twice then accepted, `down@` never answers,
/// `nobody@` does not exist, anything else is sent.
async fn deliver(mail: &Mail, attempt: u32) -> Result<(), Refusal> {
    match mail.to.split('@').next().unwrap_or_default() {
        "busy" if attempt <= 2 => Err(Refusal::Busy),
        "down" => Err(Refusal::Unavailable),
        "nobody" => Err(Refusal::Rejected),
        _ => Ok(()),
    }
}

/// How much longer each attempt waits after the provider said it was busy.
const BACKOFF: Duration = Duration::from_secs(1);

#[subscriber(InboxQueue::<SendMail>::new("emails"))]
async fn send(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    let attempt = attempt.unwrap_or(1);
    match deliver(mail, attempt).await {
        Ok(()) => {
            println!("sent      {:<24} attempt {attempt}", mail.to);
            HandlerOutcome::ack()
        }
        // The provider's rate limit is spent: a retry right now would be refused again.
        Err(Refusal::Busy) => {
            let wait = BACKOFF * attempt;
            println!(
                "busy      {:<24} attempt {attempt}: retry after {wait:?}",
                mail.to
            );
            HandlerOutcome::retry_after(wait)
        }
        // The provider did not answer: the next attempt may reach it.
        Err(Refusal::Unavailable) => {
            println!("no answer {:<24} attempt {attempt}: retry now", mail.to);
            HandlerOutcome::retry()
        }
        // The mailbox does not exist: every attempt gets the same answer.
        Err(Refusal::Rejected) => {
            tracing::warn!(to = %mail.to, "address rejected, dropped");
            println!(
                "dropped   {:<24} attempt {attempt}: address rejected",
                mail.to
            );
            HandlerOutcome::drop()
        }
    }
}

/// Counts the dead letters `review` read (the example's summary prints it).
static REVIEWED: AtomicU32 = AtomicU32::new(0);

#[subscriber(InboxQueue::<SendMail>::new("emails.dead"))]
async fn review(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    tracing::error!(to = %mail.to, ?attempt, "email not sent, needs a person");
    println!(
        "reviewed  {:<24} dead letter: not sent, needs a person",
        mail.to
    );
    REVIEWED.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::ack()
}

/// The subscriptions, the same on every database.
fn mount<B: Broker>(b: &mut RouteBuilder<B>)
where
    InboxQueue<SendMail>: stagedoor_jobs::QueueFor<B>,
{
    // Five deliveries, the first included; the fifth failure moves the row into the
    // `emails.dead` group.
    b.include(send)
        .max_attempts(nonzero!(5u32))
        .dead_letter("emails.dead");
    b.include(review);
}

/// The mailer's route: the broker and its table, on whichever database `url` names.
enum Route {
    Sqlite(SqlxRoute<sqlx::Sqlite, SendMail>),
    Postgres(SqlxRoute<sqlx::Postgres, SendMail>),
}

impl Route {
    async fn publish(
        &self,
        job: Job,
    ) -> Result<stagedoor_jobs::Published, stagedoor_jobs::BrokerError> {
        match self {
            Route::Sqlite(r) => r.publish(job).await,
            Route::Postgres(r) => r.publish(job).await,
        }
    }

    async fn stats(
        &self,
        queue: &str,
    ) -> Result<stagedoor_jobs::QueueStats, stagedoor_jobs::BrokerError> {
        match self {
            Route::Sqlite(r) => r.stats(queue).await,
            Route::Postgres(r) => r.stats(queue).await,
        }
    }
}

/// The service on the database `url` names, and its route for publishing.
fn service(url: &str) -> (Service, Route) {
    let schema_url = url.to_owned();
    let app = Service::new(AppInfo::new("mailer", "0.1.0"));
    if url.starts_with("postgres") {
        // Nothing connects here: the broker builds its pool when the service starts.
        let route = SqlxBroker::from_url(url, PgPoolOptions::new()).route::<SendMail>("emails");
        let service = app
            // The table, created before the subscription checks it.
            .on_startup(async move |()| {
                let mut conn = sqlx::PgConnection::connect(&schema_url).await?;
                sqlx::raw_sql(POSTGRES_SCHEMA).execute(&mut conn).await?;
                conn.close().await
            })
            .with_broker(route.clone(), mount);
        (service, Route::Postgres(route))
    } else {
        let route = SqlxBroker::from_url(url, SqlitePoolOptions::new()).route::<SendMail>("emails");
        let service = app
            .on_startup(async move |()| {
                let mut conn = sqlx::SqliteConnection::connect(&schema_url).await?;
                sqlx::raw_sql(SQLITE_SCHEMA).execute(&mut conn).await?;
                conn.close().await
            })
            .with_broker(route.clone(), mount);
        (service, Route::Sqlite(route))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let (url, _dir) = match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => (url, None),
        _ => {
            let dir = std::env::temp_dir().join(format!("stagedoor-mailer-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let url = format!("sqlite://{}?mode=rwc", dir.join("mail.db").display());
            (url, Some(TempDir(dir)))
        }
    };
    println!(
        "mailer on {}",
        if url.starts_with("postgres") {
            "Postgres"
        } else {
            "SQLite"
        }
    );
    let (service, route) = service(&url);
    let running = service.start().await?;

    let addresses = [
        "ada@example.com",
        "busy@example.com",
        "down@example.com",
        "nobody@example.com",
        "grace@example.com",
    ];
    for to in addresses {
        let mail = Mail {
            to: to.to_owned(),
            subject: "Your tickets for Friday".to_owned(),
        };
        route.publish(Job::new("emails", &mail)?).await?;
    }

    // Until every email has settled: nothing left in `emails`, and the dead letters reviewed.
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (main, dead) = (
            route.stats("emails").await?,
            route.stats("emails.dead").await?,
        );
        let busy =
            main.ready + main.pending + main.delayed + dead.ready + dead.pending + dead.delayed;
        if busy == 0 {
            break;
        }
    }
    running.shutdown().await;
    println!(
        "{} emails published, {} reviewed as dead letters",
        addresses.len(),
        REVIEWED.load(Ordering::SeqCst)
    );
    Ok(())
}

/// Removes the example's SQLite folder at the end.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    //! Seed 002's Testing section: the harness publishes as the service's own publisher does.
    use super::*;
    use stagedoor_jobs::testing::Outcome;

    fn sqlite_url(tag: &str) -> (String, TempDir) {
        let dir = std::env::temp_dir().join(format!(
            "stagedoor-mailer-test-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let url = format!("sqlite://{}?mode=rwc", dir.join("mail.db").display());
        (url, TempDir(dir))
    }

    fn mail(to: &str) -> Job {
        Job::new(
            "emails",
            &Mail {
                to: to.to_owned(),
                subject: "s".to_owned(),
            },
        )
        .expect("encode")
    }

    /// A rejected address is dropped at once: on `TestApp::start`'s paused clock the publish
    /// returns once the job has settled, so its outcome is there to read (seed 002's guide).
    /// The handler saw the id the publish returned: the row id the database generated.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rejected_address_is_dropped_at_once() {
        let (url, _dir) = sqlite_url("rejected");
        let (service, _) = service(&url);
        let app = TestApp::start(service).await.expect("start");
        let published = app
            .publish(mail("nobody@example.com"))
            .await
            .expect("publish");
        let got: Vec<_> = app
            .outcomes("send")
            .into_iter()
            .map(|r| (r.job_id, r.attempt, r.outcome))
            .collect();
        assert_eq!(got, [(published.id().clone(), 1, Outcome::Dropped)]);
        assert_eq!(published.id().as_str(), "1", "the row id");
        assert!(app.dead_letters("emails.dead").await.is_empty());
        app.stop().await;
    }

    /// A busy provider: the row waits `attempt` seconds each time, on the real clock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_provider_is_retried_later() {
        let (url, _dir) = sqlite_url("busy");
        let (service, _) = service(&url);
        let app = TestApp::start_live(service).await.expect("start");
        app.publish(mail("busy@example.com"))
            .await
            .expect("publish");
        app.drain().await;
        app.advance(Duration::from_millis(3_300)).await;
        let got: Vec<_> = app
            .outcomes("send")
            .into_iter()
            .map(|r| (r.attempt, r.outcome))
            .collect();
        assert!(
            matches!(&got[..], [
            (1, Outcome::Retried { delay: d1, .. }),
            (2, Outcome::Retried { delay: d2, .. }),
            (3, Outcome::Acked),
        ] if *d1 == BACKOFF && *d2 == BACKOFF * 2),
            "{got:?}"
        );
        app.stop().await;
    }

    /// An unanswered email spends its five deliveries and lands in `emails.dead`, payload and
    /// attempt as they were, where `review` reads it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unanswered_email_reaches_the_dead_letter_group() {
        let (url, _dir) = sqlite_url("down");
        let (service, _) = service(&url);
        let app = TestApp::start_live(service).await.expect("start");
        app.publish(mail("down@example.com"))
            .await
            .expect("publish");
        app.drain().await;
        let sent: Vec<u32> = app.outcomes("send").iter().map(|r| r.attempt).collect();
        assert_eq!(sent, [1, 2, 3, 4, 5]);
        assert!(
            matches!(app.outcomes("send")[4].outcome, Outcome::DeadLettered { ref target, .. } if target == "emails.dead")
        );
        let reviewed = app.outcomes("review");
        assert_eq!(reviewed.len(), 1, "{reviewed:?}");
        assert_eq!(reviewed[0].outcome, Outcome::Acked);
        app.stop().await;
    }
}
