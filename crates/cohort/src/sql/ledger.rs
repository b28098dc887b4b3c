//! Cohort's own ledger statements (runs, summaries, details, holds),
//! built once for the configured schema.

use crate::ident::SqlText;
use crate::sql::tables::CohortTable;

/// Fixed ledger statements for Cohort's schema, built once.
#[derive(Debug, Clone)]
pub(crate) struct LedgerPlan {
    /// `$1` run id, `$2` kind, `$3` trigger, `$4` dry run, `$5` tenant, `$6`
    /// logical now, `$7` occurrence, `$8` its pass, `$9` its passes (NULL
    /// for runs that are not scheduled).
    pub(crate) insert_run: SqlText,
    /// A scheduled pass that failed before its run existed, recorded as a
    /// settled failed run of its occurrence. `$1` run id, `$2` dry run,
    /// `$3` tenant, `$4` occurrence (also the logical now), `$5` error,
    /// `$6` pass, `$7` passes.
    pub(crate) insert_not_started: SqlText,
    /// `$1` run id, `$2` status, `$3` error text, `$4` failures (JSON
    /// array of `{entity_id, entity, error}`). Returns settled_at.
    pub(crate) settle_run: SqlText,
    /// `$1` run, `$2` entity id, `$3` type, `$4` category, `$5` tenant,
    /// `$6` strategy, `$7` cutoff, `$8` period days, `$9` period secs,
    /// `$10` legal-min days, `$11` legal-min secs, `$12` source, `$13` reason.
    pub(crate) insert_summary: SqlText,
    /// `$1` summary id, `$2` affected increment.
    pub(crate) add_affected: SqlText,
    /// `$1` summary id, `$2` affected, `$3` held, `$4` skipped, `$5` null
    /// anchor, `$6` error, `$7` kept by legal minimum, `$8` kept by policy.
    pub(crate) finish_summary: SqlText,
    /// `$1` run, `$2` entity id, `$3` type, `$4` tenant, `$5` action, `$6` record ids (text[]).
    pub(crate) insert_details: SqlText,
    /// `$1` hold id, `$2` entity id, `$3` record id, `$4` tenant, `$5` reason,
    /// `$6` created at, `$7` expires at. Returns the hold; no row when
    /// `expires_at` is already past by the database clock.
    pub(crate) insert_hold: SqlText,
    /// `$1` entity id or NULL, `$2` tenant or NULL, `$3` active only.
    pub(crate) list_holds: SqlText,
    /// `$1` hold id. Returns the hold if it was active.
    pub(crate) release_hold: SqlText,
    /// `$1` hold id.
    pub(crate) get_hold: SqlText,
    /// The record ids of an entity's active holds, at most `$2` of them.
    /// `$1` entity id.
    pub(crate) active_holds: SqlText,
    /// Active holds among records (whatever tenant they were placed in).
    /// `$1` entity id, `$2` record ids (text[]). Returns the held record ids.
    pub(crate) held_records: SqlText,
}

const HOLD_COLUMNS: &str =
    " hold_id, retention_entity_id, record_id, tenant_id, reason, created_at, \
    expires_at, released_at, (released_at IS NULL OR released_at > pg_catalog.now()) \
    AND (expires_at IS NULL OR expires_at > pg_catalog.now()) AS active";

