//! A job as stream entry fields, and back.
//!
//! Fields: `kind`, `job_id`, `attempts` (attempts spent before this entry
//! was added; 0 for a new job), `payload`, `enqueued_at` (milliseconds since the epoch),
//! `priority` (a level other than normal, `-2` to `2`: which stream it goes back to), `request_id`,
//! `trace`, `h.<name>` for any other header. A dead entry adds `error`,
//! `traceback`, `failed_at` (RFC 3339) and `origin` (the queue it failed on), and its
//! `attempts` is the attempts it spent.
//!
//! Names and values are kept as the bytes the server holds: an entry added by hand with a
//! field name that is not UTF-8 is re-added (retried, dead-lettered) with the same name.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::MAX_ATTEMPT;
use stagedoor_jobs::{Envelope, Headers, JobId, Priority};

/// The field names the broker writes for a job ([`encode`]; `h.<name>` for other headers):
/// the claim's reader keeps these static instead of slicing them from every reply.
pub(crate) const JOB_FIELDS: [&str; 8] = [
    "kind",
    "job_id",
    "attempts",
    "payload",
    "enqueued_at",
    "priority",
    "request_id",
    "trace",
];

/// Fields of one entry, in order, as bytes.
pub(crate) type Fields = Vec<(Bytes, Bytes)>;

/// The fields of `envelope`, whose job has spent `attempts`.
pub(crate) fn encode(envelope: &Envelope, attempts: u32) -> Fields {
    let h = envelope.headers();
    let mut f: Fields = vec![
        (
            "kind".into(),
            Bytes::copy_from_slice(envelope.kind().as_bytes()),
        ),
        (
            "job_id".into(),
            Bytes::copy_from_slice(envelope.id().as_str().as_bytes()),
        ),
        ("attempts".into(), attempts.to_string().into()),
        ("payload".into(), Bytes::copy_from_slice(envelope.payload())),
        (
            "enqueued_at".into(),
            envelope.enqueued_at().timestamp_millis().to_string().into(),
        ),
    ];
    if envelope.priority() != Priority::NORMAL {
        f.push(("priority".into(), envelope.priority().to_string().into()));
    }
    if let Some(r) = &h.request_id {
        f.push(("request_id".into(), r.clone().into()));
    }
    if let Some(t) = &h.trace {
        f.push(("trace".into(), t.clone().into()));
    }
    for (k, v) in &h.extra {
        f.push((format!("h.{k}").into(), v.clone().into()));
    }
    f
}

/// The priority level field `priority` names: the stream a retry, a due delayed job or a
/// replay goes back to. Absent, or not a level (an entry edited by hand): normal.
pub(crate) fn level(fields: &Fields) -> Priority {
    text(fields, "priority")
        .and_then(|t| Priority::parse(&t).ok())
        .unwrap_or_default()
}

/// `fields` with its `priority` field saying `level` (none for normal): a delivery's fields
/// name the level of the stream it was read from, where its retry goes back.
pub(crate) fn at_level(fields: Fields, level: Priority) -> Fields {
    let wanted = (level != Priority::NORMAL).then(|| level.to_string().into_bytes());
    if get(&fields, "priority") == wanted.as_deref() {
        return fields;
    }
    if level == Priority::NORMAL {
        without(&fields, &["priority"])
    } else {
        with(&fields, "priority", level.to_string())
    }
}

/// The value of field `name`.
pub(crate) fn get<'a>(fields: &'a Fields, name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(k, _)| k == name.as_bytes())
        .map(|(_, v)| &v[..])
}

/// `fields` without the fields named in `names`.
pub(crate) fn without(fields: &Fields, names: &[&str]) -> Fields {
    fields
        .iter()
        .filter(|(k, _)| !names.iter().any(|n| k == n.as_bytes()))
        .cloned()
        .collect()
}

