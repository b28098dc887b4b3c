use cohort::Retained;

#[derive(Retained)]
#[retain(category = "events", anchor = "created_at", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8", tenantless, sweep_parallelism = 0)]
struct Event {
    id: i64,
    created_at: chrono::DateTime<chrono::Utc>,
}

#[derive(Retained)]
#[retain(category = "events", anchor = "created_at", id = "b3f467fe-c5d0-4f17-9897-83c373cc1dc8", tenantless, sweep_parallelism = "4")]
struct Other {
    id: i64,
    created_at: chrono::DateTime<chrono::Utc>,
}

fn main() {}
