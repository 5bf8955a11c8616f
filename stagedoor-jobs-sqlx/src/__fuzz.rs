//! Entry points for the fuzz targets (`fuzz/` in the repository): what reads a row's values
//! without a database, re-exported as it is. Not a public API: it changes without notice.

use chrono::{DateTime, Utc};
use stagedoor_jobs::{Envelope, Headers};

use crate::headers::HeaderDoc;

/// The document of a row's `headers` column.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderColumn(HeaderDoc);

impl HeaderColumn {
    /// The column's text as a claim reads it (NULL or not a document: an empty one).
    pub fn parse(text: Option<&str>) -> Self {
        Self(HeaderDoc::parse(text))
    }

    /// The column of `envelope` published on `queue` (as a publish writes it).
    pub fn published(queue: &str, envelope: &Envelope) -> Self {
        let h = envelope.headers();
        Self(HeaderDoc {
            kind: (envelope.kind() != queue).then(|| envelope.kind().to_owned()),
            job_id: Some(envelope.id().to_string()),
            request_id: h.request_id.clone(),
            trace: h.trace.clone(),
            extra: h.extra.clone(),
            ..HeaderDoc::default()
        })
    }

    /// This column with a dead letter's fields (as a dead-lettering settlement writes it).
    pub fn dead(
        self,
        origin: &str,
        error: &str,
        traceback: &str,
        failed_at: DateTime<Utc>,
    ) -> Self {
        Self(HeaderDoc {
            origin: Some(origin.to_owned()),
            error: Some(error.to_owned()),
            traceback: Some(traceback.to_owned()),
            failed_at: Some(failed_at),
            ..self.0
        })
    }

    /// The text written to the column.
    pub fn to_json(&self) -> String {
        self.0.to_json()
    }

    /// The job's headers.
    pub fn headers(&self) -> Headers {
        self.0.headers()
    }

    /// The job's kind, when it is not its queue's name.
    pub fn kind(&self) -> Option<&str> {
        self.0.kind.as_deref()
    }

    /// The job's id.
    pub fn job_id(&self) -> Option<&str> {
        self.0.job_id.as_deref()
    }

    /// A dead letter's time of failure.
    pub fn failed_at(&self) -> Option<DateTime<Utc>> {
        self.0.failed_at
    }
}

/// A stored attempt count as the number it stands for (`floor` 1 for a claim, 0 for a dead
/// letter).
pub fn attempt_number(stored: Option<i64>, floor: u32) -> u32 {
    crate::rows::attempt_number(stored, floor)
}

/// A text value shortened for a message.
pub fn shorten(text: &str) -> String {
    crate::rows::shorten(text)
}

/// A bytes value shortened for a message.
pub fn shorten_bytes(bytes: &[u8]) -> String {
    crate::rows::shorten_bytes(bytes)
}
