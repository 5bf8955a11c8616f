//! The hosts the dashboard answers to (DNS rebinding) and the origins a POST may come from.

use std::net::IpAddr;

use axum::http::{HeaderMap, header};

/// A host as `Host` or `Origin` name it: the name (lowercase, brackets kept on IPv6) and the
/// port, if given.
fn split_host(host: &str) -> (String, Option<u16>) {
    let host = host.trim().to_ascii_lowercase();
    let (name, port) = if host.starts_with('[') {
        match host.find(']') {
            Some(end) => (
                host[..=end].to_owned(),
                host[end + 1..].strip_prefix(':').map(str::to_owned),
            ),
            None => (host.clone(), None),
        }
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) => (n.to_owned(), Some(p.to_owned())),
            None => (host.clone(), None),
        }
    };
    let port = port.and_then(|p| p.parse::<u16>().ok());
    (name.trim_end_matches('.').to_owned(), port)
}

/// Whether `name` is an IP address (`127.0.0.1`, `[::1]`): a host a web page cannot rebind, as
/// no DNS answer is involved.
fn is_ip(name: &str) -> bool {
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    bare.parse::<IpAddr>().is_ok()
}

/// Whether the dashboard answers to `host` (a `Host` header): `localhost` or an IP address
/// (on the port it serves, when it knows it), or a name allowed with
/// [`Dashboard::allowed_host`](crate::Dashboard::allowed_host). Any other name may be a DNS
/// rebinding: a page of that name pointed at this address.
pub(crate) fn host_allowed(host: &str, served_port: Option<u16>, allowed: &[String]) -> bool {
    let (name, port) = split_host(host);
    let allowed_name = allowed.iter().any(|a| {
        let (a_name, a_port) = split_host(a);
        a_name == name && (a_port.is_none() || a_port == port)
    });
    if allowed_name {
        return true;
    }
    let local = name == "localhost" || is_ip(&name);
    let port_ok = match served_port {
        None => true,
        Some(p) => port.unwrap_or(80) == p,
    };
    local && port_ok
}

/// Why a POST is refused as coming from another site: an `Origin` that is neither the `Host`
/// it was sent to nor an allowed host, or a `Sec-Fetch-Site` other than `same-origin`/`none`.
pub(crate) fn cross_site(
    headers: &HeaderMap,
    host: Option<&str>,
    allowed: &[String],
) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return Some(format!(
            "the browser says it was sent {site} (Sec-Fetch-Site)"
        ));
    }
    let origin = headers.get(header::ORIGIN)?;
    let Some(origin) = origin.to_str().ok() else {
        return Some("its Origin header is not text".to_owned());
    };
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    let same = authority.is_some_and(|a| {
        let a = split_host(a);
        host.is_some_and(|h| split_host(h) == a)
            || allowed.iter().any(|x| {
                let x = split_host(x);
                x.0 == a.0 && (x.1.is_none() || x.1 == a.1)
            })
    });
    if same {
        None
    } else {
        Some(format!("its Origin is `{origin}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn hosts_answered() {
        let allowed = [
            "jobs.example.com".to_owned(),
            "ops.example.com:8443".to_owned(),
        ];
        for (host, port, ok) in [
            ("127.0.0.1:8787", Some(8787), true),
            ("localhost:8787", Some(8787), true),
            ("[::1]:8787", Some(8787), true),
            ("10.1.2.3:8787", Some(8787), true),
            ("localhost:8788", Some(8787), false),
            ("localhost", Some(80), true),
            ("localhost", Some(8787), false),
            ("localhost:3000", None, true),
            ("attacker.example:8787", Some(8787), false),
            ("attacker.example:8787", None, false),
            ("127.0.0.1.nip.io", None, false),
            ("Jobs.Example.com", Some(8787), true),
            ("jobs.example.com:443", None, true),
            ("ops.example.com:8443", None, true),
            ("ops.example.com", None, false),
            ("evil.jobs.example.com", None, false),
        ] {
            assert_eq!(host_allowed(host, port, &allowed), ok, "{host} {port:?}");
        }
    }

    #[test]
    fn origins_checked() {
        let mut h = HeaderMap::new();
        let allowed = ["jobs.example.com".to_owned()];
        assert!(
            cross_site(&h, Some("127.0.0.1:8787"), &allowed).is_none(),
            "no headers"
        );
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8787"),
        );
        assert!(cross_site(&h, Some("127.0.0.1:8787"), &allowed).is_none());
        assert!(cross_site(&h, Some("127.0.0.1:9999"), &allowed).is_some());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://jobs.example.com"),
        );
        assert!(
            cross_site(&h, Some("10.0.0.5:8787"), &allowed).is_none(),
            "allowed"
        );
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(cross_site(&h, Some("127.0.0.1:8787"), &allowed).is_some());
        h.remove(header::ORIGIN);
        h.insert("sec-fetch-site", HeaderValue::from_static("same-site"));
        assert!(cross_site(&h, Some("127.0.0.1:8787"), &allowed).is_some());
    }
}
