//! What a row's `headers` column holds: the envelope's fields a table has no column for.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use stagedoor_jobs::Headers;

/// The JSON document in the `headers` column.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeaderDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) trace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) extra: BTreeMap<String, String>,
    /// A dead letter's queue of origin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) origin: Option<String>,
    /// A dead letter's traceback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) traceback: Option<String>,
    /// A dead letter's error (also in `last_error` where the table has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// When it was dead-lettered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) failed_at: Option<DateTime<Utc>>,
}

impl HeaderDoc {
    pub(crate) fn parse(text: Option<&str>) -> Self {
        text.and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default()
    }

    pub(crate) fn headers(&self) -> Headers {
        Headers {
            request_id: self.request_id.clone(),
            trace: self.trace.clone(),
            extra: self.extra.clone(),
        }
    }

    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}
