//! The CSRF tokens: an HMAC-SHA-256, under a per-process key, of the cookie's nonce and the
//! session; and the random tokens nonces and sessions are made of.

use std::sync::Arc;

use hmac::{KeyInit as _, Mac as _};

/// The CSRF token of `nonce` (the cookie's value) and `session`: HMAC-SHA-256 under `key`, as
/// hex.
pub(crate) fn csrf_token(key: &[u8; 32], nonce: &str, session: Option<&str>) -> String {
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(key) else {
        // An HMAC takes a key of any length; this is never reached.
        return String::new();
    };
    mac.update(b"stagedoor-jobs dashboard csrf\0");
    mac.update(nonce.as_bytes());
    mac.update(b"\0");
    mac.update(session.unwrap_or_default().as_bytes());
    hex(&mac.finalize().into_bytes())
}

/// `bytes` as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The per-process secrets: the CSRF tokens' HMAC key (`None` if the OS gave no random bytes:
/// every request is then refused).
#[derive(Debug)]
pub(crate) struct Keys(pub(crate) Option<Arc<[u8; 32]>>);

impl Keys {
    /// A new key from the OS's random source.
    pub(crate) fn new() -> Self {
        let mut key = [0u8; 32];
        Self(getrandom::fill(&mut key).ok().map(|()| Arc::new(key)))
    }
}

/// 32 random bytes from the OS, as hex; `None` if the OS has none to give.
pub(crate) fn random_token() -> Option<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).ok()?;
    Some(hex(&bytes))
}

/// Whether `t` looks like one of our tokens (64 hex digits).
pub(crate) fn well_formed(t: &str) -> bool {
    t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_tokens_bind_key_nonce_and_session() {
        let (k1, k2) = ([1u8; 32], [2u8; 32]);
        let n = "ab".repeat(32);
        let t = csrf_token(&k1, &n, None);
        assert_eq!(t.len(), 64);
        assert_ne!(t, n, "the token is not the cookie");
        assert_eq!(t, csrf_token(&k1, &n, None));
        assert_ne!(t, csrf_token(&k2, &n, None), "another process's key");
        assert_ne!(t, csrf_token(&k1, &"cd".repeat(32), None), "another cookie");
        assert_ne!(t, csrf_token(&k1, &n, Some("s")), "another session");
    }

    #[test]
    fn random_tokens_are_well_formed_and_differ() {
        let a = random_token().unwrap();
        let b = random_token().unwrap();
        assert!(well_formed(&a), "{a}");
        assert_ne!(a, b);
    }
}
