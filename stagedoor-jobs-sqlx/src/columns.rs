//! The startup check of a job table's column types: each role's column, as the database
//! declares it, against what the row's field needs (its [`ColumnType`]) and what this backend
//! binds and reads through sqlx.
//!
//! A statement that prepares can still fail on every run: Postgres infers an untyped
//! parameter's type from its column at prepare time, and sqlx binds a typed one later (a
//! `Vec<u8>` payload into a `text` column stores hex text that no claim reads back). So the
//! columns are read from the catalog (`pg_attribute`, SQLite's `table_info`) and compared,
//! and every problem names the column, the type found, the type expected and the fix.
//!
//! - Postgres: integers are `smallint`, `integer` or `bigint` (an attempt may be `numeric`);
//!   text is `text`, `varchar`, `char`, `citext` or `name` (what sqlx decodes a `String` from;
//!   `json`, `jsonb` and `uuid` take no text parameter: every publish would fail); bytes are
//!   `bytea`; timestamps are `timestamptz` only: sqlx decodes a `DateTime<Utc>` from nothing
//!   else, so a `timestamp` (without time zone) column fails every claim with "mismatched
//!   types".
//! - SQLite types by affinity. sqlx decodes by the stored value, so what matters is what the
//!   column's affinity does to the values this backend writes: an integer role refuses TEXT
//!   affinity (SQLite compares its values as text: `'10' < '9'`); a text role refuses the
//!   numeric affinities (text that looks like a number, `"42"`, is stored as a number and no
//!   longer reads as text); bytes need BLOB affinity (`BLOB` or no type); timestamps (written
//!   as RFC 3339 text) refuse INTEGER and REAL affinity, in which SQLite orders every number a
//!   program writes before any text. `DATETIME`, `TIMESTAMP`, `TEXT` hold them.
//! - An id the database fills (`#[field(id, generated)]`) needs a default: an identity, a
//!   serial or a `DEFAULT` on Postgres; on SQLite `INTEGER PRIMARY KEY` (the row id; `INT
//!   PRIMARY KEY` is not one) or a `DEFAULT`. A generated attempt needs a default too; the
//!   lease column must be nullable; any other column a publish leaves out must be nullable or
//!   have a default.

use sqlx::Row as _;
use stagedoor_jobs::inbox::{Column, ColumnType, Table};

