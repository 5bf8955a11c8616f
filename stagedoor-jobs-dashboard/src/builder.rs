//! [`Dashboard`]: what a dashboard shows and how it answers, set by its builder methods.

use std::sync::Arc;
use std::time::Duration;

use stagedoor_jobs::broker::Records;
use stagedoor_jobs::{Activity, DeadLetters};

use crate::auth::Auth;

/// How long the dashboard waits for one backend call before it shows an error instead.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to tell a dead letter's name from a queue's (see [`Dashboard::dead_letters_named`]).
pub(crate) type DeadRule = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The dashboard of one backend: build it, then mount its [`router`](Dashboard::router) or
/// [`serve`] it.
#[derive(Clone)]
pub struct Dashboard<B> {
    /// The backend.
    pub(crate) broker: B,
    /// No actions.
    pub(crate) read_only: bool,
    /// Who may see it (`None`: anyone who reaches it).
    pub(crate) auth: Option<Auth>,
    /// The name in the header and the tab's title.
    pub(crate) title: String,
    /// How to tell a dead letter's name from a queue's, when given.
    pub(crate) dead_rule: Option<DeadRule>,
    /// How long one request may take.
    pub(crate) timeout: Duration,
    /// The host names it answers to besides localhost and IP addresses.
    pub(crate) allowed_hosts: Vec<String>,
    /// The port [`bind`](crate::bind) serves it on, which a `Host` must name.
    pub(crate) served_port: Option<u16>,
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
    B: DeadLetters + Activity + Records + Clone + Send + Sync + 'static,
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
}
