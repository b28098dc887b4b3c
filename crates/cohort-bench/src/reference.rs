//! The in-server reference of SPEC §15: the fastest known way to do the
//! same work, a PL/pgSQL procedure looping one fused statement per batch
//! with a `COMMIT` after each, on the same table, index, batch size and
//! hold test. Like Cohort it continues each batch after the previous
//! batch's last `(created_at, id)`, so it never walks again past rows it
//! already finished, and when the scenario writes per-row audit it inserts
//! one detail row per changed row in the same statement: into Cohort's
//! `sweep_run_row_detail` (the ledger-shaped reference: its primary key,
//! indexes and foreign key to the run), or into a plain table without keys,
//! indexes or foreign keys (the plain reference, the fastest a loop can
//! write them). It writes no run or summary rows and reads no rows back
//! into a client.

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, PgConnection};
use uuid::Uuid;

use crate::scenario::Scenario;

/// The run the reference's per-row details hang from (a settled run row).
pub(crate) const REFERENCE_RUN: &str = "00000000-0000-4000-8000-00000000beef";

/// Where the reference writes its per-row details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Details {
    /// Cohort's ledger table, as Cohort writes them.
    Ledger,
    /// A plain table: no primary key, index or foreign key.
    Plain,
}

impl Details {
    fn table(self) -> &'static str {
        match self {
            Details::Ledger => "public.sweep_run_row_detail",
            Details::Plain => "public.bench_plain_detail",
        }
    }
}

fn procedure(scenario: &Scenario, details: Details) -> String {
    match details {
        Details::Ledger => format!("public.bench_reference_{}", scenario.label),
        Details::Plain => format!("public.bench_plain_reference_{}", scenario.label),
    }
}

/// Creates (or replaces) the scenario's procedure, and the run row its
/// per-row details reference (and, for the plain reference, its table).
pub(crate) async fn install(
    conn: &mut PgConnection,
    scenario: &Scenario,
    details: Details,
) -> sqlx::Result<()> {
    if details == Details::Plain {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS public.bench_plain_detail (run_id uuid, \
               retention_entity_id uuid, entity_type text, record_id text, tenant_id text, \
               action text, recorded_at timestamptz DEFAULT pg_catalog.now())",
        )
        .execute(&mut *conn)
        .await?;
    }
    let audit = if scenario.per_row {
        format!(
            ", d AS (INSERT INTO {table} \
               (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) \
               SELECT '{REFERENCE_RUN}', p_entity, 'reference', m.id::text, p_tenant::text, '{action}' FROM m)",
            table = details.table(),
            action = scenario.strategy.as_str()
        )
    } else {
        String::new()
    };
    // Archive: the deleted rows, every column, go into the archive table
    // in the same statement (as Cohort's fused statement does).
    let (returning, archive) =
        match scenario.archive_insert_sql(&format!("'{REFERENCE_RUN}'::uuid")) {
            Some(insert) => ("t.*", format!(", a AS ({insert})")),
            None => ("t.id", String::new()),
        };
    let sql = format!(
        "CREATE OR REPLACE PROCEDURE {name}(p_tenant uuid, p_cutoff timestamptz, p_entity uuid, \
           p_limit int, INOUT total bigint DEFAULT 0) LANGUAGE plpgsql AS $proc$ \
         DECLARE n bigint; last_at timestamptz := '-infinity'; last_id uuid := \
           '00000000-0000-0000-0000-000000000000'; next_at timestamptz; next_id uuid; \
         BEGIN \
           total := 0; \
           LOOP \
             WITH c AS (SELECT t.ctid AS tid, t.id, t.created_at FROM {table} t WHERE t.tenant_id = p_tenant \
                 AND t.created_at < p_cutoff{not_done} AND t.created_at >= last_at \
                 AND (t.created_at, t.id) > (last_at, last_id) AND NOT {held} \
                 ORDER BY t.created_at, t.id LIMIT p_limit FOR UPDATE SKIP LOCKED), \
               m AS ({mutation} RETURNING {returning}){archive}{audit}, \
               last AS (SELECT c.created_at, c.id FROM c ORDER BY c.created_at DESC, c.id DESC LIMIT 1) \
             SELECT (SELECT count(*) FROM m), (SELECT created_at FROM last), (SELECT id FROM last) \
               INTO n, next_at, next_id; \
             EXIT WHEN next_at IS NULL; \
             total := total + n; last_at := next_at; last_id := next_id; \
             COMMIT; \
           END LOOP; \
         END $proc$",
        name = procedure(scenario, details),
        table = scenario.table,
        not_done = scenario.not_done,
        held = crate::scenario::held("p_entity"),
        mutation = scenario.baseline_mutation_sql(),
    );
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, settled_at) \
         VALUES ($1, 'sweep', 'manual', false, 'succeeded', pg_catalog.now(), pg_catalog.now()) \
         ON CONFLICT DO NOTHING",
    )
    .bind(Uuid::parse_str(REFERENCE_RUN).expect("constant"))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Calls the procedure (outside any transaction block, so its `COMMIT`s
/// end each batch); returns the rows changed.
pub(crate) async fn run(
    conn: &mut PgConnection,
    scenario: &Scenario,
    details: Details,
    tenant: Uuid,
    cutoff: DateTime<Utc>,
    batch: u32,
) -> sqlx::Result<u64> {
    let total: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "CALL {}($1, $2, $3, $4, NULL)",
        procedure(scenario, details)
    )))
    .bind(tenant)
    .bind(cutoff)
    .bind(scenario.entity_uuid())
    .bind(i32::try_from(batch).unwrap_or(i32::MAX))
    .fetch_one(&mut *conn)
    .await?;
    Ok(total.max(0) as u64)
}
