//! The benchmark tables, one per strategy, and how they are seeded and
//! inspected.
//!
//! Every table has the key `id uuid PRIMARY KEY DEFAULT gen_random_uuid()`,
//! a `seq bigint` (the `generate_series` value the row was made from), a
//! `tenant_id uuid` and the anchor `created_at timestamptz`. Row `g` belongs
//! to tenant `g % T` and is `75 days * frac(g * φ⁻¹)` old (a low-discrepancy
//! sequence: deterministic, evenly spread, not correlated with `id`), so 60%
//! of the rows are older than the 30-day cutoff. Rows whose index within
//! their tenant (`g / T`) is a multiple of 100 and which are past the cutoff
//! get an active hold when they belong to the swept tenant: 1% of its
//! eligible rows.
//!
//! All SQL here is assembled only from the `&'static str` constants of this
//! module (fixed table names), never from input.

use chrono::SubsecRound;
use chrono::{DateTime, Utc};
use cohort::model::AnonymiseMethod;
use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort::EntityDeclaration;
use sqlx::{AssertSqlSafe, PgPool, Row};
use uuid::Uuid;

/// Retention period of every benchmark category, in days.
pub(crate) const PERIOD_DAYS: i64 = 30;
/// Age range of the seeded anchors, in days (60% past a 30-day cutoff).
const AGE_SPREAD_DAYS: i64 = 75;
/// One row in this many (within the swept tenant, past the cutoff) is held.
const HOLD_EVERY: i64 = 100;
/// The key the tables use, as reported in the output.
pub(crate) const KEY_DESCRIPTION: &str = "id uuid PRIMARY KEY DEFAULT gen_random_uuid()";

/// One benchmarked strategy: its table, its Cohort entity and its hand-written baseline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scenario {
    /// The strategy swept.
    pub(crate) strategy: Strategy,
    /// Label in the output (`purge`, `anonymise`, `soft_delete`).
    pub(crate) label: &'static str,
    /// Schema-qualified table name.
    pub(crate) table: &'static str,
    /// Durable entity id (also `retention_entity_id` of the holds).
    pub(crate) entity_id: &'static str,
    /// Cohort category name.
    pub(crate) category: &'static str,
    /// Column definitions after the common ones.
    pub(crate) extra_columns: &'static str,
    /// Extra column names filled by the seed insert.
    seed_columns: &'static str,
    /// Their values (may use `g`, the series value).
    seed_values: &'static str,
    /// The strategy's "not yet done" condition on alias `t`, with a leading ` AND `.
    pub(crate) not_done: &'static str,
    /// The baseline mutation of the locked rows `c` (`{table}` is substituted).
    /// It takes them by address with `ctid = ANY (ARRAY(SELECT c.tid FROM
    /// c))`, a TID scan, the access path of Cohort's own mutation on a plain
    /// table (`ctid = ANY($2)`): key lookups (`id = ANY (…)`) probe the
    /// primary key per row, and the join form `… FROM c WHERE t.id = c.id`
    /// is planned as a hash join over a sequential scan of the whole table,
    /// once per batch; either would make the baseline slower than it needs
    /// to be.
    pub(crate) baseline_mutation: &'static str,
    /// A count of rows in the done state whose columns are all as the strategy
    /// leaves them (`0` for purge).
    done_consistent: &'static str,
    /// Whether the category asks for per-row audit (Cohort and the
    /// in-server reference then write one row detail per changed row).
    pub(crate) per_row: bool,
    /// For archive: the archive table (the source's columns, then
    /// `archived_at` and `run_id`), recreated empty with every seed. The
    /// baseline and the reference then move the deleted rows into it in
    /// the same statement, as Cohort does.
    pub(crate) archive: Option<&'static str>,
}

