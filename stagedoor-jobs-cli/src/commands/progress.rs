//! What a replay or purge shows while it runs: a progress bar (or a spinner) on a terminal, and
//! the watch for Ctrl-C that stops it between two moves.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Above this many selected dead letters, a replay shows a progress bar.
pub(super) const BAR_FROM: usize = 20;

pub(super) fn progress(len: usize, verb: &str) -> ProgressBar {
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

pub(super) fn spinner(len: usize, verb: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_message(format!("{verb} {len} dead letters…"));
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Watches for Ctrl-C while dead letters move one at a time: the first stops the loop after
/// the move under way (each is atomic), so the summary says what was done; a second ends the
/// process at once.
pub(super) struct Interrupt {
    raised: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Interrupt {
    pub(super) fn listen() -> Self {
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

    pub(super) fn raised(&self) -> bool {
        self.raised.load(Ordering::SeqCst)
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        self.task.abort();
    }
}
