//! Cohort's own ledger statements (runs, summaries, details; the holds'
//! are in `holds.rs`), built once for the configured schema.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::holds;
pub(crate) use super::holds::{ActiveHolds, HoldRow, InsertHold, ListHolds, SubjectHoldRow};
use super::statement::{Args, Params, Statement};
use crate::base::ident::{QualifiedName, SqlText};
use crate::sql::tables::CohortTable;

/// Fixed ledger statements for Cohort's schema, built once.
#[derive(Debug, Clone)]
pub(crate) struct LedgerPlan {
    /// The hold gate, shared (`sql::locks::hold_gate`): what every batch
    /// takes between its row locks and its hold re-check.
    pub(super) hold_gate: SqlText,
    /// `$1` run id, `$2` kind, `$3` trigger, `$4` dry run, `$5` tenant, `$6`
    /// logical now, `$7` occurrence, `$8` its pass, `$9` its passes (NULL
    /// for runs that are not scheduled).
    pub(super) insert_run: SqlText,
    /// A scheduled pass that failed before its run existed, recorded as a
    /// settled failed run of its occurrence. `$1` run id, `$2` dry run,
    /// `$3` tenant, `$4` occurrence (also the logical now), `$5` error,
    /// `$6` pass, `$7` passes.
    pub(super) insert_not_started: SqlText,
    /// `$1` run id, `$2` status, `$3` error text, `$4` failures (JSON
    /// array of `{entity_id, entity, error}`). Returns settled_at.
    pub(super) settle_run: SqlText,
    /// `$1` run, `$2` entity id, `$3` type, `$4` category, `$5` tenant,
    /// `$6` strategy, `$7` cutoff, `$8` period days, `$9` period secs,
    /// `$10` legal-min days, `$11` legal-min secs, `$12` source, `$13` reason.
    pub(super) insert_summary: SqlText,
    /// `$1` summary id, `$2` affected increment.
    pub(super) add_affected: SqlText,
    /// `add_affected` emitting `$3` as the transaction's CDC marker.
    pub(super) add_affected_marked: SqlText,
    /// What the sweep left in the table (see [`TableHealth`]).
    pub(super) table_health: SqlText,
    /// `$1` summary id, `$2` affected, `$3` held, `$4` skipped, `$5` null
    /// anchor, `$6` error, `$7` kept by legal minimum, `$8` kept by policy,
    /// `$9` held by subject, `$10` batch size, `$11` note.
    pub(super) finish_summary: SqlText,
    /// `$1` run, `$2` entity id, `$3` type, `$4` tenant, `$5` action, `$6` record ids (text[]).
    pub(super) insert_details: SqlText,
    /// `$1` hold id, `$2` entity id, `$3` record id, `$4` tenant, `$5` reason,
    /// `$6` created at, `$7` expires at. Returns the hold; no row when
    /// `expires_at` is already past by the database clock.
    pub(super) insert_hold: SqlText,
    /// `$1` entity id or NULL, `$2` tenant or NULL, `$3` active only.
    pub(super) list_holds: SqlText,
    /// `$1` hold id. Returns the hold if it was active.
    pub(super) release_hold: SqlText,
    /// `$1` hold id.
    pub(super) get_hold: SqlText,
    /// The record ids of an entity's active holds, at most `$2` of them.
    /// `$1` entity id.
    pub(super) active_holds: SqlText,
    /// Active subject holds' kinds and forms, at most `$1` of them.
    pub(super) active_subject_holds: SqlText,
}

impl LedgerPlan {
    pub(crate) fn build(schema: &str) -> Self {
        let run = CohortTable::SweepRun.qualified(schema);
        let summary = CohortTable::EntitySummary.qualified(schema);
        let detail = CohortTable::RowDetail.qualified(schema);
        let hold = CohortTable::Hold.qualified(schema);
        let t = Tables {
            run,
            summary,
            detail,
            hold,
        };
        LedgerPlan {
            insert_run: insert_run(&t),
            insert_not_started: insert_not_started(&t),
            settle_run: settle_run(&t),
            insert_summary: insert_summary(&t),
            add_affected: add_affected(&t),
            add_affected_marked: add_affected_marked(&t),
            table_health: table_health(&t),
            finish_summary: finish_summary(&t),
            insert_details: insert_details(&t),
            insert_hold: holds::insert_hold(&t.hold),
            list_holds: holds::list_holds(&t.hold),
            release_hold: holds::release_hold(&t.hold),
            get_hold: holds::get_hold(&t.hold),
            active_holds: holds::active_holds(&t.hold),
            active_subject_holds: holds::active_subject_holds(&t.hold),
            hold_gate: super::locks::hold_gate_sql(schema, true),
        }
    }
}

