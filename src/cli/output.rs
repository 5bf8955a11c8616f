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

/// A payload as text when it is UTF-8, else as hex.
pub(crate) fn payload_text(p: &[u8]) -> (Option<&str>, Option<String>) {
    match std::str::from_utf8(p) {
        Ok(s) => (Some(s), None),
        Err(_) => (None, Some(p.iter().map(|b| format!("{b:02x}")).collect())),
    }
}

/// A dead letter as JSON, every field.
pub(crate) fn dead_json(d: &DeadLetter, dead: &str) -> serde_json::Value {
    let env = &d.envelope;
    let h = env.headers();
    let (text, hex) = payload_text(env.payload());
    let mut v = serde_json::json!({
        "id": d.id,
        "dead_letter": dead,
        "queue": d.origin,
        "kind": env.kind(),
        "job_id": env.id().as_str(),
        "attempts": d.attempts,
        "failed_at": d.failed_at.to_rfc3339(),
        "enqueued_at": env.enqueued_at().to_rfc3339(),
        "request_id": h.request_id,
        "trace": h.trace,
        "headers": h.extra,
        "payload": text,
        "error": d.error,
        "traceback": d.traceback,
    });
    if let Some(hex) = hex {
        v["payload_hex"] = serde_json::Value::String(hex);
    }
    v
}

/// Dead letters as a table: one line each.
pub(crate) fn dead_table(letters: &[DeadLetter]) -> Table {
    let mut t = table(
        &["ID", "KIND", "JOB ID", "ATTEMPTS", "FAILED", "ERROR"],
        &[3],
    );
    for d in letters {
        t.add_row(vec![
            d.id.clone(),
            d.envelope.kind().to_owned(),
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
    fn first_lines() {
        assert_eq!(first_line("abc\ndef", 10), "abc");
        assert_eq!(first_line("abcdefghijk", 5), "abcd…");
    }
}
