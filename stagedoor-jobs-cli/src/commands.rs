//! The commands, written once for every backend.

use std::collections::BTreeSet;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use stagedoor_jobs::{BrokerError, Cancelled, DeadLetter, DeadLetters, DeadSelector, ReplayReport};

use super::backend::Ctx;
use super::error::{FAILED, Failure, OK};
use super::output::{self, Out};
use super::{Command, Dead, Select};

/// Above this many selected dead letters, a replay shows a progress bar.
const BAR_FROM: usize = 20;
/// Up to this many, a replay moves the dead letters it listed one at a time, by id (the bar
/// moves); above it, one call with the selector, which the backends walk a page at a time. A
/// purge always deletes one at a time, by id: exactly what was listed and confirmed, never a
/// letter that arrived since (a backend looks one dead letter up by its id, not by reading the
/// dead letter).
const ONE_BY_ONE_UP_TO: usize = 1_000;

/// Runs `command` on broker `b`; returns the exit code.
pub(crate) async fn run<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    command: Command,
) -> Result<u8, Failure> {
    match command {
        Command::Queues => queues(b, ctx, out).await,
        Command::Dead(Dead::List { queue, kind, limit }) => {
            let dead = resolve(b, ctx, &queue).await?;
            list(b, ctx, out, &dead, kind, limit as usize).await
        }
        Command::Dead(Dead::Show {
            queue,
            id,
            payload_to,
        }) => {
            let dead = resolve(b, ctx, &queue).await?;
            show(b, ctx, out, &dead, &id, payload_to.as_deref()).await
        }
        Command::Dead(Dead::Replay {
            queue,
            select,
            dry_run,
        }) => {
            let dead = resolve(b, ctx, &queue).await?;
            replay(b, ctx, out, &dead, selector(select), dry_run).await
        }
        Command::Dead(Dead::Purge {
            queue,
            select,
            dry_run,
            yes,
        }) => {
            let dead = resolve(b, ctx, &queue).await?;
            purge(b, ctx, out, &dead, selector(select), dry_run, yes).await
        }
        // Served by `dashboard::serve` before the commands run.
        Command::Cancel { queue, id } => cancel(b, ctx, out, &queue, &id).await,
        Command::Dashboard(_) => Err(Failure::usage(
            "the dashboard is not a listing command: run `stagedoor-jobs dashboard`",
        )),
    }
}

fn selector(s: Select) -> DeadSelector {
    match (s.id, s.kind) {
        (Some(id), _) => DeadSelector::Id(id),
        (None, Some(kind)) => DeadSelector::Kind(kind),
        (None, None) => DeadSelector::All,
    }
}

fn describe(sel: &DeadSelector) -> String {
    match sel {
        DeadSelector::Id(id) => format!("dead letter `{id}`"),
        DeadSelector::Kind(k) => format!("dead letters of kind `{k}`"),
        DeadSelector::All => "dead letters".to_owned(),
    }
}

/// One row of `queues`.
struct QueueRow {
    queue: String,
    dead_letter: String,
    ready: u64,
    pending: u64,
    delayed: u64,
    dead: u64,
    oldest: Option<Duration>,
}

async fn queues<B: DeadLetters>(b: &B, ctx: &Ctx, out: &Out) -> Result<u8, Failure> {
    let names = ctx.queues(b).await.map_err(Failure::broker)?;
    // A queue and its dead letter are one row; a dead letter whose queue is gone has a row too.
    let mut sources: BTreeSet<String> = BTreeSet::new();
    for n in &names {
        if ctx.is_dead(n) {
            sources.insert(ctx.source_of(n));
        } else {
            sources.insert(n.clone());
        }
    }
    let mut rows = Vec::new();
    for q in sources {
        let dead_letter = b.default_dead_letter(&q);
        let s = b.stats(&q).await.map_err(Failure::broker)?;
        let dead = if ctx.dead_exists(&dead_letter) {
            b.dead_len(&dead_letter).await.map_err(Failure::broker)?
        } else {
            0
        };
        rows.push(QueueRow {
            queue: q,
            dead_letter,
            ready: s.ready,
            pending: s.pending,
            delayed: s.delayed,
            dead,
            oldest: s.oldest,
        });
    }
    if out.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "queue": r.queue,
                    "dead_letter": r.dead_letter,
                    "ready": r.ready,
                    "pending": r.pending,
                    "delayed": r.delayed,
                    "dead": r.dead,
                    "oldest_seconds": r.oldest.map(|d| d.as_secs_f64()),
                })
            })
            .collect();
        out.json(&serde_json::Value::Array(v));
    } else if rows.is_empty() {
        out.line(format!("no queues in {}", ctx.place));
    } else {
        let mut t = output::table(
            &["QUEUE", "READY", "PENDING", "DELAYED", "DEAD", "OLDEST"],
            &[1, 2, 3, 4, 5],
        );
        for r in &rows {
            t.add_row(vec![
                r.queue.clone(),
                r.ready.to_string(),
                r.pending.to_string(),
                r.delayed.to_string(),
                r.dead.to_string(),
                r.oldest.map_or("-".to_owned(), output::age),
            ]);
        }
        output::print_table(out, &t);
    }
    Ok(OK)
}

