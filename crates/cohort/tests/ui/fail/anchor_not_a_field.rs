use cohort::Retained;

#[derive(Retained)]
#[retain(category = "session-notes", anchor = "inserted_at", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")]
struct SessionNote {
    id: i64,
    created_at: i64,
}

fn main() {}