/// The tables the statements name.
struct Tables {
    run: QualifiedName,
    summary: QualifiedName,
    detail: QualifiedName,
    hold: QualifiedName,
}

/// The statement of [`LedgerPlan::insert_run`].
fn insert_run(t: &Tables) -> SqlText {
    let mut insert_run = SqlText::new("INSERT INTO ");
    insert_run.table(&t.run).push(
        " (run_id, kind, trigger, dry_run, tenant_id, status, logical_now, started_at, \
           occurrence, occurrence_pass, occurrence_passes, policy_fingerprint, erasure_subject_kind) \
         VALUES ($1, $2, $3, $4, $5, 'started', $6, pg_catalog.clock_timestamp(), $7, $8, $9, $10, $11) \
         RETURNING started_at",
    );
    insert_run
}

/// A row detail: its id and the record it is about (what an audited
/// statement, the detail insert and a purged partition's detail page
/// return).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DetailRow {
    pub(crate) row_detail_id: i64,
    pub(crate) record_id: String,
}

/// A run as settled: what the statements that settle one return.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SettledRow {
    pub(crate) kind: String,
    pub(crate) trigger: String,
    pub(crate) settled_at: chrono::DateTime<chrono::Utc>,
}

/// The statement of [`LedgerPlan::insert_not_started`].
fn insert_not_started(t: &Tables) -> SqlText {
    let mut insert_not_started = SqlText::new("INSERT INTO ");
    insert_not_started.table(&t.run).push(
        " (run_id, kind, trigger, dry_run, tenant_id, status, logical_now, started_at, settled_at, \
           error, occurrence, occurrence_pass, occurrence_passes, policy_fingerprint) \
         VALUES ($1, 'sweep', 'scheduled', $2, $3, 'failed', $4, pg_catalog.clock_timestamp(), \
           pg_catalog.clock_timestamp(), $5, $4, $6, $7, $8) \
         RETURNING kind, trigger, settled_at",
    );
    insert_not_started
}

/// The statement of [`LedgerPlan::settle_run`].
fn settle_run(t: &Tables) -> SqlText {
    let mut settle_run = SqlText::new("UPDATE ");
    settle_run.table(&t.run).push(
        " SET status = $2, settled_at = pg_catalog.clock_timestamp(), error = $3, failures = $4 \
         WHERE run_id = $1 AND status = 'started' RETURNING kind, trigger, settled_at",
    );
    settle_run
}

/// The statement of [`LedgerPlan::insert_summary`].
fn insert_summary(t: &Tables) -> SqlText {
    let mut insert_summary = SqlText::new("INSERT INTO ");
    insert_summary.table(&t.summary).push(
        " (run_id, retention_entity_id, entity_type, category, tenant_id, strategy, cutoff, \
           resolved_period, legal_min, rule_source, rule_reason, stage) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, \
           pg_catalog.make_interval(months => $8, days => $9, secs => $10), \
           CASE WHEN $11::int4 IS NULL THEN NULL \
             ELSE pg_catalog.make_interval(months => $11, days => $12, secs => $13) END, \
           $14, $15, $16) RETURNING summary_id",
    );
    insert_summary
}

/// The statement of [`LedgerPlan::add_affected`].
fn add_affected(t: &Tables) -> SqlText {
    let mut add_affected = SqlText::new("UPDATE ");
    add_affected.table(&t.summary).push(
        " SET affected_count = affected_count + $2, updated_at = pg_catalog.clock_timestamp() WHERE summary_id = $1",
    );
    add_affected
}

/// The statement of [`LedgerPlan::add_affected_marked`]: the message is
/// emitted by a one-row subquery the update joins, once per statement.
fn add_affected_marked(t: &Tables) -> SqlText {
    let mut s = SqlText::new("UPDATE ");
    s.table(&t.summary).push(
        " s SET affected_count = s.affected_count + $2, updated_at = pg_catalog.clock_timestamp() \
         FROM (SELECT pg_catalog.pg_logical_emit_message(true, 'cohort', $3::text) AS lsn) m \
         WHERE s.summary_id = $1",
    );
    s
}

