//! TLS beyond a `rediss://` URL (feature `tls`): a private certificate authority, a client
//! certificate (mutual TLS).

use std::fmt;

/// What a TLS connection trusts and presents, for [`RedisBroker::from_url_with_tls`] (and
/// [`RedisBroker::cluster_with_tls`] with the `cluster` feature). All in PEM.
///
/// A plain `rediss://` URL needs none of this when the server's certificate is signed by an
/// authority the machine trusts (its native certificate store).
///
/// ```no_run
/// use stagedoor_jobs_redis::{RedisBroker, Tls};
///
/// # fn main() -> std::io::Result<()> {
/// let ca = std::fs::read("/etc/redis/ca.crt")?;
/// let broker = RedisBroker::from_url_with_tls("rediss://redis.internal:6380/", Tls::new().root_cert(ca));
/// # let _ = broker;
/// # Ok(())
/// # }
/// ```
///
/// [`RedisBroker::from_url_with_tls`]: crate::RedisBroker::from_url_with_tls
/// [`RedisBroker::cluster_with_tls`]: crate::RedisBroker
#[derive(Clone, Default)]
pub struct Tls {
    root_cert: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("root_cert", &self.root_cert.as_ref().map(|_| "<pem>"))
            .field("client_cert", &self.client.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Tls {
    /// Trust the native certificate store, present no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust this certificate authority (PEM) instead of the native store: a server whose
    /// certificate it did not sign is refused.
    pub fn root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_cert = Some(pem.into());
        self
    }

    /// Present this certificate and its private key (both PEM) to a server that asks for one
    /// (`tls-auth-clients yes`).
    pub fn client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    pub(crate) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.root_cert.clone(),
        }
    }
}

/// Makes ring rustls' process-wide crypto provider unless the application installed one: with
/// two providers compiled in (another crate enabling aws-lc-rs), rustls would not pick.
pub(crate) fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
