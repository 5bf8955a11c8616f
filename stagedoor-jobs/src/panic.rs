//! Catching a handler's panic with its message and location, so the worker lives on.
//!
//! The traceback kept with the failure (and in the dead letter) is the panic site, then, when
//! a backtrace was captured (`RUST_BACKTRACE=1`), the frames of the application's code only:
//! frames of the standard library, the async runtime, `futures`, `tracing` and stagedoor-jobs
//! itself are left out, at most [`TRACEBACK_MAX_FRAMES`] frames and [`TRACEBACK_MAX_BYTES`]
//! bytes are kept, and a last line says how many were omitted. Paths are made relative: to the
//! workspace (or crate) root for the application's files, to the crate's own folder for a
//! dependency's (`tokio-1.47.1/src/..`); no absolute path of the build machine is kept.
//!
//! The backtrace is only captured in the panic hook; its symbols are resolved afterwards on
//! tokio's blocking pool while [`CatchPanic`] waits. Resolving reads the binary's debug info:
//! from about 100 ms for a process's first panic to well over a second on a busy machine. Done in
//! the hook, it held the handler's thread that long, and with it the delivery's task, whose lease
//! renewals then stopped: a lease shorter than that ran out and the worker's own claim loop
//! reclaimed the job it was still running (its next delivery, an attempt too many).

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll, ready};

use crate::outcome::{Failure, FailureCause};

thread_local! {
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<Option<Caught>> = const { RefCell::new(None) };
}

/// A handler's panic as the hook saw it: its site, and its backtrace captured (with
/// `RUST_BACKTRACE=1`) but not yet resolved to symbols.
struct Caught {
    site: Option<(String, u32, u32)>,
    backtrace: Option<std::backtrace::Backtrace>,
}

impl Caught {
    /// The traceback; with a backtrace this resolves its symbols, which is slow (see the module
    /// documentation): [`CatchPanic`] calls it on the blocking pool.
    fn traceback(self) -> String {
        let backtrace = self.backtrace.map(|bt| bt.to_string());
        let site = self.site.as_ref().map(|(f, l, c)| (f.as_str(), *l, *c));
        traceback(site, backtrace.as_deref())
    }
}

static HOOK: Once = Once::new();

/// Installs (once per process) a panic hook that, for a panic inside a handler, records where it
/// happened (the backtrace captured, not resolved: that is slow) and keeps it off stderr (the
/// runtime logs it with the job); every other panic goes to the previous hook unchanged.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
            if IN_HANDLER.with(Cell::get) {
                let backtrace = capture_backtrace();
                let site = info
                    .location()
                    .map(|l| (l.file().to_owned(), l.line(), l.column()));
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(Caught { site, backtrace }));
            } else {
                previous(info);
            }
        }));
    });
}

#[cfg(test)]
thread_local! {
    /// A unit test's way to capture a backtrace whatever `RUST_BACKTRACE` says.
    static FORCE_BACKTRACE: Cell<bool> = const { Cell::new(false) };
}

/// The backtrace of a panic, captured when `RUST_BACKTRACE` (or `RUST_LIB_BACKTRACE`) asks for
/// one; its symbols are not resolved yet.
fn capture_backtrace() -> Option<std::backtrace::Backtrace> {
    #[cfg(test)]
    if FORCE_BACKTRACE.with(Cell::get) {
        return Some(std::backtrace::Backtrace::force_capture());
    }
    let bt = std::backtrace::Backtrace::capture();
    (bt.status() == std::backtrace::BacktraceStatus::Captured).then_some(bt)
}

/// The most backtrace frames a panic's traceback keeps (the application's frames nearest the
/// panic); the rest are counted in a last "… N frames omitted" line.
pub const TRACEBACK_MAX_FRAMES: usize = 12;

/// The most bytes a panic's traceback takes, its last line included: frames beyond it are
/// counted as omitted.
pub const TRACEBACK_MAX_BYTES: usize = 2048;