/// The statement of [`LedgerPlan::table_health`].
fn table_health(t: &Tables) -> SqlText {
    let mut s = SqlText::new("UPDATE ");
    s.table(&t.summary).push(
        " SET dead_tuples_before = $2, dead_tuples_after = $3, table_bytes_before = $4, \
           table_bytes_after = $5, vacuumed = $6, throttled_ms = $7 WHERE summary_id = $1",
    );
    s
}

/// The statement of [`LedgerPlan::finish_summary`].
fn finish_summary(t: &Tables) -> SqlText {
    let mut finish_summary = SqlText::new("UPDATE ");
    finish_summary.table(&t.summary).push(
        " SET affected_count = $2, held_count = $3, skipped_count = $4, null_anchor_count = $5, \
           error = $6, kept_by_legal_min_count = $7, kept_by_policy_count = $8, \
           held_by_subject_count = $9, batch_size = $10, note = $11, paused = $12, \
           lag_waited_ms = $13, updated_at = pg_catalog.clock_timestamp() WHERE summary_id = $1",
    );
    finish_summary
}

/// The statement of [`LedgerPlan::insert_details`].
fn insert_details(t: &Tables) -> SqlText {
    let mut insert_details = SqlText::new("INSERT INTO ");
    insert_details.table(&t.detail).push(
        " (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) \
         SELECT $1, $2, $3, r, $4, $5 FROM pg_catalog.unnest($6::text[]) AS r \
         RETURNING row_detail_id, record_id",
    );
    insert_details
}

/// A run's first row (`insert_run`); the occurrence fields are `None` for
/// runs that are not scheduled.
#[derive(Debug)]
pub(crate) struct InsertRun {
    pub(crate) run_id: Uuid,
    pub(crate) kind: &'static str,
    pub(crate) trigger: &'static str,
    pub(crate) dry_run: bool,
    pub(crate) tenant: Option<String>,
    pub(crate) logical_now: DateTime<Utc>,
    pub(crate) occurrence: Option<DateTime<Utc>>,
    pub(crate) pass: Option<i32>,
    pub(crate) passes: Option<i32>,
    pub(crate) policy_fingerprint: Option<String>,
    /// An erasure's subject kind, if it named one.
    pub(crate) erasure_subject_kind: Option<String>,
}

impl Params for InsertRun {
    fn bind(self, q: Args) -> Args {
        q.bind(self.run_id)
            .bind(self.kind)
            .bind(self.trigger)
            .bind(self.dry_run)
            .bind(self.tenant)
            .bind(self.logical_now)
            .bind(self.occurrence)
            .bind(self.pass)
            .bind(self.passes)
            .bind(self.policy_fingerprint)
            .bind(self.erasure_subject_kind)
    }
}

/// A scheduled pass that failed before its run existed.
#[derive(Debug)]
pub(crate) struct InsertNotStarted {
    pub(crate) run_id: Uuid,
    pub(crate) dry_run: bool,
    pub(crate) tenant: Option<String>,
    pub(crate) occurrence: DateTime<Utc>,
    pub(crate) error: String,
    pub(crate) pass: i32,
    pub(crate) passes: i32,
    pub(crate) policy_fingerprint: String,
}

impl Params for InsertNotStarted {
    fn bind(self, q: Args) -> Args {
        q.bind(self.run_id)
            .bind(self.dry_run)
            .bind(self.tenant)
            .bind(self.occurrence)
            .bind(self.error)
            .bind(self.pass)
            .bind(self.passes)
            .bind(self.policy_fingerprint)
    }
}

/// Settles a run still `started`.
#[derive(Debug, Clone)]
pub(crate) struct SettleRun {
    pub(crate) run_id: Uuid,
    pub(crate) status: &'static str,
    pub(crate) error: Option<String>,
    /// A JSON array of `{entity_id, entity, error}`.
    pub(crate) failures: serde_json::Value,
}

impl Params for SettleRun {
    fn bind(self, q: Args) -> Args {
        q.bind(self.run_id)
            .bind(self.status)
            .bind(self.error)
            .bind(self.failures)
    }
}

/// A period as the ledger stores it: calendar months, whole days and the
/// seconds left over (PostgreSQL's `make_interval` arguments).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct IntervalParts {
    pub(crate) months: i32,
    pub(crate) days: i32,
    pub(crate) secs: f64,
}

