//! What the SQL model tests (`tests/model_sqlite.rs`, `tests/model_postgres.rs`) share: the
//! hand-edited rows of each kind of junk.
#![allow(dead_code)]

use stagedoor_jobs::conformance::Junk;

/// The kinds of junk a row of the conformance table can hold.
pub(crate) const SQL_JUNK: [Junk; 4] = [
    Junk::BadTimestamp,
    Junk::BadHeaders,
    Junk::AttemptOutOfRange,
    Junk::PriorityOutOfRange,
];

/// An `INSERT` of one junk row of kind `junk` (`$1` its id, `$2` its group), due now, on
/// SQLite (`sqlite`) or Postgres.
pub(crate) fn junk_row(junk: Junk, sqlite: bool) -> Result<String, String> {
    let past = "'2026-01-01T00:00:00+00:00'";
    let payload = if sqlite {
        "CAST('{\"n\":0}' AS BLOB)"
    } else {
        "convert_to('{\"n\":0}', 'UTF8')"
    };
    let (retry_after, attempt, headers, priority) = match junk {
        Junk::BadTimestamp => (if sqlite { "''" } else { "'-infinity'" }, "1", "NULL", "0"),
        Junk::BadHeaders => (past, "1", "'{not json'", "0"),
        // SQLite's INTEGER holds any; Postgres' SMALLINT stops at 32767 (the cap's ceiling).
        Junk::AttemptOutOfRange => (past, if sqlite { "99999" } else { "32767" }, "NULL", "0"),
        Junk::PriorityOutOfRange => (past, "1", "NULL", "100"),
        other => return Err(format!("{other:?} is not a SQL edit")),
    };
    Ok(format!(
        "INSERT INTO conf_jobs (id, queue, attempt, retry_after, payload, enqueued_at, headers, priority) \
         VALUES ($1, $2, {attempt}, {retry_after}, {payload}, {past}, {headers}, {priority})"
    ))
}
