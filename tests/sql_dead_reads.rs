//! Reads sized by the request, not by the queue (issue 29, items 5 and 6): a dead-letter
//! listing reads about as many rows as it returns, newest first as before; one dead letter by
//! its id, and a cancel, read the rows of that id only; asking about names of no table keeps
//! nothing in the route.
//!
//! The route counts the rows it reads from the database (`SqlxRoute::rows_read`), so a read of
//! the whole group shows. Each behaviour runs on SQLite (a fresh file) and Postgres (a fresh
//! schema of `DATABASE_URL`).

mod common;

use common::{ConfRow, Db, conf_ddl, ddl};
use stagedoor_jobs::broker::{Cancelled, DeadLetters, Inspect, Publish};
use stagedoor_jobs::inbox::{Column, ColumnType, Table};
use stagedoor_jobs::{DeadSelector, Inbox, Job, JobId};
use stagedoor_jobs_sqlx::{Dialect, SqlxRoute};

/// How many rows the group holds: far more than any read below may touch.
const ROWS: usize = 300;

fn jobs(queue: &str, kind: Option<&str>, n: usize) -> Vec<Job> {
    (0..n)
        .map(|i| {
            let job = Job::new(queue, &i).expect("encodes");
            match kind {
                Some(k) => job.kind(k),
                None => job,
            }
        })
        .collect()
}

fn ids(letters: &[stagedoor_jobs::DeadLetter]) -> Vec<String> {
    letters.iter().map(|d| d.id.clone()).collect()
}

/// A dead-letter group of 300 rows: a listing of 1, then of 50, reads no more rows than it
/// returns and returns the first rows of the whole listing, in its order; one dead letter by
/// its id reads that row only; a listing by kind stops once it has its rows.
async fn listings_read_the_rows_they_return<D: Db>()
where
    D::DB: Dialect,
{
    let db = D::fresh("deadpage", conf_ddl::<D>()).await;
    let route: SqlxRoute<D::DB, ConfRow> = db.broker().route::<ConfRow>("emails");
    route.connect().await.expect("connect");
    // Two kinds: the older half `old`, the newer half `new` (a listing is newest first).
    route
        .publish_jobs(jobs("emails.dead", Some("old"), ROWS / 2))
        .await
        .expect("publish");
    route
        .publish_jobs(jobs("emails.dead", Some("new"), ROWS / 2))
        .await
        .expect("publish");
    let all = route
        .dead_letters("emails.dead", &DeadSelector::All, usize::MAX)
        .await
        .expect("list all");
    assert_eq!(all.len(), ROWS);

    for limit in [1, 50] {
        let before = route.rows_read();
        let page = route
            .dead_letters("emails.dead", &DeadSelector::All, limit)
            .await
            .expect("list a page");
        let read = route.rows_read() - before;
        assert_eq!(
            ids(&page),
            ids(&all[..limit]),
            "the page is the listing's first {limit}"
        );
        assert!(
            read <= limit as u64,
            "a listing of {limit} read {read} rows of {ROWS}"
        );
    }

    let middle = &all[ROWS / 2 + 7];
    let before = route.rows_read();
    let found = route
        .dead_letters("emails.dead", &DeadSelector::Id(middle.id.clone()), 1)
        .await
        .expect("one by id");
    let read = route.rows_read() - before;
    assert_eq!(ids(&found), vec![middle.id.clone()]);
    assert!(read <= 1, "one dead letter by id read {read} rows");

    let before = route.rows_read();
    let old = route
        .dead_letters("emails.dead", &DeadSelector::Kind("old".to_owned()), 5)
        .await
        .expect("by kind");
    let read = route.rows_read() - before;
    let expected: Vec<String> = all
        .iter()
        .filter(|d| d.envelope.kind() == "old")
        .take(5)
        .map(|d| d.id.clone())
        .collect();
    assert_eq!(ids(&old), expected, "the newest five of the kind");
    assert!(
        read < ROWS as u64,
        "a listing of five by kind read the whole group ({read} rows)"
    );
}

