//! The run executor, shared by sweeps and erasure: the run's advisory lock
//! is taken on a dedicated connection and the `Started` row is committed
//! before any mutation; entities are processed dependents first; batches of
//! `sweep_batch_size` rows are locked, mutated and audited in one
//! transaction each (on the run's connection, or on several at once in
//! disjoint key ranges, `sweep_parallelism`); the run settles `Succeeded`, `PartiallyFailed`,
//! `Failed` or `Cancelled`. One entity's failure is recorded (sanitised) and
//! the run goes on. A batch that changes nothing ends that entity's loop, so
//! no loop can spin.

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres, Row};
use tracing::Instrument;
use uuid::Uuid;

use super::batches::Progress;
use super::counts::{counts, counts_after_run, oldest_eligible, outcome};
use super::lanes::sweep_rows;
use super::partitions::{self, RowPath};
use super::work::{stop_from, RunCtx, RunSpec, Stop, Work};
use super::{failure, EntityFailure, EntityOutcome, RunKind, RunStatus, SweepResult};
use crate::context::{Context, Prepared};
use crate::diagnostic::Diagnostic;
use crate::error::Result;
use crate::locks::LockKey;
use crate::observer::AuditEvent;
use crate::sql::ledger;
use crate::sql::locks;

/// Runs the works of one run: lock, Started, entities, settle.
pub(crate) async fn execute(
    cx: &Context,
    ready: &Prepared,
    spec: RunSpec,
    works: Vec<std::result::Result<Work<'_>, EntityFailure>>,
) -> Result<SweepResult> {
    let run_id = Uuid::new_v4();
    let span = tracing::info_span!(
        "cohort.run",
        run_id = %run_id,
        kind = spec.kind.as_str(),
        trigger = spec.trigger.as_str(),
        tenant = spec.tenant.as_deref(),
        dry_run = spec.dry_run,
    );
    execute_in_span(cx, ready, spec, works, run_id)
        .instrument(span)
        .await
}

