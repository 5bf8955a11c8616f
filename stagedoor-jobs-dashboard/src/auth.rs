//! [`Auth`]: how the dashboard asks who is there, and how the secrets sent are compared.

use sha2::Digest as _;
use subtle::ConstantTimeEq as _;

/// How the dashboard asks who is there. The secret is best read from an environment variable
/// (the command line's `--auth-token-env VAR`, `--basic-auth-env VAR`).
#[derive(Clone)]
#[non_exhaustive]
pub enum Auth {
    /// A shared token: `Authorization: Bearer <token>` on each request (scripts), or typed
    /// once into the sign-in page, which sets a session cookie (browsers).
    Token(String),
    /// HTTP basic auth: the browser asks for the user and password.
    Basic {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Token(_) => f.write_str("Token(***)"),
            Auth::Basic { user, .. } => write!(f, "Basic {{ user: {user:?}, password: *** }}"),
        }
    }
}

/// `given == secret`, comparing their SHA-256 digests in constant time: the time taken says
/// nothing of where they differ, nor of the secret's length. An empty secret never matches.
pub(crate) fn token_eq(given: &str, secret: &str) -> bool {
    let a = sha2::Sha256::digest(given.as_bytes());
    let b = sha2::Sha256::digest(secret.as_bytes());
    !secret.is_empty() && bool::from(a.as_slice().ct_eq(b.as_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare() {
        assert!(token_eq("abc", "abc"));
        assert!(!token_eq("abd", "abc"));
        assert!(!token_eq("ab", "abc"));
        assert!(!token_eq("abcd", "abc"));
        assert!(!token_eq("", ""));
    }

    #[test]
    fn secrets_are_not_debug_printed() {
        let t = format!("{:?}", Auth::Token("s3cret".into()));
        let b = format!(
            "{:?}",
            Auth::Basic {
                user: "ops".into(),
                password: "s3cret".into()
            }
        );
        assert!(!t.contains("s3cret") && !b.contains("s3cret"), "{t} {b}");
    }
}
