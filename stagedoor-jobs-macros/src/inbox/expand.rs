//! The expansion of a checked row, and the stub impl emitted next to errors.
//!
//! ```text
//! const _: () = {
//!     // Only for an `id` that is not `generated`: an integer one (through a type alias, which
//!     // the checks cannot see) fails here, when the crate compiles.
//!     const _: () = match <Id as roles::IdType>::TYPE {
//!         ColumnType::Integer => panic!("an integer `id` is filled by the database: .."),
//!         _ => {}
//!     };
//!
//!     #[automatically_derived]
//!     impl Inbox for SendMail {
//!         const TABLE: Table = Table {
//!             schema: None,
//!             name: "mail_jobs",
//!             id: Column { name: "id", generated: true, ty: <i64 as roles::IdType>::TYPE },
//!             group: Some(Column { name: "name", generated: false, ty: <String as roles::GroupType>::TYPE }),
//!             fifo: false,
//!             attempt: Some(Column { name: "attempt", generated: true, ty: <i16 as roles::AttemptType>::TYPE }),
//!             retry_after: Some(Column { .. <DateTime<Utc> as roles::TimeType>::TYPE }),
//!             locked_until: Some(Column { .. <Option<DateTime<Utc>> as roles::TimeType>::TYPE }),
//!             payload: Column { name: "payload", generated: false, ty: <Vec<u8> as roles::PayloadType>::TYPE },
//!             enqueued_at: None,
//!             last_error: None,
//!             headers: None,
//!             columns: &["id", "name", "attempt", "retry_after", "locked_until", "payload"],
//!         };
//!     }
//! };
//! ```
//!
//! (`Inbox`, `Table`, `Column`, `ColumnType` and `roles` stand for their paths under
//! `::stagedoor_jobs::__private`.)
//!
//! Each `<T as roles::..>::TYPE` is spanned on the field's type: a type that cannot hold its
//! role fails there, with the role trait's message, once.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{DeriveInput, Ident, LitStr};

use super::model::Row;
use super::role::Role;

/// The path every name of the expansion goes through.
fn private() -> TokenStream {
    quote!(::stagedoor_jobs::__private)
}