async fn execute_in_span(
    cx: &Context,
    ready: &Prepared,
    spec: RunSpec,
    works: Vec<std::result::Result<Work<'_>, EntityFailure>>,
    run_id: Uuid,
) -> Result<SweepResult> {
    let inner = cx;
    let clock = std::time::Instant::now();
    let mut conn = crate::locks::Held::new(inner.pool.acquire().await?);
    locks::lock(&mut conn, LockKey::Run(run_id)).await?;
    let insert = ledger::InsertRun {
        run_id,
        kind: spec.kind.as_str(),
        trigger: spec.trigger.as_str(),
        dry_run: spec.dry_run,
        tenant: spec.tenant.clone(),
        logical_now: spec.now,
        occurrence: spec.occurrence.map(|o| o.at),
        pass: spec.occurrence.map(|o| o.pass),
        passes: spec.occurrence.map(|o| o.passes),
        policy_fingerprint: spec
            .occurrence
            .map(|_| crate::peers::fingerprint(inner, ready)),
        erasure_subject_kind: spec.erasure_kind.clone(),
    };
    let started = ready
        .ledger
        .insert_run(insert)
        .query()
        .fetch_one(&mut *conn)
        .await
        .and_then(|row| row.try_get::<DateTime<Utc>, _>("started_at"));
    let started_at = match started {
        Ok(at) => at,
        Err(e) => {
            release_run_lock(conn.into_inner(), run_id).await;
            return Err(e.into());
        }
    };
    tracing::info!(entities = works.len(), now = %spec.now, "run started");
    inner.observers.emit(AuditEvent::Started {
        run_id,
        kind: spec.kind,
        trigger: spec.trigger,
        dry_run: spec.dry_run,
        tenant: spec.tenant.clone(),
        now: spec.now,
    });

    let ctx = RunCtx {
        cx,
        ready,
        run_id,
        spec: &spec,
    };
    let mut outcomes = Vec::new();
    let mut failures = Vec::new();
    let mut status = RunStatus::Succeeded;
    let mut run_error: Option<String> = None;
    // The live peers, read once: an entity for which one of them has a
    // handler this process lacks is not mutated (fail closed; a failed
    // read fails every mutating entity the same way).
    let peers = if spec.dry_run {
        Ok(Vec::new())
    } else {
        crate::peers::live(cx, None).await
    };
    for work in works {
        if spec.cancel.is_cancelled() {
            status = RunStatus::Cancelled;
            break;
        }
        let work = match work {
            Ok(w) => w,
            Err(f) => {
                tracing::error!(entity = %f.entity, error = %f.error, "entity not run: its rule could not be resolved");
                failures.push(f);
                continue;
            }
        };
        if !spec.dry_run && work.rule.strategy().mutates() {
            let refused = match &peers {
                Ok(peers) => crate::peers::conflict(cx, peers, work.entity.id).map(|why| {
                    crate::telemetry::peer_conflict(&work.entity.name);
                    Diagnostic::capture(
                        "peer",
                        Some("handler_missing_here".into()),
                        &format!("{}: {why}", work.entity.name),
                    )
                }),
                Err(e) => Some(Diagnostic::capture(
                    "peer",
                    Some("peers_unreadable".into()),
                    &format!(
                        "{}: the peer records could not be read ({e}); its rows are left alone",
                        work.entity.name
                    ),
                )),
            };
            if let Some(d) = refused {
                if spec.kind == RunKind::Sweep {
                    crate::telemetry::backlog_unmeasured(
                        &work.entity.name,
                        backlog_scope(&spec, &work),
                    );
                }
                outcomes.push(outcome(&work));
                failures.push(failure(work.entity.id, &work.entity.name, &d));
                continue;
            }
        }
        let mut out = outcome(&work);
        let span = tracing::info_span!(
            "cohort.entity",
            entity = %work.entity.name,
            strategy = work.rule.strategy().as_str(),
        );
        let result = run_entity(&ctx, &mut conn, &work, &mut out)
            .instrument(span.clone())
            .await;
        span.in_scope(|| report_entity(ctx.spec, &out, &result));
        if result.is_err() && ctx.spec.kind == RunKind::Sweep {
            crate::telemetry::backlog_unmeasured(&work.entity.name, backlog_scope(ctx.spec, &work));
        }
        outcomes.push(out);
        match result {
            Ok(()) => {}
            Err(Stop::Entity(d)) => failures.push(failure(work.entity.id, &work.entity.name, &d)),
            Err(Stop::Cancelled) => {
                status = RunStatus::Cancelled;
                break;
            }
            Err(Stop::Run(err)) => {
                run_error = Some(Diagnostic::from_sqlx(&err).to_string());
                status = RunStatus::Failed;
                break;
            }
        }
    }
    if status == RunStatus::Succeeded && !failures.is_empty() {
        status = RunStatus::PartiallyFailed;
    }
    // Entity failures first ("entity <id>: <diagnostic>", read back by
    // `runs show`), then the run-level failure, if any.
    let mut parts: Vec<String> = failures
        .iter()
        .map(|f| format!("entity {}: {}", f.entity_id, f.error))
        .collect();
    parts.extend(run_error.map(|e| format!("run: {e}")));
    let error = (!parts.is_empty()).then(|| parts.join("; "));
    let settled = settle(
        cx,
        ready,
        &mut conn,
        run_id,
        status,
        error.as_deref(),
        &failures,
    )
    .await;
    release_run_lock(conn.into_inner(), run_id).await;
    let settled_at = settled?;
    let took = clock.elapsed();
    crate::telemetry::run_settled(spec.kind, spec.trigger, status, took);
    if status == RunStatus::Succeeded && !spec.dry_run {
        crate::telemetry::last_success(spec.kind, settled_at);
    }
    let affected: u64 = outcomes.iter().map(|o| o.affected).sum();
    match status {
        RunStatus::Succeeded => {
            tracing::info!(
                status = status.as_str(),
                affected,
                duration_ms = took.as_millis() as u64,
                "run settled"
            )
        }
        RunStatus::Cancelled => {
            tracing::warn!(
                status = status.as_str(),
                affected,
                duration_ms = took.as_millis() as u64,
                "run settled"
            )
        }
        _ => tracing::error!(
            status = status.as_str(),
            affected,
            failures = failures.len(),
            error = error.as_deref().unwrap_or(""),
            duration_ms = took.as_millis() as u64,
            "run settled"
        ),
    }
    let total = |f: fn(&EntityOutcome) -> u64| outcomes.iter().map(f).sum::<u64>();
    inner.observers.emit(AuditEvent::Settled {
        run_id,
        kind: spec.kind,
        status,
        duration_ms: took.as_millis() as u64,
        affected,
        held: total(|o| o.held),
        skipped: total(|o| o.skipped),
        null_anchor: total(|o| o.null_anchor),
        kept_by_legal_min: total(|o| o.kept_by_legal_min),
        kept_by_policy: total(|o| o.kept_by_policy),
        error: error.clone(),
    });
    Ok(SweepResult {
        run_id,
        kind: spec.kind,
        trigger: spec.trigger,
        status,
        dry_run: spec.dry_run,
        tenant: spec.tenant,
        started_at,
        settled_at: Some(settled_at),
        entities: outcomes,
        failures,
        erasure_kind: spec.erasure_kind,
    })
}