/// An entity's summary row, written before its first batch.
#[derive(Debug)]
pub(crate) struct InsertSummary {
    pub(crate) run_id: Uuid,
    pub(crate) entity_id: Uuid,
    pub(crate) entity: String,
    pub(crate) category: String,
    pub(crate) tenant: Option<String>,
    pub(crate) strategy: &'static str,
    pub(crate) cutoff: Option<DateTime<Utc>>,
    pub(crate) period: IntervalParts,
    pub(crate) legal_min: Option<IntervalParts>,
    pub(crate) rule_source: Option<String>,
    pub(crate) rule_reason: Option<String>,
    /// The stage's position in a category with stages (1 first).
    pub(crate) stage: Option<i16>,
}

impl Params for InsertSummary {
    fn bind(self, q: Args) -> Args {
        let legal = self.legal_min;
        q.bind(self.run_id)
            .bind(self.entity_id)
            .bind(self.entity)
            .bind(self.category)
            .bind(self.tenant)
            .bind(self.strategy)
            .bind(self.cutoff)
            .bind(self.period.months)
            .bind(self.period.days)
            .bind(self.period.secs)
            .bind(legal.map(|l| l.months))
            .bind(legal.map_or(0, |l| l.days))
            .bind(legal.map_or(0.0, |l| l.secs))
            .bind(self.rule_source)
            .bind(self.rule_reason)
            .bind(self.stage)
    }
}

/// Adds a batch's rows to a summary's affected count.
#[derive(Debug, Clone)]
pub(crate) struct AddAffected {
    pub(crate) summary_id: i64,
    pub(crate) rows: i64,
    /// With `cdc_marker`: the content of the transaction's logical
    /// decoding message (JSON), emitted by the same statement.
    pub(crate) marker: Option<String>,
}

impl Params for AddAffected {
    fn bind(self, q: Args) -> Args {
        let q = q.bind(self.summary_id).bind(self.rows);
        match self.marker {
            Some(content) => q.bind(content),
            None => q,
        }
    }
}

/// A summary's final counts.
#[derive(Debug)]
pub(crate) struct FinishSummary {
    pub(crate) summary_id: i64,
    pub(crate) affected: i64,
    pub(crate) held: i64,
    pub(crate) held_by_subject: i64,
    pub(crate) skipped: i64,
    pub(crate) null_anchor: i64,
    pub(crate) error: Option<String>,
    pub(crate) kept_by_legal_min: i64,
    pub(crate) kept_by_policy: i64,
    /// The largest batch limit the entity's batches used (`None`: no batch).
    pub(crate) batch_size: Option<i32>,
    /// Why rows left will not go by themselves (`EntityOutcome::note`).
    pub(crate) note: Option<String>,
    /// A pause stopped the entity.
    pub(crate) paused: bool,
    /// Time waited for standbys (`None`: no lag limit applied).
    pub(crate) lag_waited_ms: Option<i64>,
}

impl Params for FinishSummary {
    fn bind(self, q: Args) -> Args {
        q.bind(self.summary_id)
            .bind(self.affected)
            .bind(self.held)
            .bind(self.skipped)
            .bind(self.null_anchor)
            .bind(self.error)
            .bind(self.kept_by_legal_min)
            .bind(self.kept_by_policy)
            .bind(self.held_by_subject)
            .bind(self.batch_size)
            .bind(self.note)
            .bind(self.paused)
            .bind(self.lag_waited_ms)
    }
}

/// What a sweep left in its table: dead tuples and size (bytes) before
/// its batches and after them, what `vacuum_after` ran, and how long a
/// paced sweep waited.
#[derive(Debug, Clone)]
pub(crate) struct TableHealth {
    pub(crate) summary_id: i64,
    pub(crate) dead_tuples_before: i64,
    pub(crate) dead_tuples_after: i64,
    pub(crate) bytes_before: i64,
    pub(crate) bytes_after: i64,
    pub(crate) vacuumed: Option<&'static str>,
    /// Milliseconds a paced sweep waited between batches.
    pub(crate) throttled_ms: Option<i64>,
}

impl Params for TableHealth {
    fn bind(self, q: Args) -> Args {
        q.bind(self.summary_id)
            .bind(self.dead_tuples_before)
            .bind(self.dead_tuples_after)
            .bind(self.bytes_before)
            .bind(self.bytes_after)
            .bind(self.vacuumed)
            .bind(self.throttled_ms)
    }
}

