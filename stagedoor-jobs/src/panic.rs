//! Catching a handler's panic with its message and location, so the worker lives on.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};

use crate::outcome::{Failure, FailureCause};

thread_local! {
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Installs (once per process) a panic hook that, for a panic inside a handler, records where it
/// happened and keeps it off stderr (the runtime logs it with the job); every other panic goes
/// to the previous hook unchanged.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
            if IN_HANDLER.with(Cell::get) {
                let mut where_ = match info.location() {
                    Some(l) => format!("panicked at {}:{}:{}", l.file(), l.line(), l.column()),
                    None => "panicked at an unknown location".to_owned(),
                };
                let bt = std::backtrace::Backtrace::capture();
                if bt.status() == std::backtrace::BacktraceStatus::Captured {
                    where_.push('\n');
                    where_.push_str(&bt.to_string());
                }
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(where_));
            } else {
                previous(info);
            }
        }));
    });
}

/// A future that turns a panic of the inner future into `Err(Failure)`.
pub(crate) struct CatchPanic<F> {
    inner: Pin<Box<F>>,
}

impl<F: Future> CatchPanic<F> {
    pub(crate) fn new(inner: F) -> Self {
        install_hook();
        Self {
            inner: Box::pin(inner),
        }
    }
}

struct Flag(bool);
impl Drop for Flag {
    fn drop(&mut self) {
        IN_HANDLER.with(|c| c.set(self.0));
    }
}

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, Failure>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let was = IN_HANDLER.with(|c| c.replace(true));
        let _restore = Flag(was);
        let inner = self.inner.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(move || inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(payload) => {
                let location = LAST_PANIC
                    .with(|p| p.borrow_mut().take())
                    .unwrap_or_default();
                Poll::Ready(Err(Failure::new(
                    FailureCause::Panic,
                    format!("panic: {}", panic_message(&*payload)),
                    location,
                )))
            }
        }
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

    #[tokio::test]
    async fn a_formatted_panic_message_is_kept() {
        let n = 7;
        let err = CatchPanic::new(async move { panic!("order {n} broke") })
            .await
            .expect_err("caught");
        assert_eq!(err.error, "panic: order 7 broke");
    }
}