/// Symbol prefixes of frames that are not the application's code.
const INTERNAL: &[&str] = &[
    "std::",
    "core::",
    "alloc::",
    "tokio::",
    "futures::",
    "futures_util::",
    "futures_core::",
    "futures_executor::",
    "tracing::",
    "tracing_futures::",
    "stagedoor_jobs::",
    "stagedoor_jobs_redis::",
    "stagedoor_jobs_sqlx::",
    "backtrace::",
    "panic_unwind::",
    "test::",
    "__rust",
    "rust_begin_unwind",
    "rust_panic",
    "_start",
    "__libc_start",
    "start_thread",
    "clone",
    "__clone",
    "<unknown>",
];

/// One frame of a printed backtrace: its header (`  12: crate::f`) and its `at` lines.
struct Frame<'a> {
    index: &'a str,
    symbol: &'a str,
    at: Vec<&'a str>,
}

/// The traceback of a panic: the panic site (`file:line:col`), then the application's frames of
/// `backtrace` (a `std::backtrace::Backtrace` as printed), bounded, paths made relative.
pub(crate) fn traceback(site: Option<(&str, u32, u32)>, backtrace: Option<&str>) -> String {
    let mut roots = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd.to_string_lossy().into_owned());
    }
    let frames = backtrace.map(parse_frames).unwrap_or_default();
    // The panic site of the application's own code is relative (`src/jobs.rs`): the absolute
    // path a frame gives for that same file tells the root of its workspace.
    if let Some((file, _, _)) = site
        && !is_absolute(file)
    {
        let tail = format!("/{}", file.trim_start_matches("./"));
        for f in &frames {
            for at in &f.at {
                let (path, _) = split_location(at);
                if let Some(root) = path.strip_suffix(tail.as_str())
                    && is_absolute(root)
                    && !roots.iter().any(|r| r == root)
                {
                    roots.push(root.to_owned());
                }
            }
        }
    }
    let mut out = match site {
        Some((file, line, col)) => format!("panicked at {}:{line}:{col}", relative(file, &roots)),
        None => "panicked at an unknown location".to_owned(),
    };
    if backtrace.is_none() {
        return truncate(out, TRACEBACK_MAX_BYTES);
    }
    let total = frames.len();
    let mut kept = 0;
    // What the omitted line takes at most, reserved.
    let reserve = 160;
    for f in frames.iter().filter(|f| is_application(f.symbol)) {
        if kept == TRACEBACK_MAX_FRAMES {
            break;
        }
        let mut text = format!("\n{:>4}: {}", f.index, f.symbol);
        for at in &f.at {
            let (path, rest) = split_location(at);
            text.push_str(&format!(
                "\n             at {}{rest}",
                relative(path, &roots)
            ));
        }
        if out.len() + text.len() + reserve > TRACEBACK_MAX_BYTES {
            break;
        }
        out.push_str(&text);
        kept += 1;
    }
    let omitted = total - kept;
    if omitted > 0 {
        out.push_str(&format!(
            "\n… {omitted} frames omitted (the standard library, the async runtime, stagedoor-jobs, and beyond {TRACEBACK_MAX_FRAMES} frames or {TRACEBACK_MAX_BYTES} bytes)"
        ));
    }
    truncate(out, TRACEBACK_MAX_BYTES)
}

/// The frames of a backtrace printed by `std::backtrace::Backtrace`'s `Display`.
fn parse_frames(bt: &str) -> Vec<Frame<'_>> {
    let mut frames: Vec<Frame<'_>> = Vec::new();
    for line in bt.lines() {
        let t = line.trim_start();
        if let Some(at) = t.strip_prefix("at ") {
            if let Some(f) = frames.last_mut() {
                f.at.push(at.trim_end());
            }
            continue;
        }
        if let Some((index, symbol)) = t.split_once(": ")
            && !index.is_empty()
            && index.bytes().all(|b| b.is_ascii_digit())
        {
            frames.push(Frame {
                index,
                symbol: symbol.trim_end(),
                at: Vec::new(),
            });
        }
    }
    frames
}

/// Whether a frame's symbol is the application's code (not the standard library, the runtime,
/// stagedoor-jobs, or the unwinding machinery). `<A as B>::f` is judged by `A`.
fn is_application(symbol: &str) -> bool {
    let mut s = symbol.trim();
    if let Some(inner) = s.strip_prefix('<') {
        s = inner;
        for p in ["&mut ", "&", "dyn ", "*const ", "*mut "] {
            s = s.strip_prefix(p).unwrap_or(s);
        }
    }
    !INTERNAL.iter().any(|p| s.starts_with(p))
}

