//! `dead show QUEUE ID`: one dead letter with every field, its error and its traceback; its
//! payload's exact bytes to a file with `--payload-to`.

use std::io::Write;
use std::path::Path;

use stagedoor_jobs::{DeadLetter, DeadLetters, DeadSelector};

use super::select::{no_such_id, stored};
use crate::ctx::Ctx;
use crate::error::{FAILED, Failure, OK};
use crate::output::{self, Out, Stored};

/// Where `--payload-to` wrote the payload, and how many bytes.
type Written<'a> = Option<(&'a Path, usize)>;

/// Shows dead letter `id` of `dead` (and writes its payload to `payload_to`, if given).
pub(super) async fn show<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    dead: &str,
    id: &str,
    payload_to: Option<&Path>,
) -> Result<u8, Failure> {
    let found = b
        .dead_letters(dead, &DeadSelector::Id(id.to_owned()), 1)
        .await
        .map_err(Failure::broker)?;
    let Some(d) = found.into_iter().next() else {
        return Err(no_such_id(dead, id));
    };
    let stored = stored(ctx, dead, std::slice::from_ref(&d))
        .await?
        .pop()
        .unwrap_or_default();
    let payload = stored.payload(&d);
    let mut written = None;
    if let Some(path) = payload_to {
        let Some(bytes) = payload else {
            return Err(Failure::new(
                FAILED,
                format!(
                    "dead letter `{}` in `{dead}` has no payload to write: the entry has no `payload` field",
                    d.id
                ),
            ));
        };
        if path.as_os_str() == "-" {
            return to_stdout(bytes);
        }
        std::fs::write(path, bytes).map_err(|e| {
            Failure::new(
                FAILED,
                format!("cannot write the payload to `{}`: {e}", path.display()),
            )
        })?;
        written = Some((path, bytes.len()));
    }
    if out.json {
        out.json(&output::dead_json(&d, dead, &stored));
        return Ok(OK);
    }
    print_facts(out, &d, dead, &stored);
    print_payload(out, payload, written);
    print_rest(out, &d, &stored);
    Ok(OK)
}

/// `--payload-to -`: the payload's bytes on stdout, and nothing else (a closed pipe is fine).
fn to_stdout(bytes: &[u8]) -> Result<u8, Failure> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(OK),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(OK),
        Err(e) => Err(Failure::new(
            FAILED,
            format!("cannot write the payload to stdout: {e}"),
        )),
    }
}

/// One line of `dead show`: the field's name in a column, then its value.
fn field(out: &Out, name: &str, value: &str) {
    out.line(format!("{name:<13}{value}"));
}

/// The dead letter's facts: where it is, its kind, job, attempts, times and headers.
fn print_facts(out: &Out, d: &DeadLetter, dead: &str, stored: &Stored) {
    let env = &d.envelope;
    let h = env.headers();
    field(out, "dead letter", &format!("{} in {dead}", d.id));
    field(out, "queue", &d.origin);
    field(
        out,
        "kind",
        &stored
            .kind(d)
            .unwrap_or_else(|| "(missing: the entry has no `kind` field)".to_owned()),
    );
    if stored.job_id_stored() {
        field(out, "job id", env.id().as_str());
    } else {
        field(
            out,
            "job id",
            &format!(
                "{} (none stored: the dead letter's id stands for it)",
                env.id()
            ),
        );
    }
    match stored.attempts_note(d) {
        Some(note) => field(out, "attempts", &format!("{} ({note})", d.attempts)),
        None => field(out, "attempts", &d.attempts.to_string()),
    }
    let failed = format!(
        "{} UTC ({})",
        output::when(d.failed_at),
        output::ago(d.failed_at)
    );
    match stored.failed_note() {
        Some(note) => field(out, "failed at", &format!("{failed}; {note}")),
        None => field(out, "failed at", &failed),
    }
    match stored.enqueued(d) {
        Ok(t) => field(out, "enqueued at", &format!("{} UTC", output::when(t))),
        Err(why) => field(out, "enqueued at", &why),
    }
    if let Some(r) = &h.request_id {
        field(out, "request id", r);
    }
    if let Some(t) = &h.trace {
        field(out, "trace", t);
    }
    if stored.fields.is_none() {
        for (k, v) in &h.extra {
            field(out, &format!("header {k}"), v);
        }
    }
}

/// The payload, bounded (and its size when cut), and where `--payload-to` wrote it.
fn print_payload(out: &Out, payload: Option<&[u8]>, written: Written<'_>) {
    match payload {
        None => field(
            out,
            "payload",
            "(missing: the entry has no `payload` field)",
        ),
        Some(p) => {
            let view = output::payload_view(p);
            let more = if view.truncated { "…" } else { "" };
            match (&view.text, &view.hex) {
                (Some(text), _) => field(out, "payload", &format!("{text}{more}")),
                (None, Some(hex)) => field(out, "payload (hex)", &format!("{hex}{more}")),
                _ => {}
            }
            if view.truncated {
                let (shown, not_utf8) = if view.text.is_some() {
                    (output::TEXT_PREVIEW, "")
                } else {
                    (output::HEX_PREVIEW, ", not UTF-8")
                };
                field(
                    out,
                    "payload size",
                    &format!(
                        "{} bytes{not_utf8}, the first {shown} shown (`--payload-to FILE` writes all of it)",
                        view.bytes,
                    ),
                );
            }
        }
    }
    if let Some((path, n)) = written {
        field(
            out,
            "",
            &format!(
                "(the payload's {n} bytes were written to {})",
                path.display()
            ),
        );
    }
}

/// The other stored fields, the error and the traceback.
fn print_rest(out: &Out, d: &DeadLetter, stored: &Stored) {
    for (k, v) in stored.other_fields() {
        field(out, &format!("field {k}"), &v);
    }
    field(out, "error", d.error.lines().next().unwrap_or_default());
    for line in d.error.lines().skip(1) {
        field(out, "", line);
    }
    if d.traceback.is_empty() {
        field(out, "traceback", "(none)");
    } else {
        out.line("traceback");
        for line in d.traceback.lines() {
            out.line(format!("  {line}"));
        }
    }
}
