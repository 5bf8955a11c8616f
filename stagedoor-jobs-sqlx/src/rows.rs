//! Rows as statements bind and read them: the values one statement may bind, one row as read
//! back, and how a value that cannot be read is described.

use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::MAX_ATTEMPT;
use stagedoor_jobs::inbox::Table;

use crate::receipt::IdValue;

/// The values one statement may bind.
#[derive(Default)]
pub(crate) struct Vals {
    pub(crate) id: Option<IdValue>,
    /// The fence: [`P::Lease`], [`P::Fence1`], ...
    pub(crate) leases: Option<[DateTime<Utc>; crate::sql::FENCES]>,
    /// The claim's reclaim cutoff ([`P::Reclaim`]); `now` when unset.
    pub(crate) reclaim: Option<DateTime<Utc>>,
    pub(crate) new_lease: Option<DateTime<Utc>>,
    pub(crate) group: Option<String>,
    pub(crate) target: Option<String>,
    pub(crate) now: Option<DateTime<Utc>>,
    pub(crate) due: Option<DateTime<Utc>>,
    pub(crate) limit: i64,
    pub(crate) error: Option<String>,
    pub(crate) headers: Option<String>,
    pub(crate) payload: Vec<u8>,
    pub(crate) enqueued_at: Option<DateTime<Utc>>,
    pub(crate) job_id: Option<String>,
    pub(crate) floor: Option<DateTime<Utc>>,
    /// The attempts a dead letter has spent.
    pub(crate) attempt: i64,
}

/// One row as read back: id, attempt, payload, lease, due, last error, headers, enqueued at.
///
/// Read column by column: a value that does not decode (a text that is not a timestamp, a NULL
/// payload, an infinite Postgres timestamp) leaves its field empty and is described in
/// `problem`, so that one bad row never fails the statement that read it with others.
pub(crate) struct RowRead {
    pub(crate) id: String,
    /// The stored count (a claim returns the delivery's number); `None` for NULL.
    pub(crate) attempt: Option<i64>,
    pub(crate) payload: Vec<u8>,
    pub(crate) lease: Option<DateTime<Utc>>,
    pub(crate) due: Option<DateTime<Utc>>,
    pub(crate) last_error: Option<String>,
    pub(crate) headers: Option<String>,
    pub(crate) enqueued_at: Option<DateTime<Utc>>,
    /// What could not be read: each column, the value found and the fix.
    pub(crate) problem: Option<String>,
}

/// An attempt count as the `1..=MAX_ATTEMPT` (or `0..=`, `floor` 0) number it stands for:
/// saturating, never wrapping; a count below the floor is the floor.
pub(crate) fn attempt_number(stored: Option<i64>, floor: u32) -> u32 {
    let n = stored
        .unwrap_or(i64::from(floor))
        .clamp(i64::from(floor), i64::from(MAX_ATTEMPT));
    u32::try_from(n).unwrap_or(MAX_ATTEMPT)
}

/// At most `MAX_SHOWN` characters of `text`, marked when cut.
pub(crate) fn shorten(text: &str) -> String {
    const MAX_SHOWN: usize = 60;
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(MAX_SHOWN).collect();
    if chars.next().is_some() {
        format!("{head}… ({} characters)", text.chars().count())
    } else {
        head
    }
}

/// The first bytes of `bytes` in hex, marked when cut.
pub(crate) fn shorten_bytes(bytes: &[u8]) -> String {
    const MAX_SHOWN: usize = 24;
    let hex: String = bytes
        .iter()
        .take(MAX_SHOWN)
        .map(|b| format!("{b:02x}"))
        .collect();
    if bytes.len() > MAX_SHOWN {
        format!("0x{hex}… ({} bytes)", bytes.len())
    } else {
        format!("0x{hex}")
    }
}

/// A Postgres `timestamptz` as stored (microseconds since 2000-01-01 UTC), if chrono can hold
/// it: `infinity`, `-infinity` and the years beyond chrono's range cannot.
pub(crate) fn pg_time(micros: i64) -> Option<DateTime<Utc>> {
    const PG_EPOCH: i64 = 946_684_800;
    let secs = PG_EPOCH.checked_add(micros.div_euclid(1_000_000))?;
    let nanos = u32::try_from(micros.rem_euclid(1_000_000))
        .ok()?
        .checked_mul(1_000)?;
    DateTime::from_timestamp(secs, nanos)
}

/// What column `column` of `table` holds that cannot be read, and the fix.
pub(crate) fn unreadable(table: &Table, column: &str, value: &str, role: Role) -> String {
    let (expected, fix) = match role {
        Role::Time { nullable } => (
            "a timestamp",
            format!(
                "write a finite timestamp{} (on SQLite as RFC 3339 text such as `2026-01-01T00:00:00+00:00`)",
                if nullable { " or NULL" } else { "" }
            ),
        ),
        Role::Payload => (
            "a payload",
            "store the job's payload as the column's type (bytes, or text for a text column), never NULL".to_owned(),
        ),
        Role::Text => (
            "a text",
            "set it to NULL or to the text stagedoor-jobs wrote".to_owned(),
        ),
        Role::Id => ("an id", "give the row an id".to_owned()),
    };
    format!(
        "column `{column}` of table `{}` holds {value}, which is not {expected}: {fix}",
        table.name
    )
}

/// What a column of a read holds, for [`unreadable`].
#[derive(Clone, Copy)]
pub(crate) enum Role {
    Time { nullable: bool },
    Payload,
    Text,
    Id,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_numbers_saturate_and_never_wrap() {
        assert_eq!(
            attempt_number(Some(-32_768), 1),
            1,
            "below 1: a first delivery"
        );
        assert_eq!(attempt_number(Some(0), 1), 1);
        assert_eq!(attempt_number(None, 1), 1);
        assert_eq!(attempt_number(Some(5), 1), 5);
        assert_eq!(attempt_number(Some(i64::MAX), 1), MAX_ATTEMPT);
        assert_eq!(attempt_number(Some(-1), 0), 0, "a dead letter spent none");
        assert_eq!(attempt_number(Some(4_294_967_296), 0), MAX_ATTEMPT);
    }

    #[test]
    fn postgres_timestamps_outside_chrono_are_none_not_a_panic() {
        assert_eq!(pg_time(i64::MAX), None, "infinity");
        assert_eq!(pg_time(i64::MIN), None, "-infinity");
        assert_eq!(
            pg_time(0).map(|t| t.to_rfc3339()),
            Some("2000-01-01T00:00:00+00:00".to_owned())
        );
        assert_eq!(
            pg_time(-1).map(|t| t.to_rfc3339()),
            Some("1999-12-31T23:59:59.999999+00:00".to_owned())
        );
    }

    #[test]
    fn shown_values_are_short() {
        assert_eq!(shorten("soon"), "soon");
        let long = "x".repeat(1000);
        assert!(shorten(&long).ends_with("… (1000 characters)"));
        assert!(shorten(&long).chars().count() < 100);
        assert_eq!(shorten_bytes(&[0xde, 0xad]), "0xdead");
        assert!(shorten_bytes(&[0u8; 1 << 20]).ends_with("… (1048576 bytes)"));
    }
}