/// The dead letter that QUEUE names (QUEUE, or its default dead letter), checked to exist.
/// `cancel QUEUE ID`.
async fn cancel<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    queue: &str,
    id: &str,
) -> Result<u8, Failure> {
    let job = stagedoor_jobs::JobId::from_string(id);
    let what = b.cancel(queue, &job).await.map_err(Failure::broker)?;
    if what == Cancelled::NotFound {
        let names = ctx.queues(b).await.map_err(Failure::broker)?;
        if !names.iter().any(|n| n == queue) {
            return Err(Failure::not_found(format!(
                "unknown queue `{queue}`: {} has no queue of that name (`stagedoor-jobs queues` lists them)",
                ctx.place
            )));
        }
    }
    let (word, line) = match what {
        Cancelled::Removed => (
            "removed",
            format!(
                "cancelled job {id} of `{queue}`: it was waiting, and is removed; it will not run"
            ),
        ),
        Cancelled::Running => (
            "running",
            format!(
                "cancelled job {id} of `{queue}`: it is running; its handler is told to stop, and the job is dropped when the handler returns"
            ),
        ),
        Cancelled::NotFound => (
            "not_found",
            format!("no job {id} in `{queue}`: it finished, was cancelled already, or never was"),
        ),
    };
    if out.json {
        out.json(&serde_json::json!({ "queue": queue, "job_id": id, "cancelled": word }));
    } else if what == Cancelled::NotFound {
        return Err(Failure::not_found(line));
    } else {
        out.line(line);
    }
    Ok(if what == Cancelled::NotFound {
        super::error::NOT_FOUND
    } else {
        OK
    })
}

async fn resolve<B: DeadLetters>(b: &B, ctx: &Ctx, queue: &str) -> Result<String, Failure> {
    let (source, dead) = if ctx.is_dead(queue) {
        (ctx.source_of(queue), queue.to_owned())
    } else {
        (queue.to_owned(), b.default_dead_letter(queue))
    };
    let unknown = || {
        Failure::not_found(format!(
            "unknown queue `{queue}`: {} has no queue or dead letter of that name (`stagedoor-jobs queues` lists them)",
            ctx.place
        ))
    };
    if !ctx.dead_exists(&dead) {
        return Err(unknown());
    }
    let names = ctx.queues(b).await.map_err(Failure::broker)?;
    if names.iter().any(|n| *n == source || *n == dead) {
        return Ok(dead);
    }
    // A Redis Cluster lists the streams of the nodes given only: ask the dead letter itself.
    if b.dead_len(&dead).await.map_err(Failure::broker)? > 0 {
        return Ok(dead);
    }
    Err(unknown())
}

/// What the backend stored for each of `letters` (see [`output::Stored`]), in order: on
/// Redis, each entry's fields as they are.
async fn stored(
    ctx: &Ctx,
    dead: &str,
    letters: &[DeadLetter],
) -> Result<Vec<output::Stored>, Failure> {
    let fields = match &ctx.redis {
        Some(r) => {
            let ids: Vec<String> = letters.iter().map(|d| d.id.clone()).collect();
            r.dead_letter_fields(dead, &ids)
                .await
                .map_err(Failure::broker)?
        }
        None => vec![None; letters.len()],
    };
    Ok(fields
        .into_iter()
        .map(|fields| output::Stored {
            fields,
            stores_enqueued: ctx.stores_enqueued,
        })
        .collect())
}

