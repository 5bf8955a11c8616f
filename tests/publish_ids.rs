//! One id per job, on every SQL table layout (issue 12, items 6 and 8): the id `publish`
//! returns is the id the handler sees (`Ctx<keys::JobId>`), the harness records and the dead
//! letter keeps, whether the database generates the row id or the publisher mints it, with or
//! without a headers column, in the group form and the table form of dead letters; and a
//! publish tells which jobs it stored.
//!
//! Each behaviour runs on SQLite (a fresh file) and Postgres (a fresh schema of
//! `DATABASE_URL`; a missing URL is a failure). The backend-neutral rows (every backend,
//! Redis and memory included) are in the conformance suite:
//! `published_id_is_the_handlers_and_the_dead_letters`,
//! `duplicate_publishes_are_reported_not_stored`,
//! `paused_publish_returns_once_the_job_has_settled`.

mod common;

use std::sync::{Arc, Mutex};

use common::{Db, Sql, ddl};
use serde::{Deserialize, Serialize};
use stagedoor_jobs::{Data, DeadSelector, Publish, Published};
use stagedoor_jobs_sqlx::prelude::*;

/// The group-form tables: `{id}` is filled per database (an integer key the database fills).
const GROUP_DDL: &str = "
CREATE TABLE row_id_jobs (id {id}, name TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,
    retry_after {time} NOT NULL, locked_until {time}, payload {bytes} NOT NULL);
CREATE TABLE row_id_headers_jobs (id {id}, name TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,
    retry_after {time} NOT NULL, locked_until {time}, payload {bytes} NOT NULL, headers TEXT);
CREATE TABLE text_id_jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,
    retry_after {time} NOT NULL, locked_until {time}, payload {bytes} NOT NULL);
CREATE TABLE plain_row_id_jobs (id {serial}, attempt INTEGER NOT NULL DEFAULT 1,
    retry_after {time} NOT NULL, locked_until {time}, payload {bytes} NOT NULL);
CREATE TABLE plain_row_id_dead (id {serial}, attempt INTEGER NOT NULL DEFAULT 1,
    retry_after {time} NOT NULL, locked_until {time}, payload {bytes} NOT NULL);
";

