//! Records on SQL (issue 34), on SQLite and Postgres, beyond the conformance rows:
//!
//! - a row of `stagedoor_records` edited by hand into what the backend never writes (a NULL
//!   value, a version below 1 or at the largest, an expiry that is not a time) is an error
//!   naming the key, never a panic; every other key keeps working, and a delete without an
//!   expected version clears the row;
//! - brokers of pools of their own racing on the very first creation of the table (and its
//!   index) all succeed;
//! - writers of overlapping keys, naming them in different orders, with keys created and
//!   deleted under them, neither deadlock nor lose an increment;
//! - records that ran out are deleted by later writes (the table does not grow for good); a
//!   call of more keys than one statement names (500) is written whole.
//!
//! Postgres reads `DATABASE_URL` (run under `scripts/test-all`); there a missing URL is a
//! failure; a plain `cargo test` without it lists the test as ignored.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{ConfRow, Db, conf_ddl, ddl, on_both};
use stagedoor_jobs::broker::{BrokerError, Inspect, RecordWrite, Records};

/// A connected route of a new broker (a pool of its own) on `db`.
async fn records<D: Db>(db: &D) -> D::Route<ConfRow>
where
    D::Route<ConfRow>: Records,
{
    let route = D::route::<ConfRow>(&db.broker(), "cf");
    route.connect().await.expect("connect the route");
    route
}

/// The value and version of record `key`.
async fn value<B: Records>(route: &B, key: &str) -> Option<(Vec<u8>, u64)> {
    route
        .read_record(key)
        .await
        .expect("read a record")
        .map(|r| (r.value.to_vec(), r.version))
}

/// `err` names the key, the table, the column and the fix.
fn names_the_row(err: &BrokerError, key: &str, column: &str) {
    let m = err.to_string();
    for part in [&format!("`{key}`"), "`stagedoor_records`", column, "delete"] {
        assert!(m.contains(part), "`{part}` is not in: {m}");
    }
}

/// The records' table as an operator might make it by hand, with a value that may be NULL.
const HAND_MADE: &str = "CREATE TABLE stagedoor_records (record_key TEXT PRIMARY KEY, value {bytes}, version BIGINT NOT NULL, expires_at {time});";

/// How many tables and indexes of `names` the database has (in the test's schema).
async fn objects<D: Db>(db: &D, names: &str) -> i64 {
    let sql = if D::NAME == "sqlite" {
        format!("SELECT count(*) FROM sqlite_master WHERE name IN ({names})")
    } else {
        format!(
            "SELECT CAST(count(*) AS BIGINT) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relname IN ({names})"
        )
    };
    db.rows(sql).await[0][0].int()
}

