#![cfg_attr(docsrs, feature(doc_cfg))]
//! A web dashboard for stagedoor-jobs: the queues with their counts refreshed live and a chart
//! of the last hour, the dead letters (read, filter, replay, purge), the schedules and delayed
//! jobs, and the live workers. It works on every backend (anything that is
//! [`DeadLetters`] + [`Activity`]).
//!
//! Mount it in a service's own axum app, the way Sidekiq::Web mounts in Rails:
//!
//! ```no_run
//! # async fn f(broker: stagedoor_jobs::MemoryBroker) -> std::io::Result<()> {
//! use stagedoor_jobs_dashboard::{Auth, Dashboard};
//! let dashboard = Dashboard::new(broker)
//!     .auth(Auth::Token(std::env::var("JOBS_DASHBOARD_TOKEN").unwrap_or_default()))
//!     .title("billing jobs");
//! let app = axum::Router::new().nest("/jobs", dashboard.router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! or run it alone with [`serve`] (what `stagedoor-jobs dashboard` does).
//!
//! # Security
//! - Every change (replay, purge, sign in and out) is a POST carrying a CSRF token: a random
//!   value in an `HttpOnly`, `SameSite=Strict` cookie that the form repeats in a hidden field,
//!   compared in constant time. A POST without it is refused (403).
//! - [`Auth::Token`] accepts `Authorization: Bearer <token>` or a sign-in form that sets a
//!   session cookie; [`Auth::Basic`] is HTTP basic auth. A request without them gets 401.
//! - [`Dashboard::read_only`] shows no action buttons and refuses every action (403).
//! - Pages are rendered with maud, which escapes every value: a payload holding `<script>` is
//!   shown as text. Backend errors are shown with URL passwords masked.
//! - [`serve`] refuses an address beyond loopback without [`Dashboard::auth`].
//! - Responses carry a strict Content-Security-Policy (scripts and styles from the dashboard
//!   only, no framing).

mod chart;
mod data;
mod pages;
mod params;
mod render;
mod security;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use stagedoor_jobs::{Activity, DeadLetters};

pub use security::Auth;

/// How long the dashboard waits for one backend call before it shows an error instead.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to tell a dead letter's name from a queue's (see [`Dashboard::dead_letters_named`]).
type DeadRule = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The dashboard of one backend: build it, then mount its [`router`](Dashboard::router) or
/// [`serve`] it.
#[derive(Clone)]
pub struct Dashboard<B> {
    broker: B,
    read_only: bool,
    auth: Option<Auth>,
    title: String,
    dead_rule: Option<DeadRule>,
    timeout: Duration,
}

impl<B> std::fmt::Debug for Dashboard<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("read_only", &self.read_only)
            .field("auth", &self.auth)
            .field("title", &self.title)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<B> Dashboard<B>
