//! `cohort-partitions-bench`: a purge of a table range-partitioned by month,
//! through the row path and through opt-in partition purge
//! (`partitions = "drop"`).
//!
//! ```text
//! cargo run --release -p cohort-bench --bin cohort-partitions-bench -- [--rows N] [--batch B]
//! ```
//!
//! Seeds two tables of the same N rows: one spread evenly over 12 monthly
//! partitions (plus a default partition) with a unique index on
//! `(id, created_at)`, the other one plain table with the primary key
//! `id` (the row path needs a single-column key, which a partitioned table
//! keyed by month cannot have), each with an index on `created_at`. Both
//! purge rows older than 90 days (nine partitions wholly expired, a tenth
//! straddling the cutoff), then, on fresh tables, older than 92 days (the
//! cutoff on a partition boundary). The plain table is swept through the
//! row path, the partitioned one with `partitions = "drop"`; both must
//! purge the same number of rows and keep the same rows, or the program
//! exits non-zero. Each way's WAL (`pg_current_wal_lsn()` before and after)
//! is printed beside its time.
//!
//! A third table holds the same rows spread over four tenants (a
//! `tenant_id` column, the primary key `(id, created_at)` declared as a
//! composite record key, `partitions = "drop"`): every tenant's pass is run
//! in turn, the first dropping each partition whose rows are due for every
//! tenant, the others finding only their rows of the straddling month.
//! Their total must purge and keep the same rows as the other two ways.

use std::time::Instant;

use clap::Parser;
use cohort::policy::PolicyFile;
use cohort::{Cohort, RunStatus, SweepRequest};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-partitions-bench",
    about = "Partition purge against the row path on a monthly-partitioned table"
)]
struct Args {
    /// Rows per table.
    #[arg(long, default_value_t = 4_000_000, value_parser = clap::value_parser!(u64).range(12_000..=100_000_000))]
    rows: u64,
    /// Rows per batch of the row path.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
}

/// The logical time of both sweeps: the twelve partitions cover the year before.
const NOW: &str = "2026-11-01T00:00:00Z";

/// A plain table of the same rows, keyed by `id` alone (the row path).
fn seed_plain(table: &str, rows: u64) -> String {
    format!(
        "CREATE TABLE app.{table} (id bigint PRIMARY KEY, created_at timestamptz NOT NULL, \
            kind text NOT NULL, body text);
         INSERT INTO app.{table} (id, created_at, kind, body)
           SELECT g, '2025-11-01Z'::timestamptz + (g::int8 * 31535999 / {rows}) * interval '1 second',
                  'kind-' || (g % 7), 'event body ' || g
           FROM generate_series(1, {rows}) g;
         CREATE INDEX ON app.{table} (created_at);
         ANALYZE app.{table};"
    )
}

/// The table in 12 monthly partitions (and a default). `tenants`: with a
/// tenant column (row `g` is tenant `g % 4`'s) and the primary key
/// `(id, created_at)`; otherwise unique on `(id, created_at)`.
fn seed(table: &str, rows: u64, tenants: bool) -> String {
    let (tenant_column, tenant_value, key) = if tenants {
        (
            "tenant_id uuid NOT NULL, ",
            "('00000000-0000-4000-8000-00000000000' || (g % 4 + 1))::uuid, ",
            format!(
                "ALTER TABLE app.{table} ADD PRIMARY KEY (id, created_at);\n         CREATE INDEX ON app.{table} (tenant_id, created_at);"
            ),
        )
    } else {
        (
            "",
            "",
            format!("CREATE UNIQUE INDEX ON app.{table} (id, created_at);"),
        )
    };
    let tenant_name = if tenants { "tenant_id, " } else { "" };
    let mut sql = format!(
        "CREATE TABLE app.{table} (id bigint NOT NULL, created_at timestamptz NOT NULL, \
            {tenant_column}kind text NOT NULL, body text) PARTITION BY RANGE (created_at);\n"
    );
    // November 2025 to October 2026.
    let month = |i: u32| (2025 + (10 + i) / 12, (10 + i) % 12 + 1);
    for i in 0..12 {
        let ((fy, fm), (ty, tm)) = (month(i), month(i + 1));
        sql.push_str(&format!(
            "CREATE TABLE app.{table}_{fy}_{fm:02} PARTITION OF app.{table} \
             FOR VALUES FROM ('{fy}-{fm:02}-01Z') TO ('{ty}-{tm:02}-01Z');\n"
        ));
    }
    sql.push_str(&format!(
        "CREATE TABLE app.{table}_default PARTITION OF app.{table} DEFAULT;
         INSERT INTO app.{table} (id, created_at, {tenant_name}kind, body)
           SELECT g, '2025-11-01Z'::timestamptz + (g::int8 * 31535999 / {rows}) * interval '1 second',
                  {tenant_value}'kind-' || (g % 7), 'event body ' || g
           FROM generate_series(1, {rows}) g;
         {key}
         CREATE INDEX ON app.{table} (created_at);
         ANALYZE app.{table};"
    ));
    sql
}

