//! Shared test support: a fresh database per test, cloned from a template
//! that already has Cohort's migrations in `public`.
#![allow(dead_code, unreachable_pub)]

use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort_pgtemp::{TemplateSpec, TestDatabase};
use sqlx::{AssertSqlSafe, PgPool, Row};

/// A template key that changes whenever the migrations change.
fn template() -> TemplateSpec {
    let sql: String = cohort::schema::migrations("public")
        .unwrap()
        .into_iter()
        .map(|m| m.sql)
        .collect();
    TemplateSpec::new(TemplateSpec::hashed_key("cohort", sql.as_bytes()), |pool| {
        Box::pin(async move {
            let mut conn = pool.acquire().await?;
            cohort::schema::migrate(&mut conn, "public").await?;
            Ok(())
        })
    })
}

/// A fresh database with Cohort's tables in `public`.
pub async fn migrated_db() -> TestDatabase {
    cohort_pgtemp::fresh_database(&template())
        .await
        .expect("test database")
}

/// A fresh database with nothing in it.
pub async fn empty_db() -> TestDatabase {
    cohort_pgtemp::fresh_empty_database()
        .await
        .expect("test database")
}

/// Runs SQL written by the test (several statements allowed).
pub async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{e}\nin:\n{sql}"));
}

/// A digest of a table's whole content, to prove nothing changed.
pub async fn table_digest(pool: &PgPool, table: &str) -> String {
    let sql = format!(
        "SELECT count(*)::text || ':' || COALESCE(md5(string_agg(t::text, ',' ORDER BY t::text)), '') AS d FROM {table} t"
    );
    sqlx::query(AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap()
        .get("d")
}

/// Rows in Cohort's ledger tables (all must stay 0 during validation).
pub async fn ledger_rows(pool: &PgPool, schema: &str) -> i64 {
    let q = cohort::quote_ident(schema);
    let sql = format!(
        "SELECT (SELECT count(*) FROM {q}.sweep_run) + (SELECT count(*) FROM {q}.sweep_run_entity_summary) \
         + (SELECT count(*) FROM {q}.sweep_run_row_detail) + (SELECT count(*) FROM {q}.sweep_row_handler_status) \
         + (SELECT count(*) FROM {q}.retention_hold) AS n"
    );
    sqlx::query(AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap()
        .get("n")
}

pub fn days(n: i64) -> Period {
    Period::from_days(n).unwrap()
}

/// Categories used across tests: `notes` purge 30d, `contacts` anonymise
/// 90d, `soft` soft delete 10d, `kept` exempt, `mixed` purge with a
/// soft-delete override.
pub fn rules() -> StaticRuleProvider {
    StaticRuleProvider::builder()
        .category("notes", RetentionRule::new(days(30), Strategy::Purge))
        .category(
            "contacts",
            RetentionRule::new(days(90), Strategy::Anonymise),
        )
        .category("soft", RetentionRule::new(days(10), Strategy::SoftDelete))
        .category("kept", RetentionRule::new(days(1), Strategy::Exempt))
        .category_with(
            "mixed",
            RetentionRule::new(days(30), Strategy::Purge),
            vec![cohort::rules::RuleOverride {
                tenant: Some("t2".into()),
                jurisdiction: None,
                rule: RetentionRule::new(days(30), Strategy::SoftDelete),
            }],
            None,
        )
        .build()
        .unwrap()
}

pub const NOTE_ID: &str = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8";
pub const CONTACT_ID: &str = "b7316df4-7db5-46ad-aea7-f65c4b430f73";
pub const OTHER_ID: &str = "5d1d2c55-2f0e-4e6c-9d59-5c0b6f3b8a11";
