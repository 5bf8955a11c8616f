//! Rows as statements bind and read them: the values one statement may bind (and how they
//! become its parameters), one row as read back column by column, and how a value that cannot
//! be read is described.

use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::MAX_ATTEMPT;
use stagedoor_jobs::inbox::{ColumnType, Table};
use stagedoor_jobs::{BrokerError, Priority};

use crate::dialect::db_err;
use crate::dialect::sealed::{Driver, Value};
use crate::receipt::IdValue;
use crate::sql::{P, Stmt};

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
    /// The rows a page passes over ([`P::Offset`]).
    pub(crate) offset: i64,
    pub(crate) error: Option<String>,
    pub(crate) headers: Option<String>,
    pub(crate) payload: Vec<u8>,
    pub(crate) enqueued_at: Option<DateTime<Utc>>,
    pub(crate) job_id: Option<String>,
    pub(crate) floor: Option<DateTime<Utc>>,
    /// The attempts a dead letter has spent.
    pub(crate) attempt: i64,
    /// The job's priority level ([`P::Priority`]); 0 (normal) unless set.
    pub(crate) priority: i64,
    /// The row's version ([`P::Ctid`]).
    pub(crate) ctid: Option<String>,
}

/// One row as read back: id, attempt, payload, lease, due, last error, headers, enqueued at,
/// priority.
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
    /// The job's priority: normal for a table without the column and for a NULL there.
    pub(crate) priority: Priority,
    /// What could not be read: each column, the value found and the fix.
    pub(crate) problem: Option<String>,
    /// Where the claimed row's version is (Postgres: its `ctid` as text, which a claim
    /// returns in a tenth column and [`read_claimed`] reads); `None` for other reads.
    pub(crate) ctid: Option<String>,
}

/// The parameters of `stmt`, in order, from `v`.
pub(crate) fn params(stmt: &Stmt, v: &Vals, table: &Table) -> Vec<Value> {
    stmt.params.iter().map(|p| value(*p, v, table)).collect()
}

/// The parameters of a multi-row statement: `template`'s values for each of `rows`, in order
/// (`None` entries are literals, nothing to bind).
pub(crate) fn params_rows(template: &[Option<P>], rows: &[Vals], table: &Table) -> Vec<Value> {
    rows.iter()
        .flat_map(|v| template.iter().flatten().map(move |p| value(*p, v, table)))
        .collect()
}

/// The value `p` stands for in `v`.
fn value(p: P, v: &Vals, table: &Table) -> Value {
    match p {
        P::Id => match &v.id {
            Some(id) => id.value(),
            None => Value::Text(None),
        },
        P::Lease => Value::Time(v.leases.map(|l| l[0])),
        P::Fence1 => Value::Time(v.leases.map(|l| l[1])),
        P::Fence2 => Value::Time(v.leases.map(|l| l[2])),
        P::Fence3 => Value::Time(v.leases.map(|l| l[3])),
        P::Reclaim => Value::Time(v.reclaim.or(v.now)),
        P::NewLease => Value::Time(v.new_lease),
        P::Group => Value::Text(v.group.clone()),
        P::Target => Value::Text(v.target.clone()),
        P::Now => Value::Time(v.now),
        P::Due => Value::Time(v.due),
        P::Limit => Value::Int(Some(v.limit)),
        P::Offset => Value::Int(Some(v.offset)),
        P::Error => Value::Text(v.error.clone()),
        P::Headers => Value::Text(v.headers.clone()),
        P::Payload => match table.payload.ty {
            ColumnType::Bytes => Value::Bytes(v.payload.clone()),
            _ => Value::Text(Some(String::from_utf8_lossy(&v.payload).into_owned())),
        },
        P::EnqueuedAt => Value::Time(v.enqueued_at),
        P::JobId => Value::Text(v.job_id.clone()),
        P::Floor => Value::Time(v.floor),
        P::Attempt => Value::Int(Some(v.attempt)),
        P::Priority => Value::Int(Some(v.priority)),
        P::Ctid => Value::Text(v.ctid.clone()),
    }
}

/// The ids (as text) an insert returned, one per stored row.
pub(crate) fn returned_ids<DB: Driver>(rows: &[DB::Row]) -> Result<Vec<String>, BrokerError> {
    rows.iter()
        .map(|r| {
            DB::text(r, 0)
                .map_err(db_err)?
                .ok_or_else(|| BrokerError::Backend("an insert returned a NULL id".to_owned()))
        })
        .collect()
}

/// How column `i` of `row` is shown in a message: its value, shortened, or its type.
pub(crate) fn shown<DB: Driver>(row: &DB::Row, i: usize) -> String {
    match DB::is_null(row, i) {
        Err(_) => return "a value that cannot be read".to_owned(),
        Ok(true) => return "NULL".to_owned(),
        Ok(false) => {}
    }
    if let Some(stored) = DB::stored_time(row, i) {
        return stored.map_or_else(|shown| shown, |t| format!("'{}'", t.to_rfc3339()));
    }
    if let Ok(Some(s)) = DB::text(row, i) {
        return format!("'{}'", shorten(&s));
    }
    if let Ok(Some(v)) = DB::int(row, i) {
        return v.to_string();
    }
    if let Ok(Some(v)) = DB::float(row, i) {
        return v.to_string();
    }
    if let Ok(Some(b)) = DB::bytes(row, i) {
        return shorten_bytes(&b);
    }
    let ty = DB::type_name(row, i).unwrap_or_default();
    format!("a value of type {ty}")
}

