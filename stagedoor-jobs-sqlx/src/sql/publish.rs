//! The statements of a publish: the insert of one row (on Postgres also its `NOTIFY`) and of
//! many rows in one statement.

use stagedoor_jobs::inbox::{Column, Table};

use super::parts::{CHANNEL, Flavor, Names, P, Stmt, q};
use super::statements::Statements;

/// The name the inserts return each stored row's id under (as text).
const INSERTED: &str = "stagedoor_inserted_id";

/// What an insert returns: the id (as text) of each row it stored; a row skipped because its id
/// was taken returns nothing.
fn insert_returning(id: &str) -> String {
    format!(" RETURNING CAST({id} AS TEXT) AS {INSERTED}")
}

fn insert_conflict(table: &Table) -> &'static str {
    if table.id.generated {
        ""
    } else {
        " ON CONFLICT DO NOTHING"
    }
}

/// How an insert writes the value of `p`, bound as `placeholder`: the priority typed as the
/// `BIGINT` the driver sends (a statement prepared without argument types would type it as the
/// column, a `SMALLINT` that the 8-byte value does not fit); the others as they are.
fn value_of(p: P, placeholder: String) -> String {
    match p {
        P::Priority => format!("CAST({placeholder} AS BIGINT)"),
        _ => placeholder,
    }
}

/// The inserts of a table (see the fields of the same names in [`Statements`]).
pub(super) struct Inserts {
    pub(super) insert: Stmt,
    pub(super) insert_notify: Stmt,
    pub(super) insert_cols: String,
    pub(super) insert_row: Vec<Option<P>>,
    pub(super) insert_conflict: &'static str,
}

pub(super) fn build(n: &Names) -> Inserts {
    let (t, id, table) = (&n.t, &n.id, &n.table);
    let mut insert = Stmt::default();
    let mut insert_row = Vec::new();
    let insert_cols;
    {
        let s = &mut insert;
        let mut cols = Vec::new();
        let mut vals = Vec::new();
        let mut put = |c: Option<Column>, p: P, s: &mut Stmt| {
            if let Some(c) = c {
                cols.push(q(c.name));
                vals.push(value_of(p, s.p(p)));
                insert_row.push(Some(p));
            }
        };
        put(table.group, P::Group, s);
        put(Some(table.payload), P::Payload, s);
        put(table.retry_after, P::Due, s);
        put(table.enqueued_at, P::EnqueuedAt, s);
        put(table.headers, P::Headers, s);
        put((!table.id.generated).then_some(table.id), P::JobId, s);
        put(table.priority, P::Priority, s);
        if let Some(a) = table.attempt.filter(|a| !a.generated) {
            cols.push(q(a.name));
            vals.push("1".to_owned());
            insert_row.push(None);
        }
        s.sql = format!(
            "INSERT INTO {t} ({}) VALUES ({}){}{}",
            cols.join(", "),
            vals.join(", "),
            insert_conflict(table),
            insert_returning(id)
        );
        insert_cols = cols.join(", ");
    }

    let insert_notify = match n.flavor {
        Flavor::Sqlite => insert.clone(),
        Flavor::Postgres => {
            let mut s = insert.clone();
            let g = s.p(P::Group);
            s.sql = format!(
                "WITH ins AS ({}) SELECT ins.{INSERTED}, pg_notify('{CHANNEL}', CAST({g} AS TEXT)) FROM ins",
                s.sql
            );
            s
        }
    };

    Inserts {
        insert,
        insert_notify,
        insert_cols,
        insert_row,
        insert_conflict: insert_conflict(table),
    }
}

impl Statements {
    /// An insert of `n` rows (at most [`MAX_ROWS`](super::MAX_ROWS)) in one statement: bind row
    /// 1's values ([`insert_template`](Self::insert_template)), then row 2's, ... Returns the
    /// id (as text) of each row it stored, in no particular order. Built once per `n`:
    /// [`many`](Self::many).
    pub(super) fn insert_many(&self, n: usize) -> String {
        let mut k = 0;
        let tuples: Vec<String> = (0..n)
            .map(|_| {
                let vals: Vec<String> = self
                    .insert_row
                    .iter()
                    .map(|p| match p {
                        Some(p) => {
                            k += 1;
                            value_of(*p, format!("${k}"))
                        }
                        None => "1".to_owned(),
                    })
                    .collect();
                format!("({})", vals.join(", "))
            })
            .collect();
        let sql = format!(
            "INSERT INTO {} ({}) VALUES {}{}{}",
            self.qualified,
            self.insert_cols,
            tuples.join(", "),
            self.insert_conflict,
            insert_returning(&self.id_col)
        );
        sql
    }

    /// The value of each placeholder of one row of [`insert_many`](Self::insert_many), in order.
    pub(crate) fn insert_template(&self) -> &[Option<P>] {
        &self.insert_row
    }
}
