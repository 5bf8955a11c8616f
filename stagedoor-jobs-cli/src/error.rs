//! Exit codes and the one-line errors the command prints.

use stagedoor_jobs::BrokerError;

/// Everything went as asked.
pub(crate) const OK: u8 = 0;
/// The operation failed, or part of it did (a replay with failures).
pub(crate) const FAILED: u8 = 1;
/// A usage error (clap's own code for bad arguments).
pub(crate) const USAGE: u8 = 2;
/// Cannot connect: a bad URL, a server that is down, a table that is not a job table.
pub(crate) const CONNECT: u8 = 3;
/// An unknown queue, dead letter or table.
pub(crate) const NOT_FOUND: u8 = 4;

/// A failed command: its exit code and the line printed after `error: `.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The exit code.
    pub(crate) code: u8,
    /// What went wrong and how to fix it.
    pub(crate) message: String,
}

impl Failure {
    /// A failure with exit `code`.
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// Cannot connect (code 3).
    pub(crate) fn connect(message: impl Into<String>) -> Self {
        Self::new(CONNECT, message)
    }

    /// Unknown queue, dead letter or table (code 4).
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(NOT_FOUND, message)
    }

    /// A usage error (code 2).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::new(USAGE, message)
    }

    /// A broker's error: connection problems are code 3, an unknown queue 4, the rest 1.
    pub(crate) fn broker(e: BrokerError) -> Self {
        match e {
            BrokerError::Connection(m) => {
                Self::connect(format!("lost the connection to the backend: {m}"))
            }
            BrokerError::NotConnected => Self::connect(e.to_string()),
            BrokerError::UnknownQueue(_) => Self::not_found(e.to_string()),
            other => Self::new(FAILED, other.to_string()),
        }
    }
}

/// The longest job or flow id the commands read, in bytes: a record's key (at most
/// [`MAX_RECORD_KEY`](stagedoor_jobs::broker::MAX_RECORD_KEY)) is the id after a short prefix.
pub(crate) const MAX_ID: usize = 500;

/// A usage error (exit 2) for an id no record can be kept under: empty or past [`MAX_ID`].
pub(crate) fn check_id(what: &str, id: &str) -> Result<(), Failure> {
    if id.is_empty() || id.len() > MAX_ID {
        return Err(Failure::usage(format!(
            "a {what} id must be 1 to {MAX_ID} bytes, not {}: `{}…`",
            id.len(),
            crate::output::escaped(&id.as_bytes()[..id.len().min(40)])
        )));
    }
    Ok(())
}

/// A broker's error at connect (code 3), without the variant's prefix.
pub(crate) fn connect_error(e: BrokerError) -> Failure {
    match e {
        BrokerError::Connection(m) => Failure::connect(m),
        other => Failure::connect(other.to_string()),
    }
}

/// `text` on one line: line breaks and runs of blanks become one space.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A URL with its password (or token) masked, for messages.
pub(crate) use stagedoor_jobs::broker::mask_url as mask;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_passwords() {
        assert_eq!(
            mask("postgres://app:s3cret@db/app"),
            "postgres://app:***@db/app"
        );
        assert_eq!(mask("redis://:pw@h:6379/"), "redis://:***@h:6379/");
        assert_eq!(mask("redis://tok@h:6379/"), "redis://***@h:6379/");
        assert_eq!(mask("sqlite://mail.db"), "sqlite://mail.db");
    }

    #[test]
    fn one_line_joins() {
        assert_eq!(one_line("a\n  b\tc\n"), "a b c");
    }
}
