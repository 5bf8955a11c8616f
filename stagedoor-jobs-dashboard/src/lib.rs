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
    allowed_hosts: Vec<String>,
    served_port: Option<u16>,
}

impl<B> std::fmt::Debug for Dashboard<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("read_only", &self.read_only)
            .field("auth", &self.auth)
            .field("title", &self.title)
            .field("timeout", &self.timeout)
            .field("allowed_hosts", &self.allowed_hosts)
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
            allowed_hosts: Vec::new(),
            served_port: None,
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

    /// How long one request may take: every backend call it makes shares this deadline (a
    /// confirmation counting 1,000 selected letters one by one stops at it and says so), and
    /// each call waits at most this long ([`DEFAULT_TIMEOUT`] unless set).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Answers to `host` too (`jobs.example.com`, any port; `jobs.example.com:8443`, that
    /// port only): the name a proxy or a browser reaches the dashboard by. Call once per name.
    ///
    /// Without it the dashboard answers only to `localhost` and IP addresses (on the port it
    /// serves, when started with [`bind`]/[`serve`]); any other `Host` gets 421. That stops DNS
    /// rebinding: a web page whose name is pointed at 127.0.0.1 reaches the dashboard with its
    /// own name as `Host`, and is refused. A POST whose `Origin` is one of these names (or the
    /// `Host` it was sent to) is accepted; any other `Origin` gets 403.
    pub fn allowed_host(mut self, host: impl Into<String>) -> Self {
        self.allowed_hosts.push(host.into());
        self
    }

    /// The dashboard as an axum [`Router`], to serve alone or to mount in an app with
    /// `app.nest_service("/jobs", dashboard.router())`: its links work at any mount point, and
    /// `nest_service` serves the page at `/jobs/` too (axum's `nest` serves `/jobs` and
    /// `/jobs/dead`, but answers 404 at `/jobs/`). Serve the app with
    /// `into_make_service_with_connect_info::<SocketAddr>()` so that failed sign-ins are
    /// counted per client (without it every client counts as one).
    pub fn router(&self) -> Router {
        let app = Arc::new(data::App::new(self.clone()));
        Router::new()
            .route("/", get(pages::queues::page::<B>))
            .route("/api/queues", get(pages::queues::json::<B>))
            .route("/dead", get(pages::dead::list::<B>))
            .route("/dead/letter", get(pages::dead::letter::<B>))
            .route("/dead/confirm", get(pages::dead::confirm::<B>))
            .route("/dead/action", post(pages::dead::action::<B>))
            .route("/dead/payload", get(pages::dead::download::<B>))
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

    /// Serves until `stop` completes, then finishes the requests in flight. Each request
    /// knows its client's address (failed sign-ins are counted per client).
    pub async fn run_until(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let addr = self.addr;
        axum::serve(
            self.listener,
            self.router
                .into_make_service_with_connect_info::<SocketAddr>(),
        )
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
    let mut dashboard = dashboard;
    dashboard.served_port = Some(addr.port());
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
