//! Tables for people, JSON for scripts, and the small formats both use.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use chrono::{DateTime, Utc};
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table, presets};
use stagedoor_jobs::DeadLetter;

/// Where results go: stdout, as tables or as JSON.
pub(crate) struct Out {
    /// JSON instead of tables.
    pub(crate) json: bool,
}

impl Out {
    /// Output as tables, or as JSON when `json`.
    pub(crate) fn new(json: bool) -> Self {
        Self { json }
    }

    /// Prints `text` and a line break to stdout; a closed pipe (`| head`) is not an error.
    pub(crate) fn line(&self, text: impl std::fmt::Display) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
    }

    /// Prints `value` as pretty JSON.
    pub(crate) fn json(&self, value: &serde_json::Value) {
        self.line(serde_json::to_string_pretty(value).unwrap_or_default());
    }
}

/// A table with a header row, no borders, numbers aligned right in the `numeric` columns.
pub(crate) fn table(header: &[&str], numeric: &[usize]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    if std::io::stdout().is_terminal() {
        t.set_content_arrangement(ContentArrangement::Dynamic);
    }
    t.set_header(header.iter().map(Cell::new));
    for &i in numeric {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// Prints a table without the padding comfy-table puts at the start of each line.
pub(crate) fn print_table(out: &Out, t: &Table) {
    for line in t.lines() {
        out.line(line.strip_prefix(' ').unwrap_or(&line).trim_end());
    }
}

/// A short age: `42s`, `3m05s`, `2h10m`, `4d02h`.
pub(crate) fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// How long ago `t` was, as [`age`].
pub(crate) fn ago(t: DateTime<Utc>) -> String {
    format!("{} ago", age((Utc::now() - t).to_std().unwrap_or_default()))
}

/// A time as people read it in a table: `2026-05-01 21:14:03`, in UTC.
pub(crate) fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// The first line of `text`, cut to `max` characters.
pub(crate) fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > max {
        let cut: String = line.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

/// The most payload bytes shown as text; a longer payload is cut there.
pub(crate) const TEXT_PREVIEW: usize = 1024;
/// The most payload bytes shown as hex (two characters each) when it is not UTF-8.
pub(crate) const HEX_PREVIEW: usize = 64;
/// The most characters of a stored field's value shown by `dead show`.
const FIELD_PREVIEW: usize = 200;

/// A payload as shown: text when it is UTF-8, else hex; bounded ([`TEXT_PREVIEW`],
/// [`HEX_PREVIEW`]), with its size and whether it was cut.
pub(crate) struct PayloadView {
    /// The payload (or its start) as text, when it is UTF-8.
    pub(crate) text: Option<String>,
    /// The payload (or its start) as hex, when it is not UTF-8.
    pub(crate) hex: Option<String>,
    /// Its size in bytes.
    pub(crate) bytes: usize,
    /// Whether only its start is shown.
    pub(crate) truncated: bool,
}

/// A payload as text when it is UTF-8, else as hex, bounded.
pub(crate) fn payload_view(p: &[u8]) -> PayloadView {
    match std::str::from_utf8(p) {
        Ok(s) => {
            let mut end = s.len().min(TEXT_PREVIEW);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            PayloadView {
                text: Some(s[..end].to_owned()),
                hex: None,
                bytes: p.len(),
                truncated: end < s.len(),
            }
        }
        Err(_) => PayloadView {
            text: None,
            hex: Some(
                p.iter()
                    .take(HEX_PREVIEW)
                    .map(|b| format!("{b:02x}"))
                    .collect(),
            ),
            bytes: p.len(),
            truncated: p.len() > HEX_PREVIEW,
        },
    }
}

/// Bytes as text on one line: UTF-8 as it is but control characters, which are escaped
/// (`\x00`, `\x0a`), as is every byte that is not UTF-8 (`\xff`); never replaced.
pub(crate) fn escaped(bytes: &[u8]) -> String {
    bytes.utf8_chunks().fold(String::new(), |mut s, c| {
        for ch in c.valid().chars() {
            if ch.is_ascii_control() {
                s.push_str(&format!("\\x{:02x}", u32::from(ch)));
            } else if ch.is_control() {
                s.push_str(&format!("\\u{{{:04x}}}", u32::from(ch)));
            } else {
                s.push(ch);
            }
        }
        for b in c.invalid() {
            s.push_str(&format!("\\x{b:02x}"));
        }
        s
    })
}

/// A stored value for one line: escaped, cut at [`FIELD_PREVIEW`] characters (saying its size).
fn field_value(v: &[u8]) -> String {
    let text = escaped(v);
    if text.chars().count() > FIELD_PREVIEW {
        let cut: String = text.chars().take(FIELD_PREVIEW).collect();
        format!("{cut}… ({} bytes)", v.len())
    } else {
        text
    }
}

/// The fields every dead entry of Redis may have, which `dead show` shows by their own names.
const KNOWN_FIELDS: [&str; 11] = [
    "kind",
    "job_id",
    "attempts",
    "payload",
    "enqueued_at",
    "request_id",
    "trace",
    "error",
    "traceback",
    "failed_at",
    "origin",
];

/// What the backend stored for a dead letter, beyond its decoded form: the facts that are
/// missing (so that nothing made up is shown) and, on Redis, every field as stored.
#[derive(Default)]
pub(crate) struct Stored {
    /// The dead entry's fields as stored (Redis), names and values as bytes; `None` for a
    /// backend whose dead letters are rows.
    pub(crate) fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
    /// Whether the backend keeps enqueued times (an SQL table may have no `enqueued_at`).
    pub(crate) stores_enqueued: bool,
}

impl Stored {
    /// `Some(value)` when the entry has field `name`, `Some(None)` when it has not, `None`
    /// when the backend has no fields.
    fn field(&self, name: &str) -> Option<Option<&[u8]>> {
        self.fields.as_ref().map(|f| {
            f.iter()
                .find(|(k, _)| k == name.as_bytes())
                .map(|(_, v)| v.as_slice())
        })
    }

    /// The kind, or `None` when none is stored.
    pub(crate) fn kind(&self, d: &DeadLetter) -> Option<String> {
        match self.field("kind") {
            Some(Some(k)) if !k.is_empty() => Some(escaped(k)),
            Some(_) => None,
            None => Some(d.envelope.kind().to_owned()),
        }
    }

    /// Whether a job id is stored (else the dead letter's own id stands for it).
    pub(crate) fn job_id_stored(&self) -> bool {
        !matches!(self.field("job_id"), Some(None | Some([])))
    }

    /// When the job was enqueued, or why that is unknown.
    pub(crate) fn enqueued(&self, d: &DeadLetter) -> Result<DateTime<Utc>, String> {
        match self.field("enqueued_at") {
            Some(None) => Err("unknown (the entry has no `enqueued_at` field)".to_owned()),
            Some(Some(v)) => std::str::from_utf8(v)
                .ok()
                .and_then(|t| t.parse::<i64>().ok())
                .and_then(DateTime::<Utc>::from_timestamp_millis)
                .ok_or_else(|| format!("unknown (its `enqueued_at` field is `{}`)", escaped(v))),
            None if self.stores_enqueued => Ok(d.envelope.enqueued_at()),
            None => Err("unknown (the table has no `enqueued_at` column)".to_owned()),
        }
    }

    /// Why the failure time shown is the dead entry's own, when no `failed_at` is stored.
    pub(crate) fn failed_note(&self) -> Option<&'static str> {
        matches!(self.field("failed_at"), Some(None))
            .then_some("no `failed_at` field: when the entry was added to the dead stream")
    }

    /// The payload's exact bytes, or `None` when none is stored.
    pub(crate) fn payload<'a>(&'a self, d: &'a DeadLetter) -> Option<&'a [u8]> {
        match self.field("payload") {
            Some(p) => p,
            None => Some(d.envelope.payload()),
        }
    }

    /// The `attempts` field as stored, when it is not the number shown.
    pub(crate) fn attempts_note(&self, d: &DeadLetter) -> Option<String> {
        match self.field("attempts") {
            Some(Some(v)) if v != d.attempts.to_string().as_bytes() => Some(format!(
                "the entry's `attempts` field is `{}`",
                field_value(v)
            )),
            Some(None) => Some("the entry has no `attempts` field".to_owned()),
            _ => None,
        }
    }

    /// The stored fields other than the known ones (headers `h.<name>`, anything a producer
    /// added), names and values escaped where they are not UTF-8, values bounded.
    pub(crate) fn other_fields(&self) -> Vec<(String, String)> {
        self.fields
            .iter()
            .flatten()
            .filter(|(k, _)| !KNOWN_FIELDS.iter().any(|n| k == n.as_bytes()))
            .map(|(k, v)| (escaped(k), field_value(v)))
            .collect()
    }
}

/// A dead letter as JSON, every field (a payload bounded as [`payload_view`]; missing facts
/// are `null`).
pub(crate) fn dead_json(d: &DeadLetter, dead: &str, stored: &Stored) -> serde_json::Value {
    let env = &d.envelope;
    let h = env.headers();
    let mut v = serde_json::json!({
        "id": d.id,
        "dead_letter": dead,
        "queue": d.origin,
        "kind": stored.kind(d),
        "job_id": env.id().as_str(),
        "job_id_stored": stored.job_id_stored(),
        "attempts": d.attempts,
        "failed_at": d.failed_at.to_rfc3339(),
        "enqueued_at": stored.enqueued(d).ok().map(|t| t.to_rfc3339()),
        "request_id": h.request_id,
        "trace": h.trace,
        "headers": h.extra,
        "payload": null,
        "error": d.error,
        "traceback": d.traceback,
    });
    match stored.payload(d) {
        Some(p) => {
            let view = payload_view(p);
            v["payload"] = view.text.into();
            if let Some(hex) = view.hex {
                v["payload_hex"] = serde_json::Value::String(hex);
            }
            v["payload_bytes"] = view.bytes.into();
            v["payload_truncated"] = view.truncated.into();
        }
        None => v["payload_missing"] = true.into(),
    }
    if stored.fields.is_some() {
        let other: serde_json::Map<String, serde_json::Value> = stored
            .other_fields()
            .into_iter()
            .map(|(k, v)| (k, v.into()))
            .collect();
        v["fields"] = other.into();
    }
    v
}

/// Dead letters as a table: one line each (`stored` is each one's [`Stored`], in order).
pub(crate) fn dead_table(letters: &[DeadLetter], stored: &[Stored]) -> Table {
    let mut t = table(
        &["ID", "KIND", "JOB ID", "ATTEMPTS", "FAILED", "ERROR"],
        &[3],
    );
    for (i, d) in letters.iter().enumerate() {
        let kind = stored
            .get(i)
            .map_or_else(|| Some(d.envelope.kind().to_owned()), |s| s.kind(d));
        t.add_row(vec![
            d.id.clone(),
            kind.unwrap_or_else(|| "(missing)".to_owned()),
            d.envelope.id().to_string(),
            d.attempts.to_string(),
            ago(d.failed_at),
            first_line(&d.error, 80),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        assert_eq!(age(Duration::from_secs(42)), "42s");
        assert_eq!(age(Duration::from_secs(185)), "3m05s");
        assert_eq!(age(Duration::from_secs(7800)), "2h10m");
        assert_eq!(age(Duration::from_secs(4 * 86400 + 7200)), "4d02h");
    }

    #[test]
    fn payloads_are_bounded() {
        let v = payload_view(&vec![0xff; 1 << 20]);
        assert_eq!(v.hex.as_deref().map(str::len), Some(2 * HEX_PREVIEW));
        assert_eq!((v.bytes, v.truncated), (1 << 20, true));
        let v = payload_view("é".repeat(TEXT_PREVIEW).as_bytes());
        assert_eq!(v.text.as_deref().map(str::len), Some(TEXT_PREVIEW));
        assert!(v.truncated);
        let v = payload_view(b"{}");
        assert_eq!((v.text.as_deref(), v.truncated), (Some("{}"), false));
    }

    #[test]
    fn bytes_are_escaped_not_replaced() {
        assert_eq!(escaped(b"h.\xffraw"), "h.\\xffraw");
        assert_eq!(escaped("café".as_bytes()), "café");
        assert_eq!(escaped(b"a\x00\nb"), "a\\x00\\x0ab");
    }

    #[test]
    fn first_lines() {
        assert_eq!(first_line("abc\ndef", 10), "abc");
        assert_eq!(first_line("abcdefghijk", 5), "abcd…");
    }
}
