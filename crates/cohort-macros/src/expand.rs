//! Code generation: the `cohort::model::Retained` impl, whose body is one
//! call chain on `cohort::model::EntityDeclaration`'s builder.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;

use crate::attr::{Anonymise, Container};
use crate::ctxt::Ctxt;

/// Expands `#[derive(Retained)]`: the impl, or one `compile_error!` per
/// problem found in the input.
pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let input: syn::DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(err) => return err.to_compile_error(),
    };
    let cx = Ctxt::new();
    let container = Container::from_ast(&cx, &input);
    match (cx.check(), container) {
        (Ok(()), Some(container)) => generate(&container),
        (Err(err), _) => err.to_compile_error(),
        (Ok(()), None) => syn::Error::new(
            Span::call_site(),
            "cohort-macros: internal error: no declaration and no error",
        )
        .to_compile_error(),
    }
}

/// Generates the impl for a valid container.
fn generate(c: &Container) -> TokenStream {
    let ident = &c.ident;
    let (impl_generics, ty_generics, where_clause) = c.generics.split_for_impl();
    let name = &c.name;
    let id = &c.id;
    let type_suffix = format!("::{}", c.ident.unraw());

    let mut calls: Vec<TokenStream> = vec![quote! {
        .origin(::cohort::model::Origin::Derive {
            type_path: ::std::string::String::from(
                ::std::concat!(::std::module_path!(), #type_suffix)
            ),
        })
    }];
    if let Some(category) = &c.category {
        calls.push(quote!(.category(#category)));
    }
    if let Some(anchor) = &c.anchor {
        calls.push(quote!(.anchor(#anchor)));
    }
    let table = &c.table;
    calls.push(quote!(.table(#table)));
    if let Some(schema) = &c.schema {
        calls.push(quote!(.schema(#schema)));
    }
    for field in &c.fields {
        let (column, name, ty) = (&field.column, &field.name, &field.rust_type);
        calls.push(quote!(.column(#column, #name, #ty)));
    }
    for field in &c.fields {
        let column = &field.column;
        for (marker, _) in &field.markers {
            let variant = format_ident!("{}", marker.variant());
            calls.push(quote!(.marker(::cohort::model::Marker::#variant, #column)));
        }
    }
    for field in &c.fields {
        if let Some(method) = &field.anonymise {
            let column = &field.column;
            let method = anonymise_method(method, &field.ty);
            calls.push(quote!(.anonymise(#column, #method)));
        }
    }
    for field in &c.fields {
        if let Some(kind) = &field.subject {
            let column = &field.column;
            let kind = match kind {
                Some(kind) => quote!(::std::option::Option::Some(#kind)),
                None => quote!(::std::option::Option::None),
            };
            calls.push(quote!(.subject(#column, #kind)));
        }
    }
    if c.tenantless {
        calls.push(quote!(.tenantless()));
    }
    for field in c.fields.iter().filter(|f| f.not_tenant) {
        let column = &field.column;
        calls.push(quote!(.not_tenant(#column)));
    }
    if let Some(n) = c.sweep_parallelism {
        calls.push(quote!(.sweep_parallelism(#n)));
    }
    if c.drop_partitions {
        calls.push(quote!(.partitions(::cohort::model::Partitions::Drop)));
    }
    match c.audit.as_deref() {
        Some("per_row") => calls.push(quote!(.audit(::cohort::rules::AuditDetail::PerRow))),
        Some(_) => calls.push(quote!(.audit(::cohort::rules::AuditDetail::Summary))),
        None => {}
    }
    if let Some(archive) = &c.archive {
        calls.push(quote!(.archive_to(#archive)));
        // A field left out narrows the copy to the other fields' columns.
        if c.fields.iter().any(|f| f.not_archived) {
            let columns = c
                .fields
                .iter()
                .filter(|f| !f.not_archived)
                .map(|f| &f.column);
            calls.push(quote!(.archive_columns([#(#columns),*])));
        }
        if c.anonymise_on_archive {
            calls.push(quote!(.anonymise_on_archive()));
        }
    }
    if let Some(reason) = &c.exempt {
        calls.push(quote!(.exempt(#reason)));
    }

    // Validated by the container: the id is a non-nil UUID.
    let id_bits = uuid::Uuid::parse_str(id)
        .map(|u| u.as_u128())
        .unwrap_or_default();
    let id_bits = proc_macro2::Literal::u128_unsuffixed(id_bits);
    quote! {
        #[allow(unused_qualifications)]
        const _: () = {
            #[automatically_derived]
            impl #impl_generics ::cohort::model::Retained for #ident #ty_generics #where_clause {
                fn declaration() -> ::cohort::model::EntityDeclaration {
                    ::cohort::model::EntityDeclaration::new(#name, #id)
                        #(#calls)*
                }
            }

            #[automatically_derived]
            impl #impl_generics #ident #ty_generics #where_clause {
                /// The durable id of this entity (`#[retain(id = ...)]`):
                /// what holds and guarded deletion name it by.
                pub const RETENTION_ENTITY_ID: ::cohort::__private::Uuid =
                    ::cohort::__private::Uuid::from_u128(#id_bits);
            }
        };
    }
}

/// The `cohort::model::AnonymiseMethod` expression for a method.
fn anonymise_method(method: &Anonymise, ty: &syn::Type) -> TokenStream {
    match method {
        Anonymise::Null => quote!(::cohort::model::AnonymiseMethod::Null),
        Anonymise::Empty => quote!(::cohort::model::AnonymiseMethod::Empty),
        Anonymise::Hash => quote!(::cohort::model::AnonymiseMethod::Hash),
        Anonymise::Literal(text) => quote! {
            ::cohort::model::AnonymiseMethod::Literal(::std::string::String::from(#text))
        },
        Anonymise::With { path, name, span } => quote_spanned! {*span=>
            ::cohort::model::AnonymiseMethod::Custom(
                ::cohort::model::CustomAnonymiser::from_fn::<#ty, _, _>(#name, #path)
            )
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token string with all whitespace removed, so fragments compare
    /// independently of how the printer spaces tokens.
    fn normalize(tokens: impl ToString) -> String {
        tokens
            .to_string()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect()
    }

    fn expand_str(src: &str) -> String {
        let input: TokenStream = src.parse().expect("test input lexes");
        normalize(expand(input))
    }

    /// Asserts the fragments (token streams or token text) appear in order.
    fn assert_contains_in_order(expanded: &str, fragments: &[&dyn ToString]) {
        let mut rest = expanded;
        for fragment in fragments {
            let fragment = normalize(fragment.to_string());
            match rest.find(&fragment) {
                Some(at) => rest = &rest[at + fragment.len()..],
                None => panic!("missing (or out of order) {fragment}\nin {expanded}"),
            }
        }
    }

    #[test]
    fn session_note_expansion() {
        let expanded = expand_str(
            r#"#[retain(category = "session-notes", anchor = "created_at", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8", table = "session_notes")]
               pub struct SessionNote { pub id: Uuid, pub tenant_id: Uuid, pub created_at: DateTime<Utc>, pub body: String }"#,
        );
        assert_contains_in_order(
            &expanded,
            &[
                &"const _: () = {",
                &quote!(impl ::cohort::model::Retained for SessionNote),
                &quote!(fn declaration() -> ::cohort::model::EntityDeclaration),
                &quote!(::cohort::model::EntityDeclaration::new(
                    "SessionNote",
                    "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
                )),
                &quote!(.origin(::cohort::model::Origin::Derive {
                    type_path: ::std::string::String::from(::std::concat!(::std::module_path!(), "::SessionNote")),
                })),
                &quote!(.category("session-notes")),
                &quote!(.anchor("created_at")),
                &quote!(.table("session_notes")),
                &quote!(.column("id", "id", "Uuid")),
                &quote!(.column("tenant_id", "tenant_id", "Uuid")),
                &quote!(.column("created_at", "created_at", "DateTime<Utc>")),
                &quote!(.column("body", "body", "String")),
            ],
        );
        for absent in [
            "marker",
            "anonymise",
            "subject",
            "tenantless",
            "exempt",
            "schema",
        ] {
            assert!(
                !expanded.contains(&format!(".{absent}(")),
                "{absent} in {expanded}"
            );
        }
    }

    #[test]
    fn case_contact_expansion() {
        let expanded = expand_str(
            r#"#[retain(category = "case-contacts", anchor = "created_at", id = "b7316df4-7db5-46ad-aea7-f65c4b430f73")]
               pub struct CaseContact {
                   pub id: Uuid, pub tenant_id: Uuid, pub created_at: DateTime<Utc>,
                   pub anonymised_at: Option<DateTime<Utc>>,
                   #[anonymise(null)] pub email: Option<String>,
                   #[anonymise(empty)] pub full_name: String,
                   #[anonymise(literal = "[redacted]")] pub phone: String,
                   #[anonymise(hash)] pub reference: String,
                   #[anonymise(with = "mask_reference")] pub external_reference: String,
                   #[erasure_subject] pub user_id: Uuid,
                   #[erasure_subject(kind = "user")] pub delegate_user_id: Option<Uuid>,
               }"#,
        );
        assert_contains_in_order(
            &expanded,
            &[
                &quote!(.category("case-contacts")),
                &quote!(.anchor("created_at")),
                &quote!(.table("case_contact")),
                &quote!(.column("anonymised_at", "anonymised_at", "Option<DateTime<Utc>>")),
                &quote!(.column("delegate_user_id", "delegate_user_id", "Option<Uuid>")),
                &quote!(.anonymise("email", ::cohort::model::AnonymiseMethod::Null)),
                &quote!(.anonymise("full_name", ::cohort::model::AnonymiseMethod::Empty)),
                &quote!(.anonymise("phone", ::cohort::model::AnonymiseMethod::Literal(::std::string::String::from("[redacted]")))),
                &quote!(.anonymise("reference", ::cohort::model::AnonymiseMethod::Hash)),
                &quote!(.anonymise("external_reference", ::cohort::model::AnonymiseMethod::Custom(
                    ::cohort::model::CustomAnonymiser::from_fn::<String, _, _>("mask_reference", mask_reference)
                ))),
                &quote!(.subject("user_id", ::std::option::Option::None)),
                &quote!(.subject("delegate_user_id", ::std::option::Option::Some("user"))),
            ],
        );
    }

    #[test]
    fn markers_flags_schema_and_exemption() {
        let expanded = expand_str(
            r#"#[retain(category = "c", anchor = "at", id = "b7316df4-7db5-46ad-aea7-f65c4b430f73", schema = "app", name = "Thing", tenantless)]
               struct Thing { #[retain(column = "org", record_id)] key: i64, #[retain(soft_delete)] gone: bool, #[retain(column = "at_col")] at: i64 }"#,
        );
        assert_contains_in_order(
            &expanded,
            &[
                &quote!(::cohort::model::EntityDeclaration::new(
                    "Thing",
                    "b7316df4-7db5-46ad-aea7-f65c4b430f73"
                )),
                &quote!(.anchor("at_col")),
                &quote!(.table("thing")),
                &quote!(.schema("app")),
                &quote!(.column("org", "key", "i64")),
                &quote!(.marker(::cohort::model::Marker::RecordId, "org")),
                &quote!(.marker(::cohort::model::Marker::SoftDelete, "gone")),
                &quote!(.tenantless()),
            ],
        );

        let exempt = expand_str(
            r#"#[exempt_from_retention("audit log, kept by law")] #[retain(id = "b7316df4-7db5-46ad-aea7-f65c4b430f73")]
               struct AuditEntry { at: i64 }"#,
        );
        assert_contains_in_order(
            &exempt,
            &[
                &quote!(.table("audit_entry")),
                &quote!(.column("at", "at", "i64")),
                &quote!(.exempt("audit log, kept by law")),
            ],
        );
        assert!(!exempt.contains(".category("));
        assert!(!exempt.contains(".anchor("));
    }

    #[test]
    fn generics_use_split_for_impl() {
        let expanded = expand_str(
            r#"#[retain(category = "c", anchor = "at", id = "b7316df4-7db5-46ad-aea7-f65c4b430f73")]
               struct Wrapper<'a, T: Clone, const N: usize> where T: Send { at: i64, payload: T, raw: &'a [u8; N] }"#,
        );
        assert_contains_in_order(
            &expanded,
            &[
                &quote!(impl<'a, T: Clone, const N: usize> ::cohort::model::Retained for Wrapper<'a, T, N> where T: Send),
                &quote!(.column("payload", "payload", "T")),
                &quote!(.column("raw", "raw", "&'a[u8;N]")),
            ],
        );
    }

    #[test]
    fn raw_identifiers_are_unrawed() {
        let expanded = expand_str(
            r#"#[retain(category = "c", anchor = "r#when", id = "b7316df4-7db5-46ad-aea7-f65c4b430f73")]
               struct r#Match { r#when: i64, r#type: String }"#,
        );
        assert_contains_in_order(
            &expanded,
            &[
                &quote!(for r#Match),
                &quote!(EntityDeclaration::new(
                    "Match",
                    "b7316df4-7db5-46ad-aea7-f65c4b430f73"
                )),
                &r#"::std::module_path!(), "::Match")"#,
                &quote!(.anchor("when")),
                &quote!(.table("match")),
                &quote!(.column("when", "when", "i64")),
                &quote!(.column("type", "type", "String")),
            ],
        );
    }

    #[test]
    fn errors_become_compile_errors() {
        let expanded = expand_str(
            r#"#[retain(category = "c", anchor = "nope", id = "zzz", colour = "red")]
               struct S { #[anonymise(null, hash)] a: Option<String> }"#,
        );
        assert!(!expanded.contains("impl"), "{expanded}");
        let count = expanded.matches("compile_error!").count();
        assert_eq!(count, 4, "{expanded}");
        for fragment in [
            "unknownkey`colour`",
            "`id`mustbeaUUID",
            "thereisnofield`nope`",
            "field`a`hastwoanonymisemethods",
        ] {
            assert!(expanded.contains(fragment), "{fragment} not in {expanded}");
        }
    }

    #[test]
    fn unparsable_input_is_a_compile_error() {
        let expanded = expand_str("fn not_a_type() {}");
        assert!(expanded.contains("compile_error!"), "{expanded}");
    }
}
