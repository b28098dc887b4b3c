//! `#[anonymise(with = f)]` takes a function of any of the three shapes:
//! per row from the value, per row from the context and the value, and
//! once per run from the context.
use chrono::{DateTime, Utc};
use cohort::model::{AnonymiseContext, AnonymiseMethod};
use cohort::Retained;
use uuid::Uuid;

fn by_value(v: &Option<i32>) -> Option<i64> {
    v.map(|n| i64::from(n / 10 * 10))
}

fn with_context(cx: &AnonymiseContext<'_>, v: &String) -> String {
    format!("{}:{}:{}", cx.entity, cx.record_id.unwrap_or("-"), v.len())
}

fn per_run(cx: &AnonymiseContext<'_>) -> String {
    format!("erased {}", cx.now.date_naive())
}

#[derive(Retained)]
#[retain(category = "contacts", anchor = "created_at", id = "5d1d2c55-2f0e-4e6c-9d59-5c0b6f3b8a11")]
pub struct Contact {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub created_at: DateTime<Utc>,
    pub anonymised_at: Option<DateTime<Utc>>,
    #[anonymise(with = "by_value")]
    pub score: Option<i32>,
    #[anonymise(with = "with_context")]
    pub reference: String,
    #[anonymise(with = "per_run")]
    pub phone: String,
}

fn main() {
    let decl = Contact::declaration();
    let modes: Vec<(String, bool)> = decl
        .anonymised()
        .iter()
        .map(|(column, method)| match method {
            AnonymiseMethod::Custom(c) => (column.clone(), c.is_per_run()),
            other => panic!("{column}: {other:?}"),
        })
        .collect();
    assert_eq!(
        modes,
        [
            ("score".to_owned(), false),
            ("reference".to_owned(), false),
            ("phone".to_owned(), true),
        ]
    );
}
