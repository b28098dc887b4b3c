//! Calendar years and months (RS-025): a period or legal minimum of `7y`
//! or `18mo` means what PostgreSQL's `interval '7 years'` means, at leap
//! days and month ends, for sweeps and erasure; the ledger and the run
//! read back keep the units as written.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use chrono::{DateTime, Utc};
use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, EntityDeclaration, SweepRequest};
use sqlx::Row;
use support::*;

const SUBJECT: &str = "dddddddd-0000-0000-0000-00000000000d";

/// Invoices every six hours over the twenty days around each boundary the
/// test uses, for tenant A and one subject.
const TABLES: &str = r#"
CREATE SCHEMA app;
CREATE TABLE app.invoices (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id uuid NOT NULL, user_id uuid NOT NULL, issued_at timestamptz NOT NULL);
"#;

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().to_utc()
}

async fn seed(pool: &sqlx::PgPool, now: DateTime<Utc>, interval: &str) {
    exec(pool, "TRUNCATE app.invoices").await;
    sqlx::query(
        "INSERT INTO app.invoices (tenant_id, user_id, issued_at) \
         SELECT $1::uuid, $2::uuid, t FROM pg_catalog.generate_series( \
           ($3::timestamptz - $4::interval) - interval '10 days', \
           ($3::timestamptz - $4::interval) + interval '10 days', interval '6 hours') t",
    )
    .bind(TENANT_A)
    .bind(SUBJECT)
    .bind(now)
    .bind(interval)
    .execute(pool)
    .await
    .unwrap();
}

/// The rows PostgreSQL itself says are older than `now - interval` (in UTC).
async fn older_by_postgres(pool: &sqlx::PgPool, now: DateTime<Utc>, interval: &str) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET TimeZone = 'UTC'")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar(
        "SELECT count(*) FROM app.invoices WHERE issued_at < $1::timestamptz - $2::interval",
    )
    .bind(now)
    .bind(interval)
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

async fn cohort_with(db: &cohort_pgtemp::TestDatabase, rule: RetentionRule) -> Cohort {
    let rules = StaticRuleProvider::builder()
        .category("invoices", rule)
        .build()
        .unwrap();
    Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules)
        .declaration(
            EntityDeclaration::new("Invoice", INVOICE_ID)
                .category("invoices")
                .anchor("issued_at")
                .table("app.invoices")
                .subject("user_id", None),
        )
        .build()
        .await
        .unwrap()
}

fn p(text: &str) -> Period {
    text.parse().unwrap()
}

/// Leap days, month ends and the day after February.
const NOWS: [&str; 5] = [
    "2024-02-29T12:00:00Z",
    "2025-03-31T00:00:00Z",
    "2025-02-28T23:00:00Z",
    "2024-03-01T00:00:00Z",
    "2026-05-31T06:00:00Z",
];

#[db_test(migrated)]
async fn a_legal_minimum_in_years_keeps_every_row_postgres_would_keep(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    // Period 30 days, legal minimum seven calendar years: the legal minimum wins.
    let rule = RetentionRule::new(days(30), Strategy::Purge).with_legal_min(p("7y"));
    let cohort = cohort_with(&db, rule).await;
    for now in NOWS.map(at) {
        seed(db.pool(), now, "7 years").await;
        let total = count(db.pool(), "SELECT count(*) FROM app.invoices").await;
        let expected = older_by_postgres(db.pool(), now, "7 years").await;
        // 2555 days (7 × 365) would reach 1 or 2 days less far back: more rows.
        let by_days = older_by_postgres(db.pool(), now, "2555 days").await;
        assert!(
            by_days > expected,
            "{now}: the fixture separates 7y from 2555d"
        );
        let preview = cohort
            .preview(cohort::PreviewRequest::tenanted(TENANT_A, now))
            .await
            .unwrap();
        assert_eq!(
            preview.entities[0].affected as i64, expected,
            "{now}: preview"
        );
        let result = cohort
            .sweep(SweepRequest::tenanted(TENANT_A, now))
            .await
            .unwrap();
        assert_eq!(result.affected() as i64, expected, "{now}: swept");
        assert_eq!(
            count(db.pool(), "SELECT count(*) FROM app.invoices").await,
            total - expected,
            "{now}: rows left"
        );
        assert_eq!(older_by_postgres(db.pool(), now, "7 years").await, 0);
        // The ledger keeps the units as written, and the run reads back the same.
        let row = sqlx::query(
            "SELECT resolved_period::text, legal_min::text, cutoff FROM sweep_run_entity_summary WHERE run_id = $1",
        )
        .bind(result.run_id)
        .fetch_one(db.pool())
        .await
        .unwrap();
        assert_eq!(row.get::<String, _>(0), "30 days");
        assert_eq!(row.get::<String, _>(1), "7 years");
        let cutoff: DateTime<Utc> = row.get(2);
        let pg_cutoff: DateTime<Utc> = sqlx::query_scalar(
            "SELECT ($1::timestamptz AT TIME ZONE 'UTC' - interval '7 years') AT TIME ZONE 'UTC'",
        )
        .bind(now)
        .fetch_one(db.pool())
        .await
        .unwrap();
        assert_eq!(cutoff, pg_cutoff, "{now}: the cutoff is PostgreSQL's");
        let read = cohort.show_run(result.run_id).await.unwrap();
        assert_eq!(read.entities[0].legal_min, Some(p("7y")));
        assert_eq!(read.entities[0].legal_min.unwrap().to_string(), "7y");
        assert_eq!(read.entities[0].period, days(30));
    }
}