async fn hand_edited_rows_are_errors_naming_the_key<D: Db>()
where
    D::Route<ConfRow>: Records,
{
    let tables = format!("{}\n{}", conf_ddl::<D>(), ddl::<D>(HAND_MADE));
    let db = D::fresh("records_hand", &tables).await;
    let route = records(&db).await;
    let good = RecordWrite::put("good", "g");
    assert_eq!(route.write_records(&[good]).await.unwrap(), Some(vec![1]));
    let (bytes, junk_time) = if D::NAME == "sqlite" {
        ("X'6869'", "'soon'")
    } else {
        ("'\\x6869'::bytea", "'infinity'")
    };
    db.run(format!(
        "INSERT INTO stagedoor_records (record_key, value, version, expires_at) VALUES \
         ('null_value', NULL, 1, NULL), ('negative', {bytes}, -3, NULL), \
         ('largest', {bytes}, 9223372036854775807, NULL), ('junk_expiry', {bytes}, 1, {junk_time})"
    ))
    .await;
    let mut good_version = 1;
    let mut good_still_works = async |route: &D::Route<ConfRow>| {
        let next = RecordWrite::put("good", "g").if_version(good_version);
        good_version += 1;
        let written = route
            .write_records(&[next])
            .await
            .expect("write another key");
        assert_eq!(written, Some(vec![good_version]));
        assert_eq!(
            value(route, "good").await,
            Some((b"g".to_vec(), good_version))
        );
    };

    // A NULL value: an error to read; a write without reading it replaces it.
    let err = route
        .read_record("null_value")
        .await
        .expect_err("NULL value");
    names_the_row(&err, "null_value", "`value`");
    assert!(err.to_string().contains("NULL"), "{err}");
    good_still_works(&route).await;
    let put = RecordWrite::put("null_value", "x").if_version(1);
    assert_eq!(route.write_records(&[put]).await.unwrap(), Some(vec![2]));
    assert_eq!(value(&route, "null_value").await, Some((b"x".to_vec(), 2)));

    // A version below 1: an error to read and to write over; a plain delete clears it.
    let err = route.read_record("negative").await.expect_err("negative");
    names_the_row(&err, "negative", "`version`");
    assert!(err.to_string().contains("-3"), "{err}");
    for put in [
        RecordWrite::put("negative", "x"),
        RecordWrite::put("negative", "x").if_version(0),
    ] {
        let err = route.write_records(&[put]).await.expect_err("over -3");
        names_the_row(&err, "negative", "`version`");
    }
    // All or nothing holds with an error too: the good key of the call is not written.
    let both = [
        RecordWrite::put("good", "changed"),
        RecordWrite::put("negative", "x"),
    ];
    names_the_row(
        &route.write_records(&both).await.expect_err("one bad row"),
        "negative",
        "`version`",
    );
    good_still_works(&route).await;
    let delete = RecordWrite::delete("negative");
    assert_eq!(route.write_records(&[delete]).await.unwrap(), Some(vec![0]));
    assert_eq!(value(&route, "negative").await, None);
    let put = RecordWrite::put("negative", "y").if_version(0);
    assert_eq!(route.write_records(&[put]).await.unwrap(), Some(vec![1]));

    // The largest version reads, but has no next one.
    let largest = i64::MAX.unsigned_abs();
    assert_eq!(
        value(&route, "largest").await,
        Some((b"hi".to_vec(), largest))
    );
    let put = RecordWrite::put("largest", "x");
    let err = route.write_records(&[put]).await.expect_err("past i64");
    names_the_row(&err, "largest", "`version`");
    let stale = RecordWrite::put("largest", "x").if_version(0);
    assert_eq!(route.write_records(&[stale]).await.unwrap(), None);
    let delete = RecordWrite::delete("largest").if_version(largest);
    assert_eq!(route.write_records(&[delete]).await.unwrap(), Some(vec![0]));

    // An expiry that is not a time (SQLite: any text; Postgres: infinity).
    let err = route.read_record("junk_expiry").await.expect_err("junk");
    names_the_row(&err, "junk_expiry", "`expires_at`");
    let put = RecordWrite::put("junk_expiry", "x");
    let err = route.write_records(&[put]).await.expect_err("junk");
    names_the_row(&err, "junk_expiry", "`expires_at`");
    good_still_works(&route).await;
    let delete = RecordWrite::delete("junk_expiry");
    assert_eq!(route.write_records(&[delete]).await.unwrap(), Some(vec![0]));
    assert_eq!(value(&route, "junk_expiry").await, None);

    if D::NAME == "sqlite" {
        // SQLite columns hold any value: a version that is not an integer.
        db.run("INSERT INTO stagedoor_records VALUES ('real', X'00', 1e30, NULL)".to_owned())
            .await;
        let err = route.read_record("real").await.expect_err("a real");
        names_the_row(&err, "real", "`version`");
        good_still_works(&route).await;
    }
    assert_eq!(
        objects(&db, "'stagedoor_records_expiry'").await,
        1,
        "the index is added to a table made by hand"
    );
}

async fn brokers_racing_on_the_first_creation_all_succeed<D: Db>()
where
    D::Route<ConfRow>: Records,
{
    const BROKERS: usize = 4;
    for round in 0..3 {
        let db = D::fresh("records_race", conf_ddl::<D>()).await;
        let mut routes = Vec::new();
        for _ in 0..BROKERS {
            routes.push(records(&db).await);
        }
        let start = Arc::new(tokio::sync::Barrier::new(BROKERS));
        let mut tasks = Vec::new();
        for (i, route) in routes.into_iter().enumerate() {
            let start = Arc::clone(&start);
            tasks.push(tokio::spawn(async move {
                let key = format!("first_{i}");
                start.wait().await;
                // Half of them read first: a read creates the table too.
                if i % 2 == 0 {
                    assert_eq!(value(&route, &key).await, None);
                }
                let put = RecordWrite::put(key.clone(), "v").if_version(0);
                let written = route.write_records(&[put]).await;
                (key, written, route)
            }));
        }
        for t in tasks {
            let (key, written, route) = t.await.expect("a broker panicked");
            let written = written.unwrap_or_else(|e| panic!("round {round}, {key}: {e}"));
            assert_eq!(written, Some(vec![1]), "round {round}, {key}");
            assert_eq!(value(&route, &key).await, Some((b"v".to_vec(), 1)));
        }
        let names = "'stagedoor_records', 'stagedoor_records_expiry'";
        assert_eq!(objects(&db, names).await, 2, "one table, one index");
    }
}