/// The four strategies, in the order they are run.
pub(crate) const SCENARIOS: [Scenario; 4] = [
    Scenario {
        strategy: Strategy::Purge,
        label: "purge",
        table: "public.bench_purge",
        entity_id: "7d1c3e0a-5b2f-4c8e-9a41-0b6d2f3e4a51",
        category: "bench-purge",
        extra_columns: "body text NOT NULL",
        seed_columns: "body",
        seed_values: "'note ' || g",
        not_done: "",
        baseline_mutation: "DELETE FROM {table} t WHERE t.ctid = ANY (ARRAY(SELECT c.tid FROM c))",
        done_consistent: "0::int8",
        per_row: false,
        archive: None,
    },
    Scenario {
        strategy: Strategy::Archive,
        label: "archive",
        table: "public.bench_archive",
        entity_id: "9e4b2a61-7c3d-4f85-b1a0-3c5d7e9f1a54",
        category: "bench-archive",
        extra_columns: "body text NOT NULL",
        seed_columns: "body",
        seed_values: "'note ' || g",
        not_done: "",
        baseline_mutation: "DELETE FROM {table} t WHERE t.ctid = ANY (ARRAY(SELECT c.tid FROM c))",
        done_consistent: "(SELECT count(*) FROM public.bench_archive_store)",
        per_row: false,
        archive: Some("public.bench_archive_store"),
    },
    Scenario {
        strategy: Strategy::Anonymise,
        label: "anonymise",
        table: "public.bench_anonymise",
        entity_id: "2f6a9b14-8c3d-4e7f-a052-1d9e8b7c6a52",
        category: "bench-anonymise",
        extra_columns: "anonymised_at timestamptz, email text, full_name text NOT NULL, \
                        phone text NOT NULL",
        seed_columns: "email, full_name, phone",
        seed_values: "'person' || g || '@example.com', 'Person ' || g, '+44 20 7946 ' || g",
        not_done: " AND t.anonymised_at IS NULL",
        baseline_mutation: "UPDATE {table} t SET email = NULL, full_name = '', \
                            phone = '[redacted]', anonymised_at = pg_catalog.now() \
                            WHERE t.ctid = ANY (ARRAY(SELECT c.tid FROM c))",
        done_consistent: "count(*) FILTER (WHERE anonymised_at IS NOT NULL AND email IS NULL \
                          AND full_name = '' AND phone = '[redacted]')",
        per_row: true,
        archive: None,
    },
    Scenario {
        strategy: Strategy::SoftDelete,
        label: "soft_delete",
        table: "public.bench_soft_delete",
        entity_id: "c83e5f27-1a9b-4d6c-8e30-7f2a1b4c5d53",
        category: "bench-soft-delete",
        extra_columns: "is_deleted boolean NOT NULL DEFAULT false, deleted_at timestamptz, \
                        body text NOT NULL",
        seed_columns: "body",
        seed_values: "'ticket ' || g",
        not_done: " AND t.is_deleted IS NOT TRUE",
        baseline_mutation: "UPDATE {table} t SET is_deleted = TRUE, deleted_at = pg_catalog.now() \
                            WHERE t.ctid = ANY (ARRAY(SELECT c.tid FROM c))",
        done_consistent: "count(*) FILTER (WHERE is_deleted AND deleted_at IS NOT NULL)",
        per_row: false,
        archive: None,
    },
];

/// The active-hold test of row `t`, exactly as Cohort's statements write it
/// (`$entity` is the parameter holding the entity id).
pub(crate) fn held(entity_param: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM public.retention_hold h WHERE h.retention_entity_id = {entity_param} \
         AND h.record_id = t.id::text AND h.tenant_id = t.tenant_id::text \
         AND (h.released_at IS NULL OR h.released_at > pg_catalog.now()) \
         AND (h.expires_at IS NULL OR h.expires_at > pg_catalog.now()))"
    )
}

/// Counts describing a table after (or before) a sweep; two runs did the
/// same work when their states are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableState {
    /// Rows in the table.
    pub(crate) total: i64,
    /// Rows of the swept tenant.
    pub(crate) tenant_rows: i64,
    /// Rows not yet processed (for purge: every remaining row).
    pub(crate) not_done: i64,
    /// Processed rows whose columns are exactly as the strategy leaves them.
    pub(crate) done_consistent: i64,
    /// Rows of the swept tenant past the cutoff, not done, under an active hold.
    pub(crate) held: i64,
    /// Rows of the swept tenant past the cutoff, not done and not held: the
    /// work left (the expected `affected` before a sweep, 0 after).
    pub(crate) eligible: i64,
}

impl Scenario {
    /// The same scenario, with or without per-row audit.
    pub(crate) fn with_per_row(self, per_row: bool) -> Self {
        Scenario { per_row, ..self }
    }

