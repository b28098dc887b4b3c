//! The run recorder: everything a run tells the outside, in one place.
//! The ledger's rows (the run's `Started` and settled row, each entity's
//! summary), the metrics, the log lines and the observers' events are
//! written here, in the order the executor reaches each step; the
//! executor decides what happens, the recorder says so.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::work::{stop_from, RunSpec, Stop, Work};
use super::{EntityFailure, EntityOutcome, RunKind, RunStatus};
use crate::context::{Context, Prepared};
use crate::domain::model::EntityDescriptor;
use crate::domain::observer::AuditEvent;
use crate::domain::rules::Strategy;
use crate::error::Result;
use crate::sql::ledger;

/// A batch as committed, for [`RunRecorder::batch_committed`].
pub(crate) struct CommittedBatch {
    /// Rows changed.
    pub(crate) rows: u64,
    /// From the batch's start to its commit.
    pub(crate) took: std::time::Duration,
    /// Rows changed so far by the entity (every lane of it).
    pub(crate) total: u64,
    /// The changed keys, when row details were written.
    pub(crate) per_row: Option<Vec<String>>,
}

/// Records one run.
pub(crate) struct RunRecorder<'a> {
    cx: &'a Context,
    ready: &'a Prepared,
    run_id: Uuid,
    spec: &'a RunSpec,
    clock: std::time::Instant,
}

impl<'a> RunRecorder<'a> {
    pub(crate) fn new(
        cx: &'a Context,
        ready: &'a Prepared,
        run_id: Uuid,
        spec: &'a RunSpec,
    ) -> Self {
        RunRecorder {
            cx,
            ready,
            run_id,
            spec,
            clock: std::time::Instant::now(),
        }
    }

    /// Commits the `Started` row (on the run's connection, which holds the
    /// run lock), then logs and emits `Started`. Returns when it started.
    pub(crate) async fn started(
        &self,
        conn: &mut PgConnection,
        entities: usize,
    ) -> std::result::Result<DateTime<Utc>, sqlx::Error> {
        let spec = self.spec;
        let insert = ledger::InsertRun {
            run_id: self.run_id,
            kind: spec.kind.as_str(),
            trigger: spec.trigger.as_str(),
            dry_run: spec.dry_run,
            tenant: spec.tenant.clone(),
            logical_now: spec.now,
            occurrence: spec.occurrence.map(|o| o.at),
            pass: spec.occurrence.map(|o| o.pass),
            passes: spec.occurrence.map(|o| o.passes),
            policy_fingerprint: Some(crate::run::peers::fingerprint(self.cx, self.ready)),
            erasure_subject_kind: spec.erasure_kind.clone(),
        };
        let started_at = self
            .ready
            .ledger
            .insert_run(insert)
            .query_scalar::<DateTime<Utc>>()
            .fetch_one(&mut *conn)
            .await?;
        tracing::info!(entities, now = %spec.now, "run started");
        self.cx.observers.emit(AuditEvent::Started {
            run_id: self.run_id,
            kind: spec.kind,
            trigger: spec.trigger,
            dry_run: spec.dry_run,
            tenant: spec.tenant.clone(),
            now: spec.now,
        });
        Ok(started_at)
    }

    /// An entity that did not run (its rows are left alone): its backlog
    /// is not measured this pass.
    pub(crate) fn entity_not_run(&self, work: &Work<'_>) {
        if self.spec.kind == RunKind::Sweep {
            crate::domain::telemetry::backlog_unmeasured(
                &work.entity.name,
                self.backlog_scope(work),
            );
        }
    }

    /// A committed batch of `entity`: the batch and row metrics, then the
    /// observers' progress and, with row details, the batch's rows.
    pub(crate) fn batch_committed(
        &self,
        entity: &EntityDescriptor,
        strategy: Strategy,
        batch: CommittedBatch,
    ) {
        crate::domain::telemetry::batch(batch.took);
        crate::domain::telemetry::rows(&entity.name, strategy, "affected", batch.rows);
        self.progress(entity, strategy, batch.rows, batch.total);
        if let Some(record_ids) = batch.per_row {
            self.rows_changed(entity, strategy, self.spec.tenant.clone(), record_ids);
        }
    }

