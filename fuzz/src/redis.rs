//! The Redis backend's decoders: stream entry fields to an envelope (what a claim reads), a
//! `{q}:delayed` member to its fields (what the delayed listing and cancel read), and the
//! server's replies (RESP) to entries.

use chrono::{DateTime, Utc};
use stagedoor_jobs::Priority;
use stagedoor_jobs::broker::MAX_ATTEMPT;
use stagedoor_jobs_redis::__fuzz as r;

use crate::input::Input;

/// Field names an entry holds, so that inputs reach them without guessing their spelling: the
/// broker's job fields, then a header's and a dead letter's.
static NAMES: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
    r::JOB_FIELDS
        .iter()
        .copied()
        .chain(["h.x", "error", "traceback", "failed_at", "origin"])
        .collect()
});

/// Whether a published envelope is one whose round trip is a known, reported finding (see
/// `fuzz/README.md`, Findings): skipped here so that the fuzzer looks for new ones; each has
/// its regression test in `tests/findings.rs`.
pub fn known_round_trip_finding(env: &stagedoor_jobs::Envelope) -> bool {
    // Finding 1: a job published with an empty kind is dead-lettered as "no `kind` field".
    // Finding 2: a job published with an empty id is delivered under its entry's id.
    env.kind().is_empty() || env.id().as_str().is_empty()
}

/// Target `redis_entry`. Even first byte: an envelope as a publisher builds it, encoded to
/// entry fields, must decode to itself (and its delayed member to the same fields). Odd: any
/// fields, read as a claim reads an entry of a queue's or a dead stream: a delivery numbered
/// 1..=MAX_ATTEMPT at the stream's level, or an error naming what is wrong; a delivery
/// re-encoded (its retry) decodes to itself.
pub fn entry(data: &[u8]) {
    let mut inp = Input::new(data);
    if inp.u8() & 1 == 0 {
        round_trip(&mut inp);
    } else {
        claimed(&mut inp);
    }
}

fn round_trip(inp: &mut Input<'_>) {
    let env = crate::envelope(inp);
    let spent = (inp.u64() % u64::from(MAX_ATTEMPT + 100)) as u32;
    let f = r::encode(&env, spent);
    assert_eq!(r::attempts(&f), Ok(spent.min(MAX_ATTEMPT)), "{f:?}");
    assert_eq!(r::level(&f), env.priority(), "{f:?}");
    assert_eq!(r::unmember(&r::member(&f)).as_ref(), Some(&f), "member");
    if known_round_trip_finding(&env) {
        return;
    }
    let attempt = r::attempt_of(spent, 1, false);
    let back = r::decode(&f, attempt, DateTime::<Utc>::UNIX_EPOCH)
        .unwrap_or_else(|e| panic!("{env:?} encoded as {f:?} does not decode: {e}"));
    assert_eq!(
        back,
        env.clone().with_attempt(attempt),
        "round trip of {f:?}"
    );
}

/// Entry fields from the input: names from [`NAMES`] (or any bytes), values any bytes.
fn fields(inp: &mut Input<'_>) -> r::Fields {
    let mut f = r::Fields::new();
    while !inp.is_empty() && f.len() < 64 {
        let n = inp.u8();
        let name = match NAMES.get(usize::from(n)) {
            Some(known) => known.as_bytes().to_vec(),
            None => inp.chunk().to_vec(),
        };
        f.push((name.into(), inp.chunk().to_vec().into()));
    }
    f
}

fn claimed(inp: &mut Input<'_>) {
    let level = Priority::new((inp.u8() % 5) as i8 - 2).unwrap_or_default();
    let dead_stream = inp.u8() & 1 == 1;
    let deliveries = inp.u64().max(1);
    let id = inp.text();
    let f = fields(inp);
    // As `claim.rs`' `delivery` does.
    let f = r::at_level(f, level);
    let f = if r::get(&f, "job_id").is_some_and(|j| !j.is_empty()) {
        f
    } else {
        r::with(&f, "job_id", id.clone())
    };
    assert_eq!(r::level(&f), level);
    let decoded = r::attempts(&f).and_then(|spent| {
        let attempt = r::attempt_of(spent, deliveries, dead_stream);
        r::decode(&f, attempt, r::id_time(&id)).map(|e| (spent, e))
    });
    match decoded {
        Ok((spent, env)) => {
            assert!((1..=MAX_ATTEMPT).contains(&env.attempt()), "{env:?}");
            assert!(spent <= MAX_ATTEMPT);
            assert_eq!(env.priority(), level);
            assert!(!env.kind().is_empty());
            // Its retry: the same job, one attempt on.
            let next = r::attempts_after(env.attempt(), dead_stream);
            let again = r::encode(&env, next);
            let back = r::decode(&again, env.attempt(), DateTime::<Utc>::UNIX_EPOCH)
                .unwrap_or_else(|e| panic!("{env:?} re-encoded as {again:?}: {e}"));
            assert_eq!(back, env, "a delivery's retry decodes to it");
            assert_eq!(
                r::attempt_of(r::attempts(&again).unwrap_or(0), 1, dead_stream),
                (env.attempt() + 1).min(MAX_ATTEMPT),
                "the retry's next delivery"
            );
        }
        Err(why) => {
            // A message that names the field (the dead letter's error).
            assert!(
                why.contains("`kind`") || why.contains("`payload`") || why.contains("`attempts`"),
                "{why}"
            );
            let _ = r::shown(r::get(&f, "attempts").unwrap_or_default());
        }
    }
}

/// Target `redis_member`: any bytes as a `{q}:delayed` member, read as the delayed listing
/// reads it (fields, or the bytes shown); fields read back from a member are what the member
/// of those fields reads back to.
pub fn member(data: &[u8]) {
    match r::unmember(data) {
        Some(f) => {
            let spent = r::attempts(&f).unwrap_or(0);
            let attempt = r::attempt_of(spent, 1, false);
            assert!((1..=MAX_ATTEMPT).contains(&attempt));
            let _ = (r::text(&f, "job_id"), r::text(&f, "kind"));
            let again = r::member(&f);
            assert_eq!(r::unmember(&again).as_ref(), Some(&f), "member of {f:?}");
        }
        None => {
            let shown = r::shown(data);
            assert!(shown.len() >= data.len());
        }
    }
}

/// Target `redis_reply`: any bytes as a server reply (RESP), read as the claim (through
/// redis-rs, and by the reader of a plain connection), the dead-letter listing and the cancel
/// read theirs: no panic, and each entry's fields decode
/// or are refused with a reason.
pub fn reply(data: &[u8]) {
    if let Some(streams) = r::streams_reply(data) {
        for (_, entries) in streams {
            for (id, f) in entries {
                let _ = r::id_time(&id);
                let _ = r::attempts(&f)
                    .map(|s| r::decode(&f, r::attempt_of(s, 1, false), r::id_time(&id)));
            }
        }
    }
    if let Some(streams) = r::claim_read(data) {
        for (_, entries) in streams {
            for (id, f) in entries {
                let _ = r::attempts(&f)
                    .map(|s| r::decode(&f, r::attempt_of(s, 1, false), r::id_time(&id)));
            }
        }
    }
    if let Some(reads) = r::range_reply(data) {
        for (id, f) in reads.entries {
            let _ = r::decode(&f, 1, r::id_time(&id));
        }
        for (_, f, d) in reads.claimed {
            let _ = r::attempt_of(r::attempts(&f).unwrap_or(0), d.max(1) as u64, false);
        }
        assert_eq!(
            reads.fields, reads.taken,
            "by reference and taken read alike"
        );
    }
}
