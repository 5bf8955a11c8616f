//! A job table's layout, read from the database: SQLite's `pragma table_info`, Postgres'
//! `information_schema.columns`. Columns play their roles by their conventional names (those
//! `#[derive(Inbox)]` tables use): `id`, the group `name` or `queue` (or `--group-column`),
//! `attempt`, `retry_after`, `locked_until`, `payload`, and optionally `enqueued_at`,
//! `last_error`, `headers`.

use sqlx::Row as _;
use stagedoor_jobs::inbox::{Column, ColumnType, Table, is_plain_identifier};

use crate::error::Failure;

/// One column as the database describes it.
#[derive(Clone, Debug)]
pub(crate) struct ColumnInfo {
    /// The column's name.
    pub(crate) name: String,
    /// The declared type, lower case (`integer`, `text`, `bytea`, `timestamp with time zone`).
    pub(crate) ty: String,
    /// Whether the database fills it when an insert leaves it out.
    pub(crate) has_default: bool,
}

/// What a column holds, from its declared type; `None` for a type this tool cannot bind.
fn kind_of(c: &ColumnInfo) -> Option<ColumnType> {
    let t = c.ty.as_str();
    if t.contains("int") || t == "serial" || t == "bigserial" || t == "smallserial" {
        Some(ColumnType::Integer)
    } else if t.contains("char") || t.contains("text") || t.contains("clob") {
        Some(ColumnType::Text)
    } else if t.contains("blob") || t == "bytea" || t.is_empty() {
        Some(ColumnType::Bytes)
    } else if t.contains("time") || t.contains("date") {
        Some(ColumnType::Timestamp)
    } else {
        None
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

/// The names a table is given with (`--table`, `--schema`) must be plain identifiers.
pub(crate) fn check_identifier(what: &str, name: &str) -> Result<(), Failure> {
    if is_plain_identifier(name) {
        Ok(())
    } else {
        Err(Failure::usage(format!(
            "{what} `{name}` is not a plain SQL identifier (letters, digits and `_`, not starting with a digit)"
        )))
    }
}

/// The columns of table `name`, looked up by the role each plays.
struct Roles<'a> {
    name: &'a str,
    columns: &'a [ColumnInfo],
}

impl Roles<'_> {
    fn find(&self, n: &str) -> Option<&ColumnInfo> {
        self.columns.iter().find(|c| c.name == n)
    }

    fn not_a_job_table(&self, what: String) -> Failure {
        Failure::connect(format!(
            "table `{}` is not a job table stagedoor-jobs can read: {what} (job tables use the column names id, name or queue, attempt, retry_after, locked_until, payload, and optionally enqueued_at, last_error, headers, priority)",
            self.name
        ))
    }

    fn required(&self, n: &str) -> Result<&ColumnInfo, Failure> {
        self.find(n)
            .ok_or_else(|| self.not_a_job_table(format!("it has no `{n}` column")))
    }

    /// Column `c` in a role that takes the types `want` (a time role reads text as times).
    fn role(
        &self,
        c: &ColumnInfo,
        want: &[ColumnType],
        generated: bool,
    ) -> Result<Column, Failure> {
        match kind_of(c) {
            Some(k) if want.contains(&k) => Ok(Column {
                name: leak(&c.name),
                generated,
                ty: if want.contains(&ColumnType::Timestamp) {
                    ColumnType::Timestamp
                } else {
                    k
                },
            }),
            _ => Err(self.not_a_job_table(format!(
                "its column `{}` has the type `{}`, which this tool cannot read for that role",
                c.name, c.ty
            ))),
        }
    }

    fn optional(&self, n: &str, want: &[ColumnType]) -> Result<Option<Column>, Failure> {
        self.find(n)
            .map(|c| self.role(c, want, c.has_default))
            .transpose()
    }

    /// The `id` column: an integer (generated) or text.
    fn id(&self) -> Result<Column, Failure> {
        let info = self.required("id")?;
        match kind_of(info) {
            Some(ColumnType::Integer) => self.role(info, &[ColumnType::Integer], true),
            Some(ColumnType::Text) => self.role(info, &TEXT, false),
            _ => Err(self.not_a_job_table(format!(
                "its `id` column has the type `{}`: an id is an integer or text",
                info.ty
            ))),
        }
    }

    /// The group column: `given` (`--group-column`), else `name`, else `queue`, else none.
    fn group(&self, given: Option<&str>) -> Result<Option<Column>, Failure> {
        match given {
            Some(g) => {
                let c = self.find(g).ok_or_else(|| {
                    Failure::not_found(format!(
                        "table `{}` has no column `{g}` (given with --group-column)",
                        self.name
                    ))
                })?;
                Some(self.role(c, &TEXT, false)).transpose()
            }
            None => self
                .find("name")
                .or_else(|| self.find("queue"))
                .map(|c| self.role(c, &TEXT, false))
                .transpose(),
        }
    }
}

/// The types a time column may have (text is read as times).
const TIME: [ColumnType; 2] = [ColumnType::Timestamp, ColumnType::Text];
/// A text column's type.
const TEXT: [ColumnType; 1] = [ColumnType::Text];