/// Expands a row that passed the checks.
pub(crate) fn expand(row: &Row<'_>) -> TokenStream {
    let private = private();
    let ident = &row.input.ident;
    let name = row
        .attrs
        .table
        .as_ref()
        .expect("checked: the table is named");
    let schema = match &row.attrs.schema {
        Some(s) => quote!(::core::option::Option::Some(#s)),
        None => quote!(::core::option::Option::None),
    };

    let mut items = Vec::new();
    let mut roles = Vec::new();
    for role in Role::ALL {
        let slot = format_ident!("{}", role.name());
        let value = role_value(&private, row, role, &mut items);
        roles.push(quote!(#slot: #value,));
    }
    let fifo = row
        .field_of(Role::Group)
        .is_some_and(|f| f.attrs.fifo.is_some());
    let columns = row
        .fields()
        .iter()
        .map(|f| LitStr::new(&f.column, f.ident.span()));

    quote! {
        const _: () = {
            #(#items)*

            #[automatically_derived]
            impl #private::Inbox for #ident {
                const TABLE: #private::Table = #private::Table {
                    schema: #schema,
                    name: #name,
                    fifo: #fifo,
                    #(#roles)*
                    columns: &[#(#columns),*],
                };
            }
        };
    }
}

/// The value of `role`'s slot in the table: its column, or `None` for an optional role no
/// field plays. An `id` that is not `generated` also pushes its type's check to `items`.
fn role_value(
    private: &TokenStream,
    row: &Row<'_>,
    role: Role,
    items: &mut Vec<TokenStream>,
) -> TokenStream {
    let Some(field) = row.field_of(role) else {
        assert!(role.optional(), "checked: the `{}` is given", role.name());
        return quote!(::core::option::Option::None);
    };
    let ty = field.ty;
    let column = LitStr::new(&field.column, field.ident.span());
    let generated = field.generated();
    let type_trait = Ident::new(role.type_trait(), Span::call_site());
    let column_type = quote_spanned!(ty.span()=> <#ty as #private::roles::#type_trait>::TYPE);
    if role == Role::Id && !generated {
        items.push(id_not_integer(private, ty, &column_type));
    }
    let column = quote! {
        #private::Column {
            name: #column,
            generated: #generated,
            ty: #column_type,
        }
    };
    if role.optional() {
        quote!(::core::option::Option::Some(#column))
    } else {
        column
    }
}

/// The check that an `id` the publisher mints is not an integer (through a type alias, which
/// the checks cannot see).
fn id_not_integer(private: &TokenStream, ty: &syn::Type, column_type: &TokenStream) -> TokenStream {
    // A free constant is evaluated when the crate compiles, read or not; this one is read by
    // nobody, so that its failure is the only error.
    quote_spanned! {ty.span()=>
        const _: () = match #column_type {
            #private::ColumnType::Integer => ::core::panic!(
                "an integer `id` is filled by the database: write \
                 `#[field(id, generated)]`; an `id` the publisher mints is a `String`"
            ),
            _ => {}
        };
    }
}

/// An impl of `Inbox` for an item with errors, so that its uses add no error of their own
/// ("`SendMail` is not a job table row"). Such a program does not compile: the stub's table is
/// never read.
pub(crate) fn stub(input: &DeriveInput) -> TokenStream {
    let private = private();
    let ident = &input.ident;
    let generics = &input.generics;
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let mut predicates: Vec<TokenStream> = where_clause
        .map(|w| w.predicates.iter().map(|p| quote!(#p)).collect())
        .unwrap_or_default();
    // With parameters, `Inbox`'s supertraits are assumed, not proven (they may not hold, which
    // is no error of this derive). Without, a bound that does not hold would be an error.
    if !generics.params.is_empty() {
        predicates.push(quote!(#ident #ty_generics: ::core::marker::Send
            + ::core::marker::Sync + 'static));
    }
    let where_clause = (!predicates.is_empty()).then(|| quote!(where #(#predicates),*));
    let column = quote! {
        #private::Column {
            name: "",
            generated: false,
            ty: #private::ColumnType::Text,
        }
    };
    let none = quote!(::core::option::Option::None);
    quote! {
        const _: () = {
            #[automatically_derived]
            impl #impl_generics #private::Inbox for #ident #ty_generics #where_clause {
                const TABLE: #private::Table = #private::Table {
                    schema: #none,
                    name: "",
                    id: #column,
                    group: #none,
                    fifo: false,
                    attempt: #none,
                    retry_after: #none,
                    locked_until: #none,
                    payload: #column,
                    enqueued_at: #none,
                    last_error: #none,
                    headers: #none,
                    priority: #none,
                    columns: &[],
                };
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctxt::Ctxt;
    use quote::ToTokens;
    use syn::{File, Item, parse_quote};

    /// The tokens without any whitespace, to look for needles written without any.
    fn compact<T: ToTokens>(tokens: T) -> String {
        tokens
            .to_token_stream()
            .to_string()
            .split_whitespace()
            .collect()
    }

    fn expanded(input: DeriveInput) -> File {
        let cx = Ctxt::new();
        let row = Row::from_ast(&cx, &input);
        super::super::check::check(&cx, &row);
        cx.check().expect("no error");
        syn::parse2(expand(&row)).expect("the expansion parses as items")
    }

    #[test]
    fn the_seed_row() {
        let file = expanded(parse_quote! {
            #[inbox(table = "mail_jobs")]
            struct SendMail {
                #[field(id, generated)] id: i64,
                #[field(group)] name: String,
                #[field(attempt, generated)] attempt: i16,
                #[field(retry_after)] retry_after: DateTime<Utc>,
                #[field(locked_until)] locked_until: Option<DateTime<Utc>>,
                #[field(payload)] payload: Vec<u8>,
            }
        });
        let [Item::Const(c)] = &file.items[..] else {
            panic!("one const expected: {}", quote!(#file));
        };
        let body = compact(&c.expr);
        let p = "::stagedoor_jobs::__private::";
        for needle in [
            format!("#[automatically_derived]impl{p}InboxforSendMail"),
            format!("constTABLE:{p}Table={p}Table{{schema:::core::option::Option::None,name:\"mail_jobs\",fifo:false,"),
            format!("id:{p}Column{{name:\"id\",generated:true,ty:<i64as{p}roles::IdType>::TYPE,}},"),
            format!("group:::core::option::Option::Some({p}Column{{name:\"name\",generated:false,ty:<Stringas{p}roles::GroupType>::TYPE,}}),"),
            format!("attempt:::core::option::Option::Some({p}Column{{name:\"attempt\",generated:true,ty:<i16as{p}roles::AttemptType>::TYPE,}}),"),
            format!("ty:<DateTime<Utc>as{p}roles::TimeType>::TYPE"),
            format!("ty:<Option<DateTime<Utc>>as{p}roles::TimeType>::TYPE"),
            format!("payload:{p}Column{{name:\"payload\",generated:false,ty:<Vec<u8>as{p}roles::PayloadType>::TYPE,}},"),
            "enqueued_at:::core::option::Option::None,last_error:::core::option::Option::None,headers:::core::option::Option::None,".into(),
            "columns:&[\"id\",\"name\",\"attempt\",\"retry_after\",\"locked_until\",\"payload\"]".into(),
        ] {
            assert!(body.contains(&needle), "{needle}\nnot in\n{body}");
        }
        assert!(!body.contains("panic!"), "{body}");
    }

    #[test]
    fn schema_fifo_optional_roles_and_a_minted_id() {
        let file = expanded(parse_quote! {
            #[inbox(schema = "jobs", table = "t")]
            struct R {
                #[field(id)] r#id: JobId,
                #[field(group, fifo)] queue: String,
                #[field(locked_until)] l: L,
                r#type: String,
                #[field(payload)] p: String,
                #[field(enqueued_at)] e: E,
                #[field(last_error)] err: Option<String>,
                #[field(headers)] h: String,
            }
        });
        let body = compact(&file.items[0]);
        let p = "::stagedoor_jobs::__private::";
        for needle in [
            "schema:::core::option::Option::Some(\"jobs\"),name:\"t\",fifo:true,".to_string(),
            format!(
                "const_:()=match<JobIdas{p}roles::IdType>::TYPE{{{p}ColumnType::Integer=>::core::panic!("
            ),
            format!(
                "id:{p}Column{{name:\"id\",generated:false,ty:<JobIdas{p}roles::IdType>::TYPE,}}"
            ),
            format!(
                "enqueued_at:::core::option::Option::Some({p}Column{{name:\"e\",generated:false,ty:<Eas{p}roles::TimeType>::TYPE,}})"
            ),
            format!("ty:<Option<String>as{p}roles::TextType>::TYPE"),
            format!(
                "headers:::core::option::Option::Some({p}Column{{name:\"h\",generated:false,ty:<Stringas{p}roles::TextType>::TYPE,}})"
            ),
            "attempt:::core::option::Option::None,retry_after:::core::option::Option::None,".into(),
            "columns:&[\"id\",\"queue\",\"l\",\"type\",\"p\",\"e\",\"err\",\"h\"]".into(),
        ] {
            assert!(body.contains(&needle), "{needle}\nnot in\n{body}");
        }
    }

    #[test]
    fn stub_of_a_generic_item() {
        let input: DeriveInput = parse_quote!(
            struct R<'a, T: Clone>
            where
                T: Copy,
            {
                x: &'a T,
            }
        );
        let out = compact(stub(&input));
        assert!(
            out.contains(
                "impl<'a,T:Clone>::stagedoor_jobs::__private::InboxforR<'a,T>whereT:Copy,R<'a,T>:::core::marker::Send+::core::marker::Sync+'static{"
            ),
            "{out}"
        );
        let _: File = syn::parse2(stub(&input)).expect("the stub parses");
    }

    #[test]
    fn stub_of_a_plain_item() {
        let input: DeriveInput = parse_quote!(
            enum E {
                A,
            }
        );
        let out = compact(stub(&input));
        assert!(
            out.contains("impl::stagedoor_jobs::__private::InboxforE{constTABLE"),
            "{out}"
        );
    }
}
