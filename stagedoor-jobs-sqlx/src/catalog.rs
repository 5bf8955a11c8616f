//! A table as the database's catalog describes it: its columns with their declared types,
//! nullability and defaults. Read by each dialect (`Sealed::layout`), compared with the row's
//! fields by `columns`.

/// One column as the database declares it.
#[derive(Clone, Debug)]
#[allow(unreachable_pub)]
pub struct Found {
    /// The column's name.
    pub(crate) name: String,
    /// The type as declared (Postgres: `format_type`; SQLite: the declared text).
    pub(crate) declared: String,
    /// Postgres: the type's name in the catalog (a domain's base type), lower case (`int2`,
    /// `text`, `timestamptz`). SQLite: the declared type, upper case.
    pub(crate) base: String,
    /// `NOT NULL`.
    pub(crate) not_null: bool,
    /// Whether an insert that leaves the column out gets a value: a `DEFAULT`, an identity,
    /// a serial.
    pub(crate) has_default: bool,
    /// SQLite: the column's position in the primary key (0: not in it).
    pub(crate) pk: i64,
}

/// A table as the database describes it.
#[derive(Clone, Debug, Default)]
#[allow(unreachable_pub)]
pub struct Layout {
    /// Its columns, in order; empty when there is no such table.
    pub(crate) columns: Vec<Found>,
    /// SQLite: whether the table has a row id (it is not `WITHOUT ROWID`).
    pub(crate) rowid: bool,
}