impl LedgerPlan {
    pub(crate) fn build(schema: &str) -> Self {
        let run = CohortTable::SweepRun.qualified(schema);
        let summary = CohortTable::EntitySummary.qualified(schema);
        let detail = CohortTable::RowDetail.qualified(schema);
        let mut insert_run = SqlText::new("INSERT INTO ");
        insert_run.table(&run).push(
            " (run_id, kind, trigger, dry_run, tenant_id, status, logical_now, started_at, \
               occurrence, occurrence_pass, occurrence_passes, policy_fingerprint) \
             VALUES ($1, $2, $3, $4, $5, 'started', $6, pg_catalog.clock_timestamp(), $7, $8, $9, $10) \
             RETURNING started_at",
        );
        let mut insert_not_started = SqlText::new("INSERT INTO ");
        insert_not_started.table(&run).push(
            " (run_id, kind, trigger, dry_run, tenant_id, status, logical_now, started_at, settled_at, \
               error, occurrence, occurrence_pass, occurrence_passes, policy_fingerprint) \
             VALUES ($1, 'sweep', 'scheduled', $2, $3, 'failed', $4, pg_catalog.clock_timestamp(), \
               pg_catalog.clock_timestamp(), $5, $4, $6, $7, $8)",
        );
        let mut settle_run = SqlText::new("UPDATE ");
        settle_run.table(&run).push(
            " SET status = $2, settled_at = pg_catalog.clock_timestamp(), error = $3, failures = $4 \
             WHERE run_id = $1 AND status = 'started' RETURNING settled_at",
        );
        let mut insert_summary = SqlText::new("INSERT INTO ");
        insert_summary.table(&summary).push(
            " (run_id, retention_entity_id, entity_type, category, tenant_id, strategy, cutoff, \
               resolved_period, legal_min, rule_source, rule_reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, \
               pg_catalog.make_interval(months => $8, days => $9, secs => $10), \
               CASE WHEN $11::int4 IS NULL THEN NULL \
                 ELSE pg_catalog.make_interval(months => $11, days => $12, secs => $13) END, \
               $14, $15) RETURNING summary_id",
        );
        let mut add_affected = SqlText::new("UPDATE ");
        add_affected.table(&summary).push(
            " SET affected_count = affected_count + $2, updated_at = pg_catalog.clock_timestamp() WHERE summary_id = $1",
        );
        let mut finish_summary = SqlText::new("UPDATE ");
        finish_summary.table(&summary).push(
            " SET affected_count = $2, held_count = $3, skipped_count = $4, null_anchor_count = $5, \
               error = $6, kept_by_legal_min_count = $7, kept_by_policy_count = $8, \
               updated_at = pg_catalog.clock_timestamp() WHERE summary_id = $1",
        );
        let mut insert_details = SqlText::new("INSERT INTO ");
        insert_details.table(&detail).push(
            " (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) \
             SELECT $1, $2, $3, r, $4, $5 FROM pg_catalog.unnest($6::text[]) AS r \
             RETURNING row_detail_id, record_id",
        );
        let hold = CohortTable::Hold.qualified(schema);
        let mut insert_hold = SqlText::new("INSERT INTO ");
        insert_hold
            .table(&hold)
            .push(
                " (hold_id, retention_entity_id, record_id, tenant_id, reason, created_at, expires_at) \
                 SELECT $1, $2, $3, $4, $5, $6, $7 \
                 WHERE $7::timestamptz IS NULL OR $7::timestamptz > pg_catalog.now() RETURNING",
            )
            .push(HOLD_COLUMNS);
        let mut list_holds = SqlText::new("SELECT");
        list_holds
            .push(HOLD_COLUMNS)
            .push(" FROM ")
            .table(&hold)
            .push(
                " WHERE ($1::uuid IS NULL OR retention_entity_id = $1) \
               AND ($2::text IS NULL OR tenant_id = $2) \
               AND (NOT $3 OR ((released_at IS NULL OR released_at > pg_catalog.now()) \
                    AND (expires_at IS NULL OR expires_at > pg_catalog.now()))) \
             ORDER BY created_at, hold_id LIMIT $4",
            );
        let mut release_hold = SqlText::new("UPDATE ");
        release_hold
            .table(&hold)
            .push(
                " SET released_at = pg_catalog.now() WHERE hold_id = $1 \
                 AND (released_at IS NULL OR released_at > pg_catalog.now()) RETURNING",
            )
            .push(HOLD_COLUMNS);
        let mut get_hold = SqlText::new("SELECT");
        get_hold
            .push(HOLD_COLUMNS)
            .push(" FROM ")
            .table(&hold)
            .push(" WHERE hold_id = $1");
        let mut held_records = SqlText::new("SELECT DISTINCT record_id FROM ");
        held_records.table(&hold).push(
            " WHERE retention_entity_id = $1 AND record_id = ANY($2::text[]) \
               AND (released_at IS NULL OR released_at > pg_catalog.now()) \
               AND (expires_at IS NULL OR expires_at > pg_catalog.now()) ORDER BY record_id",
        );
        let mut active_holds = SqlText::new("SELECT DISTINCT record_id FROM ");
        active_holds.table(&hold).push(
            " WHERE retention_entity_id = $1 \
               AND (released_at IS NULL OR released_at > pg_catalog.now()) \
               AND (expires_at IS NULL OR expires_at > pg_catalog.now()) LIMIT $2",
        );
        LedgerPlan {
            active_holds,
            held_records,
            insert_hold,
            list_holds,
            release_hold,
            get_hold,
            insert_run,
            insert_not_started,
            settle_run,
            insert_summary,
            add_affected,
            finish_summary,
            insert_details,
        }
    }
}
