use cohort::Retained;

#[derive(Retained)]
#[retain(category = "session-notes", anchor = "created_at", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dcZ")]
struct SessionNote {
    created_at: i64,
}

#[derive(Retained)]
#[retain(category = "session-notes", anchor = "created_at", id = "00000000-0000-0000-0000-000000000000")]
struct NilId {
    created_at: i64,
}

fn main() {}