#[db_test(migrated)]
async fn a_period_in_months_ends_where_postgres_says_at_month_ends(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    let cohort = cohort_with(&db, RetentionRule::new(p("18mo"), Strategy::Purge)).await;
    for now in NOWS.map(at) {
        seed(db.pool(), now, "18 months").await;
        let expected = older_by_postgres(db.pool(), now, "18 months").await;
        assert!(expected > 0);
        let result = cohort
            .sweep(SweepRequest::tenanted(TENANT_A, now))
            .await
            .unwrap();
        assert_eq!(result.affected() as i64, expected, "{now}");
        assert_eq!(older_by_postgres(db.pool(), now, "18 months").await, 0);
        assert_eq!(result.entities[0].period.to_string(), "1y6mo");
        let stored: String = sqlx::query_scalar(
            "SELECT resolved_period::text FROM sweep_run_entity_summary WHERE run_id = $1",
        )
        .bind(result.run_id)
        .fetch_one(db.pool())
        .await
        .unwrap();
        assert_eq!(stored, "1 year 6 mons");
    }
}

#[db_test(migrated)]
async fn erasure_waits_for_a_legal_minimum_in_calendar_years(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    let rule = RetentionRule::new(days(30), Strategy::Purge).with_legal_min(p("7y"));
    let cohort = cohort_with(&db, rule).await;
    for now in NOWS.map(at) {
        seed(db.pool(), now, "7 years").await;
        let expected = older_by_postgres(db.pool(), now, "7 years").await;
        let total = count(db.pool(), "SELECT count(*) FROM app.invoices").await;
        let result = cohort
            .erase(ErasureRequest::tenanted(
                TENANT_A,
                ErasureScope::new(SUBJECT),
                now,
            ))
            .await
            .unwrap();
        assert_eq!(result.affected() as i64, expected, "{now}: erased");
        assert_eq!(
            result.entities[0].kept_by_legal_min as i64,
            total - expected,
            "{now}: kept by the legal minimum"
        );
        assert_eq!(older_by_postgres(db.pool(), now, "7 years").await, 0);
    }
}

#[tokio::test]
async fn cutoffs_agree_with_postgres_interval_arithmetic_everywhere() {
    use chrono::Datelike;
    let db = migrated_db().await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::query("SET TimeZone = 'UTC'")
        .execute(&mut *conn)
        .await
        .unwrap();
    // A fixed-seed walk over times (1990..2040, often at month ends and
    // leap days) and periods mixing calendar and fixed units.
    let mut state: u64 = 0x5eed;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    for _ in 0..400 {
        let day_end = matches!(next(3), 0);
        let year = 1990 + next(50) as i32;
        let month = 1 + next(12) as u32;
        let day = if day_end {
            chrono::NaiveDate::from_ymd_opt(year, month, 1)
                .unwrap()
                .checked_add_months(chrono::Months::new(1))
                .unwrap()
                .pred_opt()
                .unwrap()
                .day0()
                + 1
        } else {
            1 + next(28) as u32
        };
        let time = chrono::NaiveDate::from_ymd_opt(year, month, day)
            .unwrap()
            .and_hms_opt(next(24) as u32, next(60) as u32, next(60) as u32)
            .unwrap()
            .and_utc();
        let period = Period::from_parts(next(200) as i64, next(90 * 86_400) as i64).unwrap();
        let pg: DateTime<Utc> = sqlx::query_scalar(
            "SELECT ($1::timestamptz AT TIME ZONE 'UTC' - pg_catalog.make_interval(months => $2, secs => $3)) AT TIME ZONE 'UTC'",
        )
        .bind(time)
        .bind(period.months())
        .bind(period.fixed_seconds() as f64)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        assert_eq!(period.before(time), Some(pg), "{time} - {period}");
    }
}
