use cohort::Retained;

// SCOPE-002: a type is either retained (has a category) or explicitly exempt.
#[derive(Retained)]
#[exempt_from_retention("kept forever")]
#[retain(category = "session-notes", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")]
struct SessionNote {
    created_at: i64,
}

fn main() {}