/// One column as the database declares it.
#[derive(Clone, Debug)]
pub(crate) struct Found {
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

/// The databases whose tables can be read.
#[allow(unreachable_pub)]
pub trait Introspect: sqlx::Database + crate::dialect::sealed::Sealed {
    /// The layout of `table` (no columns when there is no such table).
    fn layout(
        pool: &sqlx::Pool<Self>,
        table: &Table,
    ) -> impl std::future::Future<Output = Result<Layout, sqlx::Error>> + Send;
}

impl Introspect for sqlx::Postgres {
    async fn layout(pool: &sqlx::PgPool, table: &Table) -> Result<Layout, sqlx::Error> {
        // `to_regclass` resolves the name as the statements do (the search path, or the
        // schema given); NULL, and no rows, when there is no such table.
        let rows = sqlx::query(
            "SELECT CAST(a.attname AS TEXT) AS name, \
                    format_type(a.atttypid, a.atttypmod) AS declared, \
                    CAST(CASE WHEN t.typtype = 'd' THEN b.typname ELSE t.typname END AS TEXT) AS base, \
                    a.attnotnull AS not_null, \
                    (a.atthasdef OR a.attidentity <> '') AS has_default \
             FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
             LEFT JOIN pg_catalog.pg_type b ON b.oid = t.typbasetype \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
        )
        .bind(table.qualified())
        .fetch_all(pool)
        .await?;
        let columns = rows
            .iter()
            .map(|r| {
                Ok(Found {
                    name: r.try_get("name")?,
                    declared: r.try_get("declared")?,
                    base: r
                        .try_get::<Option<String>, _>("base")?
                        .unwrap_or_default()
                        .to_ascii_lowercase(),
                    not_null: r.try_get("not_null")?,
                    has_default: r.try_get("has_default")?,
                    pk: 0,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(Layout {
            columns,
            rowid: false,
        })
    }
}

impl Introspect for sqlx::Sqlite {
    async fn layout(pool: &sqlx::SqlitePool, table: &Table) -> Result<Layout, sqlx::Error> {
        // The names passed `validate`: plain identifiers, quoted.
        let prefix = table.schema.map_or(String::new(), |s| format!("\"{s}\"."));
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "PRAGMA {prefix}table_info(\"{}\")",
            table.name
        )))
        .fetch_all(pool)
        .await?;
        let columns = rows
            .iter()
            .map(|r| {
                let declared: String = r.try_get("type")?;
                Ok(Found {
                    name: r.try_get("name")?,
                    base: declared.to_ascii_uppercase(),
                    declared,
                    not_null: r.try_get::<i64, _>("notnull")? != 0,
                    has_default: r.try_get::<Option<String>, _>("dflt_value")?.is_some(),
                    pk: r.try_get("pk")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        let master = match table.schema {
            Some(s) => format!("\"{s}\".sqlite_master"),
            None => "sqlite_master".to_owned(),
        };
        let ddl: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT sql FROM {master} WHERE type = 'table' AND name = $1"
        )))
        .bind(table.name)
        .fetch_optional(pool)
        .await?
        .flatten();
        let rowid = ddl.is_none_or(|d| {
            let words: Vec<String> = d
                .split(|c: char| c.is_whitespace() || c == ')')
                .filter(|w| !w.is_empty())
                .map(str::to_ascii_uppercase)
                .collect();
            !words
                .windows(2)
                .any(|w| w[0] == "WITHOUT" && w[1] == "ROWID")
        });
        Ok(Layout { columns, rowid })
    }
}

/// Every problem of `table`'s column types, each naming the column; none when the table
/// cannot be read (the statements' preparation reports a missing table). A column missing
/// altogether is a problem too (named here, with the others, instead of by the database's
/// first error).
pub(crate) async fn check<DB: Introspect>(pool: &sqlx::Pool<DB>, table: &Table) -> Vec<String> {
    checked::<DB>(pool, table, false).await
}

/// The same for a dead-letter table that takes `table`'s rows by copy (every column, the id
/// and attempt included, so neither needs a default there).
pub(crate) async fn check_dead_table<DB: Introspect>(
    pool: &sqlx::Pool<DB>,
    table: &Table,
) -> Vec<String> {
    let mut t = *table;
    t.id.generated = false;
    if let Some(a) = t.attempt.as_mut() {
        a.generated = false;
    }
    checked::<DB>(pool, &t, true).await
}

async fn checked<DB: Introspect>(
    pool: &sqlx::Pool<DB>,
    table: &Table,
    copied: bool,
) -> Vec<String> {
    match DB::layout(pool, table).await {
        Ok(layout) => compare(DB::FLAVOR, table, &layout, copied),
        Err(e) => {
            tracing::warn!(table = table.name, error = %e, "cannot read the table's columns; checking its statements only");
            Vec::new()
        }
    }
}

/// SQLite's type affinity of a declared type (the rules of section 3.1 of its datatype page).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Affinity {
    Integer,
    Text,
    Blob,
    Real,
    Numeric,
}

impl Affinity {
    fn of(declared_upper: &str) -> Self {
        let t = declared_upper;
        if t.contains("INT") {
            Affinity::Integer
        } else if t.contains("CHAR") || t.contains("CLOB") || t.contains("TEXT") {
            Affinity::Text
        } else if t.contains("BLOB") || t.trim().is_empty() {
            Affinity::Blob
        } else if t.contains("REAL") || t.contains("FLOA") || t.contains("DOUB") {
            Affinity::Real
        } else {
            Affinity::Numeric
        }
    }

    fn name(self) -> &'static str {
        match self {
            Affinity::Integer => "INTEGER",
            Affinity::Text => "TEXT",
            Affinity::Blob => "BLOB",
            Affinity::Real => "REAL",
            Affinity::Numeric => "NUMERIC",
        }
    }
}

/// A role of the row and its column.
struct Role {
    role: &'static str,
    column: Column,
}

/// The name as written in a fix: bare when lower case (the usual), quoted otherwise.
fn ident(name: &str) -> String {
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        format!("\"{name}\"")
    } else {
        name.to_owned()
    }
}

/// The field's Rust type, as the message names it.
fn rust(role: &Role) -> &'static str {
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