/// An entity's outcome in the log and the metrics: info when all went as
/// designed; warn for rows left although eligible (skipped) and for an
/// erasure's subject rows kept by a hold; error for a failure (its
/// sanitised diagnostic; the full error was logged under the same id).
fn report_entity(spec: &RunSpec, out: &EntityOutcome, result: &std::result::Result<(), Stop>) {
    if !spec.dry_run {
        // `affected` was counted as each batch committed.
        crate::telemetry::entity_settled(out);
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
}

/// One entity: summary row, batches (unless dry run or exempt), direct
/// counts, final summary. `out` holds only committed work.
async fn run_entity(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    out: &mut EntityOutcome,
) -> std::result::Result<(), Stop> {
    let e = work.entity;
    let plan = &ctx.ready.ledger;
    let strategy = work.rule.strategy();
    let split = |p: crate::rules::Period| ledger::IntervalParts {
        months: p.months(),
        days: (p.fixed_seconds() / 86_400) as i32,
        secs: (p.fixed_seconds() % 86_400) as f64,
    };
    let summary = ledger::InsertSummary {
        run_id: ctx.run_id,
        entity_id: e.id,
        entity: e.name.clone(),
        category: e.category.clone(),
        tenant: ctx.spec.tenant.clone(),
        strategy: strategy.as_str(),
        cutoff: work.cutoff,
        period: split(work.rule.period()),
        legal_min: work.rule.legal_min().map(split),
        rule_source: work.rule.source().map(str::to_owned),
        rule_reason: work.rule.reason().map(str::to_owned),
        stage: work.stage.map(|n| n as i16),
    };
    let summary_id: i64 = plan
        .insert_summary(summary)
        .query()
        .fetch_one(&mut *conn)
        .await
        .map_err(stop_from)?
        .try_get("summary_id")
        .map_err(stop_from)?;

    let mut result = Ok(());
    let mut progress = Progress::Drained;
    let mut row_path = RowPath::UpToCutoff;
    if partitions::applies(ctx, work) {
        match partitions::drop_expired(ctx, conn, work, summary_id, out).await {
            Ok(left) => row_path = left,
            Err(stop) => result = Err(stop),
        }
    }
    let real = strategy.mutates() && !ctx.spec.dry_run;
    if real && result.is_ok() {
        let looped = match row_path {
            RowPath::UpToCutoff => sweep_rows(ctx, conn, work, summary_id, out).await,
            RowPath::Before(bound) => {
                let earlier = work.with_row_cutoff(bound);
                sweep_rows(ctx, conn, &earlier, summary_id, out).await
            }
            RowPath::Nothing => Ok(Progress::Drained),
        };
        result = looped.map(|p| progress = p);
    }
    if matches!(result, Err(Stop::Run(_))) {
        return result;
    }
    // Held and NULL-anchor rows are measured directly, after the batches;
    // what is still eligible only when the loop may have left some (it
    // stalled, or a partition could not be locked).
    let measured = if real && row_path == RowPath::UpToCutoff && progress == Progress::Drained {
        counts_after_run(conn, ctx.ready, work).await
    } else {
        counts(conn, work).await
    };
    let error = match &result {
        Err(Stop::Entity(d)) => Some(d.to_string()),
        Err(Stop::Cancelled) => Some("cancelled".to_string()),
        _ => None,
    };
    if let Ok(c) = &measured {
        out.held = c.held;
        out.held_by_subject = c.held_by_subject;
        out.null_anchor = c.null_anchor;
        // Left although eligible: still referenced, plus either what is
        // still eligible (when measured: it includes every row a failing
        // `on_before` set aside, and, past a partition that could not be
        // locked, the rows left with it) or the rows the batches set aside.
        out.skipped = c.skipped
            + match (real, c.eligible_measured) {
                (true, true) => c.eligible,
                (true, false) => out.skipped,
                (false, _) => 0,
            };
        out.note = super::counts::kept_for_good(ctx.ready, work, out.skipped);
        out.kept_by_legal_min = c.kept_by_legal_min;
        if ctx.spec.dry_run && strategy.mutates() {
            out.affected = c.eligible;
        }
        if !strategy.mutates() {
            out.kept_by_policy = c.eligible;
        }
    }
    let finish = plan
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
        })
        .query()
        .execute(&mut *conn)
        .await;
    if finish.is_ok() {
        // The summary row as committed, failed entities included.
        ctx.cx.observers.emit(AuditEvent::EntitySummary {
            run_id: ctx.run_id,
            entity_id: e.id,
            entity: e.name.clone(),
            category: e.category.clone(),
            strategy,
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
    }
    result?;
    measured.map_err(stop_from)?;
    finish.map_err(stop_from)?;
    if ctx.spec.kind == RunKind::Sweep && ctx.cx.backlog_gauge {
        record_backlog(conn, ctx.spec, work).await;
    }
    Ok(())
}

/// Sets the entity's `cohort_entity_backlog_age_seconds` for this pass
/// (tenant and stage) from one indexed read of its oldest still-eligible
/// row. A failed read is logged and changes nothing else: the run's
/// outcome never depends on a metric.
async fn record_backlog(conn: &mut PgConnection, spec: &RunSpec, work: &Work<'_>) {
    let Some(cutoff) = work.cutoff else {
        return;
    };
    match oldest_eligible(conn, work).await {
        Ok(oldest) => crate::telemetry::backlog(
            &work.entity.name,
            backlog_scope(spec, work),
            crate::telemetry::backlog_age(cutoff, oldest),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "reading the entity's backlog failed; its gauge keeps its last value");
            crate::telemetry::backlog_unmeasured(&work.entity.name, backlog_scope(spec, work));
        }
    }
}

