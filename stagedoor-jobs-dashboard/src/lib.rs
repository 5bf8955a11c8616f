#![cfg_attr(docsrs, feature(doc_cfg))]
//! A web dashboard for stagedoor-jobs: the queues with their counts refreshed live and a chart
//! of the last hour, the dead letters (read, filter, replay, purge), the schedules and delayed
//! jobs, the live workers, and a flow's jobs or a job's result and progress. It works on every
//! backend (anything that is [`DeadLetters`](stagedoor_jobs::DeadLetters) + [`Activity`](stagedoor_jobs::Activity) +
//! [`Records`](stagedoor_jobs::broker::Records)).
//!
//! Mount it in a service's own axum app, the way Sidekiq::Web mounts in Rails:
//!
//! ```no_run
//! # async fn f(broker: stagedoor_jobs::MemoryBroker) -> std::io::Result<()> {
//! use stagedoor_jobs_dashboard::{Auth, Dashboard};
//! let dashboard = Dashboard::new(broker)
//!     .auth(Auth::Token(std::env::var("JOBS_DASHBOARD_TOKEN").unwrap_or_default()))
//!     .title("billing jobs");
//! let app = axum::Router::new().nest_service("/jobs", dashboard.router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! or run it alone with [`serve`] (what `stagedoor-jobs dashboard` does).
//!
//! # Security
//! The threat model is in the README's dashboard section; in short:
//! - It answers only to `localhost`, IP addresses (on the port [`bind`] serves) and the names
//!   given to [`Dashboard::allowed_host`]: any other `Host` gets 421 (DNS rebinding).
//! - Every change (replay, purge, sign in and out) is a POST. One whose `Origin` is not the
//!   dashboard's own, or whose `Sec-Fetch-Site` is not `same-origin`, gets 403. It must carry
//!   the CSRF token: an HMAC-SHA-256, under a per-process random key, of the nonce in an
//!   `HttpOnly`, `SameSite=Strict` cookie and of the session, compared in constant time (403
//!   without it). Over HTTPS (the URI, or `X-Forwarded-Proto: https`) the cookies are
//!   `Secure` and `__Host-` named; over plain HTTP browsers refuse that prefix, and a planted
//!   cookie is harmless anyway (its token cannot be computed without the key).
//! - [`Auth::Token`] accepts `Authorization: Bearer <token>` or a sign-in form that sets a
//!   session cookie; [`Auth::Basic`] is HTTP basic auth. A request without them gets 401, and
//!   before a credential no page shows the title or the backend. Failed credentials are
//!   limited to 5 a minute per client and 50 in all (429 with `Retry-After`); secrets are
//!   compared as SHA-256 digests in constant time.
//! - [`Dashboard::read_only`] shows no action buttons and refuses every action (403).
//! - Pages are rendered with maud, which escapes every value: a payload holding `<script>` is
//!   shown as text. Backend errors are shown with URL passwords masked.
//! - A request's cost is bounded: a query or form over 60 KB is refused, a selection holds at
//!   most 1,000 ids (counted first), its backend calls share one deadline
//!   ([`Dashboard::timeout`]), the polling pages' reads are shared for 1 s, and a payload is
//!   shown up to 64 KB (downloaded whole).
//! - [`serve`] refuses an address beyond loopback without [`Dashboard::auth`].
//! - Responses carry a strict Content-Security-Policy (scripts and styles from the dashboard
//!   only, no framing).

mod auth;
mod builder;
mod chart;
mod data;
mod guard;
mod pages;
mod params;
mod render;
mod router;
mod security;
mod server;

pub use auth::Auth;
pub use builder::{DEFAULT_TIMEOUT, Dashboard};
pub use server::{ServeError, Server, bind, serve};