/// A cancel of one waiting job of a queue of 300 reads the row of that job only, and removes it.
async fn a_cancel_reads_one_row<D: Db>()
where
    D::DB: Dialect,
{
    let db = D::fresh("cancelone", conf_ddl::<D>()).await;
    let route: SqlxRoute<D::DB, ConfRow> = db.broker().route::<ConfRow>("emails");
    route.connect().await.expect("connect");
    let published = route
        .publish_jobs(jobs("emails", None, ROWS))
        .await
        .expect("publish");
    let target = published[ROWS / 3].id().clone();
    let before = route.rows_read();
    let done = route.cancel("emails", &target).await.expect("cancel");
    let read = route.rows_read() - before;
    assert_eq!(done, Cancelled::Removed);
    assert!(read <= 1, "a cancel of one job read {read} rows of {ROWS}");
    let again = route.cancel("emails", &target).await.expect("cancel again");
    assert_eq!(again, Cancelled::NotFound);
    let missing = route
        .cancel("emails", &JobId::from_string("no-such-job"))
        .await
        .expect("cancel of an unknown id");
    assert_eq!(missing, Cancelled::NotFound);
    assert_eq!(
        route.stats("emails").await.expect("stats").ready,
        ROWS as u64 - 1
    );
}

/// A table without a group column: its dead letters are other tables.
struct Plain;
impl Inbox for Plain {
    const TABLE: Table = Table {
        schema: None,
        name: "plain_jobs",
        id: Column {
            name: "id",
            generated: true,
            ty: ColumnType::Integer,
        },
        group: None,
        fifo: false,
        attempt: None,
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
        priority: None,
        columns: &["id", "retry_after", "locked_until", "payload"],
    };
}

const PLAIN_DDL: &str = "
CREATE TABLE plain_jobs (id {id}, retry_after {time} NOT NULL, locked_until {time}, payload {bytes} NOT NULL);
CREATE TABLE plain_jobs_dead (id {id}, retry_after {time} NOT NULL, locked_until {time}, payload {bytes} NOT NULL);";

/// Asking about 10,000 names of no table (a dashboard's URLs, an operator's typos) is an error
/// naming the missing table each time, and keeps nothing; the dead-letter table that exists
/// is kept once.
async fn names_of_no_table_keep_nothing<D: Db>()
where
    D::DB: Dialect,
{
    let db = D::fresh("deadnames", &ddl::<D>(PLAIN_DDL)).await;
    let route: SqlxRoute<D::DB, Plain> = db.broker().route::<Plain>("plain");
    route.connect().await.expect("connect");
    for i in 0..10_000 {
        let name = format!("nowhere_{i}");
        let err = route
            .dead_letters(&name, &DeadSelector::All, 10)
            .await
            .expect_err("no such table");
        if i == 0 {
            assert!(
                err.to_string().contains(&format!("`{name}`")),
                "names the table: {err}"
            );
        }
    }
    assert_eq!(
        route.cached_dead_tables(),
        0,
        "names of no table are not kept"
    );
    for _ in 0..3 {
        let letters = route
            .dead_letters("plain_jobs_dead", &DeadSelector::All, 10)
            .await
            .expect("the dead table lists");
        assert!(letters.is_empty());
    }
    assert_eq!(route.cached_dead_tables(), 1, "the dead table is kept once");
}

/// How many rows a replay's or purge's walk may hold at once (its page).
const WALK_PAGE: u64 = 500;