    /// An expired partition dropped or emptied whole: the row metric, the
    /// log line, the observers' progress.
    pub(crate) fn partition_purged(
        &self,
        entity: &EntityDescriptor,
        partition: &str,
        rows: u64,
        tenants: Option<&str>,
        total: u64,
    ) {
        crate::domain::telemetry::rows(&entity.name, Strategy::Purge, "affected", rows);
        tracing::info!(entity = %entity.name, partition, rows, tenants = tenants.unwrap_or("-"), "expired partition purged");
        self.progress(entity, Strategy::Purge, rows, total);
    }

    /// Whether anything hears the rows a run changed (an observer): when
    /// nothing does, they are not read back for it.
    pub(crate) fn hears_rows(&self) -> bool {
        !self.cx.observers.is_empty()
    }

    /// The keys of rows changed (`RowDetail`), for the observers.
    pub(crate) fn rows_changed(
        &self,
        entity: &EntityDescriptor,
        action: Strategy,
        tenant: Option<String>,
        record_ids: Vec<String>,
    ) {
        self.cx.observers.emit(AuditEvent::RowDetail {
            run_id: self.run_id,
            entity_id: entity.id,
            tenant,
            record_ids,
            action,
        });
    }

    fn progress(&self, entity: &EntityDescriptor, strategy: Strategy, batch: u64, total: u64) {
        self.cx.observers.emit(AuditEvent::EntityProgress {
            run_id: self.run_id,
            entity_id: entity.id,
            strategy,
            batch,
            total,
        });
    }

    /// Opens the entity's summary row; returns its id.
    pub(crate) async fn entity_opened(
        &self,
        conn: &mut PgConnection,
        work: &Work<'_>,
    ) -> std::result::Result<i64, Stop> {
        let e = work.entity;
        let split = |p: crate::domain::rules::Period| ledger::IntervalParts {
            months: p.months(),
            days: (p.fixed_seconds() / 86_400) as i32,
            secs: (p.fixed_seconds() % 86_400) as f64,
        };
        let summary = ledger::InsertSummary {
            run_id: self.run_id,
            entity_id: e.id,
            entity: e.name.clone(),
            category: e.category.clone(),
            tenant: self.spec.tenant.clone(),
            strategy: work.rule.strategy().as_str(),
            cutoff: work.cutoff,
            period: split(work.rule.period()),
            legal_min: work.rule.legal_min().map(split),
            rule_source: work.rule.source().map(str::to_owned),
            rule_reason: work.rule.reason().map(str::to_owned),
            stage: work.stage.map(|n| n as i16),
        };
        self.ready
            .ledger
            .insert_summary(summary)
            .query_scalar()
            .fetch_one(&mut *conn)
            .await
            .map_err(stop_from)
    }

