//! The SQL backend's readings that need no database: the `headers` column's document, stored
//! attempt counts, and the values shown in a row's problem.

use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::MAX_ATTEMPT;
use stagedoor_jobs_sqlx::__fuzz::{self as s, HeaderColumn};

use crate::input::Input;

/// Target `sql_headers`. First byte even: the rest is a `headers` column's text as a claim
/// reads it (any text: a row edited by hand); the document it reads writes back to text that
/// reads back to it. Odd: an envelope published (and dead-lettered) on a queue; its column
/// reads back to it, with its headers, kind and id. Either way a stored attempt count reads as
/// a number in range, and the values shown in a row's problem are short.
pub fn headers(data: &[u8]) {
    let mut inp = Input::new(data);
    let mode = inp.u8();
    let stored = inp.i64();
    for floor in [0, 1] {
        let n = s::attempt_number(Some(stored), floor);
        assert!((floor..=MAX_ATTEMPT).contains(&n), "{stored} -> {n}");
    }
    if mode & 1 == 0 {
        let rest = inp.rest();
        let text = String::from_utf8_lossy(rest);
        let doc = HeaderColumn::parse(Some(&text));
        let json = doc.to_json();
        assert_eq!(
            HeaderColumn::parse(Some(&json)),
            doc,
            "{text:?} written as {json}"
        );
        let shown = s::shorten(&text);
        assert!(shown.chars().count() <= 60 + 40, "{shown}");
        let bytes = s::shorten_bytes(rest);
        assert!(bytes.len() <= 2 + 48 + 40, "{bytes}");
        return;
    }
    let env = crate::envelope(&mut inp);
    let queue = inp.text();
    let mut doc = HeaderColumn::published(&queue, &env);
    if mode & 2 != 0 {
        let ms = inp.i64() % 8_000_000_000_000_000;
        let failed = DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or(DateTime::UNIX_EPOCH);
        doc = doc.dead(&inp.text(), &inp.text(), &inp.text(), failed);
    }
    let json = doc.to_json();
    let back = HeaderColumn::parse(Some(&json));
    assert_eq!(back, doc, "{env:?} written as {json}");
    assert_eq!(back.headers(), *env.headers());
    assert_eq!(back.job_id(), Some(env.id().as_str()));
    assert_eq!(back.kind().unwrap_or(&queue), env.kind());
}
