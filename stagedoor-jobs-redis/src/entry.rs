//! A job as stream entry fields, and back.
//!
//! Fields (seed 000's layout): `kind`, `job_id`, `attempts` (attempts spent before this entry
//! was added; 0 for a new job), `payload`, `enqueued_at` (milliseconds since the epoch),
//! `request_id`, `trace`, `h.<name>` for any other header. A dead entry adds `error`,
//! `traceback`, `failed_at` (RFC 3339) and `origin` (the queue it failed on), and its
//! `attempts` is the attempts it spent.

use chrono::{DateTime, Utc};
use stagedoor_jobs::{Envelope, Headers, JobId};

/// Fields of one entry, in order.
pub(crate) type Fields = Vec<(String, Vec<u8>)>;

/// The fields of `envelope`, whose job has spent `attempts`.
pub(crate) fn encode(envelope: &Envelope, attempts: u32) -> Fields {
    let h = envelope.headers();
    let mut f: Fields = vec![
        ("kind".into(), envelope.kind().as_bytes().to_vec()),
        ("job_id".into(), envelope.id().as_str().as_bytes().to_vec()),
        ("attempts".into(), attempts.to_string().into_bytes()),
        ("payload".into(), envelope.payload().to_vec()),
        (
            "enqueued_at".into(),
            envelope
                .enqueued_at()
                .timestamp_millis()
                .to_string()
                .into_bytes(),
        ),
    ];
    if let Some(r) = &h.request_id {
        f.push(("request_id".into(), r.as_bytes().to_vec()));
    }
    if let Some(t) = &h.trace {
        f.push(("trace".into(), t.as_bytes().to_vec()));
    }
    for (k, v) in &h.extra {
        f.push((format!("h.{k}"), v.as_bytes().to_vec()));
    }
    f
}

/// The value of field `name`.
pub(crate) fn get<'a>(fields: &'a Fields, name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_slice())
}

/// The text of field `name`.
pub(crate) fn text(fields: &Fields, name: &str) -> Option<String> {
    get(fields, name).map(|v| String::from_utf8_lossy(v).into_owned())
}

/// An envelope from entry fields: `Err` names what is missing or malformed.
pub(crate) fn decode(fields: &Fields, attempt: u32) -> Result<Envelope, String> {
    let kind = text(fields, "kind")
        .filter(|k| !k.is_empty())
        .ok_or("the entry has no `kind` field")?;
    let payload = get(fields, "payload")
        .ok_or("the entry has no `payload` field")?
        .to_vec();
    let enqueued = text(fields, "enqueued_at")
        .and_then(|t| t.parse::<i64>().ok())
        .and_then(DateTime::<Utc>::from_timestamp_millis)
        .unwrap_or_else(Utc::now);
    let mut headers = Headers {
        request_id: text(fields, "request_id"),
        trace: text(fields, "trace"),
        ..Headers::default()
    };
    for (k, v) in fields {
        if let Some(name) = k.strip_prefix("h.") {
            headers
                .extra
                .insert(name.to_owned(), String::from_utf8_lossy(v).into_owned());
        }
    }
    let mut env = Envelope::new(kind, payload, enqueued)
        .with_attempt(attempt)
        .with_headers(headers);
    if let Some(id) = text(fields, "job_id").filter(|i| !i.is_empty()) {
        env = env.with_id(JobId::from_string(id));
    }
    Ok(env)
}

/// The attempts an entry says were spent before it was added.
pub(crate) fn attempts(fields: &Fields) -> u32 {
    text(fields, "attempts")
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

/// Fields as a flat argument list.
pub(crate) fn flat(fields: &Fields) -> Vec<Vec<u8>> {
    fields
        .iter()
        .flat_map(|(k, v)| [k.as_bytes().to_vec(), v.clone()])
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
        let back = decode(&f, 3).expect("decodes");
        assert_eq!(back.kind(), "send_email");
        assert_eq!(back.id(), env.id());
        assert_eq!(back.attempt(), 3);
        assert_eq!(back.headers().request_id.as_deref(), Some("7f3a9c2e"));
        assert_eq!(attempts(&f), 2);
    }

    #[test]
    fn a_missing_kind_is_named() {
        let f: Fields = vec![("payload".into(), b"{}".to_vec())];
        assert_eq!(decode(&f, 1).unwrap_err(), "the entry has no `kind` field");
    }

    #[test]
    fn member_is_msgpack() {
        let f: Fields = vec![("kind".into(), b"k".to_vec())];
        assert_eq!(member(&f), [0x92, 0xa4, b'k', b'i', b'n', b'd', 0xa1, b'k']);
        let long: Fields = vec![("payload".into(), vec![b'x'; 300])];
        let m = member(&long);
        assert_eq!(&m[..1], &[0x92]);
        assert_eq!(&m[9..12], &[0xda, 0x01, 0x2c]);
    }
}