/// `fields` with field `name` set to `value` (put last, any earlier one removed).
pub(crate) fn with(fields: &Fields, name: &str, value: impl Into<Vec<u8>>) -> Fields {
    let mut f = without(fields, &[name]);
    f.push((
        Bytes::copy_from_slice(name.as_bytes()),
        Bytes::from(value.into()),
    ));
    f
}

/// Bytes as text for a message: UTF-8 as it is, any other byte escaped (`\xff`), never
/// replaced.
pub(crate) fn shown(bytes: &[u8]) -> String {
    bytes.utf8_chunks().fold(String::new(), |mut s, c| {
        s.push_str(c.valid());
        for b in c.invalid() {
            s.push_str(&format!("\\x{b:02x}"));
        }
        s
    })
}

/// The text of field `name`.
pub(crate) fn text(fields: &Fields, name: &str) -> Option<String> {
    get(fields, name).map(|v| String::from_utf8_lossy(v).into_owned())
}

/// When the entry `id` (`<ms>-<seq>`) was added to its stream.
pub(crate) fn id_time(id: &str) -> DateTime<Utc> {
    id.split('-')
        .next()
        .and_then(|m| m.parse::<i64>().ok())
        .and_then(DateTime::<Utc>::from_timestamp_millis)
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

/// Whether `id` is a complete stream entry id, `<ms>-<seq>` (two whole numbers that fit 64
/// bits): what `XRANGE key id id` reads as that one entry.
pub(crate) fn is_entry_id(id: &str) -> bool {
    id.split_once('-').is_some_and(|(ms, seq)| {
        [ms, seq].iter().all(|n| {
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && n.parse::<u64>().is_ok()
        })
    })
}

/// The `enqueued_at` field as a time, if it is one.
pub(crate) fn enqueued_at(fields: &Fields) -> Option<DateTime<Utc>> {
    get(fields, "enqueued_at")
        .and_then(|t| std::str::from_utf8(t).ok())
        .and_then(|t| t.parse::<i64>().ok())
        .and_then(DateTime::<Utc>::from_timestamp_millis)
}

/// An envelope from entry fields: `Err` names what is missing or malformed. Without an
/// `enqueued_at` field (an entry added by hand) the job was enqueued at `added`, when the
/// entry was added (its id's time), never "now".
pub(crate) fn decode(
    fields: &Fields,
    attempt: u32,
    added: DateTime<Utc>,
) -> Result<Envelope, String> {
    let kind = get(fields, "kind")
        .filter(|k| !k.is_empty())
        .ok_or("the entry has no `kind` field")?;
    let kind = String::from_utf8_lossy(kind);
    // The field's bytes, shared (not copied).
    let payload = fields
        .iter()
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| v.clone())
        .ok_or("the entry has no `payload` field")?;
    let enqueued = enqueued_at(fields).unwrap_or(added);
    let mut headers = Headers {
        request_id: text(fields, "request_id"),
        trace: text(fields, "trace"),
        ..Headers::default()
    };
    for (k, v) in fields {
        if let Some(name) = k.strip_prefix(b"h.") {
            headers
                .extra
                .insert(shown(name), String::from_utf8_lossy(v).into_owned());
        }
    }
    // An entry added by hand may have no `job_id`: it gets one here.
    let id = get(fields, "job_id")
        .filter(|i| !i.is_empty())
        .map_or_else(JobId::new, |i| JobId::from(&*String::from_utf8_lossy(i)));
    Ok(Envelope::stored(id, shared_kind(&kind), payload, enqueued)
        .with_attempt(attempt)
        .with_headers(headers)
        .with_priority(level(fields)))
}

/// `kind` shared: the kinds this thread decoded last are kept (a few; a queue has few kinds),
/// so that a delivery's kind is a count increment instead of an allocation.
fn shared_kind(kind: &str) -> std::sync::Arc<str> {
    use std::cell::RefCell;
    use std::sync::Arc;
    const KEPT: usize = 16;
    thread_local! {
        static KINDS: RefCell<Vec<Arc<str>>> = const { RefCell::new(Vec::new()) };
    }
    KINDS.with(|kinds| {
        let mut kinds = kinds.borrow_mut();
        if let Some(k) = kinds.iter().find(|k| &***k == kind) {
            return Arc::clone(k);
        }
        let k: Arc<str> = Arc::from(kind);
        if kinds.len() >= KEPT {
            kinds.remove(0);
        }
        kinds.push(Arc::clone(&k));
        k
    })
}