/// Compares the table the database has with the one the row describes; `copied`: rows come
/// in by copy of every column of the row (a dead-letter table), not by publish, so only the
/// roles' types are compared.
pub(crate) fn compare(
    flavor: crate::sql::Flavor,
    table: &Table,
    layout: &Layout,
    copied: bool,
) -> Vec<String> {
    if layout.columns.is_empty() {
        return Vec::new();
    }
    let t = match table.schema {
        Some(s) => format!("{}.{}", ident(s), ident(table.name)),
        None => ident(table.name),
    };
    let roles: Vec<Role> = [
        ("id", Some(table.id)),
        ("group", table.group),
        ("attempt", table.attempt),
        ("retry_after", table.retry_after),
        ("locked_until", table.locked_until),
        ("payload", Some(table.payload)),
        ("enqueued_at", table.enqueued_at),
        ("last_error", table.last_error),
        ("headers", table.headers),
    ]
    .into_iter()
    .filter_map(|(role, c)| c.map(|column| Role { role, column }))
    .collect();

    // Columns of the table that no field names: where a role's column is missing, likely the
    // one meant (a misspelling), named with it rather than as a problem of its own.
    let unnamed: Vec<String> = layout
        .columns
        .iter()
        .filter(|f| {
            !table.columns.contains(&f.name.as_str())
                && !roles.iter().any(|r| r.column.name == f.name)
        })
        .map(|f| format!("`{}`", f.name))
        .collect();
    let mut missing = false;
    let mut problems = Vec::new();
    for r in &roles {
        let Some(found) = layout.columns.iter().find(|f| f.name == r.column.name) else {
            missing = true;
            problems.push(format!(
                "table `{}` has no column `{}` (the `{}` field): add it, or name the field after the column that plays its role{}",
                table.name,
                r.column.name,
                r.role,
                if unnamed.is_empty() {
                    String::new()
                } else {
                    format!(" (columns no field names: {})", unnamed.join(", "))
                }
            ));
            continue;
        };
        let problem = match flavor {
            crate::sql::Flavor::Postgres => postgres(&t, r, found),
            crate::sql::Flavor::Sqlite => sqlite(r, found, layout),
        };
        if let Some(p) = problem {
            problems.push(p);
            continue;
        }
        if r.role == "locked_until" && found.not_null {
            problems.push(format!(
                "column `{}` (the `locked_until` field) is `NOT NULL`, expected nullable: the lease of a row waiting to be claimed is NULL (a publish leaves it out, a retry clears it), so publishes or retries would fail; {}",
                found.name,
                match flavor {
                    crate::sql::Flavor::Postgres =>
                        format!("ALTER TABLE {t} ALTER COLUMN {} DROP NOT NULL", ident(&found.name)),
                    crate::sql::Flavor::Sqlite =>
                        format!("SQLite cannot change a column: recreate the table with `{} TEXT` (nullable)", found.name),
                }
            ));
        }
    }

    // Columns a publish leaves out: the database must fill them.
    let written = |name: &str| {
        roles.iter().any(|r| {
            r.column.name == name
                && match r.role {
                    "id" | "attempt" => !r.column.generated,
                    "locked_until" | "last_error" => false,
                    _ => true,
                }
        })
    };
    let checked = |name: &str| {
        roles
            .iter()
            .any(|r| r.column.name == name && matches!(r.role, "id" | "attempt" | "locked_until"))
    };
    // A dead-letter table's other columns are its own business (a move that fails there leaves
    // the row where it was, and says why).
    for f in layout.columns.iter().filter(|_| !copied) {
        if missing && unnamed.contains(&format!("`{}`", f.name)) {
            continue;
        }
        if written(&f.name) || checked(&f.name) || !f.not_null || f.has_default {
            continue;
        }
        // An SQLite `INTEGER PRIMARY KEY` is the row id, filled on insert.
        if flavor == crate::sql::Flavor::Sqlite && is_rowid(f, layout) {
            continue;
        }
        let why = match roles.iter().find(|r| r.column.name == f.name) {
            Some(r) => format!("the `{}` field, which a publish leaves empty", r.role),
            None => "no field plays a role in it".to_owned(),
        };
        problems.push(format!(
            "column `{}` is `NOT NULL` without a default, and a publish does not write it ({why}): every publish would fail; {}",
            f.name,
            match flavor {
                crate::sql::Flavor::Postgres => format!(
                    "give it a default (ALTER TABLE {t} ALTER COLUMN {c} SET DEFAULT ..) or drop the constraint (ALTER TABLE {t} ALTER COLUMN {c} DROP NOT NULL)",
                    c = ident(&f.name)
                ),
                crate::sql::Flavor::Sqlite =>
                    "recreate the table with a DEFAULT for it, or without NOT NULL".to_owned(),
            }
        ));
    }
    problems
}

