//! `cohort preview`, `sweep` and `erase`, and how their results print.

use cohort::{
    Cancel, Cohort, PassOutcome, PreviewAllRequest, PreviewRequest, SweepAllRequest, SweepRequest,
    SweepResult,
};
use serde_json::json;

use crate::exit::{all_tenants_code, exit_for};
use crate::output::{outcome_rows, print_json, table, OUTCOME_HEADERS};
use crate::Failure;

use super::*;

pub(super) fn print_preview(result: &cohort::PreviewResult) {
    outln!(
        "Preview for {} (nothing is changed):\n",
        result
            .tenant
            .as_deref()
            .unwrap_or("the tenantless entities")
    );
    outln!(
        "{}",
        table(&OUTCOME_HEADERS, &outcome_rows(&result.entities))
    );
    for f in &result.failures {
        outln!("\nfailed: {} ({}): {}", f.entity, f.entity_id, f.error);
    }
    print_notes(&result.entities);
}

/// One line per entity whose run recorded what it left in its table:
/// dead tuples and size before and after, and what `vacuum_after` ran.
fn print_table_health(entities: &[cohort::EntityOutcome]) {
    for e in entities {
        let Some(t) = &e.table else {
            continue;
        };
        outln!(
            "table: {}: dead tuples {} -> {}, {} -> {} bytes{}",
            e.entity,
            t.dead_tuples_before,
            t.dead_tuples_after,
            t.bytes_before,
            t.bytes_after,
            t.vacuumed
                .as_deref()
                .map(|v| format!(", then {v}"))
                .unwrap_or_default()
        );
    }
}

/// One line per entity whose rows were left for a reason that will not
/// change by itself (`EntityOutcome::note`).
fn print_notes(entities: &[cohort::EntityOutcome]) {
    for e in entities.iter().filter(|e| e.note.is_some()) {
        outln!("note: {}: {}", e.entity, e.note.as_deref().unwrap_or(""));
    }
    for e in entities {
        let waits: Vec<String> = [
            ("max_rows_per_second", e.throttled_ms),
            ("max_replica_lag", e.lag_waited_ms),
        ]
        .iter()
        .filter_map(|(why, ms)| {
            ms.filter(|ms| *ms > 0)
                .map(|ms| format!("{ms} ms for {why}"))
        })
        .collect();
        if !waits.is_empty() {
            outln!("paced: {}: waited {}", e.entity, waits.join(", "));
        }
    }
}

pub(super) fn preview_json(result: &cohort::PreviewResult) -> serde_json::Value {
    json!({
        "tenant": result.tenant,
        "entities": result.entities,
        "failures": result.failures,
    })
}

pub(crate) async fn preview(
    cohort: &Cohort,
    json: bool,
    scope: &SweepScope,
    now: Option<&str>,
) -> Result<(), Failure> {
    let now = parse_time(now, "--now")?;
    // A preview has no run, so 3 (a run settled partially failed) does not
    // apply: a rule that cannot be resolved is a configuration problem and
    // nothing was changed (exit 2).
    if scope.all_tenants {
        let previews = cohort
            .preview_all(PreviewAllRequest::new(cohort.tenant_source().clone(), now))
            .await?;
        warn_conflicting_duplicates(&previews.conflicting_duplicates);
        let mut failed = false;
        let mut docs = Vec::new();
        for p in &previews.passes {
            match p {
                Ok(r) => {
                    failed |= !r.failures.is_empty();
                    if json {
                        docs.push(preview_json(r));
                    } else {
                        print_preview(r);
                        outln!();
                    }
                }
                Err(f) => {
                    failed = true;
                    if json {
                        docs.push(json!({
                            "tenant": f.tenant,
                            "error": {"kind": f.kind.as_str(), "message": f.error},
                        }));
                    } else {
                        outln!(
                            "Preview for {} failed: {}\n",
                            f.tenant.as_deref().unwrap_or("the tenantless entities"),
                            f.error
                        );
                    }
                }
            }
        }
        if json {
            print_json(&serde_json::Value::Array(docs));
        }
        return if failed {
            Err(Failure::Status(2))
        } else {
            Ok(())
        };
    }
    // A tenant's jurisdiction and tags come from the policy's tenant
    // source (the library looks the tenant up in `tenants_query`).
    let req = match &scope.tenant {
        Some(t) => PreviewRequest::tenanted(t, now),
        None => PreviewRequest::tenantless(now),
    };
    let result = cohort.preview(req).await?;
    if json {
        print_json(&preview_json(&result));
    } else {
        print_preview(&result);
    }
    if result.failures.is_empty() {
        Ok(())
    } else {
        Err(Failure::Status(2))
    }
}

