//! The checks of a derived row, case by case.

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
fn one_error_per_misuse_of_the_table() {
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
}

#[test]
fn one_error_per_misuse_of_a_field() {
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
}

#[test]
fn one_error_per_misuse_of_the_item() {
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
