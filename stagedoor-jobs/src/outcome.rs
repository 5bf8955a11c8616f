//! What a handler returns, and what the runtime makes of it.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// The error type a handler may return: anything that converts into a boxed error, which covers
/// every `std::error::Error + Send + Sync + 'static` and `anyhow::Error`.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What a handler decided about its delivery. Build one with its constructors.
///
/// | outcome | what happens |
/// |---|---|
/// | [`ack`](Self::ack) | the job is done and leaves the queue |
/// | [`retry`](Self::retry) | a failed attempt: the job comes back after the mount's backoff (none declared: at once) |
/// | [`retry_after`](Self::retry_after) | a failed attempt: the job comes back no earlier than now + `d`, durably |
/// | [`drop`](Self::drop) | done without success: leaves the queue as `ack` does, logged; no dead letter |
///
/// A failed attempt that reaches the mount's `max_attempts` is not retried: the job moves to
/// its dead letter.
#[must_use = "a handler's outcome decides what happens to the job: return it"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandlerOutcome(pub(crate) Outcome);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ack,
    Retry,
    RetryAfter(Duration),
    Drop,
}

impl HandlerOutcome {
    /// The job is done and leaves the queue.
    pub const fn ack() -> Self {
        Self(Outcome::Ack)
    }
    /// A failed attempt: the job comes back after the mount's backoff, or at once without one.
    pub const fn retry() -> Self {
        Self(Outcome::Retry)
    }
    /// A failed attempt: the job comes back no earlier than now + `delay`, whatever the mount's
    /// backoff says. The delay is stored with the job, so it survives a restart. A delay
    /// longer than [`MAX_DELAY`](crate::MAX_DELAY) (ten years; `Duration::MAX`, or one read
    /// from an upstream's `Retry-After`) is kept at it.
    pub const fn retry_after(delay: Duration) -> Self {
        Self(Outcome::RetryAfter(delay))
    }
    /// Done without success: the job leaves the queue as on `ack`, with a log line, and is not
    /// dead-lettered. For jobs that no attempt can ever complete (a mailbox that does not exist).
    pub const fn drop() -> Self {
        Self(Outcome::Drop)
    }
    /// Whether this is `ack()`.
    pub fn is_ack(&self) -> bool {
        self.0 == Outcome::Ack
    }
}

/// Why an attempt failed: the error and where it came from, kept with the job into its dead
/// letter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// What went wrong, in one line (an error's `Display`, a panic's message).
    pub error: String,
    /// Where: a panic's location (and backtrace when captured), an error's source chain.
    pub traceback: String,
    /// What kind of failure this was.
    pub cause: FailureCause,
}

/// The kinds of failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureCause {
    /// The handler returned `retry()` or `retry_after(d)`.
    Retry,
    /// The handler returned `Err`.
    Error,
    /// The handler panicked.
    Panic,
    /// The payload did not decode into the handler's message type.
    Decode,
    /// An extractor refused the delivery.
    Extract,
    /// The job was delivered past the mount's cap (workers died during its earlier deliveries,
    /// the cap was lowered, or its stored attempt count was edited): dead-lettered unrun.
    Poison,
    /// No handler is mounted for the job's kind on its queue.
    UnknownKind,
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureCause::Retry => "retry",
            FailureCause::Error => "error",
            FailureCause::Panic => "panic",
            FailureCause::Decode => "decode",
            FailureCause::Extract => "extract",
            FailureCause::Poison => "poison",
            FailureCause::UnknownKind => "unknown_kind",
        })
    }
}

impl Failure {
    /// A failure of the given cause.
    pub fn new(
        cause: FailureCause,
        error: impl Into<String>,
        traceback: impl Into<String>,
    ) -> Self {
        Self {
            error: error.into(),
            traceback: traceback.into(),
            cause,
        }
    }

