//! A role of the row and its column, and how the messages of the column check name them.

use stagedoor_jobs::inbox::{Column, ColumnType};

/// A role of the row and its column.
pub(super) struct Role {
    /// The role's name, as `#[field(..)]` writes it.
    pub(super) role: &'static str,
    /// The column the row declares for it.
    pub(super) column: Column,
}

/// The name as written in a fix: bare when lower case (the usual), quoted otherwise.
pub(super) fn ident(name: &str) -> String {
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        format!("\"{name}\"")
    } else {
        name.to_owned()
    }
}

/// The field's Rust type, as the message names it.
pub(super) fn rust(role: &Role) -> &'static str {
    match (role.role, role.column.ty) {
        ("id", ColumnType::Integer) => "an integer id the database fills",
        ("id", _) if role.column.generated => "a `String` id the database fills",
        ("id", _) => "a `String` id the publisher mints",
        ("attempt", _) => "an integer",
        (_, ColumnType::Integer) => "an integer",
        (_, ColumnType::Text) => "`String`",
        (_, ColumnType::Bytes) => "`Vec<u8>`",
        (_, ColumnType::Timestamp) => "`DateTime<Utc>`",
    }
}