/// The pass a backlog belongs to: the run's tenant and the work's stage.
fn backlog_scope(spec: &RunSpec, work: &Work<'_>) -> String {
    format!(
        "{}/{}",
        spec.tenant.as_deref().unwrap_or(""),
        work.stage.unwrap_or(0)
    )
}

/// Writes the terminal status, on the run's connection or, if that is
/// gone, on a fresh one.
async fn settle(
    cx: &Context,
    ready: &Prepared,
    conn: &mut PgConnection,
    run_id: Uuid,
    status: RunStatus,
    error: Option<&str>,
    failures: &[EntityFailure],
) -> Result<DateTime<Utc>> {
    let structured = serde_json::to_value(failures).expect("failures serialise");
    let q = || {
        ready
            .ledger
            .settle_run(ledger::SettleRun {
                run_id,
                status: status.as_str(),
                error: error.map(str::to_owned),
                failures: structured.clone(),
            })
            .query()
    };
    let row = match q().fetch_one(&mut *conn).await {
        Ok(row) => row,
        Err(first) => {
            tracing::warn!(%run_id, error = %first, "settling on the run connection failed; retrying on a new connection");
            let mut fresh = cx.pool.acquire().await?;
            q().fetch_one(&mut *fresh).await?
        }
    };
    Ok(row.try_get("settled_at")?)
}

/// Releases the run lock. If that fails the connection is closed instead
/// (which releases the lock); the failure is logged, never returned over
/// the run's own result.
async fn release_run_lock(mut conn: PoolConnection<Postgres>, run_id: Uuid) {
    let unlock = locks::unlock(&mut conn, LockKey::Run(run_id)).await;
    if let Err(e) = unlock {
        tracing::warn!(%run_id, error = %e, "releasing the run lock failed; closing the connection instead");
        let raw = conn.detach();
        if let Err(close) = sqlx::Connection::close(raw).await {
            tracing::warn!(%run_id, error = %close, "closing the run connection failed too");
        }
    }
}
