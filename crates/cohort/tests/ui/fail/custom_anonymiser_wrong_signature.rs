use cohort::Retained;

// Takes the value instead of a reference to the field's type.
fn mask(v: i64) -> String {
    v.to_string()
}

#[derive(Retained)]
#[retain(category = "session-notes", anchor = "created_at", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")]
struct SessionNote {
    created_at: i64,
    #[anonymise(with = "mask")]
    reference: String,
}

fn main() {}