/// Whether `f` is SQLite's row id: declared exactly `INTEGER`, the whole primary key, in a
/// table with row ids.
fn is_rowid(f: &Found, layout: &Layout) -> bool {
    layout.rowid
        && f.base.trim() == "INTEGER"
        && f.pk == 1
        && layout.columns.iter().filter(|c| c.pk > 0).count() == 1
}

const PG_INTEGERS: [&str; 3] = ["int2", "int4", "int8"];
const PG_TEXTS: [&str; 5] = ["text", "varchar", "bpchar", "citext", "name"];

fn postgres(t: &str, r: &Role, f: &Found) -> Option<String> {
    let base = f.base.as_str();
    let c = ident(&f.name);
    let head = format!(
        "column `{}` (the `{}` field, {}) is `{}`",
        f.name,
        r.role,
        rust(r),
        f.declared
    );
    let text_like = PG_TEXTS.contains(&base);
    match r.column.ty {
        ColumnType::Integer => {
            // A `numeric` counter works too (it is incremented and read as `bigint`).
            let fits = PG_INTEGERS.contains(&base) || (r.role == "attempt" && base == "numeric");
            if !fits {
                return Some(if r.role == "id" {
                    format!(
                        "{head}, expected an integer column the database fills (`bigint` with a default: `BIGINT GENERATED BY DEFAULT AS IDENTITY` or `BIGSERIAL`): {}",
                        if text_like {
                            format!(
                                "declare the field `#[field(id)] id: String` (an id the publisher mints; keep `generated` only if the column has a default), or recreate the column as `{c} BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY`"
                            )
                        } else {
                            format!(
                                "recreate the column as `{c} BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY`"
                            )
                        }
                    )
                } else {
                    format!(
                        "{head}, expected `smallint`, `integer` or `bigint`: the attempt counter is incremented and compared as an integer; ALTER TABLE {t} ALTER COLUMN {c} TYPE INTEGER USING CAST({c} AS INTEGER)"
                    )
                });
            }
            if r.column.generated && !f.has_default {
                return Some(format!(
                    "{head} without a default, but the field is `generated`: a publish leaves it out and the database must fill it; {}",
                    if r.role == "id" {
                        format!(
                            "ALTER TABLE {t} ALTER COLUMN {c} ADD GENERATED BY DEFAULT AS IDENTITY"
                        )
                    } else {
                        format!("ALTER TABLE {t} ALTER COLUMN {c} SET DEFAULT 1")
                    }
                ));
            }
        }
        ColumnType::Text => {
            if !text_like {
                let reason = match base {
                    "json" | "jsonb" => format!(
                        "the backend binds and reads it as text, and a `{base}` column takes no text parameter"
                    ),
                    "uuid" => "the backend binds the id as text, and a `uuid` column takes no text parameter".to_owned(),
                    _ => "the backend binds and reads it as text".to_owned(),
                };
                let also = if r.role == "payload" && base == "bytea" {
                    ", or declare the field as `Vec<u8>`"
                } else {
                    ""
                };
                return Some(format!(
                    "{head}, expected `text` (or `varchar`): {reason}; ALTER TABLE {t} ALTER COLUMN {c} TYPE TEXT{}{also}",
                    if base == "bytea" {
                        format!(" USING convert_from({c}, 'UTF8')")
                    } else {
                        String::new()
                    }
                ));
            }
            if r.column.generated && !f.has_default {
                return Some(format!(
                    "{head} without a default, but the field is `generated`: a publish leaves it out and the database must fill it; ALTER TABLE {t} ALTER COLUMN {c} SET DEFAULT CAST(gen_random_uuid() AS TEXT), or drop `generated` (the publisher mints the id)"
                ));
            }
        }
        ColumnType::Bytes => {
            if base != "bytea" {
                let using = if text_like {
                    format!(" USING convert_to({c}, 'UTF8')")
                } else {
                    String::new()
                };
                let also = if text_like {
                    ", or declare the field as `String` (JSON text)"
                } else {
                    ""
                };
                let stored = if text_like {
                    "as hex text (`\\x7b22..`), which no claim reads back as the payload"
                } else {
                    "as something no claim reads back"
                };
                return Some(format!(
                    "{head}, expected `bytea`: the backend binds the payload as bytes, which a `{}` column stores {stored}; ALTER TABLE {t} ALTER COLUMN {c} TYPE BYTEA{using}{also}",
                    f.declared
                ));
            }
        }
        ColumnType::Timestamp => {
            if base != "timestamptz" {
                let (reason, using) = match base {
                    "timestamp" => (
                        "sqlx reads a `DateTime<Utc>` only from `timestamptz`, so every claim would fail with \"mismatched types\"",
                        format!(" USING {c} AT TIME ZONE 'UTC'"),
                    ),
                    "int2" | "int4" | "int8" | "numeric" | "float4" | "float8" => (
                        "the backend compares it with and writes `timestamptz` values",
                        format!(" USING to_timestamp({c})"),
                    ),
                    _ => (
                        "the backend compares it with and writes `timestamptz` values",
                        format!(" USING CAST({c} AS TIMESTAMPTZ)"),
                    ),
                };
                return Some(format!(
                    "{head}, expected `timestamptz` (`timestamp with time zone`): {reason}; ALTER TABLE {t} ALTER COLUMN {c} TYPE TIMESTAMPTZ{using}"
                ));
            }
        }
    }
    None
}

