//! Parsing of the derive's attributes: `#[inbox(table = "..", schema = "..")]` on the struct
//! and `#[field(role, generated | fifo)]` on its fields. Syntax errors (an unknown key or role,
//! a key given twice, a value that is not a string literal) are recorded here; what the
//! attributes mean together is judged by [`check`](super::check).

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::punctuated::Punctuated;
use syn::{Attribute, Expr, Ident, Lit, LitStr, Meta, Token};

use super::role::Role;
use crate::ctxt::{Ctxt, display};

/// The keys `#[inbox(..)]` accepts, for the messages that reject one.
const TABLE_KEYS_HELP: &str = "`#[inbox(..)]` accepts `table = \"..\"` and `schema = \"..\"`, as in `#[inbox(table = \"mail_jobs\")]`";

/// What `#[inbox]` is for, for the messages that reject it.
pub(crate) const TABLE_ATTR_HELP: &str =
    "`#[inbox(..)]` names the table: `#[inbox(table = \"mail_jobs\")]`";

/// What `#[field(..)]` accepts, for the messages that reject an argument.
pub(crate) fn roles_help() -> String {
    let roles: Vec<String> = Role::ALL
        .iter()
        .map(|r| format!("`{}`", r.name()))
        .collect();
    format!(
        "a field's role is one of {}; a field without `#[field(..)]` is a plain column",
        roles.join(", ")
    )
}

/// What `#[inbox(..)]` says. A value is `None` when it was not given or was rejected (the
/// rejection is in the [`Ctxt`]).
#[derive(Default)]
pub(crate) struct TableAttrs {
    /// `table = ".."`.
    pub(crate) table: Option<LitStr>,
    /// `schema = ".."`.
    pub(crate) schema: Option<LitStr>,
    /// The last `#[inbox(..)]` attribute, if there is one: where to say that the table is
    /// missing from it.
    pub(crate) last_attr: Option<TokenStream>,
    /// Whether a `table = ..` was written, even if its value was rejected.
    pub(crate) table_written: bool,
    /// Whether an attribute or a key was rejected, which may have been meant as the table: a
    /// missing table is then not reported as well.
    pub(crate) rejected: bool,
}

/// What the `#[field(..)]` attributes of one field say.
#[derive(Default)]
pub(crate) struct FieldAttrs {
    /// The roles given, in order, each with the word that named it (more than one is an error
    /// of [`check`](super::check)).
    pub(crate) roles: Vec<(Role, Ident)>,
    /// `generated`, if given.
    pub(crate) generated: Option<Ident>,
    /// `fifo`, if given.
    pub(crate) fifo: Option<Ident>,
    /// Whether an argument was rejected, which may have been meant as a role: a role missing
    /// from the row is then not reported as well.
    pub(crate) rejected: bool,
}

/// Parses the struct's `#[inbox(..)]` attributes (and rejects a `#[field(..)]` there).
pub(crate) fn parse_table(cx: &Ctxt, attrs: &[Attribute]) -> TableAttrs {
    let mut out = TableAttrs::default();
    for attr in attrs {
        if attr.path().is_ident("field") {
            cx.error_spanned_by(
                attr,
                "`#[field(..)]` goes on a field, to give it a role; the struct takes \
                 `#[inbox(table = \"..\")]`",
            );
            continue;
        }
        if !attr.path().is_ident("inbox") {
            continue;
        }
        out.last_attr = Some(attr.to_token_stream());
        let Some(items) = list_items(cx, attr, TABLE_ATTR_HELP) else {
            out.rejected = true;
            continue;
        };
        for meta in items {
            parse_table_item(cx, &meta, &mut out);
        }
    }
    out
}

