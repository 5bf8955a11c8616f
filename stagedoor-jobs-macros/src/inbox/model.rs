//! The model of a derived row: the table attributes, the shape of the item and, for a struct
//! with named fields, each field with its column name and its `#[field(..)]` attributes.
//! Nothing here is validated beyond parsing; [`check`](super::check) does that.

use syn::ext::IdentExt;
use syn::{Data, DeriveInput, Fields, FieldsUnnamed, Ident, Token, Type};

use super::attr::{self, FieldAttrs, TableAttrs};
use super::role::Role;
use crate::ctxt::Ctxt;

/// The shape of the derived item. Only a struct with named fields is a row.
pub(crate) enum Shape<'a> {
    /// A struct with named fields: one column each, in order.
    Named(Vec<Field<'a>>),
    /// A tuple struct: its fields, between parentheses.
    Tuple(&'a FieldsUnnamed),
    /// A unit struct.
    Unit,
    /// An enum: its `enum` keyword.
    Enum(&'a Token![enum]),
    /// A union: its `union` keyword.
    Union(&'a Token![union]),
}

/// One field of the row: one column.
pub(crate) struct Field<'a> {
    /// The field's name.
    pub(crate) ident: &'a Ident,
    /// The field's type.
    pub(crate) ty: &'a Type,
    /// The column's name: the field's, without the `r#` of a raw identifier.
    pub(crate) column: String,
    /// What `#[field(..)]` says of it.
    pub(crate) attrs: FieldAttrs,
}

impl Field<'_> {
    /// The field's role: the first one given (a second one is an error of its own).
    pub(crate) fn role(&self) -> Option<(Role, &Ident)> {
        self.attrs.roles.first().map(|(r, i)| (*r, i))
    }

    /// Whether the field is marked `generated`.
    pub(crate) fn generated(&self) -> bool {
        self.attrs.generated.is_some()
    }
}

/// A derived row: the item, its table attributes and its shape.
pub(crate) struct Row<'a> {
    /// The item as written.
    pub(crate) input: &'a DeriveInput,
    /// What `#[inbox(..)]` says.
    pub(crate) attrs: TableAttrs,
    /// The item's shape and, for a struct with named fields, its fields.
    pub(crate) shape: Shape<'a>,
}

impl<'a> Row<'a> {
    /// Parses the attributes of the item and of its fields, recording parse errors in `cx`.
    pub(crate) fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Self {
        let attrs = attr::parse_table(cx, &input.attrs);
        let shape = match &input.data {
            Data::Struct(s) => match &s.fields {
                Fields::Named(named) => Shape::Named(
                    named
                        .named
                        .iter()
                        .map(|f| {
                            let ident = f.ident.as_ref().expect("a named field has a name");
                            Field {
                                ident,
                                ty: &f.ty,
                                column: ident.unraw().to_string(),
                                attrs: attr::parse_field(cx, &f.attrs),
                            }
                        })
                        .collect(),
                ),
                Fields::Unnamed(unnamed) => Shape::Tuple(unnamed),
                Fields::Unit => Shape::Unit,
            },
            Data::Enum(e) => Shape::Enum(&e.enum_token),
            Data::Union(u) => Shape::Union(&u.union_token),
        };
        Row {
            input,
            attrs,
            shape,
        }
    }

    /// The fields of a struct with named fields; none for any other shape.
    pub(crate) fn fields(&self) -> &[Field<'a>] {
        match &self.shape {
            Shape::Named(fields) => fields,
            _ => &[],
        }
    }

    /// The field playing `role`: the first one, when several claim it.
    pub(crate) fn field_of(&self, role: Role) -> Option<&Field<'a>> {
        self.fields()
            .iter()
            .find(|f| f.role().is_some_and(|(r, _)| r == role))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    #[test]
    fn role_names_round_trip() {
        for role in Role::ALL {
            assert_eq!(Role::from_name(role.name()), Some(role));
        }
        assert_eq!(Role::from_name("ID"), None);
        assert_eq!(Role::from_name("retry_at"), None);
    }

    #[test]
    fn fields_keep_their_order_and_unraw_names() {
        let input: DeriveInput = parse_quote! {
            #[inbox(table = "t")]
            struct Row {
                #[field(id, generated)] id: i64,
                r#type: String,
                #[field(payload)] payload: Vec<u8>,
            }
        };
        let cx = Ctxt::new();
        let row = Row::from_ast(&cx, &input);
        cx.check().expect("parses");
        let columns: Vec<&str> = row.fields().iter().map(|f| f.column.as_str()).collect();
        assert_eq!(columns, ["id", "type", "payload"]);
        assert_eq!(row.field_of(Role::Id).unwrap().ident, "id");
        assert!(row.field_of(Role::Id).unwrap().generated());
        assert!(row.field_of(Role::Group).is_none());
        assert_eq!(row.attrs.table.as_ref().unwrap().value(), "t");
    }

    #[test]
    fn other_shapes_have_no_fields() {
        let cx = Ctxt::new();
        for input in [
            parse_quote!(
                struct T(i64);
            ),
            parse_quote!(
                struct U;
            ),
            parse_quote!(
                enum E {
                    A,
                }
            ),
            parse_quote!(
                union U {
                    a: u8,
                }
            ),
        ] {
            let input: DeriveInput = input;
            assert!(Row::from_ast(&cx, &input).fields().is_empty());
        }
        cx.check().expect("parses");
    }
}