fn sqlite(r: &Role, f: &Found, layout: &Layout) -> Option<String> {
    let affinity = Affinity::of(&f.base);
    let declared = if f.declared.trim().is_empty() {
        "(no type)".to_owned()
    } else {
        f.declared.clone()
    };
    let head = format!(
        "column `{}` (the `{}` field, {}) is `{declared}` ({} affinity)",
        f.name,
        r.role,
        rust(r),
        affinity.name()
    );
    let recreate = |decl: &str| {
        format!(
            "SQLite cannot change a column's type: recreate the table with `{} {decl}`",
            f.name
        )
    };
    match r.column.ty {
        ColumnType::Integer if r.role == "id" && r.column.generated => {
            if affinity == Affinity::Text || affinity == Affinity::Real {
                return Some(format!(
                    "{head}, expected `INTEGER PRIMARY KEY` (the row id, filled on insert): the id is read back as an integer; {}, or declare the field `#[field(id)] id: String` (an id the publisher mints)",
                    recreate("INTEGER PRIMARY KEY")
                ));
            }
            if !is_rowid(f, layout) && !f.has_default {
                return Some(format!(
                    "{head}, expected `INTEGER PRIMARY KEY`: the field is `generated`, but SQLite fills only a column declared exactly `INTEGER PRIMARY KEY` (the row id; `INT` or `BIGINT PRIMARY KEY` is not one), and this one has no default, so every published row would get no id; {}",
                    recreate("INTEGER PRIMARY KEY")
                ));
            }
        }
        ColumnType::Integer => {
            if affinity == Affinity::Text {
                return Some(format!(
                    "{head}, expected `INTEGER`: SQLite compares the values of a TEXT column as text ('10' < '9'), so the attempt counter would misorder; {}",
                    recreate("INTEGER NOT NULL DEFAULT 1")
                ));
            }
            if r.column.generated && !f.has_default {
                return Some(format!(
                    "{head} without a default, but the field is `generated`: a publish leaves it out and the database must fill it; {}",
                    recreate("INTEGER NOT NULL DEFAULT 1")
                ));
            }
        }
        ColumnType::Text => {
            if !matches!(affinity, Affinity::Text | Affinity::Blob) {
                return Some(format!(
                    "{head}, expected `TEXT`: SQLite stores text that looks like a number (\"42\") as a number in a column of {} affinity, and it no longer reads back as text; {}",
                    affinity.name(),
                    recreate("TEXT")
                ));
            }
            if r.column.generated && !f.has_default {
                return Some(format!(
                    "{head} without a default, but the field is `generated`: a publish leaves it out and the database must fill it; recreate the table with a DEFAULT for `{}`, or drop `generated` (the publisher mints the id)",
                    f.name
                ));
            }
        }
        ColumnType::Bytes => {
            if affinity != Affinity::Blob {
                return Some(format!(
                    "{head}, expected `BLOB`: the payload is bytes, kept as BLOB values in a column declared `{declared}`, which readers going by the declared type (the stagedoor-jobs CLI among them) take for {}; {}, or declare the field as `String` (JSON text)",
                    if affinity == Affinity::Text {
                        "text"
                    } else {
                        "numbers"
                    },
                    recreate("BLOB")
                ));
            }
        }
        ColumnType::Timestamp => {
            if matches!(affinity, Affinity::Integer | Affinity::Real) {
                return Some(format!(
                    "{head}, expected `TEXT` (or `DATETIME`): the backend writes timestamps as RFC 3339 text, which a column of {} affinity keeps beside the numbers other programs write, and SQLite orders every number before any text, so due times would misorder; {}",
                    affinity.name(),
                    recreate("TEXT")
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::Flavor;

    fn found(name: &str, declared: &str, base: &str, not_null: bool, has_default: bool) -> Found {
        Found {
            name: name.into(),
            declared: declared.into(),
            base: base.into(),
            not_null,
            has_default,
            pk: 0,
        }
    }

    #[test]
    fn sqlite_affinity() {
        for (t, a) in [
            ("INTEGER", Affinity::Integer),
            ("BIGINT", Affinity::Integer),
            ("TEXT", Affinity::Text),
            ("VARCHAR(20)", Affinity::Text),
            ("BLOB", Affinity::Blob),
            ("", Affinity::Blob),
            ("DOUBLE PRECISION", Affinity::Real),
            ("DATETIME", Affinity::Numeric),
            ("TIMESTAMP", Affinity::Numeric),
        ] {
            assert_eq!(Affinity::of(t), a, "{t}");
        }
    }

    #[test]
    fn postgres_json_and_uuid_take_no_text_a_numeric_attempt_counts() {
        let text = |name| {
            Some(Column {
                name,
                generated: false,
                ty: ColumnType::Text,
            })
        };
        let table = stagedoor_jobs::inbox::Table {
            id: Column {
                name: "id",
                generated: false,
                ty: ColumnType::Text,
            },
            attempt: Some(Column {
                name: "attempt",
                generated: true,
                ty: ColumnType::Integer,
            }),
            headers: text("headers"),
            last_error: text("last_error"),
            ..<crate::AnyTable as stagedoor_jobs::Inbox>::TABLE
        };
        let layout = Layout {
            columns: vec![
                found("id", "uuid", "uuid", true, false),
                found("attempt", "numeric", "numeric", true, true),
                found("payload", "bytea", "bytea", true, false),
                found("headers", "jsonb", "jsonb", false, false),
                found(
                    "last_error",
                    "character varying(200)",
                    "varchar",
                    false,
                    false,
                ),
            ],
            rowid: false,
        };
        let p = compare(Flavor::Postgres, &table, &layout, false);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].starts_with("column `id`") && p[0].contains("is `uuid`"),
            "{p:?}"
        );
        assert!(p[1].starts_with("column `headers`"), "{p:?}");
        assert!(p[1].contains("is `jsonb`, expected `text`"), "{p:?}");
        assert!(
            p[1].contains("ALTER TABLE any_table ALTER COLUMN headers TYPE TEXT"),
            "{p:?}"
        );
    }

    #[test]
    fn a_postgres_timestamp_without_time_zone_is_refused() {
        let table = stagedoor_jobs::inbox::Table {
            retry_after: Some(Column {
                name: "retry_after",
                generated: false,
                ty: ColumnType::Timestamp,
            }),
            ..<crate::AnyTable as stagedoor_jobs::Inbox>::TABLE
        };
        let layout = Layout {
            columns: vec![
                found("id", "bigint", "int8", true, true),
                found("payload", "bytea", "bytea", true, false),
                found(
                    "retry_after",
                    "timestamp without time zone",
                    "timestamp",
                    true,
                    false,
                ),
            ],
            rowid: false,
        };
        let p = compare(Flavor::Postgres, &table, &layout, false);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("`retry_after`"), "{p:?}");
        assert!(p[0].contains("timestamp without time zone"), "{p:?}");
        assert!(p[0].contains("AT TIME ZONE 'UTC'"), "{p:?}");
    }
}