where
    B: DeadLetters + Activity + Clone + Send + Sync + 'static,
{
    /// A dashboard of `broker`: read-write, without authentication (fine on loopback or behind
    /// the service's own auth), titled "stagedoor-jobs". The broker is connected on the first
    /// request if it is not yet (connecting is idempotent).
    pub fn new(broker: B) -> Self {
        Self {
            broker,
            read_only: false,
            auth: None,
            title: "stagedoor-jobs".to_owned(),
            dead_rule: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Read-only: no action buttons, and every replay or purge is refused (403).
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Requires `auth` on every page and call (401 without it).
    pub fn auth(mut self, auth: Auth) -> Self {
        self.auth = Some(auth);
        self
    }

    /// The name in the header and the tab's title (a URL in it is shown with its password
    /// masked).
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = title.into();
        self
    }

    /// How to tell a dead letter from a queue among the names the backend lists. By default a
    /// name is a dead letter when it ends as the backend's default dead letters do
    /// ([`DeadLetters::default_dead_letter`]: `jobs:dead`, `emails.dead`), or is the default
    /// dead letter of a listed queue (`mail_jobs_dead`). Give a rule when mounts declare dead
    /// letters named otherwise.
    pub fn dead_letters_named(
        mut self,
        rule: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.dead_rule = Some(Arc::new(rule));
        self
    }

    /// How long to wait for one backend call before showing an error instead
    /// ([`DEFAULT_TIMEOUT`] unless set).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The dashboard as an axum [`Router`], to serve alone or to mount in an app with
    /// `app.nest("/jobs", dashboard.router())`: its links work at any mount point.
    pub fn router(&self) -> Router {
        let app = Arc::new(data::App::new(self.clone()));
        Router::new()
            .route("/", get(pages::queues::page::<B>))
            .route("/api/queues", get(pages::queues::json::<B>))
            .route("/dead", get(pages::dead::list::<B>))
            .route("/dead/letter", get(pages::dead::letter::<B>))
            .route("/dead/confirm", get(pages::dead::confirm::<B>))
            .route("/dead/action", post(pages::dead::action::<B>))
            .route("/scheduled", get(pages::scheduled::page::<B>))
            .route("/workers", get(pages::workers::page::<B>))
            .route("/api/workers", get(pages::workers::json::<B>))
            .route(
                "/login",
                get(pages::login::page::<B>).post(pages::login::submit::<B>),
            )
            .route("/logout", post(pages::login::logout::<B>))
            .route("/assets/style.css", get(pages::assets::css))
            .route("/assets/live.js", get(pages::assets::js))
            .fallback(pages::not_found::<B>)
            .layer(axum::middleware::from_fn_with_state(
                app.clone(),
                security::guard::<B>,
            ))
            .with_state(app)
    }
}

/// Why [`serve`] or [`bind`] could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The address is beyond loopback and the dashboard has no authentication.
    #[error(
        "refusing to serve the dashboard on {0} without authentication: anyone who reaches it could replay and purge jobs. Set `Dashboard::auth(Auth::Token(..))` or `Auth::Basic {{ .. }}` (command line: --auth-token-env VAR or --basic-auth-env VAR), or listen on loopback (127.0.0.1)"
    )]
    NoAuth(SocketAddr),
    /// The authentication's secret (the token, the user or the password) is empty.
    #[error(
        "the dashboard's authentication has an empty secret: nobody could sign in. Set the token (or the user and password), e.g. from an environment variable that is set"
    )]
    EmptySecret,
    /// The address does not resolve.
    #[error("cannot resolve the listen address `{0}`: write host:port, e.g. 127.0.0.1:8787")]
    Resolve(String),
    /// Binding or serving failed.
    #[error("cannot listen on {addr}: {source}")]
    Io {
        /// The address.
        addr: String,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// A bound standalone dashboard server; [`run`](Server::run) serves it.
#[derive(Debug)]
pub struct Server {
    listener: tokio::net::TcpListener,
    router: Router,
    addr: SocketAddr,
}

impl Server {
    /// The address it listens on (the port chosen for `:0`).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until Ctrl-C (SIGINT).
    pub async fn run(self) -> Result<(), ServeError> {
        self.run_until(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
    }

    /// Serves until `stop` completes, then finishes the requests in flight.
    pub async fn run_until(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let addr = self.addr;
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(stop)
            .await
            .map_err(|source| ServeError::Io {
                addr: addr.to_string(),
                source,
            })
    }
}

/// Binds a standalone dashboard to `listen` (`127.0.0.1:8787`, `[::1]:0`). Refuses an address
/// beyond loopback when the dashboard has no [`auth`](Dashboard::auth), and an authentication
/// with an empty secret.
pub async fn bind<B>(dashboard: Dashboard<B>, listen: &str) -> Result<Server, ServeError>
where
    B: DeadLetters + Activity + Clone + Send + Sync + 'static,
{
    let empty = match &dashboard.auth {
        Some(Auth::Token(t)) => t.is_empty(),
        Some(Auth::Basic { user, password }) => user.is_empty() || password.is_empty(),
        None => false,
    };
    if empty {
        return Err(ServeError::EmptySecret);
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(listen)
        .await
        .map_err(|_| ServeError::Resolve(listen.to_owned()))?
        .collect();
    let Some(first) = addrs.first().copied() else {
        return Err(ServeError::Resolve(listen.to_owned()));
    };
    if dashboard.auth.is_none()
        && let Some(open) = addrs.iter().find(|a| !a.ip().is_loopback())
    {
        return Err(ServeError::NoAuth(*open));
    }
    let listener = tokio::net::TcpListener::bind(&addrs[..])
        .await
        .map_err(|source| ServeError::Io {
            addr: first.to_string(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Io {
        addr: first.to_string(),
        source,
    })?;
    Ok(Server {
        listener,
        router: dashboard.router(),
        addr,
    })
}

/// Serves `dashboard` alone on `listen` until Ctrl-C: [`bind`] then [`Server::run`].
pub async fn serve<B>(dashboard: Dashboard<B>, listen: &str) -> Result<(), ServeError>
where
    B: DeadLetters + Activity + Clone + Send + Sync + 'static,
{
    bind(dashboard, listen).await?.run().await
}
