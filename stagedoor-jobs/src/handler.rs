//! The handler trait, implemented for async fns of every reasonable arity: a message `&M`
//! followed by up to twelve extractors.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::extract::{FromJob, JobContext, Rejection};
use crate::outcome::{Failure, FailureCause, IntoOutcome, Verdict};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One call of an async fn with the message borrowed for `'a`. Implemented for every
/// `async fn(&M, A1, .., An) -> R` with extractors `A1..An` and a result `R`; you never
/// implement it yourself. [`Handler`] is this trait for every `'a`.
pub trait HandlerFn<'a, M: 'a, Args>: Send + Sync + 'static {
    /// The handler's result.
    type Output: IntoOutcome;
    /// The future of one call.
    type Future: Future<Output = Self::Output> + Send + 'a;
    /// Calls the handler.
    fn call(&self, msg: &'a M, args: Args) -> Self::Future;
}

/// An async fn that handles jobs whose payload decodes to `M`: `async fn(&M, extractors..) ->
/// HandlerOutcome` (or `Result<HandlerOutcome, E>`, `Result<(), E>`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a job handler",
    label = "not a job handler",
    note = "a handler is an `async fn(msg: &T, extractors..) -> HandlerOutcome` (or `Result<HandlerOutcome, E>`, `Result<(), E>`) where `T: serde::Deserialize` and every argument after the message is an extractor such as `Ctx<keys::Attempt>`"
)]
pub trait Handler<M, Args>: for<'a> HandlerFn<'a, M, Args> {}
impl<M, Args, H: for<'a> HandlerFn<'a, M, Args>> Handler<M, Args> for H {}

/// A tuple of extractors.
pub trait FromJobTuple: Sized + Send + 'static {
    /// Extracts every element, or the first refusal.
    fn from_job(job: &JobContext) -> Result<Self, Rejection>;
}

macro_rules! impl_handler {
    ($($a:ident),*) => {
        impl<$($a: FromJob),*> FromJobTuple for ($($a,)*) {
            #[allow(unused_variables)]
            fn from_job(job: &JobContext) -> Result<Self, Rejection> {
                Ok(($($a::from_job(job)?,)*))
            }
        }

        impl<'a, M: 'a, F, Fut, $($a),*> HandlerFn<'a, M, ($($a,)*)> for F
        where
            F: Fn(&'a M $(, $a)*) -> Fut + Send + Sync + 'static,
            Fut: Future + Send + 'a,
            Fut::Output: IntoOutcome,
        {
            type Output = Fut::Output;
            type Future = Fut;
            #[allow(non_snake_case)]
            fn call(&self, msg: &'a M, ($($a,)*): ($($a,)*)) -> Fut {
                (self)(msg $(, $a)*)
            }
        }
    };
}

impl_handler!();
impl_handler!(A1);
impl_handler!(A1, A2);
impl_handler!(A1, A2, A3);
impl_handler!(A1, A2, A3, A4);
impl_handler!(A1, A2, A3, A4, A5);
impl_handler!(A1, A2, A3, A4, A5, A6);
impl_handler!(A1, A2, A3, A4, A5, A6, A7);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12);

/// What running a handler on one delivery gave.
#[derive(Debug)]
pub(crate) enum Ran {
    /// The handler ran (or an extractor refused) and this is its verdict.
    Verdict(Verdict),
    /// The payload did not decode; the handler did not run.
    Undecodable(Failure),
}

/// A handler with its message and argument types erased, as the runtime holds it.
pub(crate) trait ErasedHandler: Send + Sync + 'static {
    fn run(&self, job: Arc<JobContext>) -> BoxFuture<'static, Ran>;
}

pub(crate) struct Typed<H, M, Args> {
    handler: Arc<H>,
    _p: PhantomData<fn(M, Args)>,
}

impl<H, M, Args> Typed<H, M, Args> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler: Arc::new(handler),
            _p: PhantomData,
        }
    }
}

impl<H, M, Args> ErasedHandler for Typed<H, M, Args>
where
    H: Handler<M, Args>,
    M: DeserializeOwned + Send + Sync + 'static,
    Args: FromJobTuple,
{
    fn run(&self, job: Arc<JobContext>) -> BoxFuture<'static, Ran> {
        let handler = Arc::clone(&self.handler);
        Box::pin(async move {
            let msg: M = match serde_json::from_slice(job.envelope().payload()) {
                Ok(m) => m,
                Err(e) => {
                    return Ran::Undecodable(Failure::new(
                        FailureCause::Decode,
                        format!(
                            "payload does not decode as `{}`: {e}",
                            std::any::type_name::<M>()
                        ),
                        String::new(),
                    ));
                }
            };
            let args = match Args::from_job(&job) {
                Ok(a) => a,
                Err(r) => {
                    return Ran::Verdict(Verdict::Failed(
                        Failure::new(FailureCause::Extract, r.0, String::new()),
                        None,
                    ));
                }
            };
            Ran::Verdict(call(&*handler, &msg, args).await.into_verdict())
        })
    }
}

fn call<'a, H, M, Args>(h: &H, msg: &'a M, args: Args) -> <H as HandlerFn<'a, M, Args>>::Future
where
    H: HandlerFn<'a, M, Args>,
{
    h.call(msg, args)
}