pub(super) fn print_result(result: &SweepResult) {
    finish_progress();
    outln!(
        "Run {} ({}{}{}) for {}: {}",
        result.run_id,
        if result.dry_run { "dry run, " } else { "" },
        result.kind.as_str(),
        result
            .erasure_kind
            .as_deref()
            .map(|k| format!(" of a {k} subject"))
            .unwrap_or_default(),
        result
            .tenant
            .as_deref()
            .unwrap_or("the tenantless entities"),
        result.status.as_str()
    );
    outln!(
        "{}",
        table(&OUTCOME_HEADERS, &outcome_rows(&result.entities))
    );
    for f in &result.failures {
        outln!("failed: {} ({}): {}", f.entity, f.entity_id, f.error);
    }
    print_notes(&result.entities);
    print_table_health(&result.entities);
}

/// `cohort sweep`: one run for a tenant or the tenantless entities, or
/// one pass per tenant with `--all-tenants`; exit as its runs settled.
pub(crate) async fn sweep(
    cohort: &Cohort,
    json: bool,
    scope: &SweepScope,
    now: Option<&str>,
    (dry_run, allow_future_now): (bool, bool),
) -> Result<(), Failure> {
    let now = parse_time(now, "--now")?;
    note_worker_settings(cohort, dry_run).await?;
    let cancel = Cancel::new();
    crate::services::cancel_on_signal(&cancel, "cancelling; the open batch will be rolled back");
    if scope.all_tenants {
        return sweep_all_tenants(cohort, json, now, (dry_run, allow_future_now), cancel).await;
    }
    let req = match &scope.tenant {
        Some(t) => SweepRequest::tenanted(t, now),
        None => SweepRequest::tenantless(now),
    }
    .dry_run(dry_run)
    .allow_future_now(allow_future_now)
    .cancellation(cancel);
    let result = cohort.sweep(req).await?;
    if json {
        print_json(&serde_json::to_value(&result).expect("result serialises"));
    } else {
        print_result(&result);
    }
    exit_for([result.status])
}

/// `cohort sweep --all-tenants`: a pass per tenant of the policy's tenant
/// source, each printed; exit 1 when cancelled, else as
/// [`all_tenants_code`] reads the passes.
async fn sweep_all_tenants(
    cohort: &Cohort,
    json: bool,
    now: chrono::DateTime<chrono::FixedOffset>,
    (dry_run, allow_future_now): (bool, bool),
    cancel: Cancel,
) -> Result<(), Failure> {
    let source = cohort.tenant_source().clone();
    let cancelled = cancel.clone();
    let result = cohort
        .sweep_all(
            SweepAllRequest::new(source, now)
                .dry_run(dry_run)
                .allow_future_now(allow_future_now)
                .cancellation(cancel),
        )
        .await?;
    warn_conflicting_duplicates(&result.conflicting_duplicates);
    if json {
        print_json(&passes_json(&result.passes));
    } else {
        print_passes(&result.passes);
    }
    // A cancelled command did not sweep every tenant: it failed.
    if cancelled.is_cancelled() {
        eprintln!("cohort: cancelled; later passes were not run");
        return Err(Failure::Status(1));
    }
    match all_tenants_code(&result.passes) {
        0 => Ok(()),
        code => Err(Failure::Status(code)),
    }
}

/// An all-tenants sweep's passes as one JSON array: each run's result, or
/// a pass that did not start with its error.
fn passes_json(passes: &[PassOutcome]) -> serde_json::Value {
    let docs: Vec<serde_json::Value> = passes
        .iter()
        .map(|p| match p {
            PassOutcome::Ran(r) => serde_json::to_value(r).expect("result serialises"),
            PassOutcome::NotStarted(f) => json!({
                "run_id": null,
                "status": "not_started",
                "tenant": f.tenant,
                "position": f.position,
                "error": {"kind": f.kind.as_str(), "message": f.error},
            }),
            _ => json!(null),
        })
        .collect();
    serde_json::Value::Array(docs)
}

/// An all-tenants sweep's passes as text: each run's result, or why a
/// pass did not start.
fn print_passes(passes: &[PassOutcome]) {
    for p in passes {
        match p {
            PassOutcome::Ran(r) => {
                print_result(r);
                outln!();
            }
            PassOutcome::NotStarted(f) => match (&f.tenant, f.position) {
                (Some(t), _) => outln!("Pass for {t} did not start: {}\n", f.error),
                (None, Some(_)) => outln!("A pass did not start: {}\n", f.error),
                (None, None) if f.kind.is_bad_input() => {
                    outln!("Not swept: {}\n", f.error)
                }
                (None, None) => outln!(
                    "Pass for the tenantless entities did not start: {}\n",
                    f.error
                ),
            },
            _ => {}
        }
    }
}

