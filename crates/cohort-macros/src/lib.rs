//! Derive macros for Cohort. Use them through the `cohort` crate, which
//! re-exports `#[derive(Retained)]` as `cohort::Retained`.
//!
//! The derive reads the struct's `#[retain(...)]`, `#[anonymise(...)]`,
//! `#[erasure_subject]` and `#[exempt_from_retention("...")]` attributes
//! (and the table/column names of `sqlx`, `sea_orm` and `diesel`
//! attributes) and implements `cohort::model::Retained` with a call chain
//! on the `cohort::model::EntityDeclaration` builder. Conventions and
//! validation against the database happen at runtime in `cohort`.

mod attr;
mod ctxt;
mod expand;

use proc_macro::TokenStream;

/// Implements `cohort::model::Retained` for a struct with named fields.
///
/// ```ignore
/// #[derive(cohort::Retained)]
/// #[retain(category = "case-contacts", anchor = "created_at", id = "b7316df4-7db5-46ad-aea7-f65c4b430f73")]
/// pub struct CaseContact {
///     pub id: Uuid,
///     pub tenant_id: Uuid,
///     pub created_at: DateTime<Utc>,
///     #[anonymise(null)]
///     pub email: Option<String>,
///     #[erasure_subject(kind = "user")]
///     pub user_id: Uuid,
/// }
/// ```
///
/// Struct keys of `#[retain(...)]`: `category`, `anchor` (a field name),
/// `id` (a UUID, required), `table`, `schema`, `name`, `tenantless`,
/// `partitions = "drop"` (opt-in partition purge, see docs/partitions.md),
/// `sweep_parallelism = N` (1 to 64 connections per sweep of the entity),
/// `audit = "per_row"` or `"summary"` (the entity's own audit detail, which
/// wins over its category's), `archive = "schema.table"` (where the
/// `archive` strategy moves rows) and `anonymise_on_archive` (the
/// anonymise methods apply to the copy); or
/// `#[exempt_from_retention("reason")]` for a documented exemption. Field
/// keys: `column = "..."`, the markers `record_id` (on several fields: a
/// composite record key, its columns in field order), `tenant`,
/// `soft_delete`, `deleted_at`, `anonymised_at`, `not_archived` (the
/// column is left out of the archived copy) and `not_tenant` (its name
/// reads as a tenant id but it is not one: a `tenantless` type's table
/// may keep it). `#[anonymise(...)]` takes
/// one of `null`, `empty`, `literal = "..."`, `hash`, `with = "path::to::fn"`
/// (`fn(&T) -> R`, `fn(&AnonymiseContext, &T) -> R`, or
/// `fn(&AnonymiseContext) -> R` computed once per run).
#[proc_macro_derive(
    Retained,
    attributes(
        retain,
        anonymise,
        erasure_subject,
        exempt_from_retention,
        sqlx,
        sea_orm,
        diesel
    )
)]
pub fn derive_retained(input: TokenStream) -> TokenStream {
    expand::expand(input.into()).into()
}
