//! The first inputs of each target's corpus, written by `cargo run -p stagedoor-jobs-fuzz --
//! seeds` into `fuzz/corpus/<target>/seed-*` (the fuzzer's own finds are added beside them).

use crate::dashboard::{CSRF, TOKEN};
use crate::input::Enc;

/// An envelope as [`crate::envelope`] reads it.
fn envelope(kind: &str, id: &str, payload: &[u8], ms: i64, level: u8) -> Enc {
    Enc::new()
        .chunk(kind)
        .chunk(id)
        .chunk(payload)
        .i64(ms)
        .u8(0x13)
        .chunk("7f3a9c2e")
        .chunk("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .chunk("tenant")
        .chunk("acme")
        .u8(level)
}

/// (target, file name, bytes) of every seed.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut add =
        |t: &'static str, name: &str, b: Vec<u8>| out.push((t, format!("seed-{name}"), b));

    // redis_entry: round trips, then entries as a claim reads them.
    add(
        "redis_entry",
        "round-trip",
        Enc::new()
            .u8(0)
            .rest(
                envelope(
                    "send_email",
                    "0192f0c1-aaaa",
                    b"{\"to\":\"a\"}",
                    1_764_411_360_123,
                    4,
                )
                .done(),
            )
            .u64(3)
            .done(),
    );
    add(
        "redis_entry",
        "round-trip-binary",
        Enc::new()
            .u8(0)
            .rest(envelope("k", "id-1", &[0, 0xff, 0xc3, 0x28], -1, 0).done())
            .u64(40_000)
            .done(),
    );
    // Entries: level byte, dead-stream byte, deliveries, entry id, then (name index, value).
    let entry = |dead: u8, fields: &[(u8, &[u8])]| {
        let mut e = Enc::new()
            .u8(1)
            .u8(3)
            .u8(dead)
            .u64(2)
            .chunk("1764411360123-0");
        for (n, v) in fields {
            e = e.u8(*n).chunk(v);
        }
        e.done()
    };
    add(
        "redis_entry",
        "entry",
        entry(
            0,
            &[
                (0, b"send_email"),
                (1, b"j-1"),
                (2, b"2"),
                (3, b"{}"),
                (4, b"1764411360000"),
                (5, b"1"),
                (6, b"r"),
                (7, b"t"),
                (8, b"v"),
            ],
        ),
    );
    add(
        "redis_entry",
        "entry-by-hand",
        entry(0, &[(0, b"k"), (3, b"")]),
    );
    add(
        "redis_entry",
        "entry-bad-attempts",
        entry(1, &[(0, b"k"), (3, b"x"), (2, b"-1")]),
    );
    add(
        "redis_entry",
        "entry-huge-attempts",
        entry(0, &[(0, b"k"), (3, b"x"), (2, b"99999999999999999999")]),
    );
    add(
        "redis_entry",
        "entry-no-kind",
        entry(0, &[(3, b"x"), (12, b"jobs")]),
    );

    // redis_member: members as `member` writes them, and some that are not.
    let member = |items: &[&[u8]]| {
        let mut m = vec![0x90 | items.len() as u8];
        for i in items {
            m.push(0xa0 | i.len() as u8);
            m.extend_from_slice(i);
        }
        m
    };
    add(
        "redis_member",
        "member",
        member(&[
            b"kind",
            b"k",
            b"job_id",
            b"j-1",
            b"attempts",
            b"3",
            b"payload",
            b"{}",
        ]),
    );
    add(
        "redis_member",
        "member-bin",
        vec![0x92, 0xc4, 1, b'a', 0xda, 0, 1, b'b'],
    );
    add(
        "redis_member",
        "member-array32",
        vec![0xdd, 0, 0, 0, 2, 0xd9, 1, b'a', 0xdb, 0, 0, 0, 1, b'b'],
    );
    add("redis_member", "not-a-member", b"by hand".to_vec());

    // redis_reply: RESP replies of XREADGROUP, XRANGE and the claim script.
    add(
        "redis_reply",
        "xreadgroup",
        b"*1\r\n*2\r\n$6\r\n{jobs}\r\n*1\r\n*2\r\n$15\r\n1764411360123-0\r\n*4\r\n$4\r\nkind\r\n$1\r\nk\r\n$7\r\npayload\r\n$2\r\n{}\r\n".to_vec(),
    );
    add(
        "redis_reply",
        "claim-script",
        b"*3\r\n$3\r\n1-0\r\n*2\r\n$4\r\nkind\r\n$1\r\nk\r\n:2\r\n".to_vec(),
    );
    add(
        "redis_reply",
        "resp3-map",
        b"%1\r\n$6\r\n{jobs}\r\n*1\r\n*2\r\n$3\r\n1-0\r\n%1\r\n+kind\r\n+k\r\n".to_vec(),
    );
    add("redis_reply", "nil", b"_\r\n".to_vec());

    // sql_headers: columns as text, then envelopes published and dead-lettered.
    add(
        "sql_headers",
        "column",
        Enc::new()
            .u8(0)
            .i64(3)
            .rest(r#"{"kind":"k","job_id":"j","request_id":"r","extra":{"a":"b"},"failed_at":"2026-01-01T00:00:00Z","origin":"jobs"}"#)
            .done(),
    );
    add(
        "sql_headers",
        "column-not-json",
        Enc::new().u8(0).i64(-1).rest("{not json").done(),
    );
    add(
        "sql_headers",
        "published",
        Enc::new()
            .u8(1)
            .i64(i64::MAX)
            .rest(envelope("invoice", "0192f0c1-bbbb", b"{}", 1_764_411_360_000, 2).done())
            .chunk("billing")
            .done(),
    );
    add(
        "sql_headers",
        "dead",
        Enc::new()
            .u8(3)
            .i64(5)
            .rest(envelope("billing", "j-9", b"{}", 1_764_411_360_000, 1).done())
            .chunk("billing")
            .i64(1_764_411_361_000)
            .chunk("billing")
            .chunk("boom")
            .chunk("at billing.rs:1")
            .done(),
    );

    // dashboard: flags (1 POST, 2-3 auth mode, 4-8 credentials, 0x10 CSRF field, 0x20 CSRF
    // cookie, 0x80 nested), route, [path], query, cookie, authorization, body.
    let req = |flags: u8, route: u8, query: &str, cookie: &str, auth: &str, body: &str| {
        Enc::new()
            .u8(flags)
            .u8(route)
            .chunk(query)
            .chunk(cookie)
            .chunk(auth)
            .rest(body)
            .done()
    };
    add("dashboard", "queues", req(0, 0, "", "", "", ""));
    add(
        "dashboard",
        "dead-list",
        req(
            0,
            2,
            "dl=billing.dead&kind=invoice&q=boom&page=2",
            "",
            "",
            "",
        ),
    );
    add(
        "dashboard",
        "dead-letter",
        req(0, 3, "dl=billing.dead&id=inv-0", "", "", ""),
    );
    add(
        "dashboard",
        "confirm-ids",
        req(
            0,
            4,
            "dl=billing.dead&action=replay&id=inv-0&id=ref-0",
            "",
            "",
            "",
        ),
    );
    add(
        "dashboard",
        "confirm-kind",
        req(
            0,
            4,
            "dl=billing.dead&action=purge&kind=invoice",
            "",
            "",
            "",
        ),
    );
    add(
        "dashboard",
        "confirm-all",
        req(0, 4, "dl=billing.dead&action=replay&all=1", "", "", ""),
    );
    add(
        "dashboard",
        "action-replay",
        req(
            0x31,
            5,
            "",
            "",
            "",
            "dl=billing.dead&action=replay&id=inv-1",
        ),
    );
    add(
        "dashboard",
        "action-purge-all",
        req(0x31, 5, "", "", "", "dl=billing.dead&action=purge&all=1"),
    );
    add(
        "dashboard",
        "action-no-csrf",
        req(0x01, 5, "", "", "", "dl=billing.dead&action=purge&all=1"),
    );
    add(
        "dashboard",
        "login-token",
        req(0x33, 9, "", "", "", &format!("token={TOKEN}")),
    );
    add("dashboard", "bearer", req(0x06, 0, "", "", "", ""));
    add(
        "dashboard",
        "basic",
        req(0x0c, 7, "", "", "Basic b3BzOnB3", ""),
    );
    add(
        "dashboard",
        "session-cookie",
        req(0x02, 8, "", &format!("sdj_session={CSRF}"), "", ""),
    );
    add(
        "dashboard",
        "read-only-action",
        req(0x37, 5, "", "", "", "dl=billing.dead&action=replay&all=1"),
    );
    add("dashboard", "nested", req(0x80, 6, "", "", "", ""));
    add("dashboard", "logout", req(0x31, 10, "", "", "", ""));
    add(
        "dashboard",
        "any-path",
        Enc::new()
            .u8(0)
            .u8(200)
            .chunk("dead/../x%00")
            .chunk("")
            .chunk("")
            .chunk("")
            .done(),
    );
    add(
        "dashboard",
        "csrf-field-only",
        req(0x11, 5, "", "", "", "dl=x&action=replay&id=a"),
    );

    // cron: mode, zone, time, expression (or period).
    let cron =
        |zone: u8, secs: i64, expr: &str| Enc::new().u8(0).u8(zone).i64(secs).rest(expr).done();
    add("cron", "daily", cron(0, 1_764_411_360, "0 3 * * *"));
    add("cron", "dst-prague", cron(1, 1_774_746_000, "30 2 * * *"));
    add(
        "cron",
        "lord-howe",
        cron(3, 1_775_318_400, "*/15 1-3 * * *"),
    );
    add("cron", "never", cron(0, 0, "0 0 31 2 *"));
    add(
        "cron",
        "weekday-nth",
        cron(2, 1_764_411_360, "0 9 * * MON#2"),
    );
    add("cron", "last-day", cron(6, 1_764_411_360, "59 23 L * *"));
    add("cron", "seconds", cron(4, 1_764_411_360, "*/5 * * * * *"));
    add("cron", "bad", cron(0, 0, "61 25 * * *"));
    add(
        "cron",
        "every",
        Enc::new().u8(1).u8(0).i64(1_764_411_360).u64(60_000).done(),
    );
    add(
        "cron",
        "every-huge",
        Enc::new()
            .u8(1)
            .u8(0)
            .i64(-62_000_000_000)
            .u64(u64::MAX)
            .done(),
    );
    out
}
