//! The statements of records (`route/records.rs`): the table `stagedoor_records` (a row per
//! key: its value, its version, when it runs out) and its index of expiries, reading a record,
//! locking the rows a write names, writing them, and deleting records that ran out.
//!
//! Every key, value, version and time is a bind parameter; the only text put together here is
//! the list of placeholders of [`lock_rows`].

use super::Flavor;

/// The records' table, as messages name it.
pub(crate) const TABLE: &str = "stagedoor_records";

/// The objects records need, each with what it is for (for messages) and its DDL, created
/// where they are missing (see `locks::ensure_tables`): the table, then the index its clean-up
/// reads (only the rows that run out).
pub(crate) fn objects(flavor: Flavor) -> [(&'static str, &'static str, &'static str); 2] {
    let table = match flavor {
        Flavor::Postgres => {
            "CREATE TABLE IF NOT EXISTS stagedoor_records (record_key TEXT PRIMARY KEY, value BYTEA NOT NULL, version BIGINT NOT NULL, expires_at TIMESTAMPTZ)"
        }
        Flavor::Sqlite => {
            "CREATE TABLE IF NOT EXISTS stagedoor_records (record_key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL, version BIGINT NOT NULL, expires_at TIMESTAMPTZ)"
        }
    };
    [
        (TABLE, "records: jobs' results and progress", table),
        (
            "stagedoor_records_expiry",
            "deleting the records that ran out",
            "CREATE INDEX IF NOT EXISTS stagedoor_records_expiry ON stagedoor_records (expires_at) WHERE expires_at IS NOT NULL",
        ),
    ]
}

/// Record `$1`: its value, version and expiry; on Postgres also the database's time (the
/// statement's).
pub(crate) fn read(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Postgres => {
            "SELECT value, version, expires_at, now() FROM stagedoor_records WHERE record_key = $1"
        }
        Flavor::Sqlite => {
            "SELECT value, version, expires_at FROM stagedoor_records WHERE record_key = $1"
        }
    }
}

/// The most keys one [`lock_rows`] statement names.
pub(crate) const KEYS_PER_STATEMENT: usize = 500;

/// The rows of `n` keys (`$1` to `$n`): key, version, expiry. On Postgres each row is locked
/// until the transaction ends, in the keys' byte order (`COLLATE "C"`, the order the caller
/// sorts them in), so that two writers of the same keys never wait for each other in a circle.
/// SQLite's transaction holds the database's write lock already.
pub(crate) fn lock_rows(flavor: Flavor, n: usize) -> String {
    let list = (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let select = format!(
        "SELECT record_key, version, expires_at FROM stagedoor_records WHERE record_key IN ({list})"
    );
    match flavor {
        Flavor::Postgres => format!("{select} ORDER BY record_key COLLATE \"C\" FOR UPDATE"),
        Flavor::Sqlite => select,
    }
}

/// Creates record `$1` with value `$2`, version 1, running out at `$3` (NULL: never), unless a
/// row of that key is there (then it changes nothing: another writer created it meanwhile).
pub(crate) const INSERT: &str = "INSERT INTO stagedoor_records (record_key, value, version, expires_at) VALUES ($1, $2, 1, $3) ON CONFLICT (record_key) DO NOTHING";

/// Sets record `$1` (a row the transaction holds) to value `$2`, version `$3`, running out at
/// `$4` (NULL: never).
pub(crate) const UPDATE: &str =
    "UPDATE stagedoor_records SET value = $2, version = $3, expires_at = $4 WHERE record_key = $1";

/// Deletes record `$1`.
pub(crate) const DELETE: &str = "DELETE FROM stagedoor_records WHERE record_key = $1";

/// Deletes up to 64 records that ran out at or before `$1`. On Postgres
/// it skips rows another transaction holds (it never waits, so it never joins a circle of
/// waits), and runs on its own, outside any write.
pub(crate) fn drop_expired(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Postgres => {
            "DELETE FROM stagedoor_records WHERE record_key IN (SELECT record_key FROM stagedoor_records WHERE expires_at IS NOT NULL AND expires_at <= $1 LIMIT 64 FOR UPDATE SKIP LOCKED) AND expires_at <= $1"
        }
        Flavor::Sqlite => {
            "DELETE FROM stagedoor_records WHERE record_key IN (SELECT record_key FROM stagedoor_records WHERE expires_at IS NOT NULL AND expires_at <= $1 LIMIT 64)"
        }
    }
}

/// How a write's transaction starts: on Postgres at `READ COMMITTED` whatever the server's
/// default (its row locks, not its snapshots, keep writers apart); on SQLite `IMMEDIATE`, with
/// the database's write lock taken at once (waiting for it under the busy timeout), so that no
/// transaction that has read is refused the lock later.
pub(crate) fn begin(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Postgres => "BEGIN ISOLATION LEVEL READ COMMITTED",
        Flavor::Sqlite => "BEGIN IMMEDIATE",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locking_names_every_key_by_its_own_parameter() {
        assert_eq!(
            lock_rows(Flavor::Sqlite, 3),
            "SELECT record_key, version, expires_at FROM stagedoor_records WHERE record_key IN ($1, $2, $3)"
        );
        assert!(
            lock_rows(Flavor::Postgres, 1)
                .ends_with("ORDER BY record_key COLLATE \"C\" FOR UPDATE")
        );
    }
}
