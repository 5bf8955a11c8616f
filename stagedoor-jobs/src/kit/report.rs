//! A worker's report as a backend stores it: JSON written by [`encode_report`], read back by
//! [`decode_report`]; and [`counts_kept_from`], the oldest minute of counts a backend keeps.

use chrono::{DateTime, Utc};

use crate::activity::{COUNTS_KEPT, WorkerReport, minute_of};
use crate::broker::{BrokerError, chrono_duration};

/// `worker`'s report as a backend stores it (JSON), for [`Activity::report`](crate::Activity::report).
///
/// # Errors
///
/// [`BrokerError::Backend`] when it cannot be encoded (it always can: every field is plain
/// data), naming the worker.
pub fn encode_report(worker: &WorkerReport) -> Result<String, BrokerError> {
    serde_json::to_string(worker).map_err(|e| {
        BrokerError::Backend(format!(
            "cannot encode the report of worker `{}`: {e}",
            worker.id
        ))
    })
}

/// A stored report read back, for [`Activity::workers`](crate::Activity::workers); `None`
/// (logged at WARN with `worker`, the id it was stored under, and `store`, where it was read)
/// when it does not read as one: a report edited by hand is left out, not an error.
pub fn decode_report(worker: &str, json: &str, store: &str) -> Option<WorkerReport> {
    match serde_json::from_str::<WorkerReport>(json) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(worker = %worker, store = %store, error = %e, "a worker's report does not read as one: left out");
            None
        }
    }
}

/// The oldest minute a backend keeps counts of at `now`: counts of earlier minutes are not
/// added and are deleted ([`COUNTS_KEPT`] before the minute that holds `now`).
pub fn counts_kept_from(now: DateTime<Utc>) -> DateTime<Utc> {
    minute_of(now) - chrono_duration(COUNTS_KEPT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_back_and_one_edited_by_hand_is_left_out() {
        let at = DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_default();
        let w = WorkerReport::new("w1", "host", 7, at, at);
        let json = encode_report(&w).unwrap_or_default();
        assert_eq!(decode_report("w1", &json, "test"), Some(w));
        assert_eq!(decode_report("w1", "{not json", "test"), None);
    }

    #[test]
    fn counts_are_kept_from_two_hours_before_the_minute() {
        let now = DateTime::from_timestamp(1_700_000_030, 0).unwrap_or_default();
        let from = counts_kept_from(now);
        assert_eq!(from, minute_of(now) - chrono_duration(COUNTS_KEPT));
        assert_eq!(from.timestamp() % 60, 0);
    }
}
