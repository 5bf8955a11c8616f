//! What a request's credentials are worth: a live session, a Bearer token or a basic-auth
//! pair (right or wrong), or none.

use axum::http::{HeaderMap, header};
use base64::Engine as _;

use super::csrf::well_formed;
use super::request::cookie;
use super::sessions::Sessions;
use crate::auth::{Auth, token_eq};

/// What the request's credentials are worth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Credentials {
    /// The dashboard asks for none.
    Open,
    /// A live session (its id is 256 random bits: not guessed).
    Session,
    /// A Bearer token or a basic-auth pair was sent: right or wrong. Either is refused while
    /// the client is throttled; a wrong one is counted.
    Sent(bool),
    /// None were sent: not a guess.
    Missing,
}

/// Whether the request carries the credentials `auth` asks for, and its live session (of
/// `sessions`, in cookie `session_cookie`).
pub(crate) fn authorized(
    auth: Option<&Auth>,
    sessions: &Sessions,
    headers: &HeaderMap,
    session_cookie: &str,
) -> (Credentials, Option<String>) {
    let session = cookie(headers, session_cookie)
        .filter(|s| well_formed(s) && sessions.valid(s))
        .map(str::to_owned);
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let verdict = Credentials::Sent;
    let c = match auth {
        None => Credentials::Open,
        Some(_) if session.is_some() => Credentials::Session,
        Some(Auth::Token(token)) => match authorization.and_then(|v| v.strip_prefix("Bearer ")) {
            Some(b) => verdict(token_eq(b.trim(), token)),
            None => Credentials::Missing,
        },
        Some(Auth::Basic { user, password }) => {
            match authorization.and_then(|v| v.strip_prefix("Basic ")) {
                Some(b) => verdict(
                    base64::engine::general_purpose::STANDARD
                        .decode(b.trim())
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())
                        .is_some_and(|pair| match pair.split_once(':') {
                            Some((u, p)) => token_eq(u, user) & token_eq(p, password),
                            None => false,
                        }),
                ),
                None => Credentials::Missing,
            }
        }
    };
    (c, session)
}
