use chrono::{DateTime, Utc};
use cohort::Retained;
use uuid::Uuid;

fn mask_reference(v: &String) -> String {
    format!("***{}", v.len())
}

#[derive(Retained)]
#[retain(category = "case-contacts", anchor = "created_at", id = "b7316df4-7db5-46ad-aea7-f65c4b430f73")]
pub struct CaseContact {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub created_at: DateTime<Utc>,
    pub anonymised_at: Option<DateTime<Utc>>,
    #[anonymise(null)]
    pub email: Option<String>,
    #[anonymise(empty)]
    pub full_name: String,
    #[anonymise(literal = "[redacted]")]
    pub phone: String,
    #[anonymise(hash)]
    pub reference: String,
    #[anonymise(with = "mask_reference")]
    pub external_reference: String,
    #[erasure_subject]
    pub user_id: Uuid,
    #[erasure_subject(kind = "user")]
    pub delegate_user_id: Option<Uuid>,
}

fn main() {
    let decl = CaseContact::declaration();
    assert_eq!(decl.name(), "CaseContact");
}