    /// The rule provider with this scenario's single category.
    pub(crate) fn rules(&self) -> Result<StaticRuleProvider, String> {
        let period = Period::from_days(PERIOD_DAYS).map_err(|e| e.to_string())?;
        let mut rule = RetentionRule::new(period, self.strategy);
        if self.per_row {
            rule = rule
                .with_audit(cohort::AuditDetail::PerRow)
                .map_err(|e| e.to_string())?;
        }
        StaticRuleProvider::builder()
            .category(self.category, rule)
            .build()
            .map_err(|problems| {
                problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            })
    }

    /// The Cohort declaration of the table (markers use Cohort's default
    /// column names: `id`, `tenant_id`, `anonymised_at`, `is_deleted`, `deleted_at`).
    pub(crate) fn declaration(&self) -> EntityDeclaration {
        let d = EntityDeclaration::new(format!("Bench{}", self.label), self.entity_id)
            .category(self.category)
            .anchor("created_at")
            .table(self.table);
        if let Some(archive) = self.archive {
            return d.archive_to(archive);
        }
        match self.strategy {
            Strategy::Anonymise => d
                .anonymise("email", AnonymiseMethod::Null)
                .anonymise("full_name", AnonymiseMethod::Empty)
                .anonymise("phone", AnonymiseMethod::Literal("[redacted]".into())),
            _ => d,
        }
    }

    /// The entity id as a UUID.
    pub(crate) fn entity_uuid(&self) -> Uuid {
        Uuid::parse_str(self.entity_id).expect("constant entity ids are valid")
    }

    /// The mutation of the locked rows `c`, with the table name in place.
    pub(crate) fn baseline_mutation_sql(&self) -> String {
        self.baseline_mutation.replace("{table}", self.table)
    }

    /// For archive, the insert of the deleted rows `m` (every column) into
    /// the archive table, stamped with `run`: the second half of the fused
    /// statement.
    pub(crate) fn archive_insert_sql(&self, run: &str) -> Option<String> {
        self.archive.map(|archive| {
            format!("INSERT INTO {archive} SELECT m.*, pg_catalog.now(), {run} FROM m")
        })
    }

    /// The hand-written batch statement: `$1` tenant, `$2` cutoff, `$3`
    /// entity id, `$4` batch size.
    pub(crate) fn baseline_sql(&self) -> String {
        if let Some(insert) = self.archive_insert_sql(&format!("'{}'::uuid", Uuid::nil())) {
            return format!(
                "WITH c AS (SELECT t.ctid AS tid, t.id FROM {table} t WHERE t.tenant_id = $1 AND t.created_at < $2 \
                 AND NOT {held} ORDER BY t.created_at LIMIT $4 FOR UPDATE SKIP LOCKED), \
                 m AS ({mutation} RETURNING t.*) {insert}",
                table = self.table,
                held = held("$3"),
                mutation = self.baseline_mutation_sql(),
            );
        }
        format!(
            "WITH c AS (SELECT t.ctid AS tid, t.id FROM {table} t WHERE t.tenant_id = $1 AND t.created_at < $2{not_done} \
             AND NOT {held} ORDER BY t.created_at LIMIT $4 FOR UPDATE SKIP LOCKED) {mutation}",
            table = self.table,
            not_done = self.not_done,
            held = held("$3"),
            mutation = self.baseline_mutation_sql(),
        )
    }

