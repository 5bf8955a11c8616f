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
/// | [`ack_with`](Self::ack_with) | as `ack`, its value kept as the job's result ([`Results`](crate::Results)) |
/// | [`retry`](Self::retry) | a failed attempt: the job comes back after the mount's backoff (none declared: at once) |
/// | [`retry_after`](Self::retry_after) | a failed attempt: the job comes back no earlier than now + `d`, durably |
/// | [`drop`](Self::drop) | done without success: leaves the queue as `ack` does, logged; no dead letter |
///
/// A failed attempt that reaches the mount's `max_attempts` is not retried: the job moves to
/// its dead letter.
#[must_use = "a handler's outcome decides what happens to the job: return it"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandlerOutcome(pub(crate) Outcome);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ack,
    /// Acknowledged with a result: its JSON, or why it could not be made.
    AckWith(Result<bytes::Bytes, String>),
    Retry,
    RetryAfter(Duration),
    Drop,
}

impl HandlerOutcome {
    /// The job is done and leaves the queue.
    pub const fn ack() -> Self {
        Self(Outcome::Ack)
    }
    /// The job is done and leaves the queue, with `value` kept as its result: stored as JSON
    /// before the job is acknowledged, for the mount's
    /// [`keep_results`](crate::mount::Mount::keep_results), readable by the job's id
    /// ([`Results::result`](crate::Results::result)). A value past
    /// [`MAX_RESULT_BYTES`](crate::results::MAX_RESULT_BYTES) is not kept (its result reads as
    /// too large); a value that does not serialize fails the attempt, naming serde's error.
    pub fn ack_with<T: serde::Serialize + ?Sized>(value: &T) -> Self {
        Self(Outcome::AckWith(
            serde_json::to_vec(value)
                .map(Into::into)
                .map_err(|e| e.to_string()),
        ))
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
    /// Whether this is `ack()` or `ack_with(..)`.
    pub fn is_ack(&self) -> bool {
        matches!(self.0, Outcome::Ack | Outcome::AckWith(_))
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
    /// `ack()`, with the result's JSON when the handler returned one.
    Ack(Option<bytes::Bytes>),
    /// `drop()`
    Drop,
    /// A failed attempt, with the delay asked for (`retry_after`) if any.
    Failed(Failure, Option<Duration>),
}

/// Values a handler may return: [`HandlerOutcome`], `Result<HandlerOutcome, E>` and
/// `Result<T, E>` for any `T: Serialize` (where `Ok(())` is `ack()`, `Ok(value)` is
/// `ack_with(&value)` — a value serializing to `null`, as `()` and `None` do, keeps no result —
/// and `Err(e)` a failed attempt carrying `e`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a job handler's result",
    label = "a handler returns `HandlerOutcome`, `Result<HandlerOutcome, E>` or `Result<T, E>` (`T: Serialize`, its value kept as the job's result; `Result<(), E>` keeps none)",
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
            Outcome::Ack => Verdict::Ack(None),
            Outcome::AckWith(Ok(json)) => Verdict::Ack(Some(json)),
            Outcome::AckWith(Err(e)) => Verdict::Failed(unserializable(&e), None),
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

fn unserializable(error: &str) -> Failure {
    Failure::new(
        FailureCause::Error,
        format!("the handler's result does not serialize as JSON: {error}"),
        String::new(),
    )
}

/// The verdict of `Ok(value)`: acknowledged, with the value's JSON unless it is `null`.
fn value_verdict<T: serde::Serialize>(value: &T) -> Verdict {
    match serde_json::to_vec(value) {
        Ok(json) if json == b"null" => Verdict::Ack(None),
        Ok(json) => Verdict::Ack(Some(json.into())),
        Err(e) => Verdict::Failed(unserializable(&e.to_string()), None),
    }
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

impl<T: serde::Serialize + Send, E: Into<BoxError> + Send> IntoOutcome for Result<T, E> {
    fn into_verdict(self) -> Verdict {
        match self {
            Ok(value) => value_verdict(&value),
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
        assert!(matches!(
            HandlerOutcome::ack().into_verdict(),
            Verdict::Ack(None)
        ));
        assert!(
            matches!(HandlerOutcome::ack_with(&[1, 2]).into_verdict(), Verdict::Ack(Some(j)) if j == "[1,2]")
        );
        assert!(matches!(
            Ok::<_, std::io::Error>(Some(7)).into_verdict(),
            Verdict::Ack(Some(j)) if j == "7"
        ));
        assert!(matches!(
            Ok::<Option<u8>, std::io::Error>(None).into_verdict(),
            Verdict::Ack(None)
        ));
        let bad: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(matches!(
            HandlerOutcome::ack_with(&bad).into_verdict(),
            Verdict::Failed(f, None) if f.error.contains("does not serialize")
        ));
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
            Verdict::Ack(None)
        ));
        let r: Result<HandlerOutcome, BoxError> = Ok(HandlerOutcome::drop());
        assert!(matches!(r.into_verdict(), Verdict::Drop));
    }
}