fn parse_table_item(cx: &Ctxt, meta: &Meta, out: &mut TableAttrs) {
    let key = meta.path().get_ident().map(Ident::to_string);
    let (slot, example) = match key.as_deref() {
        Some("table") => {
            out.table_written = true;
            (&mut out.table, "table = \"mail_jobs\"")
        }
        Some("schema") => (&mut out.schema, "schema = \"jobs\""),
        Some("fifo") => {
            out.rejected = true;
            cx.error_spanned_by(
                meta,
                "`fifo` goes on the group field: `#[field(group, fifo)] name: String`",
            );
            return;
        }
        _ => {
            out.rejected = true;
            let key = display(meta.path());
            let hint = suggest(&key, &["table", "schema"])
                .map(|s| format!(" (did you mean `{s}`?)"))
                .unwrap_or_default();
            cx.error_spanned_by(
                meta.path(),
                format!("unknown key `{key}`{hint}: {TABLE_KEYS_HELP}"),
            );
            return;
        }
    };
    let key = key.expect("a known key is an identifier");
    let value = match meta {
        Meta::NameValue(nv) => string_literal(&nv.value).ok_or_else(|| nv.value.to_token_stream()),
        other => Err(other.to_token_stream()),
    };
    if slot.is_some() {
        cx.error_spanned_by(
            meta.path(),
            format!("`{key}` is given twice: keep one of the two"),
        );
        return;
    }
    match value {
        Ok(lit) => *slot = Some(lit.clone()),
        Err(tokens) => cx.error_spanned_by(
            tokens,
            format!("`{key}` takes a string literal: `{example}`"),
        ),
    }
}

/// Parses the `#[field(..)]` attributes of one field (and rejects an `#[inbox(..)]` there).
pub(crate) fn parse_field(cx: &Ctxt, attrs: &[Attribute]) -> FieldAttrs {
    let mut out = FieldAttrs::default();
    for attr in attrs {
        if attr.path().is_ident("inbox") {
            cx.error_spanned_by(
                attr,
                "`#[inbox(..)]` goes on the struct; a field takes `#[field(..)]` to give it a role",
            );
            continue;
        }
        if !attr.path().is_ident("field") {
            continue;
        }
        let help = format!(
            "`#[field(..)]` names the field's role, as in `#[field(payload)]`: {}",
            roles_help()
        );
        let Some(items) = list_items(cx, attr, &help) else {
            out.rejected = true;
            continue;
        };
        if items.is_empty() {
            out.rejected = true;
            cx.error_spanned_by(attr, help);
        }
        for meta in items {
            parse_field_item(cx, &meta, &mut out);
        }
    }
    out
}

fn parse_field_item(cx: &Ctxt, meta: &Meta, out: &mut FieldAttrs) {
    let Meta::Path(path) = meta else {
        out.rejected = true;
        let key = display(meta.path());
        let msg = if ["rename", "name", "column"].contains(&key.as_str()) {
            format!(
                "`{key}` is not supported: a column is named after its field (write `r#type` for a \
                 column `type`); rename the field"
            )
        } else {
            format!(
                "`#[field(..)]` takes words, not `{key} ..`: a role, then `generated` or `fifo`, \
                 as in `#[field(id, generated)]`"
            )
        };
        cx.error_spanned_by(meta, msg);
        return;
    };
    let Some(ident) = path.get_ident() else {
        out.rejected = true;
        cx.error_spanned_by(
            path,
            format!("unknown role `{}`: {}", display(path), roles_help()),
        );
        return;
    };
    let word = ident.to_string();
    let flag = match word.as_str() {
        "generated" => Some(&mut out.generated),
        "fifo" => Some(&mut out.fifo),
        _ => None,
    };
    if let Some(flag) = flag {
        if flag.is_some() {
            cx.error_spanned_by(ident, format!("`{word}` is given twice: keep one"));
        } else {
            *flag = Some(ident.clone());
        }
        return;
    }
    match Role::from_name(&word) {
        Some(role) if out.roles.iter().any(|(r, _)| *r == role) => {
            cx.error_spanned_by(ident, format!("`{word}` is given twice: keep one"));
        }
        Some(role) => out.roles.push((role, ident.clone())),
        None => {
            out.rejected = true;
            let names: Vec<&str> = Role::ALL.iter().map(|r| r.name()).collect();
            let hint = suggest(&word, &names)
                .map(|s| format!(" (did you mean `{s}`?)"))
                .unwrap_or_default();
            cx.error_spanned_by(
                ident,
                format!("unknown role `{word}`{hint}: {}", roles_help()),
            );
        }
    }
}

