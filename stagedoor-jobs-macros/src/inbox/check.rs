//! The checks of a derived row. Each problem is recorded in the [`Ctxt`], spanned on the
//! offending tokens, with a message that names the fix; one misuse gives one error.
//!
//! What only the type checker can judge (can this field's type hold its role; is an `id` of a
//! type alias an integer) is left to the expansion, spanned on the field's type.

use syn::{GenericParam, Type};

use super::attr::TABLE_ATTR_HELP;
use super::model::{Row, Shape};
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
            continue;
        };
        for (extra, extra_ident) in &field.attrs.roles[1..] {
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
        if let Some(first) = row.fields()[..i]
            .iter()
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
mod tests {
    use super::*;
    use syn::{DeriveInput, parse_quote};

    fn errors(input: DeriveInput) -> Vec<String> {
        let cx = Ctxt::new();
        let row = Row::from_ast(&cx, &input);
        check(&cx, &row);
        match cx.check() {
            Ok(()) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    fn one_error(input: DeriveInput, needle: &str) {
        let errs = errors(input);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].contains(needle),
            "{:?} does not contain {needle:?}",
            errs[0]
        );
    }

    #[test]
    fn identifiers_as_the_core_judges_them() {
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

    #[test]
    fn the_seed_row_passes() {
        let errs = errors(parse_quote! {
            #[derive(Debug)]
            #[inbox(table = "mail_jobs")]
            pub struct SendMail {
                #[field(id, generated)] id: i64,
                #[field(group, fifo)] name: String,
                #[field(attempt, generated)] attempt: i16,
                #[field(retry_after)] retry_after: DateTime<Utc>,
                #[field(locked_until)] locked_until: Option<DateTime<Utc>>,
                #[field(payload)] payload: Vec<u8>,
                #[field(enqueued_at)] enqueued_at: DateTime<Utc>,
                #[field(last_error)] last_error: Option<String>,
                #[field(headers)] headers: String,
                r#type: String,
            }
        });
        assert!(errs.is_empty(), "{errs:?}");
    }

    #[test]
    fn the_minimum_passes() {
        let errs = errors(parse_quote! {
            #[inbox(table = "t", schema = "s")]
            struct Row {
                #[field(id)] id: String,
                #[field(locked_until)] l: Option<DateTime<Utc>>,
                #[field(payload)] p: String,
            }
        });
        assert!(errs.is_empty(), "{errs:?}");
    }

    #[test]
    fn one_error_per_misuse() {
        one_error(
            parse_quote! {
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P }
            },
            "`R` needs its table: add `#[inbox(table = \"mail_jobs\")]`",
        );
        one_error(
            parse_quote! {
                #[inbox(schema = "s")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P }
            },
            "`#[inbox(..)]` names the table",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(locked_until)] l: L, #[field(payload)] p: P }
            },
            "`R` has no `id` column",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L }
            },
            "`R` has no `payload` column",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id, generated)] id: i64, #[field(payload)] p: P }
            },
            "`R` has no `locked_until` column, the lease that claims need: add",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "mail jobs")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P }
            },
            "\"mail jobs\" is not a plain SQL identifier: a table name is",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t", schema = "x; DROP TABLE y")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P }
            },
            "a schema name is",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P, café: String }
            },
            "the column `café` is not a plain SQL identifier",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P, #[field(payload)] q: P }
            },
            "the field `p` has the role `payload` already",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id, generated, payload)] id: i64, #[field(locked_until)] l: L }
            },
            "a column plays one role: `id` is the `id` already; remove `payload`",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload, generated)] p: P }
            },
            "stagedoor-jobs writes the `payload`: remove `generated`",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P, #[field(generated)] x: i32 }
            },
            "`generated` qualifies a role",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until, fifo)] l: L, #[field(payload)] p: P }
            },
            "not the `locked_until`: write `#[field(group, fifo)]`",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P, #[field(fifo)] g: String }
            },
            "`fifo` qualifies the group",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P }
            },
            "an integer `id` is filled by the database: write `#[field(id, generated)]`",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R<T> { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: T }
            },
            "cannot be generic",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R<'a> { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: &'a str }
            },
            "owns its data",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R where i64: Copy { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P }
            },
            "no `where` clause",
        );
    }

    #[test]
    fn shapes() {
        one_error(
            parse_quote! { #[inbox(table = "t")] struct R(i64, Vec<u8>); },
            "has named fields",
        );
        one_error(
            parse_quote! { #[inbox(table = "t")] struct R; },
            "`R` has no columns",
        );
        one_error(
            parse_quote! { #[inbox(table = "t")] enum R { A { id: i64 } } },
            "an enum cannot be",
        );
        one_error(
            parse_quote! { #[inbox(table = "t")] union R { a: i64 } },
            "a union cannot be",
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let errs = errors(parse_quote! {
            #[inbox(table = "1t", colour = "red")]
            struct R {
                #[field(attempt, generated)] a: i16,
                #[field(attempt)] b: i16,
                #[field(payload, fifo)] p: Vec<u8>,
                #[field(id)] id: u64,
            }
        });
        assert_eq!(errs.len(), 6, "{errs:?}");
        assert!(errs[0].contains("unknown key `colour`"));
        assert!(errs[1].contains("\"1t\" is not a plain SQL identifier"));
        assert!(errs[2].contains("the field `a` has the role `attempt` already"));
        assert!(errs[3].contains("`fifo` qualifies the group"));
        assert!(errs[4].contains("an integer `id` is filled by the database"));
        assert!(errs[5].contains("`R` has no `locked_until` column"));
    }

    #[test]
    fn a_rejected_argument_may_be_the_missing_role() {
        // `paylod` was meant as `payload`: no "no `payload` column" on top of it.
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(paylod)] p: P }
            },
            "unknown role `paylod` (did you mean `payload`?)",
        );
        one_error(
            parse_quote! {
                #[inbox(table = "t")]
                struct R { #[field(id generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P }
            },
            "expected `,`; `#[field(..)]` names the field's role",
        );
        // And a rejected key may be the missing table.
        one_error(
            parse_quote! {
                #[inbox(tabel = "t")]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P }
            },
            "unknown key `tabel` (did you mean `table`?)",
        );
        one_error(
            parse_quote! {
                #[inbox]
                struct R { #[field(id, generated)] id: i64, #[field(locked_until)] l: L, #[field(payload)] p: P }
            },
            "`#[inbox(..)]` names the table",
        );
    }

    #[test]
    fn integers_as_written() {
        for ty in [parse_quote!(i64), parse_quote!(u8), parse_quote!((i32))] {
            assert!(is_integer(&ty));
        }
        for ty in [
            parse_quote!(String),
            parse_quote!(Id),
            parse_quote!(std::primitive::i64),
            parse_quote!(Option<i64>),
        ] {
            assert!(!is_integer(&ty));
        }
    }
}
