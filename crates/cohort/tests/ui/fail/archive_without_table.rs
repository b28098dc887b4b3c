use cohort::Retained;

#[derive(Retained)]
#[retain(category = "contacts", anchor = "created_at", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8", tenantless, anonymise_on_archive)]
struct Contact {
    id: i64,
    created_at: chrono::DateTime<chrono::Utc>,
    #[retain(not_archived)]
    notes: String,
}

fn main() {}