/// `path:line:col` split into the path and `:line:col` (either may be missing).
fn split_location(at: &str) -> (&str, &str) {
    let mut end = at.len();
    for _ in 0..2 {
        match at[..end].rfind(':') {
            Some(i) if at[i + 1..end].bytes().all(|b| b.is_ascii_digit()) && i + 1 < end => end = i,
            _ => break,
        }
    }
    at.split_at(end)
}

fn is_absolute(path: &str) -> bool {
    path.starts_with('/')
        || path.starts_with('\\')
        || (path.len() > 2
            && path.as_bytes()[1] == b':'
            && path.as_bytes()[0].is_ascii_alphabetic())
}

/// `path` without the build machine's folders: relative to one of `roots` (the working
/// directory, the workspace), to a dependency's own folder (`tokio-1.47.1/src/..`), to the
/// standard library's (`library/std/src/..`), or else its file name alone.
fn relative(path: &str, roots: &[String]) -> String {
    if !is_absolute(path) {
        return path.to_owned();
    }
    let unix = path.replace('\\', "/");
    for root in roots {
        let root = root.replace('\\', "/");
        let root = root.trim_end_matches('/');
        if let Some(rest) = unix.strip_prefix(root)
            && let Some(rest) = rest.strip_prefix('/')
        {
            return rest.to_owned();
        }
    }
    // ~/.cargo/registry/src/<index>/<crate>-<version>/..., ~/.cargo/git/checkouts/<repo>/<rev>/...
    for marker in ["/registry/src/", "/git/checkouts/"] {
        if let Some(i) = unix.find(marker) {
            let rest = &unix[i + marker.len()..];
            if let Some((_, in_index)) = rest.split_once('/') {
                return in_index.to_owned();
            }
        }
    }
    // /rustc/<commit>/library/std/src/...
    if let Some(i) = unix.find("/library/") {
        return unix[i + 1..].to_owned();
    }
    match unix.rsplit_once('/') {
        Some((_, name)) => format!("…/{name}"),
        None => unix,
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// A future that turns a panic of the inner future into `Err(Failure)`. A captured backtrace
/// is resolved on tokio's blocking pool (inline outside a tokio runtime) while this future is
/// pending, so that the task running it (a delivery's, which renews its lease) is not held up.
pub(crate) struct CatchPanic<F: ?Sized> {
    inner: Pin<Box<F>>,
    /// After a panic with a backtrace: its error, its site alone (should the traceback not be
    /// made: the runtime shutting down), and the traceback being made.
    resolving: Option<(String, String, tokio::task::JoinHandle<String>)>,
}

impl<F: Future> CatchPanic<F> {
    pub(crate) fn new(inner: F) -> Self {
        Self::boxed(Box::pin(inner))
    }
}

impl<F: Future + ?Sized> CatchPanic<F> {
    /// Around a future boxed already (a handler's): no second box.
    pub(crate) fn boxed(inner: Pin<Box<F>>) -> Self {
        install_hook();
        Self {
            inner,
            resolving: None,
        }
    }
}

struct Flag(bool);
impl Drop for Flag {
    fn drop(&mut self) {
        IN_HANDLER.with(|c| c.set(self.0));
    }
}

impl<F: Future + ?Sized> Future for CatchPanic<F> {
    type Output = Result<F::Output, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Unpin: the inner future is boxed, a JoinHandle is Unpin.
        let this = self.get_mut();
        if let Some((_, _, handle)) = &mut this.resolving {
            let made = ready!(Pin::new(handle).poll(cx));
            let (error, site, _) = this.resolving.take().expect("resolving");
            let traceback = made.unwrap_or(site);
            return Poll::Ready(Err(Failure::new(FailureCause::Panic, error, traceback)));
        }
        let was = IN_HANDLER.with(|c| c.replace(true));
        let restore = Flag(was);
        let inner = this.inner.as_mut();
        let payload = match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(v)) => return Poll::Ready(Ok(v)),
            Err(payload) => payload,
        };
        drop(restore);
        let error = format!("panic: {}", panic_message(&*payload));
        let traceback = match LAST_PANIC.with(|p| p.borrow_mut().take()) {
            None => String::new(),
            Some(caught) if caught.backtrace.is_none() => caught.traceback(),
            Some(caught) => match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let site = traceback(
                        caught.site.as_ref().map(|(f, l, c)| (f.as_str(), *l, *c)),
                        None,
                    );
                    let made = rt.spawn_blocking(move || caught.traceback());
                    this.resolving = Some((error, site, made));
                    return Pin::new(this).poll(cx);
                }
                Err(_) => caught.traceback(),
            },
        };
        Poll::Ready(Err(Failure::new(FailureCause::Panic, error, traceback)))
    }
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_becomes_a_failure_with_its_location() {
        let line = line!() + 2;
        let fut = async {
            panic!("seat label '14-C' is not a row letter");
        };
        let err = CatchPanic::new(fut).await.expect_err("the panic is caught");
        assert_eq!(err.cause, FailureCause::Panic);
        assert!(err.error.contains("seat label '14-C'"), "{}", err.error);
        assert!(
            err.traceback.contains(&format!("panic.rs:{line}")),
            "{}",
            err.traceback
        );
    }

    /// A captured backtrace is resolved to symbols off the task that polls the handler (which
    /// renews the delivery's lease meanwhile): the first poll after the panic is pending, and the
    /// traceback still has the site and the frames.
    #[tokio::test]
    async fn a_backtrace_is_resolved_without_holding_the_polling_task() {
        FORCE_BACKTRACE.with(|f| f.set(true));
        let line = line!() + 2;
        let mut fut = CatchPanic::new(async {
            panic!("the seat map has no row C");
        });
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let first = Pin::new(&mut fut).poll(&mut cx);
        FORCE_BACKTRACE.with(|f| f.set(false));
        assert!(
            first.is_pending(),
            "the backtrace's symbols are resolved off the polling task"
        );
        let err = fut.await.expect_err("the panic is caught");
        assert_eq!(err.cause, FailureCause::Panic);
        assert!(err.error.contains("no row C"), "{}", err.error);
        assert!(
            err.traceback.starts_with("panicked at ")
                && err.traceback.contains(&format!("panic.rs:{line}")),
            "{}",
            err.traceback
        );
        assert!(
            err.traceback.lines().count() > 1,
            "the backtrace's frames: {}",
            err.traceback
        );
    }

    /// A backtrace as `std` printed it for a panic in a handler (frames 0-12, 18-19, 28-29 and
    /// 89-92 of the 93 of a real one, run from another folder than the workspace), with a
    /// dependency's frame and another workspace crate's frame added.
    const CAPTURED: &str = "   0: stagedoor_jobs::panic::install_hook::{{closure}}::{{closure}}
             at /home/ci/build/stagedoor/stagedoor-jobs/src/panic.rs:36:26
   1: <alloc::boxed::Box<dyn for<'a, 'b> core::ops::function::Fn<(&'a std::panic::PanicHookInfo<'b>,), Output = ()> + core::marker::Sync + core::marker::Send> as core::ops::function::Fn<(&std::panic::PanicHookInfo,)>>::call
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/alloc/src/boxed.rs:2254:9
   2: std::panicking::panic_with_hook
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/panicking.rs:833:13
   3: std::panicking::panic_handler::{closure#0}
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/panicking.rs:698:13
   4: std::sys::backtrace::__rust_end_short_backtrace::<std::panicking::panic_handler::{closure#0}, !>
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/sys/backtrace.rs:182:18
   5: __rustc::rust_begin_unwind
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/panicking.rs:689:5
   6: core::panicking::panic_fmt
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:80:14
   7: serde_json::de::from_trait
             at /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/serde_json-1.0.140/src/de.rs:2699:5
   8: traceback::row_of
             at /home/ci/build/stagedoor/tests/traceback.rs:28:14
   9: seats::assign::{{closure}}
             at /home/ci/build/stagedoor/seats/src/assign.rs:34:16
  10: <stagedoor_jobs::handler::Typed<H,M,Args> as stagedoor_jobs::handler::ErasedHandler>::run::{{closure}}
             at /home/ci/build/stagedoor/stagedoor-jobs/src/handler.rs:143:54
  11: <core::pin::Pin<P> as core::future::future::Future>::poll
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/future/future.rs:133:9
  12: <stagedoor_jobs::panic::CatchPanic<F> as core::future::future::Future>::poll::{{closure}}
             at /home/ci/build/stagedoor/stagedoor-jobs/src/panic.rs:296:71
  18: <stagedoor_jobs::panic::CatchPanic<F> as core::future::future::Future>::poll
             at /home/ci/build/stagedoor/stagedoor-jobs/src/panic.rs:296:15
  19: stagedoor_jobs::runtime::Worker<B>::process::{{closure}}::{{closure}}::{{closure}}
             at /home/ci/build/stagedoor/stagedoor-jobs/src/runtime.rs:580:31
  28: stagedoor_jobs::runtime::Worker<B>::start::{{closure}}
             at /home/ci/build/stagedoor/stagedoor-jobs/src/runtime.rs:452:30
  29: tokio::runtime::task::core::Core<T,S>::poll::{{closure}}
             at /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/tokio-1.54.1/src/runtime/task/core.rs:365:24
  89: <alloc::boxed::Box<dyn core::ops::function::FnOnce<(), Output = ()> + core::marker::Send> as core::ops::function::FnOnce<()>>::call_once
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/alloc/src/boxed.rs:2240:9
  90: <std::sys::thread::unix::Thread>::new::thread_start
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/sys/thread/unix.rs:118:17
  91: start_thread
  92: clone3
";

    #[test]
    fn a_captured_backtrace_keeps_the_site_and_the_application_frames_relative() {
        let tb = traceback(Some(("tests/traceback.rs", 28, 14)), Some(CAPTURED));
        let want = "panicked at tests/traceback.rs:28:14
   7: serde_json::de::from_trait
             at serde_json-1.0.140/src/de.rs:2699:5
   8: traceback::row_of
             at tests/traceback.rs:28:14
   9: seats::assign::{{closure}}
             at seats/src/assign.rs:34:16
… 18 frames omitted (the standard library, the async runtime, stagedoor-jobs, and beyond 12 frames or 2048 bytes)";
        assert_eq!(tb, want);
    }

    #[test]
    fn a_long_backtrace_is_bounded() {
        let mut bt = String::new();
        for i in 0..200 {
            bt.push_str(&format!(
                "{i:4}: app::deeply::nested::recursion::step_{i}::{{{{closure}}}}\n             at /srv/app/src/recursion.rs:{i}:9\n"
            ));
        }
        let tb = traceback(Some(("src/recursion.rs", 3, 9)), Some(&bt));
        assert!(tb.len() <= TRACEBACK_MAX_BYTES, "{} bytes", tb.len());
        let frames = tb.lines().filter(|l| l.contains(": app::")).count();
        assert!(frames <= TRACEBACK_MAX_FRAMES, "{frames} frames");
        assert!(frames >= 2, "{tb}");
        assert!(tb.contains("at src/recursion.rs:0:9"), "{tb}");
        assert!(!tb.contains("/srv/"), "{tb}");
        let last = tb.lines().last().unwrap_or_default();
        assert_eq!(
            last,
            format!(
                "… {} frames omitted (the standard library, the async runtime, stagedoor-jobs, and beyond {TRACEBACK_MAX_FRAMES} frames or {TRACEBACK_MAX_BYTES} bytes)",
                200 - frames
            )
        );
    }

    #[test]
    fn without_a_backtrace_the_site_alone_and_paths_outside_the_workspace_are_cut() {
        assert_eq!(
            traceback(Some(("src/jobs.rs", 4, 2)), None),
            "panicked at src/jobs.rs:4:2"
        );
        assert_eq!(
            traceback(
                Some((
                    "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/serde_json-1.0.140/src/de.rs",
                    9,
                    1
                )),
                None
            ),
            "panicked at serde_json-1.0.140/src/de.rs:9:1"
        );
        assert_eq!(
            traceback(Some(("/opt/elsewhere/gen/out.rs", 1, 1)), None),
            "panicked at …/out.rs:1:1"
        );
        assert_eq!(traceback(None, None), "panicked at an unknown location");
    }

    #[tokio::test]
    async fn a_formatted_panic_message_is_kept() {
        let n = 7;
        let err = CatchPanic::new(async move { panic!("order {n} broke") })
            .await
            .expect_err("caught");
        assert_eq!(err.error, "panic: order 7 broke");
    }
}