/// The tenants of the multi-tenant table.
const TENANTS: [&str; 4] = [
    "00000000-0000-4000-8000-000000000001",
    "00000000-0000-4000-8000-000000000002",
    "00000000-0000-4000-8000-000000000003",
    "00000000-0000-4000-8000-000000000004",
];

fn policy_tenants(table: &str, period: &str, batch: u32) -> String {
    let directory: String = TENANTS
        .iter()
        .map(|t| format!("[[tenant]]\nid = \"{t}\"\n\n"))
        .collect();
    policy(table, "drop", period, batch)
        .replace(
            "tenantless = true\n",
            "tenant = \"tenant_id\"\nrecord_id = [\"id\", \"created_at\"]\n",
        )
        .replace("[[entity]]", &format!("{directory}[[entity]]"))
}

fn policy(table: &str, partitions: &str, period: &str, batch: u32) -> String {
    format!(
        r#"
[cohort]
sweep_batch_size = {batch}

[[entity]]
name = "Event"
id = "7e1c0a52-4f3b-4d8e-9a61-2b5c8d9e0f13"
table = "app.{table}"
category = "events"
anchor = "created_at"
tenantless = true
partitions = "{partitions}"

[[category]]
name = "events"
strategy = "purge"
period = "{period}"
"#
    )
}

/// The server's WAL position, in bytes.
async fn wal_lsn(pool: &sqlx::PgPool) -> Result<i64, BoxError> {
    Ok(
        sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8")
            .fetch_one(pool)
            .await?,
    )
}

/// Sweeps `table` under `policy`, once per request in turn (the
/// tenantless pass, or every tenant's); returns (rows purged, seconds, WAL
/// bytes written), summed.
async fn sweep(
    pool: &sqlx::PgPool,
    table: &str,
    policy: &str,
    requests: Vec<SweepRequest>,
) -> Result<(u64, f64, i64), BoxError> {
    let cohort = Cohort::builder(pool.clone())
        .policy(PolicyFile::parse(policy)?)
        .build()
        .await?;
    // Validated and planned before the clock starts, for every way alike.
    cohort.ready().await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    let wal_before = wal_lsn(pool).await?;
    let started = Instant::now();
    let mut purged = 0;
    for request in requests {
        let result = cohort.sweep(request).await?;
        if result.status != RunStatus::Succeeded {
            return Err(format!(
                "{table}: run ended {:?}: {:?}",
                result.status, result.failures
            )
            .into());
        }
        purged += result.entities[0].affected;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok((purged, secs, wal_lsn(pool).await? - wal_before))
}

async fn digest(pool: &sqlx::PgPool, table: &str) -> Result<(i64, i64), BoxError> {
    let sql = format!("SELECT count(*), COALESCE(sum(id), 0)::int8 FROM app.{table}");
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await?)
}

