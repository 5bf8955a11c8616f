//! Query strings and forms, with repeated fields (`id=a&id=b`).

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

    /// Every non-empty value of `name`, each once, in order.
    pub(crate) fn all(&self, name: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (k, v) in &self.0 {
            if k == name && !v.is_empty() && !out.contains(v) {
                out.push(v.clone());
            }
        }
        out
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
        assert_eq!(p.all("id"), vec!["a", "b"]);
        assert_eq!(p.get("kind"), None);
        assert_eq!(query_string([("dl", "a b&c")]), "dl=a+b%26c");
    }
}