/// The layout of table `name` from its columns. Errors name the missing column and the fix.
pub(crate) fn layout(
    schema: Option<&str>,
    name: &str,
    columns: &[ColumnInfo],
    group_column: Option<&str>,
) -> Result<Table, Failure> {
    let r = Roles { name, columns };
    let id = r.id()?;
    let group = r.group(group_column)?;
    let attempt = r.optional("attempt", &[ColumnType::Integer])?;
    let retry_after = r.optional("retry_after", &TIME)?;
    let locked_until = Some(r.role(r.required("locked_until")?, &TIME, false)?);
    let payload_info = r.required("payload")?;
    let payload = r.role(payload_info, &[ColumnType::Bytes, ColumnType::Text], false)?;
    let enqueued_at = r.optional("enqueued_at", &TIME)?;
    let last_error = r.optional("last_error", &TEXT)?;
    let headers = r.optional("headers", &TEXT)?;
    let priority = r.optional("priority", &[ColumnType::Integer])?;
    let names: Vec<&'static str> = columns
        .iter()
        .filter(|c| is_plain_identifier(&c.name))
        .map(|c| leak(&c.name))
        .collect();
    Ok(Table {
        schema: schema.map(leak),
        name: leak(name),
        id,
        group,
        fifo: false,
        attempt,
        retry_after,
        locked_until,
        payload,
        enqueued_at,
        last_error,
        headers,
        priority,
        columns: Box::leak(names.into_boxed_slice()),
    })
}

/// The columns of an SQLite table (empty when there is no such table).
pub(crate) async fn sqlite_columns(
    pool: &sqlx::SqlitePool,
    schema: Option<&str>,
    table: &str,
) -> Result<Vec<ColumnInfo>, sqlx::Error> {
    // Both names passed check_identifier: they are plain identifiers, quoted.
    let prefix = schema.map_or(String::new(), |s| format!("\"{s}\"."));
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "PRAGMA {prefix}table_info(\"{table}\")"
    )))
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(ColumnInfo {
                name: r.try_get("name")?,
                ty: r.try_get::<String, _>("type")?.to_ascii_lowercase(),
                has_default: r.try_get::<Option<String>, _>("dflt_value")?.is_some()
                    || r.try_get::<i64, _>("pk")? > 0,
            })
        })
        .collect()
}

/// The tables of an SQLite database (or of one of its schemas).
pub(crate) async fn sqlite_tables(
    pool: &sqlx::SqlitePool,
    schema: Option<&str>,
) -> Result<Vec<String>, sqlx::Error> {
    let master = schema.map_or("sqlite_master".to_owned(), |s| {
        format!("\"{s}\".sqlite_master")
    });
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT name FROM {master} WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
    )))
    .fetch_all(pool)
    .await
}

/// The columns of a Postgres table (empty when there is no such table), in the given schema or
/// the connection's current one.
pub(crate) async fn postgres_columns(
    pool: &sqlx::PgPool,
    schema: Option<&str>,
    table: &str,
) -> Result<Vec<ColumnInfo>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT CAST(column_name AS TEXT) AS name, CAST(data_type AS TEXT) AS ty, \
         (column_default IS NOT NULL OR is_identity = 'YES') AS has_default \
         FROM information_schema.columns \
         WHERE table_name = $1 AND table_schema = COALESCE($2, current_schema()) \
         ORDER BY ordinal_position",
    )
    .bind(table)
    .bind(schema)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(ColumnInfo {
                name: r.try_get("name")?,
                ty: r.try_get::<String, _>("ty")?.to_ascii_lowercase(),
                has_default: r.try_get("has_default")?,
            })
        })
        .collect()
}

/// The tables of a Postgres schema (the connection's current one by default).
pub(crate) async fn postgres_tables(
    pool: &sqlx::PgPool,
    schema: Option<&str>,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT CAST(table_name AS TEXT) FROM information_schema.tables \
         WHERE table_schema = COALESCE($1, current_schema()) ORDER BY table_name",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, ty: &str) -> ColumnInfo {
        ColumnInfo {
            name: name.into(),
            ty: ty.into(),
            has_default: false,
        }
    }

    #[test]
    fn the_mailer_table() {
        let cols = [
            col("id", "integer"),
            col("name", "text"),
            col("attempt", "integer"),
            col("retry_after", "text"),
            col("locked_until", "text"),
            col("payload", "blob"),
        ];
        let t = layout(None, "mail_jobs", &cols, None).expect("a job table");
        assert_eq!(t.id.ty, ColumnType::Integer);
        assert!(t.id.generated);
        assert_eq!(t.group.map(|g| g.name), Some("name"));
        assert_eq!(t.payload.ty, ColumnType::Bytes);
        assert_eq!(t.retry_after.map(|c| c.ty), Some(ColumnType::Timestamp));
        assert!(t.headers.is_none());
        assert_eq!(t.columns.len(), 6);
    }

    #[test]
    fn postgres_types_and_a_group_column() {
        let cols = [
            col("id", "text"),
            col("grp", "character varying"),
            col("queue", "text"),
            col("locked_until", "timestamp with time zone"),
            col("payload", "text"),
            col("headers", "text"),
        ];
        let t = layout(Some("jobs"), "t", &cols, Some("grp")).expect("a job table");
        assert_eq!(t.group.map(|g| g.name), Some("grp"));
        assert!(!t.id.generated);
        assert_eq!(t.payload.ty, ColumnType::Text);
        assert_eq!(t.schema, Some("jobs"));
    }

    #[test]
    fn missing_columns_are_named() {
        let cols = [col("id", "integer"), col("payload", "bytea")];
        let e = layout(None, "t", &cols, None).unwrap_err();
        assert!(
            e.message.contains("no `locked_until` column"),
            "{}",
            e.message
        );
        let e = layout(None, "t", &cols, Some("grp")).unwrap_err();
        assert!(e.message.contains("no column `grp`"), "{}", e.message);
        let cols = [col("id", "uuid"), col("payload", "bytea")];
        let e = layout(None, "t", &cols, None).unwrap_err();
        assert!(e.message.contains("`uuid`"), "{}", e.message);
    }
}
