//! A first run of the SQL backend on SQLite, with a hand-written table description.

use std::time::Duration;

use sqlx::sqlite::SqlitePoolOptions;
use stagedoor_jobs::inbox::{Column, ColumnType, Table};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::testing::Outcome;
use stagedoor_jobs_sqlx::SqlxBroker;

struct SendMail;
impl stagedoor_jobs::Inbox for SendMail {
    const TABLE: Table = Table {
        schema: None,
        name: "mail_jobs",
        id: Column {
            name: "id",
            generated: true,
            ty: ColumnType::Integer,
        },
        group: Some(Column {
            name: "name",
            generated: false,
            ty: ColumnType::Text,
        }),
        fifo: false,
        attempt: Some(Column {
            name: "attempt",
            generated: true,
            ty: ColumnType::Integer,
        }),
        retry_after: Some(Column {
            name: "retry_after",
            generated: false,
            ty: ColumnType::Timestamp,
        }),
        locked_until: Some(Column {
            name: "locked_until",
            generated: false,
            ty: ColumnType::Timestamp,
        }),
        payload: Column {
            name: "payload",
            generated: false,
            ty: ColumnType::Bytes,
        },
        enqueued_at: None,
        last_error: None,
        headers: None,
        columns: &[
            "id",
            "name",
            "attempt",
            "retry_after",
            "locked_until",
            "payload",
        ],
    };
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS mail_jobs (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    locked_until TEXT,
    payload BLOB NOT NULL
)";

async fn send(to: &String, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    match to.as_str() {
        "nobody" => HandlerOutcome::drop(),
        "down" => HandlerOutcome::retry(),
        "busy" if attempt < Some(2) => HandlerOutcome::retry_after(Duration::from_millis(200)),
        _ => HandlerOutcome::ack(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mailer_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("stagedoor-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/mail.db", dir.display());
    let _ = std::fs::remove_file(dir.join("mail.db"));
    let broker = SqlxBroker::from_url(&url, SqlitePoolOptions::new());
    let schema_url = format!("{url}?mode=rwc");
    let service = Service::new(AppInfo::new("mailer", "0.1.0"))
        .on_startup(async move |()| {
            use sqlx::Connection;
            let mut conn = sqlx::SqliteConnection::connect(&schema_url).await?;
            sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
            conn.close().await
        })
        .with_broker(broker.route::<SendMail>("emails"), |b| {
            b.include(Subscriber::new("emails", send))
                .max_attempts(nonzero!(3u32))
                .dead_letter("emails.dead");
        });
    let app = TestApp::start_live(service).await.expect("starts");
    for to in ["ada", "nobody", "down", "busy"] {
        app.publish(Job::new("emails", to).unwrap()).await.unwrap();
    }
    app.advance(Duration::from_millis(600)).await;
    let records = app.outcomes("send");
    for r in &records {
        println!("{} {} {:?}", r.job_id, r.attempt, r.outcome);
    }
    assert_eq!(
        records
            .iter()
            .filter(|r| r.outcome == Outcome::Acked)
            .count(),
        2
    );
    assert_eq!(
        records
            .iter()
            .filter(|r| r.outcome == Outcome::Dropped)
            .count(),
        1
    );
    let dead = app.dead_letters("emails.dead").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].attempts, 3);
    assert_eq!(dead[0].origin, "emails");
    let stats = app.stats("emails").await;
    assert_eq!((stats.ready, stats.pending, stats.delayed), (0, 0, 0));
    app.stop().await;
}