    /// Writes the entity's final counts to its summary row, and once it is
    /// committed emits `EntitySummary` (failed entities included).
    pub(crate) async fn entity_finished(
        &self,
        conn: &mut PgConnection,
        work: &Work<'_>,
        summary_id: i64,
        out: &EntityOutcome,
        error: Option<String>,
    ) -> std::result::Result<(), sqlx::Error> {
        let e = work.entity;
        self.ready
            .ledger
            .finish_summary(ledger::FinishSummary {
                summary_id,
                affected: out.affected as i64,
                held: out.held as i64,
                held_by_subject: out.held_by_subject as i64,
                skipped: out.skipped as i64,
                null_anchor: out.null_anchor as i64,
                error: error.clone(),
                kept_by_legal_min: out.kept_by_legal_min as i64,
                kept_by_policy: out.kept_by_policy as i64,
                batch_size: out.batch_size.and_then(|n| i32::try_from(n).ok()),
                note: out.note.clone(),
                paused: out.paused,
                lag_waited_ms: out.lag_waited_ms.map(|ms| ms as i64),
            })
            .query()
            .execute(&mut *conn)
            .await?;
        self.cx.observers.emit(AuditEvent::EntitySummary {
            run_id: self.run_id,
            entity_id: e.id,
            entity: e.name.clone(),
            category: e.category.clone(),
            strategy: work.rule.strategy(),
            stage: work.stage,
            period: work.rule.period(),
            legal_min: work.rule.legal_min(),
            cutoff: work.cutoff,
            rule_source: work.rule.source().map(str::to_owned),
            rule_reason: work.rule.reason().map(str::to_owned),
            affected: out.affected,
            held: out.held,
            held_by_subject: out.held_by_subject,
            skipped: out.skipped,
            null_anchor: out.null_anchor,
            kept_by_legal_min: out.kept_by_legal_min,
            kept_by_policy: out.kept_by_policy,
            error,
        });
        Ok(())
    }

    /// The entity's outcome in the log and the metrics: info when all went
    /// as designed; warn for rows left although eligible (skipped) and for
    /// an erasure's subject rows kept by a hold; error for a failure (its
    /// sanitised diagnostic; the full error was logged under the same id).
    /// A failed sweep entity's backlog is not measured this pass.
    pub(crate) fn entity_reported(
        &self,
        work: &Work<'_>,
        out: &EntityOutcome,
        result: &std::result::Result<(), Stop>,
    ) {
        let spec = self.spec;
        if !spec.dry_run {
            // `affected` was counted as each batch committed.
            crate::domain::telemetry::entity_settled(out);
        }
        let (affected, held, skipped, null_anchor) =
            (out.affected, out.held, out.skipped, out.null_anchor);
        match result {
            Err(Stop::Entity(d)) => tracing::error!(
                affected,
                error = %d,
                "entity failed; its committed batches stay and the run goes on"
            ),
            Err(Stop::Cancelled) => tracing::warn!(affected, "entity cancelled"),
            Err(Stop::Run(_)) => tracing::error!(affected, "run failed during this entity"),
            Ok(()) if out.paused => tracing::warn!(
                affected,
                skipped,
                note = out.note.as_deref().unwrap_or_default(),
                "entity paused (cohort pause): its eligible rows are left until cohort resume"
            ),
            Ok(()) if skipped > 0 => tracing::warn!(
                affected,
                held,
                skipped,
                null_anchor,
                "eligible rows skipped (still referenced, a failed before-handler, or a partition that could not be locked); the next run retries them"
            ),
            Ok(()) if held > 0 && spec.kind == RunKind::Erasure => tracing::warn!(
                affected,
                held,
                "the subject's rows under a legal hold were kept"
            ),
            Ok(()) => tracing::info!(affected, held, skipped, null_anchor, "entity done"),
        }
        if result.is_err() {
            self.entity_not_run(work);
        }
    }

