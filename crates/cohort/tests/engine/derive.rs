//! `#[derive(Retained)]` through `cohort::Retained`: each test builds the
//! expected declaration by hand with the builder and compares; `ui` holds
//! the inputs that must compile and those that must fail with clear
//! messages (the expected compiler output is in `tests/ui/fail/*.stderr`;
//! regenerate it with `TRYBUILD=overwrite cargo test -p cohort --test
//! engine derive::ui`).

use chrono::{DateTime, Utc};
use cohort::model::{
    AnonymiseMethod, CustomAnonymiser, EntityDeclaration, Marker, Origin, Retained,
};
use uuid::Uuid;

/// The origin the derive records for a type of this test crate.
fn origin(name: &str) -> Origin {
    Origin::Derive {
        type_path: format!("{}::{name}", module_path!()),
    }
}

#[derive(cohort::Retained)]
#[retain(
    category = "session-notes",
    anchor = "created_at",
    id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8",
    table = "session_notes"
)]
#[allow(dead_code)]
struct SessionNote {
    id: Uuid,
    tenant_id: Uuid,
    created_at: DateTime<Utc>,
    body: String,
}

#[test]
fn session_note() {
    let expected = EntityDeclaration::new("SessionNote", "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")
        .origin(origin("SessionNote"))
        .category("session-notes")
        .anchor("created_at")
        .table("session_notes")
        .column("id", "id", "Uuid")
        .column("tenant_id", "tenant_id", "Uuid")
        .column("created_at", "created_at", "DateTime<Utc>")
        .column("body", "body", "String");
    let decl = SessionNote::declaration();
    assert_eq!(decl, expected);
    assert_eq!(decl.name(), "SessionNote");
    // The id as a constant, so code naming the entity does not repeat it.
    const ID: Uuid = SessionNote::RETENTION_ENTITY_ID;
    assert_eq!(
        ID,
        Uuid::parse_str("a3f467fe-c5d0-4f17-9897-83c373cc1dc8").unwrap()
    );
    assert_eq!(decl.raw_id(), "a3f467fe-c5d0-4f17-9897-83c373cc1dc8");
    assert!(!decl.is_exempt());
    assert_eq!(
        decl.declared_origin(),
        &Origin::Derive {
            type_path: "engine::derive::SessionNote".to_owned()
        }
    );
}

/// A custom anonymiser: keeps the last four characters.
#[allow(clippy::ptr_arg)]
fn mask_reference(v: &String) -> String {
    let keep = v.len().saturating_sub(4);
    format!("{}{}", "*".repeat(keep), &v[keep..])
}

#[derive(cohort::Retained)]
#[retain(
    category = "case-contacts",
    anchor = "created_at",
    id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
)]
#[allow(dead_code)]
struct CaseContact {
    id: Uuid,
    tenant_id: Uuid,
    created_at: DateTime<Utc>,
    anonymised_at: Option<DateTime<Utc>>,
    #[anonymise(null)]
    email: Option<String>,
    #[anonymise(empty)]
    full_name: String,
    #[anonymise(literal = "[redacted]")]
    phone: String,
    #[anonymise(hash)]
    reference: String,
    #[anonymise(with = "mask_reference")]
    external_reference: String,
    #[erasure_subject]
    user_id: Uuid,
    #[erasure_subject(kind = "user")]
    delegate_user_id: Option<Uuid>,
}

