//! `cohort-erasure-bench`: how long erasing one data subject takes across
//! several entities when the tables are large and the subject columns are
//! indexed.
//!
//! ```text
//! cargo run --release -p cohort-bench --bin cohort-erasure-bench -- [--rows N]
//! ```
//!
//! Seeds `app.case_contacts` (anonymise, subjects `user_id` and
//! `delegate_user_id`) and `app.tickets` (soft delete, subject
//! `requester_id`) with N rows each over 4 tenants and N/5 subjects, with
//! an index on every subject column; then times one untimed warm-up erasure,
//! a dry run and a live erasure of another subject in one tenant, and checks
//! the rows changed are exactly the subject's.

use std::time::Instant;

use chrono::Utc;
use clap::Parser;
use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::model::AnonymiseMethod;
use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, EntityDeclaration, RunStatus};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-erasure-bench",
    about = "Time to erase one subject on large tables"
)]
struct Args {
    /// Rows per table.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    rows: u64,
}

const TENANT: &str = "00000000-0000-4000-8000-000000000000";

fn subject(n: u64) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", n, n)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let db = cohort_pgtemp::fresh_empty_database().await?;
    let pool = db.pool();
    let mut conn = db.connect().await?;
    cohort::schema::migrate(&mut conn, "public").await?;
    let seed = format!(
        "CREATE SCHEMA app;
         CREATE TABLE app.case_contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz NOT NULL,
            anonymised_at timestamptz, email text, full_name text NOT NULL, user_id uuid NOT NULL, delegate_user_id uuid);
         CREATE TABLE app.tickets (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, closed_at timestamptz,
            is_deleted boolean NOT NULL DEFAULT false, deleted_at timestamptz, requester_id uuid NOT NULL);
         INSERT INTO app.case_contacts (id, tenant_id, created_at, email, full_name, user_id, delegate_user_id)
         SELECT g, ('0000000' || (g % 4) || '-0000-4000-8000-000000000000')::uuid, now() - make_interval(days => (g % 400)::int),
                'p' || g || '@example.com', 'Person ' || g,
                (lpad(to_hex(g % {subjects}), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(g % {subjects}), 12, '0'))::uuid,
                CASE WHEN g % 7 = 0 THEN (lpad(to_hex((g + 1) % {subjects}), 8, '0') || '-0000-4000-8000-' || lpad(to_hex((g + 1) % {subjects}), 12, '0'))::uuid END
         FROM generate_series(1, {rows}) g;
         INSERT INTO app.tickets (id, tenant_id, closed_at, requester_id)
         SELECT g, ('0000000' || (g % 4) || '-0000-4000-8000-000000000000')::uuid, now() - make_interval(days => (g % 400)::int),
                (lpad(to_hex(g % {subjects}), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(g % {subjects}), 12, '0'))::uuid
         FROM generate_series(1, {rows}) g;
         CREATE INDEX ON app.case_contacts (user_id);
         CREATE INDEX ON app.case_contacts (delegate_user_id);
         CREATE INDEX ON app.tickets (requester_id);
         CREATE INDEX ON app.case_contacts (tenant_id, created_at);
         CREATE INDEX ON app.tickets (tenant_id, closed_at);
         ANALYZE;",
        rows = args.rows,
        subjects = (args.rows / 5).max(1),
    );
    let started = Instant::now();
    sqlx::raw_sql(sqlx::AssertSqlSafe(seed))
        .execute(pool)
        .await?;
    eprintln!(
        "seeded 2 x {} rows in {:.1} s",
        args.rows,
        started.elapsed().as_secs_f64()
    );

    let rules = StaticRuleProvider::builder()
        .category(
            "contacts",
            RetentionRule::new(Period::from_days(90)?, Strategy::Anonymise),
        )
        .category(
            "tickets",
            RetentionRule::new(Period::from_days(30)?, Strategy::SoftDelete),
        )
        .build()
        .map_err(|e| format!("{e:?}"))?;
    let cohort = Cohort::builder(pool.clone())
        .rules(rules)
        .declaration(
            EntityDeclaration::new("CaseContact", "b7316df4-7db5-46ad-aea7-f65c4b430f73")
                .category("contacts")
                .anchor("created_at")
                .table("app.case_contacts")
                .anonymise("email", AnonymiseMethod::Null)
                .anonymise("full_name", AnonymiseMethod::Literal("[erased]".into()))
                .subject("user_id", None)
                .subject("delegate_user_id", None),
        )
        .declaration(
            EntityDeclaration::new("Ticket", "3c1f0d4e-8a7b-4c2d-9e6f-0a1b2c3d4e5f")
                .category("tickets")
                .anchor("closed_at")
                .table("app.tickets")
                .subject("requester_id", None),
        )
        .build()
        .await?;
    let erase = |s: String, dry: bool| {
        let cohort = cohort.clone();
        async move {
            let scope = ErasureScope::new(s).allow_soft_delete(true);
            cohort
                .erase(
                    ErasureRequest::tenanted(TENANT, scope, Utc::now().fixed_offset()).dry_run(dry),
                )
                .await
        }
    };
    // Subjects whose rows fall in the measured tenant (ids ≡ 0 mod 4).
    let warm = subject(4);
    let target = subject(8);
    erase(warm, false).await?;
    let expected_contacts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM app.case_contacts WHERE tenant_id = $1::uuid AND (user_id = $2::uuid OR delegate_user_id = $2::uuid)",
    )
    .bind(TENANT)
    .bind(&target)
    .fetch_one(pool)
    .await?;
    let expected_tickets: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM app.tickets WHERE tenant_id = $1::uuid AND requester_id = $2::uuid",
    )
    .bind(TENANT)
    .bind(&target)
    .fetch_one(pool)
    .await?;

    let t = Instant::now();
    let dry = erase(target.clone(), true).await?;
    let dry_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    let live = erase(target.clone(), false).await?;
    let live_ms = t.elapsed().as_secs_f64() * 1000.0;

    let affected =
        |r: &cohort::SweepResult, name: &str| r.entity(name).map_or(0, |e| e.affected as i64);
    let ok = live.status == RunStatus::Succeeded
        && affected(&live, "CaseContact") == expected_contacts
        && affected(&live, "Ticket") == expected_tickets
        && affected(&dry, "CaseContact") == expected_contacts
        && affected(&dry, "Ticket") == expected_tickets;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await?;
    println!(
        "cohort-erasure-bench: 2 tables x {} rows, subject columns indexed, PostgreSQL {version}",
        args.rows
    );
    println!(
        "one subject, one tenant: {} contact rows anonymised, {} tickets soft-deleted",
        expected_contacts, expected_tickets
    );
    println!("dry run : {dry_ms:8.1} ms");
    println!(
        "erasure : {live_ms:8.1} ms (run {}, status {})",
        live.run_id,
        live.status.as_str()
    );
    let _ = db.drop_database().await;
    if ok {
        Ok(())
    } else {
        Err(format!("erasure changed other rows than the subject's: {live:?}").into())
    }
}