    /// Drops and recreates the table, inserts `rows` rows with one
    /// `INSERT … SELECT FROM generate_series`, builds the
    /// `(tenant_id, created_at)` index, replaces all holds with this table's
    /// and analyses both tables.
    pub(crate) async fn seed(&self, pool: &PgPool, seed: &Seed<'_>, rows: u64) -> sqlx::Result<()> {
        let table = self.table;
        let ddl = format!(
            "DROP TABLE IF EXISTS {table}; \
             CREATE TABLE {table} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), seq bigint NOT NULL, \
             tenant_id uuid NOT NULL, created_at timestamptz, {extra}); \
             UPDATE public.retention_hold SET released_at = now() WHERE released_at IS NULL; \
             TRUNCATE public.retention_hold",
            extra = self.extra_columns,
        );
        let ddl = match self.archive {
            Some(archive) => format!(
                "{ddl}; DROP TABLE IF EXISTS {archive}; \
                 CREATE TABLE {archive} (id uuid PRIMARY KEY, seq bigint NOT NULL, \
                 tenant_id uuid NOT NULL, created_at timestamptz, {extra}, \
                 archived_at timestamptz NOT NULL, run_id uuid NOT NULL)",
                extra = self.extra_columns,
            ),
            None => ddl,
        };
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(pool).await?;

        let insert = format!(
            "INSERT INTO {table} (seq, tenant_id, created_at, {cols}) \
             SELECT g, ($1::uuid[])[(1 + g % pg_catalog.cardinality($1::uuid[]))::int], \
             $2::timestamptz - interval '{AGE_SPREAD_DAYS} days' * (g * 0.618033988749895::float8 \
             - pg_catalog.floor(g * 0.618033988749895::float8)), {vals} \
             FROM pg_catalog.generate_series(0::bigint, $3::bigint - 1) AS g",
            cols = self.seed_columns,
            vals = self.seed_values,
        );
        sqlx::query(AssertSqlSafe(insert))
            .bind(seed.tenants)
            .bind(seed.now)
            .bind(i64::try_from(rows).unwrap_or(i64::MAX))
            .execute(pool)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE INDEX ON {table} (tenant_id, created_at)"
        )))
        .execute(pool)
        .await?;

        let holds = format!(
            "INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, tenant_id, reason) \
             SELECT gen_random_uuid(), $1, t.id::text, t.tenant_id::text, 'cohort-bench hold' \
             FROM {table} t WHERE t.tenant_id = $2 AND t.created_at < $3 AND (t.seq / $4) % {HOLD_EVERY} = 0"
        );
        sqlx::query(AssertSqlSafe(holds))
            .bind(self.entity_uuid())
            .bind(seed.tenant())
            .bind(seed.cutoff)
            .bind(seed.tenants.len() as i64)
            .execute(pool)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ANALYZE {table}; ANALYZE public.retention_hold"
        )))
        .execute(pool)
        .await?;
        Ok(())
    }

    /// Measures the table.
    pub(crate) async fn state(&self, pool: &PgPool, seed: &Seed<'_>) -> sqlx::Result<TableState> {
        let sql = format!(
            "SELECT count(*) AS total, \
               count(*) FILTER (WHERE t.tenant_id = $1) AS tenant_rows, \
               count(*) FILTER (WHERE TRUE{not_done}) AS not_done, \
               {consistent} AS done_consistent, \
               count(*) FILTER (WHERE t.tenant_id = $1 AND t.created_at < $2{not_done} AND {held}) AS held, \
               count(*) FILTER (WHERE t.tenant_id = $1 AND t.created_at < $2{not_done} AND NOT {held}) AS eligible \
             FROM {table} t",
            table = self.table,
            not_done = self.not_done,
            consistent = self.done_consistent,
            held = held("$3"),
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(seed.tenant())
            .bind(seed.cutoff)
            .bind(self.entity_uuid())
            .fetch_one(pool)
            .await?;
        Ok(TableState {
            total: row.try_get("total")?,
            tenant_rows: row.try_get("tenant_rows")?,
            not_done: row.try_get("not_done")?,
            done_consistent: row.try_get::<i64, _>("done_consistent")?,
            held: row.try_get("held")?,
            eligible: row.try_get("eligible")?,
        })
    }
}

/// What every seed shares: the tenants, the logical time and the cutoff.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seed<'a> {
    /// All tenants; the first is the one swept.
    pub(crate) tenants: &'a [Uuid],
    /// Logical "now" of the sweeps (whole seconds, UTC).
    pub(crate) now: DateTime<Utc>,
    /// `now - 30 days`: rows anchored strictly before it are eligible.
    pub(crate) cutoff: DateTime<Utc>,
}

impl<'a> Seed<'a> {
    /// Rows for `tenants`, anchored back from now (whole seconds), with
    /// the scenarios' period as the cutoff.
    pub(crate) fn now(tenants: &'a [Uuid]) -> Self {
        let now = chrono::Utc::now().trunc_subsecs(0);
        Seed {
            tenants,
            now,
            cutoff: now - chrono::TimeDelta::days(PERIOD_DAYS),
        }
    }

    /// The swept tenant.
    pub(crate) fn tenant(&self) -> Uuid {
        self.tenants[0]
    }
}