#[test]
fn case_contact() {
    let expected = EntityDeclaration::new("CaseContact", "b7316df4-7db5-46ad-aea7-f65c4b430f73")
        .origin(origin("CaseContact"))
        .category("case-contacts")
        .anchor("created_at")
        .table("case_contact")
        .column("id", "id", "Uuid")
        .column("tenant_id", "tenant_id", "Uuid")
        .column("created_at", "created_at", "DateTime<Utc>")
        .column("anonymised_at", "anonymised_at", "Option<DateTime<Utc>>")
        .column("email", "email", "Option<String>")
        .column("full_name", "full_name", "String")
        .column("phone", "phone", "String")
        .column("reference", "reference", "String")
        .column("external_reference", "external_reference", "String")
        .column("user_id", "user_id", "Uuid")
        .column("delegate_user_id", "delegate_user_id", "Option<Uuid>")
        .anonymise("email", AnonymiseMethod::Null)
        .anonymise("full_name", AnonymiseMethod::Empty)
        .anonymise("phone", AnonymiseMethod::Literal("[redacted]".to_owned()))
        .anonymise("reference", AnonymiseMethod::Hash)
        .anonymise(
            "external_reference",
            AnonymiseMethod::Custom(CustomAnonymiser::new::<String, _, _>(
                "mask_reference",
                mask_reference,
            )),
        )
        .subject("user_id", None)
        .subject("delegate_user_id", Some("user"));
    let decl = CaseContact::declaration();
    // Custom anonymisers compare by pointer, so compare the Debug forms.
    assert_eq!(format!("{decl:?}"), format!("{expected:?}"));
    assert!(format!("{decl:?}").contains(r#"CustomAnonymiser { name: "mask_reference""#));
    assert_ne!(
        decl, expected,
        "distinct custom anonymiser instances are not equal"
    );
    assert_eq!(mask_reference(&"AB-123456".to_owned()), "*****3456");
}

mod anonymisers {
    /// Lives in a module, so the derive must keep the path.
    pub(crate) fn last_digits(v: &Option<i64>) -> Option<i64> {
        v.map(|n| n % 100)
    }
}

#[derive(cohort::Retained)]
#[retain(
    category = "c",
    anchor = "created_at",
    id = "0b0d3a3e-7a0f-4a35-9a7c-5c1d6f9e2b11"
)]
#[allow(dead_code)]
struct PathAnonymiser {
    created_at: DateTime<Utc>,
    #[anonymise(with = "crate::derive::anonymisers::last_digits")]
    amount: Option<i64>,
}

#[test]
fn custom_anonymiser_by_path() {
    let decl = format!("{:?}", PathAnonymiser::declaration());
    assert!(
        decl.contains(
            r#"("amount", Custom(CustomAnonymiser { name: "crate::derive::anonymisers::last_digits""#
        ),
        "{decl}"
    );
    assert_eq!(anonymisers::last_digits(&Some(1234)), Some(34));
}

#[derive(cohort::Retained)]
#[sqlx(rename_all = "camelCase")]
#[retain(
    category = "events",
    anchor = "occurred_at",
    id = "2f5b7a1c-1f8e-4c0b-9d59-3b8f3c6f5e21"
)]
#[allow(dead_code)]
struct SqlxEvent {
    #[sqlx(rename = "event_id")]
    id: Uuid,
    tenant_id: Uuid,
    occurred_at: DateTime<Utc>,
    #[sqlx(default)]
    payload_json: Option<serde_json::Value>,
}

#[test]
fn sqlx_rename_and_rename_all() {
    let expected = EntityDeclaration::new("SqlxEvent", "2f5b7a1c-1f8e-4c0b-9d59-3b8f3c6f5e21")
        .origin(origin("SqlxEvent"))
        .category("events")
        .anchor("occurredAt")
        .table("sqlx_event")
        .column("event_id", "id", "Uuid")
        .column("tenantId", "tenant_id", "Uuid")
        .column("occurredAt", "occurred_at", "DateTime<Utc>")
        .column("payloadJson", "payload_json", "Option<serde_json::Value>");
    assert_eq!(SqlxEvent::declaration(), expected);
}

#[derive(cohort::Retained)]
#[sea_orm(table_name = "orders", schema_name = "shop")]
#[retain(
    category = "orders",
    anchor = "placed_at",
    id = "8d7e3c2b-4a1f-4e6d-b5c9-0a1b2c3d4e5f"
)]
#[allow(dead_code)]
struct Model {
    #[sea_orm(primary_key, auto_increment = false, column_name = "order_id")]
    id: Uuid,
    #[sea_orm(column_name = "placed")]
    placed_at: DateTime<Utc>,
    #[sea_orm(column_type = "Text", nullable)]
    note: Option<String>,
}

