//! `result ID`: the value job ID's handler returned, when it finished, and its last progress.

use stagedoor_jobs::broker::Records;
use stagedoor_jobs::results::{JobResult, Progress, ResultError, Results};

use crate::error::{Failure, NOT_FOUND, OK, check_id};
use crate::output::{self, Out};

/// `result ID`.
pub(super) async fn result<B: Records>(b: &B, out: &Out, id: &str) -> Result<u8, Failure> {
    check_id("job", id)?;
    let found = b.result(id).await.map_err(Failure::broker)?;
    let progress = b.progress(id).await.map_err(Failure::broker)?;
    if out.json {
        out.json(&json(id, found.as_ref(), progress.as_ref()));
        return Ok(if found.is_some() { OK } else { NOT_FOUND });
    }
    if let Some(p) = &progress {
        print_progress(out, p);
    }
    let Some(r) = found else {
        return Err(Failure::not_found(format!(
            "no result for job {} (not finished, finished without a value, or past its retention)",
            output::escaped(id.as_bytes())
        )));
    };
    out.line(format!(
        "{:<13}{} UTC ({})",
        "finished at",
        output::when(r.finished_at()),
        output::ago(r.finished_at())
    ));
    match r.json() {
        Ok(bytes) => {
            out.line("result");
            out.line(pretty(bytes));
        }
        Err(e) => out.line(format!("{:<13}{}", "result", too_large(&e))),
    }
    Ok(OK)
}

/// The last progress, one line: `42% copying part 3 (at 2026-05-01 21:14:03 UTC, 3s ago)`.
fn print_progress(out: &Out, p: &Progress) {
    let message = output::escaped(p.message.as_bytes());
    out.line(format!(
        "{:<13}{:.0}% {message} (at {} UTC, {})",
        "progress",
        f64::from(p.fraction.clamp(0.0, 1.0)) * 100.0,
        output::when(p.at),
        output::ago(p.at)
    ));
}

/// JSON text pretty-printed; text that does not parse as JSON is shown as stored, escaped.
fn pretty(bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| output::escaped(bytes))
}

/// Why the value is not there: too large (with its size and the limit), or what else it was.
fn too_large(e: &ResultError) -> String {
    match e {
        ResultError::TooLarge { bytes, limit, .. } => format!(
            "not kept: the handler returned {bytes} bytes of JSON, past the limit of {limit} (return a reference to where the data is instead)"
        ),
        other => other.to_string(),
    }
}

/// `result --json`: `result` is the value itself (`null` when there is none or it was too
/// large, then `too_large` says how large).
fn json(id: &str, r: Option<&JobResult>, p: Option<&Progress>) -> serde_json::Value {
    let mut v = serde_json::json!({
        "job_id": id,
        "found": r.is_some(),
        "finished_at": r.map(|r| r.finished_at().to_rfc3339()),
        "result": null,
        "progress": p.map(|p| serde_json::json!({
            "fraction": p.fraction,
            "message": p.message,
            "at": p.at.to_rfc3339(),
        })),
    });
    match r.map(JobResult::json) {
        Some(Ok(bytes)) => {
            v["result"] =
                serde_json::from_slice(bytes).unwrap_or_else(|_| output::escaped(bytes).into());
        }
        Some(Err(ResultError::TooLarge { bytes, limit, .. })) => {
            v["too_large"] = serde_json::json!({ "bytes": bytes, "limit": limit });
        }
        _ => {}
    }
    v
}