/// One comparison: fresh tables, the row path, then partition purge.
async fn compare(pool: &sqlx::PgPool, args: &Args, period: &str) -> Result<(), BoxError> {
    let started = Instant::now();
    let sql = format!(
        "DROP SCHEMA IF EXISTS app CASCADE; CREATE SCHEMA app;\n{}\n{}\n{}",
        seed_plain("events_rows", args.rows),
        seed("events_drop", args.rows, false),
        seed("events_tenants", args.rows, true)
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await?;
    // Set the visibility maps, as on a table that has been live for months.
    for vacuum in [
        "VACUUM app.events_rows",
        "VACUUM app.events_drop",
        "VACUUM app.events_tenants",
    ] {
        sqlx::raw_sql(vacuum).execute(pool).await?;
    }
    println!(
        "seeded 3 tables of {} rows (one plain, two in 12 monthly partitions, one of them of 4 tenants) in {:.1} s",
        args.rows,
        started.elapsed().as_secs_f64()
    );
    let now = chrono::DateTime::parse_from_rfc3339(NOW)?;
    let tenantless = || vec![SweepRequest::tenantless(now)];
    let (rows_purged, rows_secs, rows_wal) = sweep(
        pool,
        "events_rows",
        &policy("events_rows", "rows", period, args.batch),
        tenantless(),
    )
    .await?;
    let (drop_purged, drop_secs, drop_wal) = sweep(
        pool,
        "events_drop",
        &policy("events_drop", "drop", period, args.batch),
        tenantless(),
    )
    .await?;
    let (tenants_purged, tenants_secs, tenants_wal) = sweep(
        pool,
        "events_tenants",
        &policy_tenants("events_tenants", period, args.batch),
        TENANTS
            .iter()
            .map(|t| SweepRequest::tenanted(*t, now))
            .collect(),
    )
    .await?;
    let kept_rows = digest(pool, "events_rows").await?;
    let kept_drop = digest(pool, "events_drop").await?;
    let kept_tenants = digest(pool, "events_tenants").await?;
    let left_tenants: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'app.events_tenants'::regclass",
    )
    .fetch_one(pool)
    .await?;
    if tenants_purged != rows_purged || kept_tenants != kept_rows {
        return Err(format!(
            "the multi-tenant table disagrees: purged {tenants_purged} and kept {kept_tenants:?}, the row path {rows_purged} and {kept_rows:?}"
        )
        .into());
    }
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'app.events_drop'::regclass",
    )
    .fetch_one(pool)
    .await?;
    if rows_purged != drop_purged || kept_rows != kept_drop {
        return Err(format!(
            "the two ways disagree: row path purged {rows_purged} and kept {kept_rows:?}, partition purge purged {drop_purged} and kept {kept_drop:?}"
        )
        .into());
    }
    let cutoff = now - chrono::TimeDelta::days(period.trim_end_matches('d').parse()?);
    println!(
        "purge older than {period} (cutoff {}) of {rows_purged} of {} rows, batch {}:",
        cutoff.format("%Y-%m-%d"),
        args.rows,
        args.batch
    );
    let per_row = |wal: i64| wal as f64 / rows_purged.max(1) as f64;
    println!(
        "  row path         {rows_secs:>9.3} s  {:>12.0} rows/s  {rows_wal:>12} WAL bytes ({:.1} bytes/row)",
        rows_purged as f64 / rows_secs,
        per_row(rows_wal)
    );
    println!(
        "  partition purge  {drop_secs:>9.3} s  {:>12.0} rows/s  {drop_wal:>12} WAL bytes ({:.1} bytes/row; {} of 13 partitions dropped, the rest by the row path)",
        drop_purged as f64 / drop_secs,
        per_row(drop_wal),
        13 - left
    );
    println!(
        "  4 tenants' passes{tenants_secs:>9.3} s  {:>12.0} rows/s  {tenants_wal:>12} WAL bytes ({:.1} bytes/row; {} of 13 partitions dropped)",
        tenants_purged as f64 / tenants_secs,
        per_row(tenants_wal),
        13 - left_tenants
    );
    println!(
        "  speed-up         {:>9.1}x single-tenant, {:.1}x four tenants\n",
        rows_secs / drop_secs,
        rows_secs / tenants_secs
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let db = cohort_pgtemp::fresh_empty_database().await?;
    let mut conn = db.connect().await?;
    cohort::schema::migrate(&mut conn, "public").await?;
    // A cutoff inside a month (its partition goes through the row path),
    // then one on a month boundary (partitions only).
    for period in ["90d", "92d"] {
        compare(db.pool(), &args, period).await?;
    }
    Ok(())
}
