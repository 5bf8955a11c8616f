//! `stagedoor-jobs dashboard`: the web dashboard (`stagedoor-jobs-dashboard`) of the backend
//! `--url` names, served alone. The secret comes from an environment variable named on the
//! command line, never from the command line itself (which `ps` shows).

use std::io::Write;

use stagedoor_jobs::Broker;
use stagedoor_jobs_dashboard::{Auth, Dashboard, ServeError};

use crate::args::DashboardArgs;
use crate::ctx::Ctx;
use crate::error::{FAILED, Failure, OK};

/// What the command checked before connecting: the credentials, and that the address may be
/// served with them.
#[derive(Debug)]
pub(crate) struct Plan {
    listen: String,
    read_only: bool,
    auth: Option<Auth>,
    allowed_hosts: Vec<String>,
}

/// The value of the environment variable `var`, which must be set and not empty.
fn secret(var: &str, flag: &str) -> Result<String, Failure> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Ok(v),
        Ok(_) => Err(Failure::usage(format!(
            "{flag} {var}: the environment variable `{var}` is empty: set it to the secret"
        ))),
        Err(_) => Err(Failure::usage(format!(
            "{flag} {var}: the environment variable `{var}` is not set: export it with the secret first"
        ))),
    }
}

/// Reads the credentials and refuses an address beyond loopback without them, before any
/// connection is made.
pub(crate) async fn plan(args: &DashboardArgs) -> Result<Plan, Failure> {
    let auth = match (&args.auth_token_env, &args.basic_auth_env) {
        (Some(var), _) => Some(Auth::Token(secret(var, "--auth-token-env")?)),
        (None, Some(var)) => {
            let pair = secret(var, "--basic-auth-env")?;
            let Some((user, password)) = pair.split_once(':') else {
                return Err(Failure::usage(format!(
                    "--basic-auth-env {var}: the variable must hold `user:password`"
                )));
            };
            if user.is_empty() || password.is_empty() {
                return Err(Failure::usage(format!(
                    "--basic-auth-env {var}: the variable must hold `user:password`, both not empty"
                )));
            }
            Some(Auth::Basic {
                user: user.to_owned(),
                password: password.to_owned(),
            })
        }
        (None, None) => None,
    };
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host(args.listen.as_str())
        .await
        .map_err(|_| Failure::usage(ServeError::Resolve(args.listen.clone()).to_string()))?
        .collect();
    if auth.is_none()
        && let Some(open) = addrs.iter().find(|a| !a.ip().is_loopback())
    {
        return Err(Failure::usage(ServeError::NoAuth(*open).to_string()));
    }
    if let Some(bad) = args
        .allowed_host
        .iter()
        .find(|h| h.is_empty() || h.contains(['/', ' ', '@']))
    {
        return Err(Failure::usage(format!(
            "--allowed-host `{bad}`: give a host name as browsers send it, e.g. jobs.example.com or jobs.example.com:8443 (no scheme, no path)"
        )));
    }
    Ok(Plan {
        listen: args.listen.clone(),
        read_only: args.read_only,
        auth,
        allowed_hosts: args.allowed_host.clone(),
    })
}

/// Serves the dashboard of `b` until Ctrl-C.
pub(crate) async fn serve<B: Broker>(b: B, ctx: &Ctx, plan: Plan) -> Result<u8, Failure> {
    let naming = ctx.clone();
    let allowed_hosts = plan.allowed_hosts.clone();
    let mut dashboard = Dashboard::new(b)
        .title(format!("stagedoor-jobs · {}", ctx.place))
        .read_only(plan.read_only)
        .dead_letters_named(move |name| naming.is_dead(name));
    if let Some(auth) = plan.auth {
        dashboard = dashboard.auth(auth);
    }
    for host in &allowed_hosts {
        dashboard = dashboard.allowed_host(host);
    }
    let server = stagedoor_jobs_dashboard::bind(dashboard, &plan.listen)
        .await
        .map_err(|e| match e {
            ServeError::NoAuth(_) | ServeError::Resolve(_) => Failure::usage(e.to_string()),
            other => Failure::new(FAILED, other.to_string()),
        })?;
    let addr = server.local_addr();
    let host = if addr.is_ipv6() {
        format!("[{}]", addr.ip())
    } else {
        addr.ip().to_string()
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "dashboard of {} at http://{host}:{}/{} (Ctrl-C stops it)",
        ctx.place,
        addr.port(),
        if plan.read_only { ", read-only" } else { "" }
    );
    let _ = out.flush();
    drop(out);
    if !addr.ip().is_loopback() && allowed_hosts.is_empty() {
        let _ = writeln!(
            std::io::stderr(),
            "note: the dashboard answers to IP addresses and localhost only (another Host gets 421): add --allowed-host NAME for the name browsers or a proxy use"
        );
    }
    server
        .run()
        .await
        .map_err(|e| Failure::new(FAILED, e.to_string()))?;
    Ok(OK)
}