/// The attempts an entry says were spent (before it was added to a queue's stream; when it
/// failed, for a dead stream's entry): its `attempts` field, 0 without one, saturated at
/// [`MAX_ATTEMPT`]. `Err` when the field is not a whole number of 0 or more (`-1`, `abc`,
/// `1.5`, empty): the entry is malformed, and the message names the field, its value and the
/// fix.
pub(crate) fn attempts(fields: &Fields) -> Result<u32, String> {
    let Some(raw) = get(fields, "attempts") else {
        return Ok(0);
    };
    if raw.is_empty() || !raw.iter().all(u8::is_ascii_digit) {
        return Err(format!(
            "its `attempts` field is `{}`, not a whole number of 0 or more: set it to the attempts the job has spent (`0` for a new job), or delete the field",
            shown(raw)
        ));
    }
    // Leading zeros aside, more digits than MAX_ATTEMPT has is above it.
    let digits = raw.iter().skip_while(|b| **b == b'0').count();
    let n = if digits > 5 {
        MAX_ATTEMPT
    } else {
        raw.iter()
            .fold(0u32, |n, b| n * 10 + u32::from(b - b'0'))
            .min(MAX_ATTEMPT)
    };
    Ok(n)
}

/// The attempts a dead entry reports: its `attempts` field, or 0 when that is not a number
/// (the field itself is kept as it was, for `dead show`).
pub(crate) fn attempts_or_zero(fields: &Fields) -> u32 {
    attempts(fields).unwrap_or(0)
}

/// The attempt number of delivery `deliveries` (1 for the first) of an entry that says
/// `spent` attempts were spent, in 1..=[`MAX_ATTEMPT`], never wrapping. On a queue's stream
/// the first delivery is `spent + 1`; on a dead stream (a subscriber reading dead letters) it
/// is `spent` itself, the attempts the dead letter reports (at least 1).
pub(crate) fn attempt_of(spent: u32, deliveries: u64, dead_stream: bool) -> u32 {
    let first = if dead_stream {
        u64::from(spent.max(1))
    } else {
        u64::from(spent) + 1
    };
    let n = first.saturating_add(deliveries.max(1) - 1);
    u32::try_from(n.min(u64::from(MAX_ATTEMPT))).unwrap_or(MAX_ATTEMPT)
}

/// The `attempts` field an entry gets when delivery `attempt` of it is retried, so that its
/// next delivery is `attempt + 1` ([`attempt_of`] with one delivery).
pub(crate) fn attempts_after(attempt: u32, dead_stream: bool) -> u32 {
    if dead_stream {
        attempt.saturating_add(1).min(MAX_ATTEMPT)
    } else {
        attempt.min(MAX_ATTEMPT)
    }
}

/// Fields as a flat argument list.
pub(crate) fn flat(fields: &Fields) -> Vec<Vec<u8>> {
    fields
        .iter()
        .flat_map(|(k, v)| [k.to_vec(), v.to_vec()])
        .collect()
}