/// The comma-separated items of `#[name(..)]`, or `None` (with an error, `help` or syn's
/// followed by `help`) when the attribute is not a list or does not parse.
fn list_items(cx: &Ctxt, attr: &Attribute, help: &str) -> Option<Punctuated<Meta, Token![,]>> {
    match &attr.meta {
        Meta::List(_) => {}
        Meta::Path(_) | Meta::NameValue(_) => {
            cx.error_spanned_by(attr, help);
            return None;
        }
    }
    match attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) {
        Ok(items) => Some(items),
        Err(e) => {
            cx.syn_error(syn::Error::new(e.span(), format!("{e}; {help}")));
            None
        }
    }
}

/// The string literal `expr` is, looking through the invisible groups of `macro_rules!`.
fn string_literal(expr: &Expr) -> Option<&LitStr> {
    match expr {
        Expr::Lit(lit) if lit.attrs.is_empty() => match &lit.lit {
            Lit::Str(s) => Some(s),
            _ => None,
        },
        Expr::Group(g) => string_literal(&g.expr),
        _ => None,
    }
}

/// The candidate closest to `word`, if it is close enough to be a typo of it.
pub(crate) fn suggest<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let word = word.to_ascii_lowercase();
    candidates
        .iter()
        .map(|c| (edit_distance(&word, c), *c))
        .filter(|(d, _)| *d <= word.len() / 3 + 1)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// The Levenshtein distance of two strings, in chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn run<T>(f: impl FnOnce(&Ctxt) -> T) -> (T, Vec<String>) {
        let cx = Ctxt::new();
        let out = f(&cx);
        let msgs = match cx.check() {
            Ok(()) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        };
        (out, msgs)
    }

    fn table(attrs: Vec<Attribute>) -> (TableAttrs, Vec<String>) {
        run(|cx| parse_table(cx, &attrs))
    }

    fn field(attrs: Vec<Attribute>) -> (FieldAttrs, Vec<String>) {
        run(|cx| parse_field(cx, &attrs))
    }

    #[test]
    fn table_and_schema() {
        let (t, errs) = table(vec![
            parse_quote!(#[derive(Debug)]),
            parse_quote!(#[inbox(table = "mail_jobs", schema = "jobs",)]),
        ]);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(t.table.unwrap().value(), "mail_jobs");
        assert_eq!(t.schema.unwrap().value(), "jobs");
        assert!(t.last_attr.is_some() && t.table_written);
    }

    #[test]
    fn table_attributes_are_merged() {
        let (t, errs) = table(vec![
            parse_quote!(#[inbox(schema = "jobs")]),
            parse_quote!(#[inbox(table = "mail_jobs")]),
        ]);
        assert!(errs.is_empty(), "{errs:?}");
        assert!(t.table.is_some() && t.schema.is_some());
    }

    #[test]
    fn no_attribute() {
        let (t, errs) = table(vec![parse_quote!(#[doc = "x"])]);
        assert!(errs.is_empty(), "{errs:?}");
        assert!(t.table.is_none() && t.last_attr.is_none() && !t.table_written);
    }

    #[test]
    fn every_table_problem_is_reported() {
        let (t, errs) = table(vec![
            parse_quote!(#[inbox(table = "a", tabel = "b", table = "c", schema = jobs, fifo)]),
            parse_quote!(#[inbox]),
            parse_quote!(#[field(id)]),
        ]);
        assert_eq!(errs.len(), 6, "{errs:?}");
        assert!(errs[0].contains("unknown key `tabel` (did you mean `table`?)"));
        assert!(errs[1].contains("`table` is given twice"));
        assert!(errs[2].contains("`schema` takes a string literal: `schema = \"jobs\"`"));
        assert!(errs[3].contains("`fifo` goes on the group field"));
        assert!(errs[4].contains("`#[inbox(..)]` names the table"));
        assert!(errs[5].contains("`#[field(..)]` goes on a field"));
        assert_eq!(t.table.unwrap().value(), "a");
        assert!(t.schema.is_none() && t.rejected);
    }

    #[test]
    fn table_syntax_error() {
        let (_, errs) = table(vec![parse_quote!(#[inbox(table = "a" schema = "b")])]);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("expected `,`"), "{errs:?}");
    }

    #[test]
    fn table_not_a_literal() {
        for attr in [
            parse_quote!(#[inbox(table)]),
            parse_quote!(#[inbox(table = 1)]),
            parse_quote!(#[inbox(table("x"))]),
            parse_quote!(#[inbox(table = concat!("a", "b"))]),
        ] {
            let (t, errs) = table(vec![attr]);
            assert_eq!(errs.len(), 1, "{errs:?}");
            assert!(
                errs[0].contains("`table` takes a string literal"),
                "{errs:?}"
            );
            assert!(t.table.is_none() && t.table_written);
        }
    }

    #[test]
    fn roles_and_flags() {
        let (f, errs) = field(vec![
            parse_quote!(#[sqlx(rename = "x")]),
            parse_quote!(#[field(group, fifo)]),
        ]);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(f.roles.len(), 1);
        assert_eq!(f.roles[0].0, Role::Group);
        assert!(f.fifo.is_some() && f.generated.is_none());

        let (f, errs) = field(vec![
            parse_quote!(#[field(id)]),
            parse_quote!(#[field(generated)]),
        ]);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(f.roles[0].0, Role::Id);
        assert!(f.generated.is_some());
    }

    #[test]
    fn two_roles_are_kept_for_the_check() {
        let (f, errs) = field(vec![parse_quote!(#[field(id, payload)])]);
        assert!(errs.is_empty(), "{errs:?}");
        let roles: Vec<Role> = f.roles.iter().map(|(r, _)| *r).collect();
        assert_eq!(roles, [Role::Id, Role::Payload]);
    }

    #[test]
    fn every_field_problem_is_reported() {
        let (f, errs) = field(vec![
            parse_quote!(#[field(retry_at, id, id, generated, generated, x::y, rename = "n", len = 3)]),
            parse_quote!(#[field]),
            parse_quote!(#[field()]),
            parse_quote!(#[inbox(table = "t")]),
        ]);
        assert_eq!(errs.len(), 9, "{errs:?}");
        assert!(errs[0].contains("unknown role `retry_at` (did you mean `retry_after`?)"));
        assert!(errs[0].contains("`id`, `group`, `attempt`, `retry_after`, `locked_until`, `payload`, `enqueued_at`, `last_error`, `headers`, `priority`"));
        assert!(errs[1].contains("`id` is given twice"));
        assert!(errs[2].contains("`generated` is given twice"));
        assert!(errs[3].contains("unknown role `x::y`"));
        assert!(errs[4].contains("a column is named after its field"));
        assert!(errs[5].contains("takes words, not `len ..`"));
        assert!(errs[6].contains("`#[field(..)]` names the field's role"));
        assert!(errs[7].contains("`#[field(..)]` names the field's role"));
        assert!(errs[8].contains("`#[inbox(..)]` goes on the struct"));
        assert_eq!(f.roles.len(), 1);
        assert!(f.rejected);
    }

    #[test]
    fn suggestions() {
        let roles: Vec<&str> = Role::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(suggest("retryAfter", &roles), Some("retry_after"));
        assert_eq!(suggest("ids", &roles), Some("id"));
        assert_eq!(suggest("locked", &roles), None);
        assert_eq!(suggest("lease", &roles), None);
        assert_eq!(suggest("headrs", &roles), Some("headers"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
    }
}
