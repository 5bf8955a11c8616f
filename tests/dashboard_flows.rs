//! The dashboard's flow and result pages (issue 34), over HTTP on the memory broker: a flow of
//! two jobs listed with their states and what holds it (`flows/{id}` and `flows?id=`); an
//! unknown flow (404, not a 500); hostile ids (markup, quotes, `../`, 10 KB, NUL): escaped, or
//! refused with 400 naming the limit before any backend call; a job's result and progress as a
//! real handler left them, a result past 64 KiB cut with a download of all of it, and a job
//! with progress but no result yet (the page polls).

mod common_dashboard;

use std::time::Duration;

use axum::http::StatusCode;
use common_dashboard::{Web, enc};
use serde::{Deserialize, Serialize};
use stagedoor_jobs::broker::{RecordWrite, Records};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::results::progress_key;
use stagedoor_jobs::{Flow, Flows, MemoryBroker, Publish};
use stagedoor_jobs_dashboard::Dashboard;

#[derive(Debug, Serialize, Deserialize)]
struct Report {
    pages: u32,
}

/// Reports half way, then returns what it rendered (a large value for 999 pages).
async fn render(r: &Report, progress: JobProgress) -> HandlerOutcome {
    progress
        .set(0.5, "half of the <b>pages</b>")
        .await
        .expect("progress kept");
    if r.pages == 999 {
        return HandlerOutcome::ack_with(&"y".repeat(100_000));
    }
    HandlerOutcome::ack_with(&serde_json::json!({ "pages": r.pages, "file": "report <1>.pdf" }))
}

/// A flow `nightly` of two jobs (the second after the first), published, not run; the web.
async fn flow_of_two() -> (MemoryBroker, Web, JobId, JobId) {
    let b = MemoryBroker::new();
    let mut flow = Flow::new().with_id("nightly");
    let first = flow.add(Job::new("reports", &Report { pages: 3 }).expect("job"));
    let second = flow
        .add_after(
            Job::new("reports", &Report { pages: 7 }).expect("job"),
            [&first],
        )
        .expect("add after");
    b.publish_flow(flow).await.expect("publish the flow");
    let web = Web::new(Dashboard::new(b.clone()).router());
    (b, web, first, second)
}

#[tokio::test]
async fn a_flow_lists_its_jobs_states_and_what_holds_it() {
    let (_b, mut web, first, second) = flow_of_two().await;
    for uri in ["/flows/nightly", "/flows?id=nightly"] {
        let r = web.get(uri).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.body);
        for want in [first.as_str(), second.as_str(), ">released<", ">waiting<"] {
            assert!(r.body.contains(want), "`{want}` on {uri}: {}", r.body);
        }
        let held = format!("{} waits for {}", second.as_str(), first.as_str());
        assert!(r.body.contains(&held), "what holds it: {}", r.body);
        assert!(
            r.body.contains("2 jobs: 1 released, 1 waiting."),
            "{}",
            r.body
        );
    }
    let form = web.get("/flows").await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(form.body.contains(r#"name="id""#), "{}", form.body);

    let unknown = web.get("/flows/no-such-flow").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.body);
    assert!(
        unknown.body.contains("No flow or batch"),
        "{}",
        unknown.body
    );
}