/// One detail row per changed record of a batch.
#[derive(Debug)]
pub(crate) struct InsertDetails {
    pub(crate) run_id: Uuid,
    pub(crate) entity_id: Uuid,
    pub(crate) entity: String,
    pub(crate) tenant: Option<String>,
    pub(crate) action: &'static str,
    pub(crate) record_ids: Vec<String>,
}

impl Params for InsertDetails {
    fn bind(self, q: Args) -> Args {
        q.bind(self.run_id)
            .bind(self.entity_id)
            .bind(self.entity)
            .bind(self.tenant)
            .bind(self.action)
            .bind(self.record_ids)
    }
}

impl LedgerPlan {
    /// Writes a run's `started` row; returns `started_at`.
    pub(crate) fn insert_run(&self, p: InsertRun) -> Statement<InsertRun> {
        Statement::new(self.insert_run.clone(), p)
    }

    /// Records a scheduled pass that failed before its run existed.
    pub(crate) fn insert_not_started(&self, p: InsertNotStarted) -> Statement<InsertNotStarted> {
        Statement::new(self.insert_not_started.clone(), p)
    }

    /// Settles a run; returns `settled_at` (no row if it had settled).
    pub(crate) fn settle_run(&self, p: SettleRun) -> Statement<SettleRun> {
        Statement::new(self.settle_run.clone(), p)
    }

    /// Writes an entity's summary; returns `summary_id`.
    pub(crate) fn insert_summary(&self, p: InsertSummary) -> Statement<InsertSummary> {
        Statement::new(self.insert_summary.clone(), p)
    }

    /// Takes the hold gate shared, for the batch's transaction.
    pub(crate) fn hold_gate(&self) -> Statement<()> {
        Statement::new(self.hold_gate.clone(), ())
    }

    /// Adds a batch's rows to the summary; with a marker, emits it in the
    /// same statement as the transaction's one logical decoding message
    /// (`pg_logical_emit_message`, transactional, prefix `cohort`), so a
    /// CDC consumer decodes it with the batch's changes, at its commit.
    pub(crate) fn add_affected(&self, p: AddAffected) -> Statement<AddAffected> {
        let text = match p.marker {
            Some(_) => self.add_affected_marked.clone(),
            None => self.add_affected.clone(),
        };
        Statement::new(text, p)
    }

    /// Writes a summary's final counts.
    pub(crate) fn finish_summary(&self, p: FinishSummary) -> Statement<FinishSummary> {
        Statement::new(self.finish_summary.clone(), p)
    }

    /// Records what the sweep left in the entity's table.
    pub(crate) fn table_health(&self, p: TableHealth) -> Statement<TableHealth> {
        Statement::new(self.table_health.clone(), p)
    }

    /// Writes a batch's detail rows; returns `row_detail_id, record_id`.
    pub(crate) fn insert_details(&self, p: InsertDetails) -> Statement<InsertDetails> {
        Statement::new(self.insert_details.clone(), p)
    }
}

impl LedgerPlan {
    /// Places a hold; returns it (no row when its expiry is already past).
    pub(crate) fn insert_hold(&self, p: InsertHold) -> Statement<InsertHold> {
        Statement::new(self.insert_hold.clone(), p)
    }

    /// Holds by entity, tenant and activity, oldest first.
    pub(crate) fn list_holds(&self, p: ListHolds) -> Statement<ListHolds> {
        Statement::new(self.list_holds.clone(), p)
    }

    /// Releases a hold still active; returns it.
    pub(crate) fn release_hold(&self, hold_id: Uuid) -> Statement<(Uuid,)> {
        Statement::new(self.release_hold.clone(), (hold_id,))
    }

    /// One hold.
    pub(crate) fn get_hold(&self, hold_id: Uuid) -> Statement<(Uuid,)> {
        Statement::new(self.get_hold.clone(), (hold_id,))
    }

    /// The active subject holds' kinds and forms, at most `limit`.
    pub(crate) fn active_subject_holds(&self, limit: i64) -> Statement<(i64,)> {
        Statement::new(self.active_subject_holds.clone(), (limit,))
    }

    /// The record ids of an entity's active holds (column `record_id`).
    pub(crate) fn active_holds(&self, p: ActiveHolds) -> Statement<ActiveHolds> {
        Statement::new(self.active_holds.clone(), p)
    }
}