/// The README's mailer table: the database generates the id, no headers column.
#[derive(Inbox)]
#[inbox(table = "row_id_jobs")]
#[allow(dead_code)]
struct RowId {
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

/// A generated id and a headers column (which keeps the envelope's id).
#[derive(Inbox)]
#[inbox(table = "row_id_headers_jobs")]
#[allow(dead_code)]
struct RowIdHeaders {
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
    #[field(headers)]
    headers: Option<String>,
}

/// A text id the publisher mints (the job id is the row id).
#[derive(Inbox)]
#[inbox(table = "text_id_jobs")]
#[allow(dead_code)]
struct TextId {
    #[field(id)]
    id: String,
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

/// No group column, a generated id, no headers: dead letters move to `plain_row_id_dead`.
#[derive(Inbox)]
#[inbox(table = "plain_row_id_jobs")]
#[allow(dead_code)]
struct PlainRowId {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Msg {
    n: u64,
}

fn job(queue: &str, n: u64) -> Job {
    Job::new(queue, &Msg { n }).expect("encodes")
}

/// What the handler saw: (message, attempt, job id).
type Seen = Arc<Mutex<Vec<(u64, u32, JobId)>>>;

/// Fails every attempt, recording the job id it sees.
async fn fails(
    msg: &Msg,
    Data(seen): Data<Seen>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(id): Ctx<keys::JobId>,
) -> Result<(), std::io::Error> {
    seen.lock()
        .expect("lock")
        .push((msg.n, attempt.unwrap_or(0), id));
    Err(std::io::Error::other("the provider is down"))
}

/// Publishes job 1 with `app.publish`, jobs 2 and 3 in one batch through the route
/// (`publish_jobs`: the multi-row path), each failing twice into `dead`; then checks that each
/// job's id is the same everywhere: what publish returned, what every attempt's handler saw,
/// what the harness recorded, what the dead letter keeps (and selects it by).
async fn one_id_per_job<D: Db, R: Inbox>(tag: &str, queue: &'static str, dead: &str) {
    let db = D::fresh(tag, &ddl::<D>(GROUP_DDL)).await;
    let route = D::route::<R>(&db.broker(), queue);
    let seen: Seen = Arc::default();
    let dead_letter = dead.to_owned();
    let service = Service::new(AppInfo::new("ids", "0.1.0"))
        .state(Arc::clone(&seen))
        .with_broker(route.clone(), |b| {
            b.include(Subscriber::new(queue, fails).name("fails"))
                .max_attempts(nonzero!(2u32))
                .dead_letter(dead_letter);
        });
    let app = TestApp::start_live(service).await.expect("start");
    let first = app.publish(job(queue, 1)).await.expect("publish");
    route.connect().await.expect("connect");
    let batch = route
        .publish_jobs([job(queue, 2), job(queue, 3)])
        .await
        .expect("publish_jobs");
    let published: Vec<Published> = std::iter::once(first).chain(batch).collect();
    assert!(published.iter().all(Published::is_stored), "{published:?}");
    app.drain().await;

    let seen = seen.lock().expect("lock").clone();
    let letters = app.dead_letters(dead).await;
    for (n, p) in (1..=3).zip(&published) {
        let id = p.id();
        let handler: Vec<&JobId> = seen.iter().filter(|s| s.0 == n).map(|s| &s.2).collect();
        assert_eq!(
            handler,
            [id, id],
            "job {n}: each attempt's handler sees the id publish returned ({}, {tag})",
            D::NAME
        );
        let records = app
            .outcomes("fails")
            .iter()
            .filter(|r| r.job_id == *id)
            .count();
        assert_eq!(records, 2, "job {n}: the harness records its id");
        let letter: Vec<_> = letters
            .iter()
            .filter(|d| serde_json::from_slice::<Msg>(d.envelope.payload()).is_ok_and(|m| m.n == n))
            .collect();
        assert!(
            matches!(&letter[..], [d] if d.envelope.id() == id),
            "job {n}: the dead letter keeps the id publish returned {id}: {letters:?}"
        );
        assert!(DeadSelector::Id(id.to_string()).matches(letter[0]));
    }
    let ids: std::collections::HashSet<&JobId> = published.iter().map(Published::id).collect();
    assert_eq!(ids.len(), 3, "three jobs, three ids: {published:?}");
    app.stop().await;
}

/// The README's mailer table (generated id, no headers): the job's id is its row id, and
/// publish returns it (it returned a UUID the handler never saw).
async fn generated_id_without_headers<D: Db>() {
    one_id_per_job::<D, RowId>("row_id", "emails", "emails.dead").await;
}

/// A generated id with a headers column: the envelope's id is kept there.
async fn generated_id_with_headers<D: Db>() {
    one_id_per_job::<D, RowIdHeaders>("row_id_headers", "emails", "emails.dead").await;
}

/// A text id the publisher mints: the row id is the job id.
async fn publisher_minted_text_id<D: Db>() {
    one_id_per_job::<D, TextId>("text_id", "emails", "emails.dead").await;
}

/// No group column, a generated id, no headers: the dead letter moves to another table with
/// its row id, which is the job's id.
async fn table_form_generated_id<D: Db>() {
    one_id_per_job::<D, PlainRowId>("plain_row_id", "plain_row_id_jobs", "plain_row_id_dead").await;
}

/// A publish tells which jobs it stored, through the route's own API too: a text id already in
/// the table is not stored again (`publish`, `publish_in`, a batch with the id twice), and the
/// job runs once.
async fn route_reports_duplicates<D: Db>() {
    let db = D::fresh("dup_route", &ddl::<D>(GROUP_DDL)).await;
    let route = D::route::<TextId>(&db.broker(), "emails");
    route.connect().await.expect("connect");
    let id = JobId::from_string("invoice-42");
    let first = route
        .publish_job(job("emails", 1).id(id.clone()))
        .await
        .expect("publish");
    let again = route
        .publish_job(job("emails", 2).id(id.clone()))
        .await
        .expect("publish a known id");
    assert_eq!((first.id(), first.is_stored()), (&id, true));
    assert_eq!(
        (again.id(), again.is_stored()),
        (&id, false),
        "already there"
    );
    let other = JobId::from_string("invoice-43");
    let batch: Vec<(JobId, bool)> = route
        .publish_jobs([
            job("emails", 3).id(other.clone()),
            job("emails", 4).id(id.clone()),
            job("emails", 5).id(other.clone()),
        ])
        .await
        .expect("publish_jobs")
        .into_iter()
        .map(|p| (p.id().clone(), p.is_stored()))
        .collect();
    assert_eq!(
        batch,
        [(other.clone(), true), (id.clone(), false), (other, false)]
    );
    let rows = db
        .rows("SELECT CAST(COUNT(*) AS BIGINT) FROM text_id_jobs".to_owned())
        .await;
    assert_eq!(rows[0][0].int(), 2, "two rows stored");
    let stats = route.stats("emails").await.expect("stats");
    assert_eq!(stats.ready, 2, "{stats:?}");
}

/// `route.publish_in(&mut tx, job)` reports a known id as not stored.
async fn publish_in_reports_duplicates_sqlite() {
    let db = common::Lite::fresh("dup_in", &ddl::<common::Lite>(GROUP_DDL)).await;
    let route = db.broker().route::<TextId>("emails");
    route.connect().await.expect("connect");
    let pool = route.broker().pool().expect("connected pool").clone();
    let id = JobId::from_string("receipt-7");
    let mut tx = pool.begin().await.expect("begin");
    let first = route
        .publish_in(&mut tx, job("emails", 1).id(id.clone()))
        .await
        .expect("publish_in");
    let again = route
        .publish_in(&mut tx, job("emails", 2).id(id.clone()))
        .await
        .expect("publish_in a known id");
    tx.commit().await.expect("commit");
    assert_eq!((first.id(), first.is_stored()), (&id, true));
    assert_eq!((again.id(), again.is_stored()), (&id, false));
}

/// On a generated-id table without headers, `publish_in` returns the new row's id.
async fn publish_in_returns_the_row_id_postgres() {
    let db = common::Pg::fresh("row_id_in", &ddl::<common::Pg>(GROUP_DDL)).await;
    let route = db.broker().route::<RowId>("emails");
    route.connect().await.expect("connect");
    let pool = route.broker().pool().expect("connected pool").clone();
    let mut tx = pool.begin().await.expect("begin");
    let a = route
        .publish_in(&mut tx, job("emails", 1))
        .await
        .expect("publish_in");
    let b = route
        .publish_in(&mut tx, job("emails", 2))
        .await
        .expect("publish_in");
    tx.commit().await.expect("commit");
    let rows = db
        .rows("SELECT CAST(id AS TEXT) FROM row_id_jobs ORDER BY id".to_owned())
        .await;
    let stored: Vec<String> = rows.iter().filter_map(|r| r[0].text()).collect();
    assert_eq!(
        stored,
        [a.id().to_string(), b.id().to_string()],
        "publish_in returns the row ids"
    );
    assert!(a.is_stored() && b.is_stored());
}

/// A batch published to the README's mailer table (a generated id, no headers) goes in as
/// multi-row inserts, and each job is still told its own row's id: 1,300 jobs in one call
/// (chunks of 512, 512, 256 and 20) and two publishers of 600 at once (their ids interleave
/// in the sequence), every returned id is the row holding that job's payload.
async fn batch_ids_are_matched_to_their_rows<D: Db>() {
    let db = D::fresh("batch_ids", &ddl::<D>(GROUP_DDL)).await;
    let route = D::route::<RowId>(&db.broker(), "emails");
    route.connect().await.expect("connect");
    let publish = |from: u64, n: u64| {
        let route = route.clone();
        async move {
            let jobs: Vec<Job> = (from..from + n).map(|i| job("emails", i)).collect();
            let out = route.publish_jobs(jobs).await.expect("publish_jobs");
            (from..from + n).zip(out).collect::<Vec<(u64, Published)>>()
        }
    };
    let mut published = publish(0, 1_300).await;
    let (a, b) = tokio::join!(publish(10_000, 600), publish(20_000, 600));
    published.extend(a);
    published.extend(b);
    let rows = db
        .rows("SELECT CAST(id AS TEXT), payload FROM row_id_jobs".to_owned())
        .await;
    let stored: std::collections::HashMap<String, u64> = rows
        .iter()
        .map(|r| {
            let id = r[0].text().expect("an id");
            let msg: Msg = serde_json::from_slice(&r[1].bytes()).expect("a payload");
            (id, msg.n)
        })
        .collect();
    assert_eq!(stored.len(), 2_500, "every job stored once");
    for (n, p) in &published {
        assert!(p.is_stored(), "{p:?}");
        assert_eq!(
            stored.get(p.id().as_str()),
            Some(n),
            "job {n} was told id {}, the row of another job ({})",
            p.id(),
            D::NAME
        );
    }
}

/// A generated id that does not grow in row order (a sequence counting down): the multi-row
/// insert's ids cannot tell the rows apart, so the batch is undone and inserted one row per
/// statement, and every job is still told its own row's id; nothing is stored twice.
async fn batch_ids_fall_back_when_ids_count_down_postgres() {
    let ddl = ddl::<common::Pg>(GROUP_DDL).replace(
        "CREATE TABLE row_id_jobs (id {id},"
            .replace("{id}", common::Pg::AUTO_ID)
            .as_str(),
        "CREATE SEQUENCE down_ids INCREMENT BY -1 START WITH 1000000 MAXVALUE 1000000;
         CREATE TABLE row_id_jobs (id BIGINT PRIMARY KEY DEFAULT nextval('down_ids'),",
    );
    assert!(
        ddl.contains("down_ids"),
        "the table's id counts down: {ddl}"
    );
    let db = common::Pg::fresh("batch_down", &ddl).await;
    let route = db.broker().route::<RowId>("emails");
    route.connect().await.expect("connect");
    for round in 0..2_u64 {
        let jobs: Vec<Job> = (0..40).map(|i| job("emails", 100 * round + i)).collect();
        let out = route.publish_jobs(jobs).await.expect("publish_jobs");
        let rows = db
            .rows("SELECT CAST(id AS TEXT), payload FROM row_id_jobs".to_owned())
            .await;
        let stored: std::collections::HashMap<String, u64> = rows
            .iter()
            .map(|r| {
                let msg: Msg = serde_json::from_slice(&r[1].bytes()).expect("a payload");
                (r[0].text().expect("an id"), msg.n)
            })
            .collect();
        assert_eq!(
            stored.len(),
            40 * (round as usize + 1),
            "nothing stored twice"
        );
        for (i, p) in (0..40).zip(&out) {
            assert_eq!(
                stored.get(p.id().as_str()),
                Some(&(100 * round + i)),
                "round {round}: job {i} is told its own row's id"
            );
        }
    }
}

/// A unique job published in the caller's transaction takes its key in that transaction
/// (issue 29, item 4): a second job of the key, in a later transaction or through the route's
/// own publish, is not stored and is told the holder's id; a transaction rolled back frees
/// its job's key with it.
async fn unique_jobs_published_in_a_transaction_are_unique<D: Db>() {
    let db = D::fresh("uniq_in", &ddl::<D>(GROUP_DDL)).await;
    let route = D::route::<RowIdHeaders>(&db.broker(), "emails");
    route.connect().await.expect("connect");
    let window = std::time::Duration::from_secs(60);
    let count = |db: D| async move {
        let rows = db
            .rows("SELECT CAST(COUNT(*) AS BIGINT) FROM row_id_headers_jobs".to_owned())
            .await;
        rows[0][0].int()
    };

    let first = db
        .publish_in(&route, job("emails", 1).unique("order-7", window), true)
        .await;
    let second = db
        .publish_in(&route, job("emails", 2).unique("order-7", window), true)
        .await;
    assert_eq!(
        second, first,
        "a second job of the key, in its own transaction, is the first one's"
    );
    let outside = D::publish(&route, job("emails", 3).unique("order-7", window)).await;
    assert_eq!(outside, first, "the route's own publish sees the key taken");
    assert_eq!(count(db.clone()).await, 1, "one row for the key");

    // Rolled back: the job and its key are gone, and the key takes the next job.
    let rolled = db
        .publish_in(&route, job("emails", 4).unique("order-8", window), false)
        .await;
    let kept = db
        .publish_in(&route, job("emails", 5).unique("order-8", window), true)
        .await;
    assert_ne!(kept, rolled, "the key rolled back with its transaction");
    assert_eq!(
        count(db.clone()).await,
        2,
        "the rolled-back job is not stored"
    );
}

use common::on_both;
use stagedoor_jobs::broker::Inspect;

on_both!(
    batch_ids_are_matched_to_their_rows,
    generated_id_without_headers,
    generated_id_with_headers,
    publisher_minted_text_id,
    table_form_generated_id,
    route_reports_duplicates,
    unique_jobs_published_in_a_transaction_are_unique,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_in_reports_duplicates() {
    publish_in_reports_duplicates_sqlite().await;
}

#[ignore = "needs Postgres: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_in_returns_the_row_id() {
    publish_in_returns_the_row_id_postgres().await;
}

#[ignore = "needs Postgres: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_ids_fall_back_when_ids_count_down() {
    batch_ids_fall_back_when_ids_count_down_postgres().await;
}