#[test]
fn sea_orm_table_and_column_names() {
    let expected = EntityDeclaration::new("Model", "8d7e3c2b-4a1f-4e6d-b5c9-0a1b2c3d4e5f")
        .origin(origin("Model"))
        .category("orders")
        .anchor("placed")
        .table("orders")
        .column("order_id", "id", "Uuid")
        .column("placed", "placed_at", "DateTime<Utc>")
        .column("note", "note", "Option<String>");
    assert_eq!(Model::declaration(), expected);
}

#[derive(cohort::Retained)]
#[diesel(table_name = crate::schema::invoices)]
#[diesel(check_for_backend(diesel::pg::Pg))]
#[retain(
    category = "invoices",
    anchor = "issued_at",
    id = "c4a1e9f0-2b3d-4c5e-8f70-91a2b3c4d5e6"
)]
#[allow(dead_code)]
struct Invoice {
    id: i64,
    #[diesel(column_name = issued)]
    issued_at: DateTime<Utc>,
    #[diesel(column_name = "total_cents", serialize_as = Option<i64>)]
    total: i64,
}

#[test]
fn diesel_table_and_column_names() {
    let expected = EntityDeclaration::new("Invoice", "c4a1e9f0-2b3d-4c5e-8f70-91a2b3c4d5e6")
        .origin(origin("Invoice"))
        .category("invoices")
        .anchor("issued")
        .table("invoices")
        .column("id", "id", "i64")
        .column("issued", "issued_at", "DateTime<Utc>")
        .column("total_cents", "total", "i64");
    assert_eq!(Invoice::declaration(), expected);
}

#[derive(cohort::Retained)]
#[retain(
    category = "tickets",
    anchor = "opened",
    id = "d1e2f3a4-b5c6-4d7e-8f90-a1b2c3d4e5f6",
    table = "support.tickets",
    name = "Support ticket"
)]
#[allow(dead_code)]
struct Ticket {
    #[retain(record_id, column = "ticket_no")]
    number: i64,
    #[retain(column = "org", tenant)]
    organisation: Uuid,
    #[retain(column = "opened_at")]
    opened: DateTime<Utc>,
    #[retain(soft_delete)]
    archived: bool,
    #[retain(deleted_at)]
    archived_at: Option<DateTime<Utc>>,
    #[retain(anonymised_at)]
    scrubbed_at: Option<DateTime<Utc>>,
    #[anonymise(null)]
    #[retain(column = "contact")]
    contact_email: Option<String>,
    #[erasure_subject(kind = "customer")]
    #[retain(column = "customer")]
    customer_id: Uuid,
}

#[test]
fn explicit_columns_and_markers() {
    let expected = EntityDeclaration::new("Support ticket", "d1e2f3a4-b5c6-4d7e-8f90-a1b2c3d4e5f6")
        .origin(origin("Ticket"))
        .category("tickets")
        .anchor("opened_at")
        .table("support.tickets")
        .column("ticket_no", "number", "i64")
        .column("org", "organisation", "Uuid")
        .column("opened_at", "opened", "DateTime<Utc>")
        .column("archived", "archived", "bool")
        .column("archived_at", "archived_at", "Option<DateTime<Utc>>")
        .column("scrubbed_at", "scrubbed_at", "Option<DateTime<Utc>>")
        .column("contact", "contact_email", "Option<String>")
        .column("customer", "customer_id", "Uuid")
        .marker(Marker::RecordId, "ticket_no")
        .marker(Marker::Tenant, "org")
        .marker(Marker::SoftDelete, "archived")
        .marker(Marker::DeletedAt, "archived_at")
        .marker(Marker::AnonymisedAt, "scrubbed_at")
        .anonymise("contact", AnonymiseMethod::Null)
        .subject("customer", Some("customer"));
    let decl = Ticket::declaration();
    assert_eq!(decl, expected);
    assert_eq!(decl.name(), "Support ticket");
}