/// Column `i` of `row` as a timestamp; `Err` with the value shown when it is not one chrono
/// can hold. Read from its stored form where the driver's own decoding cannot be trusted with
/// every value (Postgres: `infinity`; see `Sealed::stored_time`).
pub(crate) fn time_at<DB: Driver>(
    row: &DB::Row,
    i: usize,
) -> Result<Option<DateTime<Utc>>, String> {
    if DB::is_null(row, i).map_err(|e| e.to_string())? {
        return Ok(None);
    }
    if let Some(stored) = DB::stored_time(row, i) {
        return stored.map(Some);
    }
    match DB::time(row, i) {
        Ok(Some(t)) => Ok(Some(t)),
        _ => Err(shown::<DB>(row, i)),
    }
}

/// Reads a row column by column (see [`RowRead`]): never fails; what cannot be read is named
/// in `problem`. Its `ctid` is `None`: only [`read_claimed`] reads it.
pub(crate) fn read<DB: Driver>(row: &DB::Row, table: &Table) -> RowRead {
    let mut problems = Vec::new();
    let lease_col = table.locked_until.map_or("locked_until", |c| c.name);
    let due_col = table.retry_after.map_or("retry_after", |c| c.name);
    let enq_col = table.enqueued_at.map_or("enqueued_at", |c| c.name);
    let id = match DB::text(row, 0) {
        Ok(Some(id)) => id,
        _ => {
            let shown = shown::<DB>(row, 0);
            problems.push(unreadable(table, table.id.name, &shown, Role::Id));
            String::new()
        }
    };
    // Read as BIGINT by every statement; unreadable only as NULL (a fresh count).
    let attempt = DB::int(row, 1).ok().flatten();
    let payload = payload_of::<DB>(row, table, &mut problems);
    let mut time = |i: usize, col: &str, nullable: bool| match time_at::<DB>(row, i) {
        Ok(t) => t,
        Err(value) => {
            problems.push(unreadable(table, col, &value, Role::Time { nullable }));
            None
        }
    };
    let lease = time(3, lease_col, true);
    let due = time(4, due_col, false);
    let enqueued_at = time(7, enq_col, false);
    // The last error is only shown: a value that is not text is shown as it is.
    let last_error = DB::text(row, 5).unwrap_or_else(|_| Some(shown::<DB>(row, 5)));
    let headers = DB::text(row, 6).unwrap_or_else(|_| {
        let col = table.headers.map_or("headers", |c| c.name);
        problems.push(unreadable(table, col, &shown::<DB>(row, 6), Role::Text));
        None
    });
    let priority = priority_of::<DB>(row, table, &mut problems);
    RowRead {
        id,
        attempt,
        payload,
        lease,
        due,
        last_error,
        headers,
        enqueued_at,
        priority,
        problem: (!problems.is_empty()).then(|| problems.join("; ")),
        ctid: None,
    }
}

/// [`read`] of a row a claim returned: with where its version is (Postgres: the `ctid` a
/// claim returns in a tenth column; SQLite returns none).
pub(crate) fn read_claimed<DB: Driver>(row: &DB::Row, table: &Table) -> RowRead {
    RowRead {
        ctid: DB::text(row, 9).ok().flatten(),
        ..read::<DB>(row, table)
    }
}

/// The payload in column 2 of `row`; empty, with a problem added, when it cannot be read.
fn payload_of<DB: Driver>(row: &DB::Row, table: &Table, problems: &mut Vec<String>) -> Vec<u8> {
    // A NULL payload is no payload (some drivers read it as empty bytes).
    let null = DB::is_null(row, 2).unwrap_or(true);
    let payload = match table.payload.ty {
        _ if null => None,
        ColumnType::Bytes => DB::bytes(row, 2).ok().flatten(),
        _ => DB::text(row, 2).ok().flatten().map(String::into_bytes),
    };
    payload.unwrap_or_else(|| {
        let shown = shown::<DB>(row, 2);
        problems.push(unreadable(table, table.payload.name, &shown, Role::Payload));
        Vec::new()
    })
}

/// The priority in column 8 of `row`: normal for a table without the column and for a NULL
/// there. A level outside -2..=2 (a row edited by hand) is no priority: named as a problem
/// (the row is dead-lettered alone), never clamped to the nearest level.
fn priority_of<DB: Driver>(row: &DB::Row, table: &Table, problems: &mut Vec<String>) -> Priority {
    let Some(c) = table.priority else {
        return Priority::NORMAL;
    };
    match DB::int(row, 8) {
        Ok(None) => Priority::NORMAL,
        Ok(Some(v)) => Priority::try_from(v).unwrap_or_else(|_| {
            problems.push(unreadable(table, c.name, &v.to_string(), Role::Priority));
            Priority::NORMAL
        }),
        Err(_) => {
            let shown = shown::<DB>(row, 8);
            problems.push(unreadable(table, c.name, &shown, Role::Priority));
            Priority::NORMAL
        }
    }
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
        Role::Priority => (
            "a priority (a whole number from -2 to 2)",
            "set it to a level from -2 (lowest) to 2 (highest), 0 for normal".to_owned(),
        ),
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
    Priority,
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
    fn shown_values_are_short() {
        assert_eq!(shorten("soon"), "soon");
        let long = "x".repeat(1000);
        assert!(shorten(&long).ends_with("… (1000 characters)"));
        assert!(shorten(&long).chars().count() < 100);
        assert_eq!(shorten_bytes(&[0xde, 0xad]), "0xdead");
        assert!(shorten_bytes(&[0u8; 1 << 20]).ends_with("… (1048576 bytes)"));
    }
}
