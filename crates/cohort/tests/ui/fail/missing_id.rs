use cohort::Retained;

#[derive(Retained)]
#[retain(category = "session-notes", anchor = "created_at")]
struct SessionNote {
    created_at: i64,
}

fn main() {}
