use cohort::Retained;

#[derive(Retained)]
#[retain(category = "session-notes", anchor = "created_at", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")]
struct SessionNote {
    created_at: i64,
    #[anonymise(null, hash)]
    email: Option<String>,
}

fn main() {}
