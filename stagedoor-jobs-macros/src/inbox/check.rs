//! The checks of a derived row. Each problem is recorded in the [`Ctxt`], spanned on the
//! offending tokens, with a message that names the fix; one misuse gives one error.
//!
//! What only the type checker can judge (can this field's type hold its role; is an `id` of a
//! type alias an integer) is left to the expansion, spanned on the field's type.

use syn::{GenericParam, Ident, Type};

use super::attr::TABLE_ATTR_HELP;
use super::model::{Field, Row, Shape};
use super::role::Role;
use crate::ctxt::{Ctxt, display};

/// Whether `name` is a plain SQL identifier: a letter or `_`, then letters, digits or `_`, at
/// most 63 bytes. The same rule as `stagedoor_jobs::inbox::is_plain_identifier`, which the SQL
/// backend relies on: only such names are ever written into SQL.
pub(crate) fn is_plain_identifier(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .enumerate()
            .all(|(i, &c)| c == b'_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()))
}

/// What a plain identifier is, for messages.
const IDENTIFIER_RULE: &str =
    "ASCII letters, digits and `_`, not starting with a digit, at most 63 bytes";

/// Records every problem of `row`.
pub(crate) fn check(cx: &Ctxt, row: &Row<'_>) {
    check_shape(cx, row);
    check_generics(cx, row);
    check_table(cx, row);
    check_fields(cx, row);
    if let Shape::Named(_) = row.shape {
        check_required(cx, row);
    }
}

fn check_shape(cx: &Ctxt, row: &Row<'_>) {
    let ident = &row.input.ident;
    match &row.shape {
        Shape::Named(_) => {}
        Shape::Tuple(fields) => cx.error_spanned_by(
            fields,
            format!(
                "a job table row has named fields, one per column: \
                 write `struct {ident} {{ id: i64, payload: Vec<u8>, .. }}`"
            ),
        ),
        Shape::Unit => cx.error_spanned_by(
            ident,
            format!(
                "`{ident}` has no columns: a job table row is a struct with named fields, one per \
                 column: `struct {ident} {{ id: i64, payload: Vec<u8>, .. }}`"
            ),
        ),
        Shape::Enum(token) => cx.error_spanned_by(
            token,
            "`#[derive(Inbox)]` goes on a struct with named fields, one per column; \
             an enum cannot be a row of a job table",
        ),
        Shape::Union(token) => cx.error_spanned_by(
            token,
            "`#[derive(Inbox)]` goes on a struct with named fields, one per column; \
             a union cannot be a row of a job table",
        ),
    }
}

fn check_generics(cx: &Ctxt, row: &Row<'_>) {
    let generics = &row.input.generics;
    if generics.params.is_empty() {
        if let Some(w) = &generics.where_clause {
            cx.error_spanned_by(
                w,
                "a job table row has no `where` clause: its columns are concrete types; remove it",
            );
        }
        return;
    }
    let only_lifetimes = generics
        .params
        .iter()
        .all(|p| matches!(p, GenericParam::Lifetime(_)));
    let msg = if only_lifetimes {
        format!(
            "a job table row owns its data (an `Inbox` is `'static`): remove `{}` and use owned \
             types (`String`, `Vec<u8>`)",
            display(generics)
        )
    } else {
        format!(
            "a job table row cannot be generic: `#[derive(Inbox)]` describes one table, whose \
             columns have concrete types; remove `{}` and name the types",
            display(generics)
        )
    };
    cx.error_spanned_by(generics, msg);
}

fn check_table(cx: &Ctxt, row: &Row<'_>) {
    let attrs = &row.attrs;
    if !attrs.table_written && !attrs.rejected {
        match &attrs.last_attr {
            Some(attr) => cx.error_spanned_by(attr, TABLE_ATTR_HELP),
            None => cx.error_spanned_by(
                &row.input.ident,
                format!(
                    "`{}` needs its table: add `#[inbox(table = \"mail_jobs\")]` to the struct",
                    row.input.ident
                ),
            ),
        }
    }
    for (what, lit) in [("table", &attrs.table), ("schema", &attrs.schema)] {
        if let Some(lit) = lit
            && !is_plain_identifier(&lit.value())
        {
            cx.error_spanned_by(
                lit,
                format!(
                    "{:?} is not a plain SQL identifier: a {what} name is {IDENTIFIER_RULE}, as in \
                     `{what} = \"{}\"`",
                    lit.value(),
                    if what == "table" { "mail_jobs" } else { "jobs" }
                ),
            );
        }
    }
}

fn check_fields(cx: &Ctxt, row: &Row<'_>) {
    for (i, field) in row.fields().iter().enumerate() {
        if !is_plain_identifier(&field.column) {
            cx.error_spanned_by(
                field.ident,
                format!(
                    "the column `{}` is not a plain SQL identifier: a column is named after its \
                     field, so rename the field with {IDENTIFIER_RULE}",
                    field.column
                ),
            );
        }
        let Some((role, role_ident)) = field.role() else {
            check_qualifiers_without_role(cx, field);
            continue;
        };
        check_one_role(cx, row, i, field, role, role_ident);
        check_qualifiers(cx, field, role);
        if role == Role::Id && !field.generated() && is_integer(field.ty) {
            cx.error_spanned_by(
                role_ident,
                format!(
                    "an integer `id` is filled by the database: write `#[field(id, generated)]` \
                     (an `i32` or `i64`); an `id` the publisher mints is a `String`, as in \
                     `#[field(id)] {}: String`",
                    field.ident
                ),
            );
        }
    }
}

/// A field without a role takes no `generated` and no `fifo`.
fn check_qualifiers_without_role(cx: &Ctxt, field: &Field<'_>) {
    if let Some(g) = &field.attrs.generated {
        cx.error_spanned_by(
            g,
            "`generated` qualifies a role: `#[field(id, generated)]` or \
             `#[field(attempt, generated)]`",
        );
    }
    if let Some(f) = &field.attrs.fifo {
        cx.error_spanned_by(f, "`fifo` qualifies the group: `#[field(group, fifo)]`");
    }
}

/// The `i`-th field plays one role, and no field before it plays that role.
fn check_one_role(
    cx: &Ctxt,
    row: &Row<'_>,
    i: usize,
    field: &Field<'_>,
    role: Role,
    role_ident: &Ident,
) {
    for (extra, extra_ident) in field.attrs.roles.iter().skip(1) {
        cx.error_spanned_by(
            extra_ident,
            format!(
                "a column plays one role: `{}` is the `{}` already; remove `{}` or give it to \
                 another field",
                field.column,
                role.name(),
                extra.name()
            ),
        );
    }
    // The first field to claim a role has it; a later one is the error.
    if let Some(first) = row
        .fields()
        .iter()
        .take(i)
        .find(|f| f.role().is_some_and(|(r, _)| r == role))
    {
        cx.error_spanned_by(
            role_ident,
            format!(
                "the field `{first}` has the role `{r}` already (a table has one `{r}` \
                 column): remove the role from `{this}` or from `{first}`",
                r = role.name(),
                first = first.column,
                this = field.column,
            ),
        );
    }
}

/// `generated` and `fifo` qualify only the roles they fit.
fn check_qualifiers(cx: &Ctxt, field: &Field<'_>, role: Role) {
    if let Some(g) = &field.attrs.generated
        && !role.may_be_generated()
    {
        cx.error_spanned_by(
            g,
            format!(
                "`generated` is for `id` and `attempt`, the columns the database may fill on \
                 insert; stagedoor-jobs writes the `{}`: remove `generated`",
                role.name()
            ),
        );
    }
    if let Some(f) = &field.attrs.fifo
        && role != Role::Group
    {
        cx.error_spanned_by(
            f,
            format!(
                "`fifo` qualifies the group (its rows are worked one at a time, in order), \
                 not the `{}`: write `#[field(group, fifo)]` on the group field",
                role.name()
            ),
        );
    }
}

fn check_required(cx: &Ctxt, row: &Row<'_>) {
    // A rejected argument may have been meant as the missing role (`#[field(paylod)]`): its
    // error is enough.
    if row.fields().iter().any(|f| f.attrs.rejected) {
        return;
    }
    let ident = &row.input.ident;
    let required = [
        (
            Role::Id,
            "",
            "mark the row id `#[field(id, generated)] id: i64` (filled by the database) or \
             `#[field(id)] id: String` (minted by the publisher)",
        ),
        (
            Role::Payload,
            "",
            "mark the job's data `#[field(payload)] payload: Vec<u8>` (or a `String` of JSON)",
        ),
        (
            Role::LockedUntil,
            ", the lease that claims need",
            "add `#[field(locked_until)] locked_until: Option<DateTime<Utc>>`",
        ),
    ];
    for (role, why, fix) in required {
        // A role given as a field's second one has its own error already.
        let given = row
            .fields()
            .iter()
            .any(|f| f.attrs.roles.iter().any(|(r, _)| *r == role));
        if !given {
            cx.error_spanned_by(
                ident,
                format!("`{ident}` has no `{}` column{why}: {fix}", role.name()),
            );
        }
    }
}

/// Whether `ty` is written as a primitive integer (`i64`, `u32`, ..). A type alias of one is
/// caught by the expansion instead.
fn is_integer(ty: &Type) -> bool {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.get_ident().is_some_and(|i| {
            [
                "i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16", "u32", "u64", "u128",
                "usize",
            ]
            .iter()
            .any(|n| i == n)
        }),
        Type::Group(g) => is_integer(&g.elem),
        Type::Paren(p) => is_integer(&p.elem),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