async fn overlapping_writers_in_any_order_never_deadlock<D: Db>()
where
    D::Route<ConfRow>: Records,
{
    const TASKS: usize = 8;
    const EACH: u64 = 5;
    let db = D::fresh("records_overlap", conf_ddl::<D>()).await;
    let route = records(&db).await;
    let keys = ["a", "b", "c", "d"];
    let start: Vec<RecordWrite> = keys.iter().map(|k| RecordWrite::put(*k, "0")).collect();
    route
        .write_records(&start)
        .await
        .expect("start the counters");
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let route = route.clone();
        tasks.push(tokio::spawn(async move {
            // Each task names the keys in an order of its own.
            let mut order = keys.to_vec();
            order.rotate_left(t % keys.len());
            if t % 2 == 1 {
                order.reverse();
            }
            let mut done = 0;
            while done < EACH {
                let mut writes = Vec::new();
                for k in &order {
                    let (v, version) = value(&route, k).await.expect("a counter");
                    let n: u64 = String::from_utf8(v).unwrap().parse().unwrap();
                    writes.push(RecordWrite::put(*k, (n + 1).to_string()).if_version(version));
                }
                // A key other tasks delete: created anew under them, found there by others.
                writes.push(RecordWrite::put(format!("z{}", t % 3), "z"));
                if route.write_records(&writes).await.expect("write").is_some() {
                    done += 1;
                    let gone = RecordWrite::delete(format!("z{}", (t + 1) % 3));
                    route.write_records(&[gone]).await.expect("delete");
                }
            }
        }));
    }
    let all = async {
        for t in tasks {
            t.await.expect("a writer panicked");
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("the writers finish");
    let total = TASKS as u64 * EACH;
    for k in keys {
        assert_eq!(
            value(&route, k).await,
            Some((total.to_string().into_bytes(), total + 1)),
            "counter {k}"
        );
    }
}

async fn records_that_ran_out_are_deleted_by_later_writes<D: Db>()
where
    D::Route<ConfRow>: Records,
{
    let db = D::fresh("records_clean", conf_ddl::<D>()).await;
    let route = records(&db).await;
    // More keys than one statement holds (500): the rows are held in two statements.
    let short: Vec<RecordWrite> = (0..600)
        .map(|i| RecordWrite::put(format!("short_{i}"), "s").ttl(Duration::from_millis(1)))
        .collect();
    let mut refused = short.clone();
    refused[599] = RecordWrite::put("short_599", "s").if_version(3);
    assert_eq!(route.write_records(&refused).await.unwrap(), None);
    let count =
        "SELECT CAST(count(*) AS BIGINT) FROM stagedoor_records WHERE record_key LIKE 'short%'";
    assert_eq!(
        db.rows(count.to_owned()).await[0][0].int(),
        0,
        "all or nothing"
    );
    assert_eq!(
        route.write_records(&short).await.unwrap(),
        Some(vec![1; 600])
    );
    assert_eq!(db.rows(count.to_owned()).await[0][0].int(), 600);
    let kept = RecordWrite::put("kept", "k").ttl(Duration::from_secs(3600));
    route.write_records(&[kept]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // SQLite deletes up to 64 in every write, Postgres in every 8th.
    for i in 0..100 {
        let other = RecordWrite::put("other", i.to_string());
        route.write_records(&[other]).await.unwrap();
    }
    assert_eq!(db.rows(count.to_owned()).await[0][0].int(), 0, "deleted");
    assert_eq!(value(&route, "kept").await, Some((b"k".to_vec(), 1)));
    assert_eq!(value(&route, "other").await, Some((b"99".to_vec(), 100)));
}

on_both!(
    hand_edited_rows_are_errors_naming_the_key,
    brokers_racing_on_the_first_creation_all_succeed,
    overlapping_writers_in_any_order_never_deadlock,
    records_that_ran_out_are_deleted_by_later_writes,
);