async fn list<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    dead: &str,
    kind: Option<String>,
    limit: usize,
) -> Result<u8, Failure> {
    let sel = kind.map_or(DeadSelector::All, DeadSelector::Kind);
    let mut letters = b
        .dead_letters(dead, &sel, limit.saturating_add(1))
        .await
        .map_err(Failure::broker)?;
    let more = letters.len() > limit;
    letters.truncate(limit);
    let facts = stored(ctx, dead, &letters).await?;
    if out.json {
        let v: Vec<_> = letters
            .iter()
            .zip(&facts)
            .map(|(d, s)| output::dead_json(d, dead, s))
            .collect();
        out.json(&serde_json::Value::Array(v));
        return Ok(OK);
    }
    if letters.is_empty() {
        out.line(format!("no {} in `{dead}`", describe(&sel)));
        return Ok(OK);
    }
    output::print_table(out, &output::dead_table(&letters, &facts));
    if more {
        out.line(format!(
            "(the newest {limit} shown: --limit N shows more, `dead show` one in full)"
        ));
    }
    Ok(OK)
}

async fn show<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    dead: &str,
    id: &str,
    payload_to: Option<&std::path::Path>,
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
            let mut stdout = std::io::stdout().lock();
            return match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
                Ok(()) => Ok(OK),
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(OK),
                Err(e) => Err(Failure::new(
                    FAILED,
                    format!("cannot write the payload to stdout: {e}"),
                )),
            };
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
    let env = &d.envelope;
    let h = env.headers();
    let field = |name: &str, value: &str| out.line(format!("{name:<13}{value}"));
    field("dead letter", &format!("{} in {dead}", d.id));
    field("queue", &d.origin);
    field(
        "kind",
        &stored
            .kind(&d)
            .unwrap_or_else(|| "(missing: the entry has no `kind` field)".to_owned()),
    );
    if stored.job_id_stored() {
        field("job id", env.id().as_str());
    } else {
        field(
            "job id",
            &format!(
                "{} (none stored: the dead letter's id stands for it)",
                env.id()
            ),
        );
    }
    match stored.attempts_note(&d) {
        Some(note) => field("attempts", &format!("{} ({note})", d.attempts)),
        None => field("attempts", &d.attempts.to_string()),
    }
    let failed = format!(
        "{} UTC ({})",
        output::when(d.failed_at),
        output::ago(d.failed_at)
    );
    match stored.failed_note() {
        Some(note) => field("failed at", &format!("{failed}; {note}")),
        None => field("failed at", &failed),
    }
    match stored.enqueued(&d) {
        Ok(t) => field("enqueued at", &format!("{} UTC", output::when(t))),
        Err(why) => field("enqueued at", &why),
    }
    if let Some(r) = &h.request_id {
        field("request id", r);
    }
    if let Some(t) = &h.trace {
        field("trace", t);
    }
    if stored.fields.is_none() {
        for (k, v) in &h.extra {
            field(&format!("header {k}"), v);
        }
    }
    match payload {
        None => field("payload", "(missing: the entry has no `payload` field)"),
        Some(p) => {
            let view = output::payload_view(p);
            let more = if view.truncated { "…" } else { "" };
            match (&view.text, &view.hex) {
                (Some(text), _) => field("payload", &format!("{text}{more}")),
                (None, Some(hex)) => field("payload (hex)", &format!("{hex}{more}")),
                _ => {}
            }
            if view.truncated {
                let shown = if view.text.is_some() {
                    output::TEXT_PREVIEW
                } else {
                    output::HEX_PREVIEW
                };
                field(
                    "payload size",
                    &format!(
                        "{} bytes{}, the first {shown} shown (`--payload-to FILE` writes all of it)",
                        view.bytes,
                        if view.text.is_some() {
                            ""
                        } else {
                            ", not UTF-8"
                        },
                    ),
                );
            }
        }
    }
    if let Some((path, n)) = written {
        field(
            "",
            &format!(
                "(the payload's {n} bytes were written to {})",
                path.display()
            ),
        );
    }
    for (k, v) in stored.other_fields() {
        field(&format!("field {k}"), &v);
    }
    field("error", d.error.lines().next().unwrap_or_default());
    for line in d.error.lines().skip(1) {
        field("", line);
    }
    if d.traceback.is_empty() {
        field("traceback", "(none)");
    } else {
        out.line("traceback");
        for line in d.traceback.lines() {
            out.line(format!("  {line}"));
        }
    }
    Ok(OK)
}