#[tokio::test]
async fn hostile_ids_are_escaped_or_refused() {
    let (_b, mut web, _, _) = flow_of_two().await;
    for id in [
        "<script>alert(1)</script>",
        "a'b\"c",
        "../../etc/passwd",
        "line\nbreak",
    ] {
        for page in ["/flows?id=", "/jobs/result?id=", "/flows/", "/jobs/"] {
            let uri = match page {
                "/jobs/" => format!("/jobs/{}/result", enc(id)),
                _ => format!("{page}{}", enc(id)),
            };
            let r = web.get(&uri).await;
            assert_eq!(r.status, StatusCode::NOT_FOUND, "{uri}: {}", r.body);
            assert!(!r.body.contains("<script>alert"), "{uri}: {}", r.body);
            assert!(!r.body.contains("a'b\"c"), "quotes escaped: {}", r.body);
        }
    }
    let r = web
        .get(&format!("/flows?id={}", enc("<script>x</script>")))
        .await;
    assert!(
        r.body.contains("&lt;script&gt;x&lt;/script&gt;"),
        "{}",
        r.body
    );

    let long = "x".repeat(10 * 1024);
    for uri in [
        format!("/flows?id={long}"),
        format!("/flows/{long}"),
        format!("/jobs/result?id={long}"),
        format!("/jobs/{long}/result"),
        format!("/jobs/result/download?id={long}"),
    ] {
        let r = web.get(&uri).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", &uri[..20]);
        assert!(r.body.contains("1 to 500 bytes"), "{}", r.body);
        assert!(!r.body.contains(&long), "the id is not echoed whole");
    }
    let api = web.get(&format!("/api/result?id={long}")).await;
    assert_eq!(api.status, StatusCode::BAD_REQUEST);
    for uri in ["/flows?id=a%00b", "/flows/a%00b", "/jobs/result?id=a%00b"] {
        let r = web.get(uri).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{uri}: {}", r.body);
        assert!(r.body.contains("NUL"), "{}", r.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_and_its_progress_are_shown() {
    let (b, mut web, first, second) = flow_of_two().await;
    let big = b
        .publish_job(Job::new("reports", &Report { pages: 999 }).expect("job"))
        .await
        .expect("publish")
        .into_id();
    let running = Service::new(AppInfo::new("dash-flows", "0.1.0"))
        .with_broker(b.clone(), |m| {
            m.include(Subscriber::new("reports", render));
        })
        .start()
        .await
        .expect("the service starts");
    for id in [&second, &big] {
        b.wait_result(id.as_str(), Duration::from_secs(30))
            .await
            .expect("the job ran");
    }
    running.shutdown().await;

    let r = web.get(&format!("/jobs/{}/result", first.as_str())).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    for want in [
        "report &lt;1&gt;.pdf",
        "&quot;pages&quot;: 3",
        "50%",
        "half of the &lt;b&gt;pages&lt;/b&gt;",
        r#"<progress max="1" value="0.5""#,
        "Finished",
    ] {
        assert!(r.body.contains(want), "`{want}`: {}", r.body);
    }
    assert!(
        !r.body.contains("data-live"),
        "a finished job's page does not poll"
    );
    let flow = web.get("/flows/nightly").await;
    assert!(flow.body.contains("2 jobs: 2 done."), "{}", flow.body);

    let big_page = web.get(&format!("/jobs/result?id={}", big.as_str())).await;
    assert_eq!(big_page.status, StatusCode::OK);
    assert!(
        big_page
            .body
            .contains("Truncated: the first 65536 bytes of 100002"),
        "{}",
        &big_page.body[..500]
    );
    assert!(
        big_page.body.len() < 80_000,
        "the page is bounded: {}",
        big_page.body.len()
    );
    let all = web
        .get(&format!("/jobs/result/download?id={}", big.as_str()))
        .await;
    assert_eq!((all.status, all.body.len()), (StatusCode::OK, 100_002));

    let none = web.get("/jobs/result?id=never-ran").await;
    assert_eq!(none.status, StatusCode::NOT_FOUND, "{}", none.body);
    assert!(none.body.contains("No result yet"), "{}", none.body);
}

#[tokio::test]
async fn a_job_with_progress_and_no_result_polls() {
    let b = MemoryBroker::new();
    let progress =
        serde_json::json!({ "fraction": 0.25, "message": "a quarter", "at": chrono::Utc::now() });
    b.write_records(&[RecordWrite::put(
        progress_key("running-job"),
        serde_json::to_vec(&progress).expect("json"),
    )])
    .await
    .expect("write the progress");
    let mut web = Web::new(Dashboard::new(b).router());
    let r = web.get("/jobs/running-job/result").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    for want in [
        "25%",
        "a quarter",
        r#"data-live="result""#,
        "/api/result?id=running-job",
    ] {
        assert!(r.body.contains(want), "`{want}`: {}", r.body);
    }
    let api = web.get("/api/result?id=running-job").await.json();
    assert_eq!(api["found"], false, "{api}");
    assert_eq!(api["progress"]["percent"], "25%", "{api}");
}
