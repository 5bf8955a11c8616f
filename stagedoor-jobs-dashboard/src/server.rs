//! The standalone server: [`bind`] an address (refused beyond loopback without
//! authentication), then [`Server::run`] until Ctrl-C; [`serve`] does both.

use std::net::SocketAddr;

use axum::Router;
use stagedoor_jobs::broker::Records;
use stagedoor_jobs::{Activity, DeadLetters};

use crate::auth::Auth;
use crate::builder::Dashboard;

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
    B: DeadLetters + Activity + Records + Clone + Send + Sync + 'static,
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
    B: DeadLetters + Activity + Records + Clone + Send + Sync + 'static,
{
    bind(dashboard, listen).await?.run().await
}
