//! `cohort-keys-bench`: what a composite record key costs against a
//! one-column key on the same rows.
//!
//! ```text
//! cargo run --release -p cohort-bench --bin cohort-keys-bench -- [--rows N] [--batch B] [--repeat R] [--per-row]
//! ```
//!
//! Per strategy (purge, soft delete, anonymise), seeds two tables of N
//! rows that differ only in their key: `id bigint PRIMARY KEY`, and the
//! primary key `(id, created_at)` declared as `record_id = ["id",
//! "created_at"]`. Half the rows are past the cutoff and ten of them are
//! held (so the hold checks run as they do in production). Each side is
//! swept alternately `--repeat` times on fresh tables; every sweep must
//! change exactly the rows due. Prints the best rows/s of each side and
//! their ratio.

use std::time::Instant;

use chrono::Utc;
use clap::Parser;
use cohort::holds::HoldRequest;
use cohort::model::AnonymiseMethod;
use cohort::rules::{AuditDetail, Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, CohortConfig, EntityDeclaration, RunStatus, SweepRequest};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-keys-bench",
    about = "A composite record key against a one-column key"
)]
struct Args {
    /// Rows per table.
    #[arg(long, default_value_t = 250_000, value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    rows: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
    /// Sweeps of each side per strategy (the best is printed).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=9))]
    repeat: u32,
    /// Per-row audit (one ledger detail per changed row).
    #[arg(long)]
    per_row: bool,
}

const TENANT: &str = "00000000-0000-4000-8000-000000000000";
const HELD: u64 = 10;

/// Seeds `public.keys_{side}`: rows 1..=N, the odd ones 400 days old
/// (due), the even ones a day old.
async fn seed(pool: &sqlx::PgPool, side: &str, rows: u64) -> Result<(), BoxError> {
    let key = if side == "composite" {
        "PRIMARY KEY (id, created_at)"
    } else {
        "PRIMARY KEY (id)"
    };
    let sql = format!(
        "DROP TABLE IF EXISTS public.keys_{side};
         UPDATE public.retention_hold SET released_at = now() WHERE released_at IS NULL;
         TRUNCATE public.retention_hold;
         CREATE TABLE public.keys_{side} (id bigint NOT NULL, tenant_id uuid NOT NULL,
             created_at timestamptz NOT NULL, is_deleted boolean NOT NULL DEFAULT false,
             deleted_at timestamptz, anonymised_at timestamptz, note text, {key});
         INSERT INTO public.keys_{side}
         SELECT g, '{TENANT}',
                CASE WHEN g % 2 = 1 THEN now() - interval '400 days' + make_interval(secs => g)
                     ELSE now() - interval '1 day' END,
                false, NULL, NULL, 'note ' || g
         FROM generate_series(1, {rows}) g;
         CREATE INDEX ON public.keys_{side} (tenant_id, created_at);"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "VACUUM ANALYZE public.keys_{side}"
    )))
    .execute(pool)
    .await?;
    Ok(())
}

/// One sweep of one side; returns rows/s after checking what changed.
async fn sweep(
    pool: &sqlx::PgPool,
    args: &Args,
    side: &str,
    strategy: Strategy,
) -> Result<f64, BoxError> {
    seed(pool, side, args.rows).await?;
    let audit = if args.per_row {
        AuditDetail::PerRow
    } else {
        AuditDetail::Summary
    };
    let rules = StaticRuleProvider::builder()
        .category(
            "keys",
            RetentionRule::new(Period::from_days(30)?, strategy)
                .with_audit(audit)
                .map_err(|e| format!("{e:?}"))?,
        )
        .build()
        .map_err(|e| format!("{e:?}"))?;
    let id = uuid::Uuid::new_v4();
    let mut decl = EntityDeclaration::new("Key", id.to_string())
        .category("keys")
        .anchor("created_at")
        .table(format!("public.keys_{side}"))
        .marker(cohort::model::Marker::SoftDelete, "is_deleted")
        .anonymise("note", AnonymiseMethod::Null);
    if side == "composite" {
        decl = decl.record_key(["id", "created_at"]);
    }
    let cohort = Cohort::builder(pool.clone())
        .config(CohortConfig {
            sweep_batch_size: cohort::BatchSize::Fixed(args.batch),
            ..CohortConfig::default()
        })
        .rules(rules)
        .declaration(decl)
        .build()
        .await?;
    // Ten due rows held, each named the way its side names a record.
    let held: Vec<(i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')
         FROM public.keys_{side} WHERE id % 2 = 1 ORDER BY id LIMIT {HELD}"
    )))
    .fetch_all(pool)
    .await?;
    for (n, at) in held {
        let record = if side == "composite" {
            format!("[{n}, \"{at}\"]")
        } else {
            n.to_string()
        };
        cohort
            .create_hold(HoldRequest::new(id, record, "bench").tenant(TENANT))
            .await?;
    }
    let t = Instant::now();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT, Utc::now().fixed_offset()))
        .await?;
    let secs = t.elapsed().as_secs_f64();
    let due = args.rows.div_ceil(2) - HELD;
    if result.status != RunStatus::Succeeded || result.affected() != due {
        return Err(format!(
            "{side} {}: status {}, affected {}, expected {due}",
            strategy.as_str(),
            result.status.as_str(),
            result.affected()
        )
        .into());
    }
    Ok(due as f64 / secs)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let db = cohort_pgtemp::fresh_empty_database().await?;
    let pool = db.pool();
    let mut conn = db.connect().await?;
    cohort::schema::migrate(&mut conn, "public").await?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await?;
    println!(
        "cohort-keys-bench: {} rows per table (half due, {HELD} held), batch {}, {} audit, best of {}, PostgreSQL {version}",
        args.rows,
        args.batch,
        if args.per_row { "per-row" } else { "summary" },
        args.repeat
    );
    println!(
        "| strategy | one-column key rows/s | composite key rows/s | composite / one-column |"
    );
    println!("|---|---|---|---|");
    for strategy in [Strategy::Purge, Strategy::SoftDelete, Strategy::Anonymise] {
        let (mut one, mut composite) = (0f64, 0f64);
        for _ in 0..args.repeat {
            one = one.max(sweep(pool, &args, "one", strategy).await?);
            composite = composite.max(sweep(pool, &args, "composite", strategy).await?);
        }
        println!(
            "| {} | {one:.0} | {composite:.0} | {:.2} |",
            strategy.as_str(),
            composite / one
        );
    }
    let _ = db.drop_database().await;
    Ok(())
}