#[derive(cohort::Retained)]
#[retain(
    category = "feature-flags",
    anchor = "changed_at",
    id = "e5f6a7b8-c9d0-4e1f-a2b3-c4d5e6f7a8b9",
    schema = "config",
    tenantless
)]
#[allow(dead_code)]
struct FlagChange {
    id: i64,
    changed_at: DateTime<Utc>,
}

#[test]
fn tenantless_with_schema() {
    let expected = EntityDeclaration::new("FlagChange", "e5f6a7b8-c9d0-4e1f-a2b3-c4d5e6f7a8b9")
        .origin(origin("FlagChange"))
        .category("feature-flags")
        .anchor("changed_at")
        .table("flag_change")
        .schema("config")
        .column("id", "id", "i64")
        .column("changed_at", "changed_at", "DateTime<Utc>")
        .tenantless();
    assert_eq!(FlagChange::declaration(), expected);
}

#[derive(cohort::Retained)]
#[retain(
    category = "events",
    anchor = "created_at",
    id = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
    tenantless,
    partitions = "drop"
)]
#[allow(dead_code)]
struct AccessEvent {
    id: i64,
    created_at: DateTime<Utc>,
}

#[test]
fn partition_purge() {
    let expected = EntityDeclaration::new("AccessEvent", "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")
        .origin(origin("AccessEvent"))
        .category("events")
        .anchor("created_at")
        .table("access_event")
        .column("id", "id", "i64")
        .column("created_at", "created_at", "DateTime<Utc>")
        .tenantless()
        .partitions(cohort::model::Partitions::Drop);
    assert_eq!(AccessEvent::declaration(), expected);
}

/// The archive strategy's table, a field left out of the copy, and the
/// copy anonymised.
#[derive(cohort::Retained)]
#[retain(
    category = "contacts",
    anchor = "created_at",
    id = "6d7e8f90-a1b2-4c3d-8e4f-5a6b7c8d9e0f",
    table = "app.contacts",
    archive = "vault.contacts_archive",
    anonymise_on_archive
)]
#[allow(dead_code)]
struct ArchivedContact {
    id: i64,
    tenant_id: Uuid,
    created_at: DateTime<Utc>,
    #[anonymise(null)]
    email: Option<String>,
    #[retain(not_archived)]
    search_vector: Option<String>,
}

#[test]
fn archive() {
    let expected =
        EntityDeclaration::new("ArchivedContact", "6d7e8f90-a1b2-4c3d-8e4f-5a6b7c8d9e0f")
            .origin(origin("ArchivedContact"))
            .category("contacts")
            .anchor("created_at")
            .table("app.contacts")
            .column("id", "id", "i64")
            .column("tenant_id", "tenant_id", "Uuid")
            .column("created_at", "created_at", "DateTime<Utc>")
            .column("email", "email", "Option<String>")
            .column("search_vector", "search_vector", "Option<String>")
            .anonymise("email", AnonymiseMethod::Null)
            .archive_to("vault.contacts_archive")
            .archive_columns(["id", "tenant_id", "created_at", "email"])
            .anonymise_on_archive();
    assert_eq!(ArchivedContact::declaration(), expected);
}

#[derive(cohort::Retained)]
#[exempt_from_retention("financial ledger: kept for 10 years by law, handled by the archive job")]
#[retain(id = "f7a8b9c0-d1e2-4f3a-b4c5-d6e7f8a9b0c1", table = "ledger_entries")]
#[allow(dead_code)]
struct LedgerEntry {
    id: i64,
    booked_at: DateTime<Utc>,
}

#[test]
fn exempt() {
    let expected = EntityDeclaration::new("LedgerEntry", "f7a8b9c0-d1e2-4f3a-b4c5-d6e7f8a9b0c1")
        .origin(origin("LedgerEntry"))
        .table("ledger_entries")
        .column("id", "id", "i64")
        .column("booked_at", "booked_at", "DateTime<Utc>")
        .exempt("financial ledger: kept for 10 years by law, handled by the archive job");
    let decl = LedgerEntry::declaration();
    assert_eq!(decl, expected);
    assert!(decl.is_exempt());
}

