//! Job tables: the layout `#[derive(Inbox)]` describes, read by SQL backends.
//!
//! The core knows nothing of SQL drivers: a table is names and roles. The SQL backend
//! (`stagedoor-jobs-sqlx`) builds its statements from this description, from validated
//! identifiers only.

/// A row type of a job table, described by `#[derive(Inbox)]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a job table row",
    label = "not an inbox row",
    note = "derive it: `#[derive(Inbox)] #[inbox(table = \"mail_jobs\")] struct {Self} {{ .. }}`"
)]
pub trait Inbox: Send + Sync + 'static {
    /// The table's layout.
    const TABLE: Table;
}

/// The layout of a job table: its name and which column plays which role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Table {
    /// The schema, if given.
    pub schema: Option<&'static str>,
    /// The table's name.
    pub name: &'static str,
    /// The row id.
    pub id: Column,
    /// The group a row waits in (the queue's name), if the table has one.
    pub group: Option<Column>,
    /// Whether rows of one group are worked one at a time, in order.
    pub fifo: bool,
    /// The delivery count: the number of the row's next delivery (1 for a new row).
    pub attempt: Option<Column>,
    /// When the row is due.
    pub retry_after: Option<Column>,
    /// Until when a claim holds the row.
    pub locked_until: Option<Column>,
    /// The job's payload.
    pub payload: Column,
    /// When the row was published.
    pub enqueued_at: Option<Column>,
    /// The last failed attempt's error.
    pub last_error: Option<Column>,
    /// The job's headers as JSON text (kind, job id, request id, trace, origin of a dead letter).
    pub headers: Option<Column>,
    /// The job's priority (`-2..=2`, see [`Priority`](crate::Priority)), which the claim
    /// orders by; without it, the table holds only jobs of normal priority.
    pub priority: Option<Column>,
    /// Every column of the row, roles or not (a dead letter moved to another table keeps all).
    pub columns: &'static [&'static str],
}

/// One column of a job table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    /// The column's name.
    pub name: &'static str,
    /// Whether the database fills it on insert (an auto-increment id, a default attempt).
    pub generated: bool,
    /// What the Rust field holds.
    pub ty: ColumnType,
}

/// What a column holds, as far as the backend must know to bind and read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    /// An integer.
    Integer,
    /// Text.
    Text,
    /// Bytes.
    Bytes,
    /// A UTC timestamp.
    Timestamp,
}

impl Table {
    /// The table's name as written in SQL, schema-qualified if it has one.
    pub fn qualified(&self) -> String {
        match self.schema {
            Some(s) => format!("\"{s}\".\"{}\"", self.name),
            None => format!("\"{}\"", self.name),
        }
    }
}

/// Whether `name` is a plain SQL identifier: a letter or `_`, then letters, digits or `_`, at
/// most 63 bytes. Only such names are ever written into SQL.
pub const fn is_plain_identifier(name: &str) -> bool {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > 63 {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let ok = c == b'_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit());
        if !ok {
            return false;
        }
        i += 1;
    }
    true
}

/// The Rust types each role accepts; the derive checks fields against them.
pub mod roles {
    use super::ColumnType;

    macro_rules! role {
        ($(#[$doc:meta])* $name:ident, $msg:literal, $($ty:ty => $ct:ident),* $(,)?) => {
            $(#[$doc])*
            #[diagnostic::on_unimplemented(message = $msg, label = "this type cannot hold the role")]
            pub trait $name {
                /// What the column holds.
                const TYPE: ColumnType;
            }
            $(impl $name for $ty { const TYPE: ColumnType = ColumnType::$ct; })*
        };
    }

    role!(
        /// Types an `id` column can have.
        IdType,
        "an `id` field is an integer (`i32`, `i64`) or a `String`",
        i32 => Integer, i64 => Integer, String => Text,
    );
    role!(
        /// Types an `attempt` column can have.
        AttemptType,
        "an `attempt` field is an integer (`i16`, `i32`, `i64`)",
        i16 => Integer, i32 => Integer, i64 => Integer,
    );
    role!(
        /// Types a `priority` column can have.
        PriorityType,
        "a `priority` field is an integer (`i16`, `i32`, `i64`)",
        i16 => Integer, i32 => Integer, i64 => Integer,
    );
    role!(
        /// Types a `group` column can have.
        GroupType,
        "a `group` field is a `String`",
        String => Text,
    );
    role!(
        /// Types a `retry_after`, `locked_until` or `enqueued_at` column can have.
        TimeType,
        "a time field is a `chrono::DateTime<chrono::Utc>` (or an `Option` of one)",
        chrono::DateTime<chrono::Utc> => Timestamp, Option<chrono::DateTime<chrono::Utc>> => Timestamp,
    );
    role!(
        /// Types a `payload` column can have.
        PayloadType,
        "a `payload` field is `Vec<u8>` (bytes) or `String` (JSON text)",
        Vec<u8> => Bytes, String => Text,
    );
    role!(
        /// Types a `last_error` or `headers` column can have.
        TextType,
        "a `last_error` or `headers` field is a `String` or an `Option<String>`",
        String => Text, Option<String> => Text,
    );
}

#[cfg(test)]
mod tests {
    use super::is_plain_identifier;

    #[test]
    fn identifiers() {
        for ok in ["mail_jobs", "_x", "T1", "a".repeat(63).as_str()] {
            assert!(is_plain_identifier(ok), "{ok}");
        }
        for bad in [
            "",
            "1x",
            "mail-jobs",
            "a b",
            "x\"; DROP TABLE y; --",
            "é",
            "a".repeat(64).as_str(),
        ] {
            assert!(!is_plain_identifier(bad), "{bad}");
        }
    }
}