/// `cohort erase`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct EraseArgs {
    /// The tenant (a negative number is a value).
    #[arg(
        long,
        required_unless_present = "tenantless",
        conflicts_with = "tenantless",
        allow_negative_numbers = true
    )]
    pub(crate) tenant: Option<String>,
    /// Erase from the tenantless entities instead of a tenant's.
    #[arg(long)]
    pub(crate) tenantless: bool,
    /// The subject id (compared exactly with each subject column, in its
    /// type). A negative number is a value (`--subject -42`); other text
    /// starting with `-` needs `--subject=-x`.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) subject: String,
    /// Only subject columns of this kind.
    #[arg(long)]
    pub(crate) kind: Option<String>,
    /// Accept soft deletion as erasure for categories that soft-delete.
    #[arg(long)]
    pub(crate) allow_soft_delete: bool,
    /// For categories in stages: erase as stage N does (1 first)
    /// instead of the last stage.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) stage: Option<u16>,
    /// Count and audit without changing rows.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Logical time (RFC 3339; default now).
    #[arg(long)]
    pub(crate) now: Option<String>,
    /// Accept a --now later than the database clock for a mutating run
    /// (refused by default: it moves every cutoff forward).
    #[arg(long)]
    pub(crate) allow_future_now: bool,
    /// Open an erasure request with this reference (unique), followed
    /// until it completes; an existing request not completed, for the
    /// same subject, runs again. Needs the hash key.
    #[arg(long, conflicts_with = "dry_run")]
    pub(crate) reference: Option<String>,
    /// When the request is due: a period after --now (60d, 2mo), a date
    /// (its end, UTC) or an RFC 3339 time (default: 30 days).
    #[arg(long, requires = "reference")]
    pub(crate) due: Option<String>,
    /// Why the request has this due date.
    #[arg(long, requires = "due")]
    pub(crate) due_reason: Option<String>,
    /// The requester's note, kept with the request.
    #[arg(long, requires = "reference")]
    pub(crate) note: Option<String>,
}

/// `cohort erase`: the scope its arguments describe, erased (or, with
/// `--reference`, a request opened or taken up and run).
pub(crate) async fn erase_with(
    cohort: &Cohort,
    json: bool,
    args: &EraseArgs,
    terms: Option<super::RequestTerms>,
) -> Result<(), Failure> {
    let mut scope =
        cohort::erasure::ErasureScope::new(&args.subject).allow_soft_delete(args.allow_soft_delete);
    if let Some(k) = &args.kind {
        scope = scope.kind(k);
    }
    if let Some(n) = args.stage {
        scope = scope.stage(n);
    }
    erase(
        cohort,
        json,
        args.tenant.as_deref(),
        scope,
        args.now.as_deref(),
        (args.dry_run, args.allow_future_now),
        terms,
    )
    .await
}

pub(crate) async fn erase(
    cohort: &Cohort,
    json: bool,
    tenant: Option<&str>,
    scope: cohort::erasure::ErasureScope,
    now: Option<&str>,
    (dry_run, allow_future_now): (bool, bool),
    terms: Option<super::RequestTerms>,
) -> Result<(), Failure> {
    let now = parse_time(now, "--now")?;
    note_worker_settings(cohort, dry_run).await?;
    let cancel = Cancel::new();
    crate::services::cancel_on_signal(&cancel, "cancelling; the open batch will be rolled back");
    let mut req = match tenant {
        Some(t) => cohort::erasure::ErasureRequest::tenanted(t, scope, now),
        None => cohort::erasure::ErasureRequest::tenantless(scope, now),
    }
    .dry_run(dry_run)
    .allow_future_now(allow_future_now)
    .cancellation(cancel);
    if let Some(terms) = terms {
        req = terms.apply(req);
    }
    let result = cohort.erase(req).await?;
    if json {
        print_json(&serde_json::to_value(&result).expect("result serialises"));
    } else {
        print_result(&result.run);
        for n in &result.not_reached {
            outln!("not reached: {} ({}): {}", n.entity, n.entity_id, n.reason);
        }
        if let Some(r) = &result.request {
            super::requests::print_request(r);
        }
    }
    exit_for([result.status])
}

/// One line on stderr per tenant listed twice with different jurisdictions.
fn warn_conflicting_duplicates(tenants: &[String]) {
    for t in tenants {
        eprintln!(
            "cohort: tenant {t:?} is listed more than once with different jurisdictions; its first listing was used"
        );
    }
}