/// A delayed job's member of the sorted set: its flat fields as a MessagePack array of
/// strings, which the mover unpacks (`cmsgpack`) and adds to the stream as they are. Binary
/// payloads survive; two retries of one job differ by their `attempts`.
pub(crate) fn member(fields: &Fields) -> Vec<u8> {
    let items = flat(fields);
    let mut out = Vec::new();
    let n = items.len();
    if n < 16 {
        out.push(0x90 | n as u8);
    } else if let Ok(n) = u16::try_from(n) {
        out.push(0xdc);
        out.extend_from_slice(&n.to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    for item in items {
        let len = item.len();
        if len < 32 {
            out.push(0xa0 | len as u8);
        } else if let Ok(l) = u8::try_from(len) {
            out.push(0xd9);
            out.push(l);
        } else if let Ok(l) = u16::try_from(len) {
            out.push(0xda);
            out.extend_from_slice(&l.to_be_bytes());
        } else {
            out.push(0xdb);
            out.extend_from_slice(&(len as u32).to_be_bytes());
        }
        out.extend_from_slice(&item);
    }
    out
}

/// The fields of a delayed job's member ([`member`]'s MessagePack array of strings); `None`
/// when the bytes are not such an array (a member added by hand).
pub(crate) fn unmember(bytes: &[u8]) -> Option<Fields> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Some(head)
    }
    fn len(b: &mut &[u8], n: usize) -> Option<usize> {
        let raw = take(b, n)?;
        Some(
            raw.iter()
                .fold(0usize, |acc, x| (acc << 8) | usize::from(*x)),
        )
    }
    let mut b = bytes;
    let tag = *take(&mut b, 1)?.first()?;
    let count = match tag {
        0x90..=0x9f => usize::from(tag & 0x0f),
        0xdc => len(&mut b, 2)?,
        0xdd => len(&mut b, 4)?,
        _ => return None,
    };
    let mut items = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let tag = *take(&mut b, 1)?.first()?;
        let n = match tag {
            0xa0..=0xbf => usize::from(tag & 0x1f),
            0xd9 | 0xc4 => len(&mut b, 1)?,
            0xda | 0xc5 => len(&mut b, 2)?,
            0xdb | 0xc6 => len(&mut b, 4)?,
            _ => return None,
        };
        items.push(take(&mut b, n)?.to_vec());
    }
    if !b.is_empty() || items.len() % 2 != 0 {
        return None;
    }
    let mut it = items.into_iter();
    let mut fields = Fields::new();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        fields.push((k.into(), v.into()));
    }
    Some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let env = Envelope::new("send_email", b"{\"to\":\"a\"}".to_vec(), Utc::now()).with_headers(
            Headers {
                request_id: Some("7f3a9c2e".into()),
                trace: Some("4bf92f35".into()),
                ..Headers::default()
            },
        );
        let f = encode(&env, 2);
        let back = decode(&f, 3, DateTime::<Utc>::UNIX_EPOCH).expect("decodes");
        assert_eq!(
            back.enqueued_at().timestamp_millis(),
            env.enqueued_at().timestamp_millis()
        );
        assert_eq!(back.kind(), "send_email");
        assert_eq!(back.id(), env.id());
        assert_eq!(back.attempt(), 3);
        assert_eq!(back.headers().request_id.as_deref(), Some("7f3a9c2e"));
        assert_eq!(attempts(&f), Ok(2));
    }

    #[test]
    fn entry_ids_are_told_from_job_ids() {
        for id in [
            "1700000000000-0",
            "0-1",
            "18446744073709551615-18446744073709551615",
        ] {
            assert!(is_entry_id(id), "{id}");
        }
        for id in [
            "",
            "-",
            "1700000000000",
            "1700000000000-",
            "-0",
            "+1-0",
            "1-+0",
            "1-0-0",
            "18446744073709551616-0",
            "0193a2b4-7c1d-7000-8000-000000000000",
            "job-1",
            "(1-0",
        ] {
            assert!(!is_entry_id(id), "{id}");
        }
    }

    fn with_attempts(v: &str) -> Fields {
        vec![("attempts".into(), v.as_bytes().to_vec().into())]
    }

    #[test]
    fn a_member_reads_back_as_its_fields() {
        let env = Envelope::new("k", vec![b'x'; 300], Utc::now());
        let mut f = encode(&env, 4);
        for i in 0..10 {
            f.push((format!("h.n{i}").into(), vec![0xff, 0x00].into()));
        }
        assert_eq!(unmember(&member(&f)), Some(f.clone()));
        let short: Fields = vec![("a".into(), vec![b'y'; 40_000].into())];
        assert_eq!(unmember(&member(&short)), Some(short));
        assert_eq!(unmember(b"not msgpack"), None);
        assert_eq!(unmember(&[0x92, 0xa1, b'a']), None, "cut short");
        assert_eq!(
            unmember(&[0x91, 0xa1, b'a']),
            None,
            "a name without a value"
        );
    }

    #[test]
    fn attempts_are_a_whole_number_or_malformed() {
        assert_eq!(attempts(&Fields::new()), Ok(0));
        assert_eq!(attempts(&with_attempts("0")), Ok(0));
        assert_eq!(attempts(&with_attempts("5")), Ok(5));
        assert_eq!(attempts(&with_attempts("0032767")), Ok(MAX_ATTEMPT));
        assert_eq!(attempts(&with_attempts("32768")), Ok(MAX_ATTEMPT));
        assert_eq!(attempts(&with_attempts("4294967295")), Ok(MAX_ATTEMPT));
        assert_eq!(
            attempts(&with_attempts("99999999999999999999999")),
            Ok(MAX_ATTEMPT)
        );
        for bad in ["-1", "abc", "", "1.5", " 3", "+3"] {
            let e = attempts(&with_attempts(bad)).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{e}");
            assert!(e.contains("`attempts`"), "{e}");
        }
        let e = attempts(&vec![("attempts".into(), vec![0xff, b'1'].into())]).unwrap_err();
        assert!(e.contains("`\\xff1`"), "{e}");
    }

    #[test]
    fn attempt_numbers_saturate_and_never_wrap() {
        assert_eq!(attempt_of(0, 1, false), 1);
        assert_eq!(attempt_of(4, 2, false), 6);
        assert_eq!(attempt_of(MAX_ATTEMPT, 1, false), MAX_ATTEMPT);
        assert_eq!(attempt_of(MAX_ATTEMPT - 1, u64::MAX, false), MAX_ATTEMPT);
        assert_eq!(
            attempt_of(5, 1, true),
            5,
            "a dead letter's reader sees its attempts"
        );
        assert_eq!(attempt_of(0, 1, true), 1);
        assert_eq!(attempt_of(5, 2, true), 6);
        assert_eq!(attempts_after(5, true), 6);
        assert_eq!(attempt_of(attempts_after(5, true), 1, true), 6);
        assert_eq!(attempt_of(attempts_after(5, false), 1, false), 6);
        assert_eq!(attempts_after(MAX_ATTEMPT, true), MAX_ATTEMPT);
    }

    #[test]
    fn shown_escapes_bytes_that_are_not_utf8() {
        assert_eq!(shown(b"caf\xc3\xa9"), "café");
        assert_eq!(shown(&[b'a', 0xff, b'b']), "a\\xffb");
    }

    #[test]
    fn a_missing_kind_is_named() {
        let f: Fields = vec![("payload".into(), "{}".into())];
        assert_eq!(
            decode(&f, 1, DateTime::<Utc>::UNIX_EPOCH).unwrap_err(),
            "the entry has no `kind` field"
        );
        let by_hand: Fields = vec![
            ("kind".into(), "k".into()),
            ("payload".into(), Bytes::new()),
        ];
        assert_eq!(
            decode(&by_hand, 1, id_time("1795985344932-0"))
                .expect("decodes")
                .enqueued_at(),
            id_time("1795985344932-0"),
            "enqueued when the entry was added"
        );
        assert_eq!(
            id_time("1795985344932-0").timestamp_millis(),
            1_795_985_344_932
        );
    }

    #[test]
    fn member_is_msgpack() {
        let f: Fields = vec![("kind".into(), "k".into())];
        assert_eq!(member(&f), [0x92, 0xa4, b'k', b'i', b'n', b'd', 0xa1, b'k']);
        let long: Fields = vec![("payload".into(), vec![b'x'; 300].into())];
        let m = member(&long);
        assert_eq!(&m[..1], &[0x92]);
        assert_eq!(&m[9..12], &[0xda, 0x01, 0x2c]);
    }
}
