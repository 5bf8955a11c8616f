//! Making a [`RedisBroker`] from the URLs of a server or of a Cluster's nodes (with TLS
//! when asked): the URL is read here, and nothing connects until the service starts.

use stagedoor_jobs::broker::mask_url as mask;

use super::RedisBroker;
use crate::conn::Target;
#[cfg(feature = "cluster")]
use crate::conn::cluster_client;

/// The TLS settings a cluster constructor passes on (nothing without the `tls` feature).
#[cfg(all(feature = "cluster", feature = "tls"))]
type TlsOption = crate::Tls;
#[cfg(all(feature = "cluster", not(feature = "tls")))]
type TlsOption = std::convert::Infallible;

/// The one line for a URL the client refused.
fn not_a_url(url: &str, e: &redis::RedisError) -> String {
    format!(
        "`{}` is not a Redis URL ({e}): write redis://[user:password@]host:port/db",
        mask(url)
    )
}

impl RedisBroker {
    /// A broker for the server at `url` (`redis://[user:password@]host:port/db`, or
    /// `rediss://` with the `tls` feature, trusting the machine's certificate store). No I/O
    /// happens here; a wrong URL or an unreachable server is reported when the service starts.
    pub fn from_url(url: impl AsRef<str>) -> Self {
        let url = url.as_ref();
        let target = if url.starts_with("rediss://") && !cfg!(feature = "tls") {
            Err(format!(
                "`{}` asks for TLS: enable the `tls` feature of stagedoor-jobs-redis",
                mask(url)
            ))
        } else {
            #[cfg(feature = "tls")]
            if url.starts_with("rediss://") {
                crate::tls::install_provider();
            }
            redis::Client::open(url)
                .map(Target::Single)
                .map_err(|e| not_a_url(url, &e))
        };
        Self::with_target(target, mask(url))
    }

    /// A broker for the server at `url` (`rediss://`) trusting `tls`'s certificate authority
    /// and presenting its client certificate, if any (see [`Tls`](crate::Tls)).
    #[cfg(feature = "tls")]
    pub fn from_url_with_tls(url: impl AsRef<str>, tls: crate::Tls) -> Self {
        let url = url.as_ref();
        crate::tls::install_provider();
        let target = if url.starts_with("rediss://") {
            redis::Client::build_with_tls(url, tls.certificates())
                .map(Target::Single)
                .map_err(|e| not_a_url(url, &e))
        } else {
            Err(format!(
                "`{}` is not a TLS URL: certificates were given, write rediss://host:port/db",
                mask(url)
            ))
        };
        Self::with_target(target, mask(url))
    }

    /// A broker for a Redis Cluster reached through any of `urls` (feature `cluster`).
    #[cfg(feature = "cluster")]
    pub fn cluster<S: AsRef<str>>(urls: impl IntoIterator<Item = S>) -> Self {
        Self::cluster_of(urls, None)
    }

    /// A broker for a Redis Cluster reached through any of `urls` (`rediss://`), trusting
    /// `tls`'s certificate authority (features `cluster` and `tls`).
    #[cfg(all(feature = "cluster", feature = "tls"))]
    pub fn cluster_with_tls<S: AsRef<str>>(
        urls: impl IntoIterator<Item = S>,
        tls: crate::Tls,
    ) -> Self {
        Self::cluster_of(urls, Some(tls))
    }

    #[cfg(feature = "cluster")]
    fn cluster_of<S: AsRef<str>>(
        urls: impl IntoIterator<Item = S>,
        #[cfg_attr(not(feature = "tls"), allow(unused_variables))] tls: Option<TlsOption>,
    ) -> Self {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        let shown = urls.iter().map(|u| mask(u)).collect::<Vec<_>>().join(",");
        let target = cluster_client(
            &urls,
            #[cfg(feature = "tls")]
            tls.as_ref(),
        )
        .map(|c| Target::Cluster(Box::new(c)))
        .map_err(|e| format!("`{shown}` are not Redis Cluster URLs ({e})"));
        Self::with_target(target, shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the `tls` feature a `rediss://` URL is refused at start, in one line naming the
    /// feature, the password masked (run by scripts/check-features, which builds this crate
    /// alone: the workspace's tests turn `tls` on).
    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_tls_url_without_the_feature_names_the_feature() {
        let broker = RedisBroker::from_url("rediss://user:secret@127.0.0.1:6380/");
        let Err(text) = &broker.inner.target else {
            panic!("a rediss:// URL without the feature must be refused");
        };
        assert!(!text.contains('\n'), "one line: {text:?}");
        assert!(
            text.contains("`tls` feature") && text.contains("stagedoor-jobs-redis"),
            "names the feature: {text}"
        );
        assert!(!text.contains("secret"), "the password is masked: {text}");
    }

    /// With it, certificates given for a plain `redis://` URL are refused, naming `rediss://`.
    #[cfg(feature = "tls")]
    #[test]
    fn certificates_for_a_plain_url_name_rediss() {
        let broker = RedisBroker::from_url_with_tls("redis://127.0.0.1:6379/", crate::Tls::new());
        let Err(text) = &broker.inner.target else {
            panic!("certificates for redis:// must be refused");
        };
        assert!(text.contains("rediss://"), "{text}");
    }
}
