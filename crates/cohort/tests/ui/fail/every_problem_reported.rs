use cohort::Retained;

#[derive(Retained)]
#[retain(category = "session-notes", anchor = "inserted_at", id = "not-a-uuid", colour = "red")]
#[retain(category = "again")]
struct SessionNote {
    #[retain(tenant)]
    org_id: i64,
    #[retain(tenant)]
    tenant_id: i64,
    created_at: i64,
    #[anonymise(null, hash)]
    email: Option<String>,
    #[retain(record_id)]
    #[anonymise(empty)]
    id: String,
    #[erasure_subject(kind = "")]
    user_id: i64,
}

fn main() {}
