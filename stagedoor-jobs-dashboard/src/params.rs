//! Query strings and forms, with repeated fields (`id=a&id=b`), and the bounds on them.

/// A query string or a form body longer than this is refused unread: a selection of 1,000 ids
/// of up to 56 characters fits (a URI longer than 64 KB is refused by the HTTP layer itself).
pub(crate) const MAX_INPUT: usize = 60 * 1024;
/// A selection holds at most this many ids.
pub(crate) const MAX_SELECTED: usize = 1_000;

/// The longest job or flow id a page reads, in bytes: a record's key (at most
/// [`MAX_RECORD_KEY`](stagedoor_jobs::broker::MAX_RECORD_KEY)) is the id after a short prefix.
pub(crate) const MAX_ID: usize = 500;

/// Why `id` cannot name a job or a flow (checked before any backend call): empty, past
/// [`MAX_ID`], or holding a NUL (no record key may).
pub(crate) fn id_problem(id: &str) -> Option<String> {
    if id.is_empty() || id.len() > MAX_ID {
        Some(format!(
            "An id must be 1 to {MAX_ID} bytes long; this one is {} bytes.",
            id.len()
        ))
    } else if id.contains('\0') {
        Some("An id cannot hold a NUL character.".to_owned())
    } else {
        None
    }
}

/// The fields of a query string or an `application/x-www-form-urlencoded` body, in order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    /// Parses `input` (a query string without `?`, or a form body).
    pub(crate) fn parse(input: &[u8]) -> Self {
        Self(
            form_urlencoded::parse(input)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The request's query string.
    pub(crate) fn query(uri: &axum::http::Uri) -> Self {
        Self::parse(uri.query().unwrap_or_default().as_bytes())
    }

    /// The first non-empty value of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    /// Every non-empty value of `name`, each once, in order; `Err(n)` when there are `n`,
    /// more than `max` (counted before any is compared, so the work is bounded by `max`).
    pub(crate) fn all(&self, name: &str, max: usize) -> Result<Vec<String>, usize> {
        let given = self
            .0
            .iter()
            .filter(|(k, v)| k == name && !v.is_empty())
            .count();
        if given > max {
            return Err(given);
        }
        let mut seen = std::collections::HashSet::with_capacity(given);
        Ok(self
            .0
            .iter()
            .filter(|(k, v)| k == name && !v.is_empty())
            .filter(|(_, v)| seen.insert(v.as_str()))
            .map(|(_, v)| v.clone())
            .collect())
    }
}

/// A query string of `pairs`, encoded (`dl=jobs%3Adead&page=2`).
pub(crate) fn query_string<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_fields() {
        let p = Params::parse(b"dl=jobs%3Adead&id=a&id=b&id=a&id=&kind=");
        assert_eq!(p.get("dl"), Some("jobs:dead"));
        assert_eq!(p.all("id", 3), Ok(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(p.all("id", 2), Err(3), "counted before de-duplicating");
        assert_eq!(p.get("kind"), None);
        assert_eq!(query_string([("dl", "a b&c")]), "dl=a+b%26c");
    }
}
