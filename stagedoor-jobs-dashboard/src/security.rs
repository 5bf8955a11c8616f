//! What keeps the dashboard to its own users: the request's context and its cookies
//! (`request.rs`), the CSRF tokens (`csrf.rs`), the hosts and origins it answers to
//! (`hosts.rs`), the credentials a request carries (`credentials.rs`), the sessions signed in
//! with the token (`sessions.rs`) and the throttling of failed credentials (`throttle.rs`).
//! `guard.rs` applies them to every request.

pub(crate) mod credentials;
pub(crate) mod csrf;
pub(crate) mod hosts;
pub(crate) mod request;
pub(crate) mod sessions;
pub(crate) mod throttle;

pub(crate) use csrf::Keys;
pub(crate) use request::ReqCtx;
pub(crate) use sessions::Sessions;
pub(crate) use throttle::Throttle;