    /// A failure from an error: its `Display` is the error, its source chain the traceback.
    pub fn from_error(cause: FailureCause, err: &(dyn StdError + 'static)) -> Self {
        let mut chain = String::new();
        let mut source = err.source();
        while let Some(s) = source {
            if !chain.is_empty() {
                chain.push('\n');
            }
            chain.push_str("caused by: ");
            chain.push_str(&s.to_string());
            source = s.source();
        }
        Self::new(cause, err.to_string(), chain)
    }
}

/// What the runtime makes of a handler's return value.
#[doc(hidden)]
#[derive(Debug)]
pub enum Verdict {
    /// `ack()`
    Ack,
    /// `drop()`
    Drop,
    /// A failed attempt, with the delay asked for (`retry_after`) if any.
    Failed(Failure, Option<Duration>),
}

/// Values a handler may return: [`HandlerOutcome`], `Result<HandlerOutcome, E>` and
/// `Result<(), E>` (where `Ok(())` is `ack()` and `Err(e)` a failed attempt carrying `e`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a job handler's result",
    label = "a handler returns `HandlerOutcome`, `Result<HandlerOutcome, E>` or `Result<(), E>`",
    note = "`E` is any error convertible into `Box<dyn std::error::Error + Send + Sync>` (every std error, `anyhow::Error`)"
)]
pub trait IntoOutcome: Send {
    /// Converts into the runtime's verdict.
    #[doc(hidden)]
    fn into_verdict(self) -> Verdict;
}

impl IntoOutcome for HandlerOutcome {
    fn into_verdict(self) -> Verdict {
        match self.0 {
            Outcome::Ack => Verdict::Ack,
            Outcome::Drop => Verdict::Drop,
            Outcome::Retry => Verdict::Failed(retry_failure(None), None),
            Outcome::RetryAfter(d) => Verdict::Failed(retry_failure(Some(d)), Some(d)),
        }
    }
}

fn retry_failure(after: Option<Duration>) -> Failure {
    let error = match after {
        None => "the handler asked for a retry".to_owned(),
        Some(d) => format!("the handler asked for a retry after {d:?}"),
    };
    Failure::new(FailureCause::Retry, error, String::new())
}

fn error_verdict<E: Into<BoxError>>(e: E) -> Verdict {
    let boxed: BoxError = e.into();
    Verdict::Failed(Failure::from_error(FailureCause::Error, &*boxed), None)
}

impl<E: Into<BoxError> + Send> IntoOutcome for Result<HandlerOutcome, E> {
    fn into_verdict(self) -> Verdict {
        match self {
            Ok(o) => o.into_verdict(),
            Err(e) => error_verdict(e),
        }
    }
}

impl<E: Into<BoxError> + Send> IntoOutcome for Result<(), E> {
    fn into_verdict(self) -> Verdict {
        match self {
            Ok(()) => Verdict::Ack,
            Err(e) => error_verdict(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("render failed for order 4471")]
    struct Render(#[source] std::io::Error);

    #[test]
    fn err_keeps_its_source_chain() {
        let r: Result<(), Render> = Err(Render(std::io::Error::other("SeatLabelInvalid: '14-C'")));
        match r.into_verdict() {
            Verdict::Failed(f, None) => {
                assert_eq!(f.error, "render failed for order 4471");
                assert_eq!(f.traceback, "caused by: SeatLabelInvalid: '14-C'");
                assert_eq!(f.cause, FailureCause::Error);
            }
            other => panic!("expected a failed attempt, got {other:?}"),
        }
    }

    #[test]
    fn outcomes_map_to_verdicts() {
        assert!(matches!(HandlerOutcome::ack().into_verdict(), Verdict::Ack));
        assert!(matches!(
            HandlerOutcome::drop().into_verdict(),
            Verdict::Drop
        ));
        assert!(matches!(
            HandlerOutcome::retry().into_verdict(),
            Verdict::Failed(_, None)
        ));
        let d = Duration::from_secs(3);
        assert!(
            matches!(HandlerOutcome::retry_after(d).into_verdict(), Verdict::Failed(_, Some(x)) if x == d)
        );
        assert!(matches!(
            Ok::<(), std::io::Error>(()).into_verdict(),
            Verdict::Ack
        ));
        let r: Result<HandlerOutcome, BoxError> = Ok(HandlerOutcome::drop());
        assert!(matches!(r.into_verdict(), Verdict::Drop));
    }
}
