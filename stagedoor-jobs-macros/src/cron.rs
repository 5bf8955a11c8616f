//! `cron!("...")`: a cron expression checked at compile time with the same parser the
//! scheduler uses at run time.

use proc_macro2::TokenStream;
use quote::quote;
use syn::LitStr;

pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let lit: LitStr = match syn::parse2(input) {
        Ok(l) => l,
        Err(e) => {
            return syn::Error::new(
                e.span(),
                "cron! takes one string literal: cron!(\"0 3 * * *\")",
            )
            .into_compile_error();
        }
    };
    let text = lit.value();
    // croner reads an empty list item (`", 3 * * *"`) as an empty list: an expression that
    // never fires. The scheduler refuses it at startup too (found by the fuzzer).
    if text
        .split_whitespace()
        .any(|f| f.split(',').any(str::is_empty))
    {
        return syn::Error::new(
            lit.span(),
            format!(
                "{text:?} has an empty list item (a comma with nothing on one side of it), which matches no time: remove the comma or write the missing value"
            ),
        )
        .into_compile_error();
    }
    match text.parse::<croner::Cron>() {
        Ok(_) => quote! { ::stagedoor_jobs::__private::CronExpr::__checked(#lit) },
        Err(e) => syn::Error::new(
            lit.span(),
            format!(
                "{text:?} is not a cron expression ({e}): write five fields, minute hour day month weekday, e.g. \"0 3 * * *\""
            ),
        )
        .into_compile_error(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_expression_expands_and_an_invalid_one_errors() {
        let ok = expand(quote! { "0 3 * * *" }).to_string();
        assert!(ok.contains("CronExpr :: __checked"), "{ok}");
        let bad = expand(quote! { "61 * * * *" }).to_string();
        assert!(bad.contains("compile_error"), "{bad}");
        assert!(bad.contains("is not a cron expression"), "{bad}");
        let empty = expand(quote! { ", 3 * * *" }).to_string();
        assert!(empty.contains("empty list item"), "{empty}");
    }
}