    /// Sets the entity's `cohort_entity_backlog_age_seconds` for this pass
    /// (tenant and stage) from one indexed read of its oldest
    /// still-eligible row, when the run is a sweep and the gauge is on. A
    /// failed read is logged and changes nothing else: the run's outcome
    /// never depends on a metric.
    pub(crate) async fn backlog(&self, conn: &mut PgConnection, work: &Work<'_>) {
        if self.spec.kind != RunKind::Sweep || !self.cx.backlog_gauge {
            return;
        }
        let Some(cutoff) = work.cutoff else {
            return;
        };
        match super::counts::oldest_eligible(conn, work).await {
            Ok(oldest) => crate::domain::telemetry::backlog(
                &work.entity.name,
                self.backlog_scope(work),
                crate::domain::telemetry::backlog_age(cutoff, oldest),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "reading the entity's backlog failed; its gauge keeps its last value");
                self.entity_not_run(work);
            }
        }
    }

    /// The pass a backlog belongs to: the run's tenant and the work's stage.
    fn backlog_scope(&self, work: &Work<'_>) -> String {
        format!(
            "{}/{}",
            self.spec.tenant.as_deref().unwrap_or(""),
            work.stage.unwrap_or(0)
        )
    }

    /// Writes the terminal status (on the run's connection or, if that is
    /// gone, on a fresh one), then the metrics, the log line and
    /// `Settled`. `error` is the run's error text: entity failures first
    /// ("entity <id>: <diagnostic>", read back by `runs show`), then the
    /// run-level failure. Returns when it settled.
    pub(crate) async fn settled(
        &self,
        conn: &mut PgConnection,
        status: RunStatus,
        error: Option<&str>,
        (outcomes, failures): (&[EntityOutcome], &[EntityFailure]),
    ) -> Result<DateTime<Utc>> {
        let spec = self.spec;
        let at = self.settle_row(conn, status, error, failures).await?;
        let took = self.clock.elapsed();
        crate::domain::telemetry::run_settled(spec.kind, spec.trigger, status, took);
        if status == RunStatus::Succeeded && !spec.dry_run {
            crate::domain::telemetry::last_success(spec.kind, at);
        }
        let affected: u64 = outcomes.iter().map(|o| o.affected).sum();
        let duration_ms = took.as_millis() as u64;
        match status {
            RunStatus::Succeeded => {
                tracing::info!(
                    status = status.as_str(),
                    affected,
                    duration_ms,
                    "run settled"
                )
            }
            RunStatus::Cancelled | RunStatus::Paused => {
                tracing::warn!(
                    status = status.as_str(),
                    affected,
                    duration_ms,
                    "run settled"
                )
            }
            _ => tracing::error!(
                status = status.as_str(),
                affected,
                failures = failures.len(),
                error = error.unwrap_or(""),
                duration_ms,
                "run settled"
            ),
        }
        let total = |f: fn(&EntityOutcome) -> u64| outcomes.iter().map(f).sum::<u64>();
        self.cx.observers.emit(AuditEvent::Settled {
            run_id: self.run_id,
            kind: spec.kind,
            status,
            duration_ms,
            affected,
            held: total(|o| o.held),
            skipped: total(|o| o.skipped),
            null_anchor: total(|o| o.null_anchor),
            kept_by_legal_min: total(|o| o.kept_by_legal_min),
            kept_by_policy: total(|o| o.kept_by_policy),
            error: error.map(str::to_owned),
        });
        Ok(at)
    }

    /// The settled row itself, and its link in the ledger's hash chain,
    /// in one transaction.
    async fn settle_row(
        &self,
        conn: &mut PgConnection,
        status: RunStatus,
        error: Option<&str>,
        failures: &[EntityFailure],
    ) -> Result<DateTime<Utc>> {
        let structured = serde_json::to_value(failures).expect("failures serialise");
        let settle = ledger::SettleRun {
            run_id: self.run_id,
            status: status.as_str(),
            error: error.map(str::to_owned),
            failures: structured,
        };
        match self.settle_once(&mut *conn, settle.clone()).await {
            Ok(at) => Ok(at),
            Err(first) => {
                tracing::warn!(run_id = %self.run_id, error = %first, "settling on the run connection failed; retrying on a new connection");
                let mut fresh = self.cx.pool.acquire().await?;
                Ok(self.settle_once(&mut fresh, settle).await?)
            }
        }
    }

    async fn settle_once(
        &self,
        conn: &mut PgConnection,
        settle: ledger::SettleRun,
    ) -> std::result::Result<DateTime<Utc>, sqlx::Error> {
        let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
        let chain = (
            self.cx.config.schema.as_str(),
            self.cx.config.ledger_key.as_ref(),
        );
        let settling = super::chain::Settling::Ran(settle);
        let row = super::chain::settle_run(&mut tx, self.ready, chain, self.run_id, settling)
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        tx.commit().await?;
        Ok(row.settled_at)
    }
}