/// A replay and a purge of 1,200 dead letters by kind, and of all of them, read a page at a
/// time (never the whole group in one read) and take exactly the selected rows; the oldest
/// dead letter (what the monitor names an incident by) is one row read.
async fn replay_and_purge_hold_a_page_at_a_time<D: Db>()
where
    D::DB: Dialect,
{
    const N: usize = 1_200;
    let db = D::fresh("deadwalk", conf_ddl::<D>()).await;
    let route: SqlxRoute<D::DB, ConfRow> = db.broker().route::<ConfRow>("emails");
    route.connect().await.expect("connect");
    for chunk in 0..N / 300 {
        let kind = if chunk % 2 == 0 { "a" } else { "b" };
        route
            .publish_jobs(jobs("emails.dead", Some(kind), 300))
            .await
            .expect("publish");
    }
    let all = route
        .dead_letters("emails.dead", &DeadSelector::All, usize::MAX)
        .await
        .expect("list all");
    assert_eq!(all.len(), N);

    let before = route.rows_read();
    let oldest = route
        .oldest_dead_letter("emails.dead")
        .await
        .expect("oldest")
        .expect("there is one");
    assert_eq!(
        oldest.id,
        all[N - 1].id,
        "the oldest is the one listed last"
    );
    assert_eq!(route.rows_read() - before, 1, "the oldest is one row read");

    route.take_largest_read();
    let report = route
        .replay("emails.dead", &DeadSelector::Kind("a".to_owned()))
        .await
        .expect("replay by kind");
    let largest = route.take_largest_read();
    assert!(
        largest <= WALK_PAGE,
        "a replay of {N} dead letters read {largest} rows at once"
    );
    assert_eq!(
        (report.replayed, report.skipped, report.failed),
        (600, 0, 0)
    );
    assert_eq!(route.dead_len("emails.dead").await.expect("len"), 600);
    let back = route.stats("emails").await.expect("stats");
    assert_eq!(back.ready, 600, "every replayed letter is back, once");

    let purged = route
        .purge("emails.dead", &DeadSelector::All)
        .await
        .expect("purge all");
    let largest = route.take_largest_read();
    assert!(
        largest <= WALK_PAGE,
        "a purge of {N} dead letters read {largest} rows at once"
    );
    assert_eq!(purged, 600);
    assert_eq!(route.dead_len("emails.dead").await.expect("len"), 0);
    assert_eq!(
        route.stats("emails").await.expect("stats").ready,
        600,
        "the purge touched no job of the queue"
    );
    assert!(
        route
            .oldest_dead_letter("emails.dead")
            .await
            .expect("oldest")
            .is_none()
    );
}

/// A replay of every dead letter while more are dead-lettered: every letter is either replayed
/// once or still dead, none twice, none lost.
async fn a_replay_while_letters_arrive_loses_and_repeats_nothing<D: Db>()
where
    D::DB: Dialect,
{
    let db = D::fresh("deadarrive", conf_ddl::<D>()).await;
    let route: SqlxRoute<D::DB, ConfRow> = db.broker().route::<ConfRow>("emails");
    route.connect().await.expect("connect");
    let tagged = |n: usize, from: usize| -> Vec<Job> {
        (from..from + n)
            .map(|i| Job::new("emails.dead", &i).expect("encodes"))
            .collect()
    };
    route.publish_jobs(tagged(1_100, 0)).await.expect("publish");
    let adder = {
        let route = route.clone();
        tokio::spawn(async move {
            for k in 0..10 {
                route
                    .publish_jobs(tagged(50, 10_000 + 50 * k))
                    .await
                    .expect("publish while replaying");
                tokio::task::yield_now().await;
            }
        })
    };
    let report = route
        .replay("emails.dead", &DeadSelector::All)
        .await
        .expect("replay all");
    adder.await.expect("adder");
    assert_eq!(report.failed, 0);
    let dead = route.dead_len("emails.dead").await.expect("len");
    let ready = route.stats("emails").await.expect("stats").ready;
    assert_eq!(ready, report.replayed, "each replayed letter is back once");
    assert_eq!(
        ready + dead,
        1_600,
        "every letter is replayed or still dead (replayed {ready}, dead {dead})"
    );
    assert!(
        report.replayed >= 1_100,
        "the letters there at the start are replayed"
    );
}

common::on_both!(
    replay_and_purge_hold_a_page_at_a_time,
    a_replay_while_letters_arrive_loses_and_repeats_nothing,
    listings_read_the_rows_they_return,
    a_cancel_reads_one_row,
    names_of_no_table_keep_nothing,
);