#[derive(cohort::Retained)]
#[retain(
    category = "envelopes",
    anchor = "created_at",
    id = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
)]
#[allow(dead_code)]
struct Envelope<'a, T: Clone, const N: usize>
where
    T: Send,
{
    created_at: DateTime<Utc>,
    payload: T,
    tags: &'a [u8; N],
}

#[test]
fn generics() {
    let expected = EntityDeclaration::new("Envelope", "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")
        .origin(origin("Envelope"))
        .category("envelopes")
        .anchor("created_at")
        .table("envelope")
        .column("created_at", "created_at", "DateTime<Utc>")
        .column("payload", "payload", "T")
        .column("tags", "tags", "&'a[u8;N]");
    assert_eq!(
        <Envelope<'static, String, 4> as Retained>::declaration(),
        expected
    );
    assert_eq!(
        <Envelope<'static, u8, 0> as Retained>::declaration(),
        expected
    );
}

#[derive(cohort::Retained)]
#[retain(
    category = "matches",
    anchor = "r#when",
    id = "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e"
)]
#[allow(dead_code, non_camel_case_types)]
struct r#match {
    r#when: DateTime<Utc>,
    r#type: String,
    #[anonymise(literal = "?")]
    r#ref: String,
}

#[test]
fn raw_identifiers() {
    let expected = EntityDeclaration::new("match", "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e")
        .origin(origin("match"))
        .category("matches")
        .anchor("when")
        .table("match")
        .column("when", "when", "DateTime<Utc>")
        .column("type", "type", "String")
        .column("ref", "ref", "String")
        .anonymise("ref", AnonymiseMethod::Literal("?".to_owned()));
    assert_eq!(r#match::declaration(), expected);
}

/// Items named like the ones the derive uses must not change its expansion.
mod shadowing {
    #![allow(dead_code, non_camel_case_types, unused_macros)]
    struct cohort;
    struct std;
    struct String;
    struct Option;
    macro_rules! concat {
        () => {};
    }

    #[derive(::cohort::Retained)]
    #[retain(
        category = "c",
        anchor = "at",
        id = "2c3d4e5f-6a7b-4c8d-9e0f-1a2b3c4d5e6f"
    )]
    pub(super) struct Shadowed {
        at: i64,
        #[erasure_subject]
        who: i64,
        #[anonymise(literal = "x")]
        text: ::std::string::String,
    }
}

#[test]
fn expansion_is_hygienic() {
    let decl = <shadowing::Shadowed as Retained>::declaration();
    assert_eq!(
        decl.declared_origin(),
        &Origin::Derive {
            type_path: "engine::derive::shadowing::Shadowed".to_owned()
        }
    );
}

#[derive(cohort::Retained)]
#[retain(
    category = "notes",
    anchor = "created_at",
    id = "0b6f5e43-3d0e-4c2b-9a51-6f7f2a8c1e90",
    audit = "per_row"
)]
#[allow(dead_code)]
struct AuditedNote {
    id: Uuid,
    tenant_id: Uuid,
    created_at: DateTime<Utc>,
}

/// `#[retain(audit = "per_row")]` is the builder's `.audit(PerRow)`.
#[test]
fn audited_note() {
    let expected = EntityDeclaration::new("AuditedNote", "0b6f5e43-3d0e-4c2b-9a51-6f7f2a8c1e90")
        .origin(origin("AuditedNote"))
        .category("notes")
        .anchor("created_at")
        .table("audited_note")
        .audit(cohort::rules::AuditDetail::PerRow)
        .column("id", "id", "Uuid")
        .column("tenant_id", "tenant_id", "Uuid")
        .column("created_at", "created_at", "DateTime<Utc>");
    assert_eq!(AuditedNote::declaration(), expected);
}

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
