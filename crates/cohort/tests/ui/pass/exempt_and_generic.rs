use chrono::{DateTime, Utc};
use cohort::Retained;

#[derive(Retained)]
#[exempt_from_retention("audit trail, kept for the lifetime of the account")]
#[retain(id = "f7a8b9c0-d1e2-4f3a-b4c5-d6e7f8a9b0c1")]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
}

#[derive(Retained)]
#[sqlx(rename_all = "camelCase")]
#[retain(category = "envelopes", anchor = "created_at", id = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", tenantless)]
pub struct Envelope<T: Clone> {
    pub created_at: DateTime<Utc>,
    #[retain(column = "body")]
    pub payload: T,
}

fn main() {
    assert!(AuditEntry::declaration().is_exempt());
    assert_eq!(Envelope::<String>::declaration().name(), "Envelope");
}