fn no_such_id(dead: &str, id: &str) -> Failure {
    Failure::not_found(format!(
        "no dead letter `{id}` in `{dead}` (`stagedoor-jobs dead list` lists them)"
    ))
}

/// The dead letters `sel` takes now; an unknown id is an error.
async fn selected<B: DeadLetters>(
    b: &B,
    dead: &str,
    sel: &DeadSelector,
) -> Result<Vec<DeadLetter>, Failure> {
    let letters = b
        .dead_letters(dead, sel, usize::MAX)
        .await
        .map_err(Failure::broker)?;
    if let (DeadSelector::Id(id), true) = (sel, letters.is_empty()) {
        return Err(no_such_id(dead, id));
    }
    Ok(letters)
}

fn progress(len: usize, verb: &str) -> ProgressBar {
    if len <= BAR_FROM || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len as u64), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({elapsed}, eta {eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(verb.to_owned());
    bar
}

fn spinner(len: usize, verb: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_message(format!("{verb} {len} dead letters…"));
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

async fn replay<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    dead: &str,
    sel: DeadSelector,
    dry_run: bool,
) -> Result<u8, Failure> {
    let letters = selected(b, dead, &sel).await?;
    let origins: BTreeSet<&str> = letters.iter().map(|d| d.origin.as_str()).collect();
    let to = origins.into_iter().collect::<Vec<_>>().join(", ");
    if dry_run {
        if out.json {
            let facts = stored(ctx, dead, &letters).await?;
            let v: Vec<_> = letters
                .iter()
                .zip(&facts)
                .map(|(d, s)| output::dead_json(d, dead, s))
                .collect();
            out.json(&serde_json::json!({
                "dry_run": true,
                "dead_letter": dead,
                "would_replay": letters.len(),
                "dead_letters": v,
            }));
        } else if letters.is_empty() {
            out.line(format!(
                "no {} in `{dead}`: nothing to replay",
                describe(&sel)
            ));
        } else {
            output::print_table(out, &output::dead_table(&letters, &[]));
            out.line(format!(
                "dry run: would replay {} {} from `{dead}` to `{to}`; nothing moved",
                letters.len(),
                plural(letters.len())
            ));
        }
        return Ok(OK);
    }
    if letters.is_empty() && !out.json {
        out.line(format!(
            "no {} in `{dead}`: nothing to replay",
            describe(&sel)
        ));
        return Ok(OK);
    }
    let mut report = ReplayReport::default();
    let mut error = None;
    let mut left = 0;
    if letters.len() <= ONE_BY_ONE_UP_TO {
        let bar = progress(letters.len(), "replaying");
        let interrupt = Interrupt::listen();
        for (i, d) in letters.iter().enumerate() {
            if interrupt.raised() {
                left = letters.len() - i;
                break;
            }
            match b.replay(dead, &DeadSelector::Id(d.id.clone())).await {
                Ok(r) if r.replayed + r.skipped + r.failed == 0 => report.skipped += 1,
                Ok(r) => {
                    report.replayed += r.replayed;
                    report.skipped += r.skipped;
                    report.failed += r.failed;
                }
                Err(e @ (BrokerError::Connection(_) | BrokerError::NotConnected)) => {
                    error = Some(e);
                    break;
                }
                Err(e) => {
                    tracing::error!(dead_letter = %d.id, error = %e, "replay failed");
                    report.failed += 1;
                }
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
    } else {
        let bar = spinner(letters.len(), "replaying");
        match b.replay(dead, &sel).await {
            Ok(r) => report = r,
            Err(e) => error = Some(e),
        }
        bar.finish_and_clear();
    }
    summary(
        out,
        "replayed",
        dead,
        &to,
        report.replayed,
        report.skipped,
        Some(report.failed),
    );
    if let Some(e) = error {
        return Err(Failure::broker(e));
    }
    if left > 0 {
        return Err(interrupted(left, "replay", "replayed"));
    }
    Ok(if report.failed > 0 { FAILED } else { OK })
}

/// Watches for Ctrl-C while dead letters move one at a time: the first stops the loop after
/// the move under way (each is atomic), so the summary says what was done; a second ends the
/// process at once.
struct Interrupt {
    raised: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Interrupt {
    fn listen() -> Self {
        let raised = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&raised);
        let task = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                flag.store(true, Ordering::SeqCst);
                if tokio::signal::ctrl_c().await.is_ok() {
                    std::process::exit(130);
                }
            }
        });
        Self { raised, task }
    }

    fn raised(&self) -> bool {
        self.raised.load(Ordering::SeqCst)
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn interrupted(left: usize, verb: &str, done: &str) -> Failure {
    Failure::new(
        FAILED,
        format!(
            "interrupted: {left} {} not {done}; run the same command again to {verb} them",
            plural(left)
        ),
    )
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        "dead letter"
    } else {
        "dead letters"
    }
}

/// The last line of a replay or purge: what was done, skipped and failed.
fn summary(
    out: &Out,
    verb: &str,
    dead: &str,
    to: &str,
    done: u64,
    skipped: u64,
    failed: Option<u64>,
) {
    if out.json {
        let mut v = serde_json::json!({
            "dead_letter": dead,
            verb: done,
            "skipped": skipped,
        });
        if let Some(f) = failed {
            v["failed"] = f.into();
        }
        out.json(&v);
        return;
    }
    let mut line = format!("{verb} {done}, skipped {skipped}");
    if let Some(f) = failed {
        line.push_str(&format!(", failed {f}"));
    }
    if to.is_empty() {
        line.push_str(&format!(" (`{dead}`)"));
    } else {
        line.push_str(&format!(" (`{dead}` -> `{to}`)"));
    }
    out.line(line);
}

/// Asks on the terminal; `Ok(false)` when the answer is not yes.
fn confirm(question: &str) -> Result<bool, Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::usage(
            "refusing to purge without a confirmation, and stdin is not a terminal to ask on: pass --yes to purge",
        ));
    }
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "{question} [y/N] ");
    let _ = err.flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::usage(format!("cannot read the answer: {e}: pass --yes to purge")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

async fn purge<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    dead: &str,
    sel: DeadSelector,
    dry_run: bool,
    yes: bool,
) -> Result<u8, Failure> {
    let letters = selected(b, dead, &sel).await?;
    if letters.is_empty() {
        if out.json {
            summary(out, "purged", dead, "", 0, 0, None);
        } else {
            out.line(format!(
                "no {} in `{dead}`: nothing to purge",
                describe(&sel)
            ));
        }
        return Ok(OK);
    }
    if dry_run {
        if out.json {
            let facts = stored(ctx, dead, &letters).await?;
            let v: Vec<_> = letters
                .iter()
                .zip(&facts)
                .map(|(d, s)| output::dead_json(d, dead, s))
                .collect();
            out.json(&serde_json::json!({
                "dry_run": true,
                "dead_letter": dead,
                "would_purge": letters.len(),
                "dead_letters": v,
            }));
        } else {
            output::print_table(out, &output::dead_table(&letters, &[]));
            out.line(format!(
                "dry run: would purge {} {} from `{dead}`; nothing deleted",
                letters.len(),
                plural(letters.len())
            ));
        }
        return Ok(OK);
    }
    if !yes {
        let what = match &sel {
            DeadSelector::Id(id) => format!("dead letter `{id}`"),
            other => format!("{} {}", letters.len(), describe(other)),
        };
        if !confirm(&format!(
            "Delete {what} from `{dead}` for good? This cannot be undone."
        ))? {
            out.line("nothing purged");
            return Ok(FAILED);
        }
    }
    let (mut purged, mut skipped) = (0u64, 0u64);
    // Exactly what was listed (and confirmed), however many: never by selector, which would
    // also take the letters that arrived since.
    let bar = progress(letters.len(), "purging");
    let interrupt = Interrupt::listen();
    for (i, d) in letters.iter().enumerate() {
        if interrupt.raised() {
            bar.finish_and_clear();
            summary(out, "purged", dead, "", purged, skipped, None);
            return Err(interrupted(letters.len() - i, "purge", "purged"));
        }
        match b.purge(dead, &DeadSelector::Id(d.id.clone())).await {
            Ok(0) => skipped += 1,
            Ok(n) => purged += n,
            Err(e) => {
                bar.finish_and_clear();
                summary(out, "purged", dead, "", purged, skipped, None);
                return Err(Failure::broker(e));
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    summary(out, "purged", dead, "", purged, skipped, None);
    Ok(OK)
}
