//! SQLite's part of the column check: the table's columns read from `table_info` and its
//! `CREATE TABLE` text, and what each role accepts of a column's type affinity (see the
//! [module](super) docs).

use stagedoor_jobs::inbox::ColumnType;

use super::role::{Role, rust};
use crate::catalog::{Found, Layout};

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

/// Whether `f` is SQLite's row id: declared exactly `INTEGER`, the whole primary key, in a
/// table with row ids.
pub(super) fn is_rowid(f: &Found, layout: &Layout) -> bool {
    layout.rowid
        && f.base.trim() == "INTEGER"
        && f.pk == 1
        && layout.columns.iter().filter(|c| c.pk > 0).count() == 1
}

/// The problem of role `r`'s column `f` in `layout`, if any.
pub(super) fn problem(r: &Role, f: &Found, layout: &Layout) -> Option<String> {
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
    let recreate = |decl: &str| recreate(f, decl);
    match r.column.ty {
        ColumnType::Integer if r.role == "id" && r.column.generated => {
            return generated_id(f, layout, &head, affinity);
        }
        ColumnType::Integer => return integer(r, f, &head, affinity),
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

/// The fix of a column whose type SQLite cannot change.
fn recreate(f: &Found, decl: &str) -> String {
    format!(
        "SQLite cannot change a column's type: recreate the table with `{} {decl}`",
        f.name
    )
}

/// A `generated` id: the row id (or a column with a default), read back as an integer.
fn generated_id(f: &Found, layout: &Layout, head: &str, affinity: Affinity) -> Option<String> {
    let recreate = |decl: &str| recreate(f, decl);
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
    None
}

/// Another integer role (`attempt`, `priority`): compared as integers, filled by the
/// database when `generated`.
fn integer(r: &Role, f: &Found, head: &str, affinity: Affinity) -> Option<String> {
    let recreate = |decl: &str| recreate(f, decl);
    if affinity == Affinity::Text {
        let (what, decl) = if r.role == "priority" {
            (
                "the claim would order the levels as text ('-1' > '-2' > '0')",
                "SMALLINT NOT NULL DEFAULT 0",
            )
        } else {
            (
                "the attempt counter would misorder",
                "INTEGER NOT NULL DEFAULT 1",
            )
        };
        return Some(format!(
            "{head}, expected `INTEGER`: SQLite compares the values of a TEXT column as text ('10' < '9'), so {what}; {}",
            recreate(decl)
        ));
    }
    if r.column.generated && !f.has_default {
        return Some(format!(
            "{head} without a default, but the field is `generated`: a publish leaves it out and the database must fill it; {}",
            recreate("INTEGER NOT NULL DEFAULT 1")
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
