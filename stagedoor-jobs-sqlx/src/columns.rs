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
//!
//! This file holds the comparison shared by both databases and the roles' checks that do not
//! depend on the database; `columns/postgres.rs` and `columns/sqlite.rs` hold each database's
//! type rules. Each database's catalog is read by its dialect (`dialect/postgres.rs`,
//! `dialect/sqlite.rs`) into a [`Layout`].

use stagedoor_jobs::inbox::Table;

use crate::catalog::Layout;
use crate::dialect::sealed::Sealed;

mod postgres;
mod role;
mod sqlite;

use role::{Role, ident};

/// Every problem of `table`'s column types, each naming the column; none when the table
/// cannot be read (the statements' preparation reports a missing table). A column missing
/// altogether is a problem too (named here, with the others, instead of by the database's
/// first error).
pub(crate) async fn check<DB: Sealed>(pool: &sqlx::Pool<DB>, table: &Table) -> Vec<String> {
    checked::<DB>(pool, table, false).await
}

/// The same for a dead-letter table that takes `table`'s rows by copy (every column, the id
/// and attempt included, so neither needs a default there).
pub(crate) async fn check_dead_table<DB: Sealed>(
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

async fn checked<DB: Sealed>(pool: &sqlx::Pool<DB>, table: &Table, copied: bool) -> Vec<String> {
    match DB::layout(pool, table).await {
        Ok(layout) => compare(DB::FLAVOR, table, &layout, copied),
        Err(e) => {
            tracing::warn!(table = table.name, error = %e, "cannot read the table's columns; checking its statements only");
            Vec::new()
        }
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
    let roles = roles_of(table);
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
    let (mut problems, missing) = role_problems(flavor, table, &t, &roles, layout, &unnamed);
    // A dead-letter table's other columns are its own business (a move that fails there leaves
    // the row where it was, and says why).
    if !copied {
        problems.extend(unfilled(flavor, &t, &roles, layout, &unnamed, missing));
    }
    problems
}

/// The roles the row gives a column.
fn roles_of(table: &Table) -> Vec<Role> {
    [
        ("id", Some(table.id)),
        ("group", table.group),
        ("attempt", table.attempt),
        ("retry_after", table.retry_after),
        ("locked_until", table.locked_until),
        ("payload", Some(table.payload)),
        ("enqueued_at", table.enqueued_at),
        ("last_error", table.last_error),
        ("headers", table.headers),
        ("priority", table.priority),
    ]
    .into_iter()
    .filter_map(|(role, c)| c.map(|column| Role { role, column }))
    .collect()
}

/// Each role's column: missing (`true` in the answer when one is), of a type that cannot hold
/// it, or a lease that cannot be NULL.
fn role_problems(
    flavor: crate::sql::Flavor,
    table: &Table,
    t: &str,
    roles: &[Role],
    layout: &Layout,
    unnamed: &[String],
) -> (Vec<String>, bool) {
    let mut missing = false;
    let mut problems = Vec::new();
    for r in roles {
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
            crate::sql::Flavor::Postgres => postgres::problem(t, r, found),
            crate::sql::Flavor::Sqlite => sqlite::problem(r, found, layout),
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
    (problems, missing)
}

/// The columns a publish leaves out that the database cannot fill (`NOT NULL` without a
/// default); `missing`: a role's column is missing, so the columns no field names
/// (`unnamed`) are left to that problem.
fn unfilled(
    flavor: crate::sql::Flavor,
    t: &str,
    roles: &[Role],
    layout: &Layout,
    unnamed: &[String],
    missing: bool,
) -> Vec<String> {
    let mut problems = Vec::new();
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
    for f in &layout.columns {
        if missing && unnamed.contains(&format!("`{}`", f.name)) {
            continue;
        }
        if written(&f.name) || checked(&f.name) || !f.not_null || f.has_default {
            continue;
        }
        // An SQLite `INTEGER PRIMARY KEY` is the row id, filled on insert.
        if flavor == crate::sql::Flavor::Sqlite && sqlite::is_rowid(f, layout) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Found;
    use crate::sql::Flavor;
    use stagedoor_jobs::inbox::{Column, ColumnType};

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
