use cohort::Retained;

#[derive(Retained)]
#[retain(category = "session-notes", anchor = "created_at", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")]
struct SessionNote {
    #[retain(tenant)]
    org_id: i64,
    #[retain(tenant)]
    tenant_id: i64,
    created_at: i64,
}

fn main() {}
