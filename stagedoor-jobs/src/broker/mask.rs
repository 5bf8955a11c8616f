//! [`mask_url`]: a URL with every password masked, for messages and logs.

/// `url` with every password masked, for messages and logs: the user-info's
/// (`postgres://app:***@db/app`, `redis://***@h/` for a Redis token alone) and the value of
/// each query parameter that carries a secret (`?password=***`, `sslpassword`, any case or
/// position, its name percent-encoded or not: every name holding `pass`, `pwd`, `secret` or
/// `token`); several URLs separated by commas each masked.
pub fn mask_url(url: &str) -> String {
    // A comma starts another URL only where a scheme follows it: a comma inside a password or
    // a parameter's value stays in its URL (and is masked with it).
    let mut out = String::with_capacity(url.len());
    let mut start = 0;
    for (i, _) in url.match_indices(',') {
        if i < start || !starts_with_scheme(url[i + 1..].trim_start()) {
            continue;
        }
        out.push_str(&mask_one(&url[start..i]));
        out.push(',');
        start = i + 1;
    }
    out.push_str(&mask_one(&url[start..]));
    out
}

/// Whether `s` begins with `scheme://`.
fn starts_with_scheme(s: &str) -> bool {
    let Some(end) = s.find("://") else {
        return false;
    };
    let scheme = &s[..end];
    scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'))
}

/// One URL masked (see [`mask_url`]).
fn mask_one(u: &str) -> String {
    let mut out = String::with_capacity(u.len());
    let mut rest = u;
    if let Some(s) = u.find("://") {
        let after = &u[s + 3..];
        // The user-info ends at the last `@` before the query; with none there, at the last
        // `@` at all (a password holding `?`): masking too much never shows a secret.
        let query = after.find(['?', '#']).unwrap_or(after.len());
        let at = after[..query].rfind('@').or_else(|| after.rfind('@'));
        out.push_str(&u[..s + 3]);
        rest = after;
        if let Some(at) = at {
            let creds = &after[..at];
            match creds.find(':') {
                Some(c) => {
                    out.push_str(&creds[..c]);
                    out.push_str(":***");
                }
                None if u.starts_with("redis") || u.starts_with("unix") => out.push_str("***"),
                None => out.push_str(creds),
            }
            rest = &after[at..];
        }
    }
    // Every `name=value` after a `?`, `&` or `;`: a secret's value masked.
    let Some(q) = rest.find('?') else {
        out.push_str(rest);
        return out;
    };
    out.push_str(&rest[..=q]);
    let (query, fragment) = match rest[q + 1..].find('#') {
        Some(f) => rest[q + 1..].split_at(f),
        None => (&rest[q + 1..], ""),
    };
    let mut params = query;
    loop {
        let end = params.find(['&', ';']).unwrap_or(params.len());
        let param = &params[..end];
        match param.split_once('=') {
            Some((name, _)) if is_secret_name(name) => {
                out.push_str(name);
                out.push_str("=***");
            }
            _ => out.push_str(param),
        }
        if end == params.len() {
            break;
        }
        out.push_str(&params[end..=end]); // the separator
        params = &params[end + 1..];
    }
    out.push_str(fragment);
    out
}

/// Whether a query parameter's name (percent-decoded, in any case) names a secret.
fn is_secret_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                decoded.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                decoded.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    let name = String::from_utf8_lossy(&decoded).to_ascii_lowercase();
    ["pass", "pwd", "secret", "token"]
        .iter()
        .any(|s| name.contains(s))
}

#[cfg(test)]
mod tests {
    use super::mask_url;

    #[test]
    fn masks_passwords() {
        assert_eq!(
            mask_url("postgres://app:s3cret@db/app"),
            "postgres://app:***@db/app"
        );
        assert_eq!(mask_url("redis://:pw@h:6379/"), "redis://:***@h:6379/");
        assert_eq!(mask_url("redis://tok@h:6379/"), "redis://***@h:6379/");
        assert_eq!(mask_url("sqlite://mail.db"), "sqlite://mail.db");
        assert_eq!(
            mask_url("redis://:a@h:1/,redis://:b@h:2/"),
            "redis://:***@h:1/,redis://:***@h:2/"
        );
    }

    /// Every password a URL can carry is masked, wherever it sits; the rest is kept.
    #[test]
    fn masks_every_password() {
        let cases = [
            (
                "postgres://u@host/db?password=secret",
                "postgres://u@host/db?password=***",
            ),
            (
                "postgres://u@host/db?sslmode=require&PASSWORD=secret&x=1",
                "postgres://u@host/db?sslmode=require&PASSWORD=***&x=1",
            ),
            (
                "postgres://u@host/db?Password=secret#frag",
                "postgres://u@host/db?Password=***#frag",
            ),
            (
                "postgres://u@host/db?sslpassword=secret&password=secret",
                "postgres://u@host/db?sslpassword=***&password=***",
            ),
            (
                "postgres://u@host/db?%70assword=secret",
                "postgres://u@host/db?%70assword=***",
            ),
            (
                "postgres://u@host/db?PASS%57ORD=secret;a=b",
                "postgres://u@host/db?PASS%57ORD=***;a=b",
            ),
            (
                "postgres://u:secret@host/db?password=secret",
                "postgres://u:***@host/db?password=***",
            ),
            (
                "postgres://u:se@cret@host/db?application_name=me",
                "postgres://u:***@host/db?application_name=me",
            ),
            ("postgres://u:se?cret@host/db", "postgres://u:***@host/db"),
            (
                "postgres://u@host/db?password=se,cret",
                "postgres://u@host/db?password=***",
            ),
            (
                "redis://:a,b@h:1/,redis://h:2/?password=secret",
                "redis://:***@h:1/,redis://h:2/?password=***",
            ),
            ("sqlite://mail.db?mode=rwc", "sqlite://mail.db?mode=rwc"),
        ];
        for (url, masked) in cases {
            let got = mask_url(url);
            assert_eq!(got, masked, "{url}");
            assert!(
                !got.contains("secret") && !got.contains("cret"),
                "{url}: {got}"
            );
        }
    }
}
