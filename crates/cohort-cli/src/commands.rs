//! `preview`, `sweep`, `holds` and `runs`.

use std::io::IsTerminal;
use std::sync::Mutex;

use chrono::{DateTime, FixedOffset, Utc};
use clap::{Args, Subcommand};
use cohort::async_trait;
use cohort::holds::{Hold, HoldFilter, HoldRequest};
use cohort::observer::{AuditEvent, AuditObserver};
use cohort::policy::PolicyFile;
use cohort::{
    Cancel, Cohort, Error, PassOutcome, PreviewRequest, RunStatus, SweepAllRequest, SweepRequest,
    SweepResult, TenantSource,
};
use serde_json::json;
use uuid::Uuid;

use crate::output::{outcome_rows, print_json, table, OUTCOME_HEADERS};
use crate::Failure;

/// `--tenant T`, `--tenantless` or `--all-tenants`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct SweepScope {
    /// The tenant whose tenant-scoped entities are swept.
    #[arg(long)]
    tenant: Option<String>,
    /// Sweep the tenantless entities.
    #[arg(long)]
    tenantless: bool,
    /// Sweep every tenant of the policy file in order, then the tenantless entities.
    #[arg(long)]
    all_tenants: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum HoldsCommand {
    /// Place a hold on one record.
    Create {
        /// Entity id or display name.
        #[arg(long)]
        entity: String,
        /// Record id (canonicalised with the key column's type).
        #[arg(long)]
        record: String,
        /// The row's tenant (omit for tenantless entities).
        #[arg(long)]
        tenant: Option<String>,
        /// Why.
        #[arg(long)]
        reason: String,
        /// When the hold lapses (RFC 3339).
        #[arg(long)]
        expires_at: Option<String>,
        /// Hold id (default: a new UUID).
        #[arg(long)]
        hold_id: Option<Uuid>,
    },
    /// List holds.
    List {
        /// Entity id or display name.
        #[arg(long)]
        entity: Option<String>,
        /// Tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Only holds active now.
        #[arg(long)]
        active: bool,
    },
    /// Release a hold now.
    Release {
        /// The hold's id.
        hold_id: Uuid,
    },
}

/// `cohort dispatch`: delivers the work of the policy file's handlers.
/// Refused when the policy declares none: work queued by an application's
/// own (Rust) handlers belongs to the application's dispatcher, and this
/// one would dead-letter it as unknown.
pub(crate) async fn dispatch(
    cohort: &Cohort,
    policy: &PolicyFile,
    json: bool,
    once: bool,
) -> Result<(), Failure> {
    if policy.handlers.is_empty() {
        return Err(bad(
            "the policy file declares no [[entity.handler]]; work queued by an application's own handlers is delivered by the application's dispatcher",
        ));
    }
    cohort
        .check_grants(&[cohort::services::Access::Dispatcher])
        .await?;
    let dispatcher = cohort.dispatcher();
    if once {
        let r = dispatcher.flush().await?;
        if json {
            print_json(&json!({
                "delivered": r.delivered,
                "failed": r.failed,
                "dead_lettered": r.dead_lettered,
                "pending": r.pending,
                "in_flight": r.in_flight,
                "superseded": r.superseded,
                "unrecorded": r.unrecorded,
                "recovered_runs": r.recovered_runs,
                "scrubbed": r.scrubbed,
            }));
        } else {
            outln!(
                "Delivered {}, failed {} (will retry), dead-lettered {}; {} pending, {} in flight elsewhere.",
                r.delivered, r.failed, r.dead_lettered, r.pending, r.in_flight
            );
        }
        return Ok(());
    }
    crate::services::dispatch_until_signal(cohort).await
}

#[derive(Debug, Subcommand)]
pub(crate) enum DeadLettersCommand {
    /// Dead-lettered handler work, most recent first.
    List {
        /// Only this entity's (id or name).
        #[arg(long)]
        entity: Option<String>,
        /// Only this handler's.
        #[arg(long)]
        handler: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Requeue dead letters: due now, attempts reset. Unknown ids, work that
    /// is not dead-lettered and scrubbed payloads exit 2 and change nothing.
    Retry {
        /// The ids `dead-letters list` prints.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<i64>,
        /// Every dead letter that still has its payload.
        #[arg(long)]
        all: bool,
    },
}

pub(crate) async fn dead_letters(
    cohort: &Cohort,
    json: bool,
    cmd: &DeadLettersCommand,
) -> Result<(), Failure> {
    use cohort::handlers::{DeadLetterFilter, RetrySelection};
    match cmd {
        DeadLettersCommand::List {
            entity,
            handler,
            limit,
        } => {
            let mut filter = DeadLetterFilter::all().limit(*limit);
            if let Some(e) = entity {
                filter = filter.entity(entity_id(cohort, e).await?);
            }
            if let Some(h) = handler {
                filter = filter.handler(h);
            }
            let letters = cohort.dead_letters(&filter).await?;
            if json {
                print_json(&serde_json::to_value(&letters).expect("dead letters serialise"));
            } else {
                let rows: Vec<Vec<String>> = letters
                    .iter()
                    .map(|l| {
                        vec![
                            l.id.to_string(),
                            l.entity.clone(),
                            l.record_id.clone(),
                            l.tenant.clone().unwrap_or_default(),
                            l.handler.clone(),
                            l.attempts.to_string(),
                            l.dead_lettered_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                            l.last_error.clone().unwrap_or_default(),
                        ]
                    })
                    .collect();
                outln!(
                    "{}",
                    table(
                        &[
                            "ID",
                            "ENTITY",
                            "RECORD",
                            "TENANT",
                            "HANDLER",
                            "ATTEMPTS",
                            "DEAD SINCE (UTC)",
                            "REASON"
                        ],
                        &rows
                    )
                );
            }
            Ok(())
        }
        DeadLettersCommand::Retry { ids, all } => {
            let selection = if *all {
                RetrySelection::All
            } else {
                RetrySelection::Ids(ids.clone())
            };
            let retried = cohort.retry_dead_letters(&selection).await?;
            if json {
                print_json(&json!({ "retried": retried }));
            } else {
                outln!("Requeued {retried} dead letter(s); they are due now.");
            }
            Ok(())
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
    /// Recent runs, newest first.
    List {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// One run with its entity summaries.
    Show {
        /// The run's id, or a unique prefix of it (the 8 characters tables print).
        run_id: String,
    },
}

fn bad(msg: impl Into<String>) -> Failure {
    Failure::Input(Error::InvalidInput(msg.into()))
}

fn parse_time(text: Option<&str>, what: &str) -> Result<DateTime<FixedOffset>, Failure> {
    match text {
        None => Ok(Utc::now().fixed_offset()),
        Some(t) => DateTime::parse_from_rfc3339(t)
            .map_err(|e| bad(format!("{what} {t:?} is not an RFC 3339 time: {e}"))),
    }
}

/// Whether to draw a progress bar: human output on a terminal.
pub(crate) fn progress_wanted(json: bool) -> bool {
    !json && std::io::stdout().is_terminal()
}

/// A progress line fed by committed ledger events: the entity being
/// processed, its rows so far, and how many the preview of the run counted.
/// Cheap to clone; the CLI keeps one handle to finish the line before it
/// prints a result, so the result never lands on the progress line.
#[derive(Clone, Default)]
pub(crate) struct Progress(std::sync::Arc<Mutex<ProgressState>>);

#[derive(Default)]
struct ProgressState {
    bar: Option<indicatif::ProgressBar>,
    names: std::collections::HashMap<Uuid, String>,
    done: bool,
}

/// The progress handle of this process, when a progress line is drawn.
static PROGRESS: std::sync::OnceLock<Progress> = std::sync::OnceLock::new();

impl Progress {
    /// The process's progress line (drawn only when stdout is a terminal).
    pub(crate) fn install() -> Self {
        PROGRESS.get_or_init(Progress::default).clone()
    }

    /// Entity names for the line, from the validated model.
    pub(crate) fn names(&self, model: &cohort::validate::ValidatedModel) {
        let mut state = self.0.lock().expect("progress lock");
        state.names = model
            .entities
            .iter()
            .map(|e| (e.id, e.name.clone()))
            .collect();
    }
}

/// Clears the progress line, if one is drawn, before a result is printed.
pub(crate) fn finish_progress() {
    if let Some(p) = PROGRESS.get() {
        let mut state = p.0.lock().expect("progress lock");
        if let Some(b) = state.bar.take() {
            b.finish_and_clear();
        }
        state.done = true;
    }
}

fn rows(n: u64) -> String {
    if n == 1 {
        "1 row".into()
    } else {
        format!("{n} rows")
    }
}

#[async_trait]
impl AuditObserver for Progress {
    async fn on_event(
        &self,
        event: &AuditEvent,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut state = self.0.lock().expect("progress lock");
        match event {
            AuditEvent::Started { tenant, .. } => {
                state.done = false;
                let b = indicatif::ProgressBar::new_spinner();
                b.set_message(format!(
                    "sweeping {}",
                    tenant.as_deref().unwrap_or("the tenantless entities")
                ));
                state.bar = Some(b);
            }
            AuditEvent::EntityProgress {
                entity_id,
                total,
                strategy,
                ..
            } if !state.done => {
                let name = state
                    .names
                    .get(entity_id)
                    .cloned()
                    .unwrap_or_else(|| entity_id.to_string());
                if let Some(b) = state.bar.as_ref() {
                    b.set_message(format!("{name}: {} so far ({strategy})", rows(*total)));
                    b.tick();
                }
            }
            AuditEvent::Settled { .. } => {
                if let Some(b) = state.bar.take() {
                    b.finish_and_clear();
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// A single tenant's jurisdiction when the tenants come from
/// `tenants_query` (the `[[tenant]]` directory is looked up by the library):
/// the query is run and the tenant found by identity. A tenant the query
/// does not list is refused, since its rules could not be resolved safely.
async fn query_jurisdiction(
    cohort: &Cohort,
    policy: &PolicyFile,
    tenant: &str,
) -> Result<Option<String>, Failure> {
    let Some(q) = &policy.tenants_query else {
        return Ok(None);
    };
    let wanted = cohort.canonical_tenant(tenant).await?;
    let identity = cohort.ready().await?.tenant_identity();
    for t in cohort
        .tenants(&TenantSource::Query(q.clone()))
        .await?
        .tenants
    {
        if identity.canonical(&t.id).as_deref() == Some(wanted.as_str()) {
            return Ok(t.jurisdiction);
        }
    }
    Err(bad(format!(
        "tenant {tenant:?} is not among the tenants tenants_query returns; its jurisdiction is unknown, so its rules cannot be resolved safely"
    )))
}

/// Worker-only settings do not change a manual run: say so when they are
/// on (in the configuration or the database). Only a note: when the
/// settings cannot be read (a role without access to them), the run goes
/// ahead as requested.
async fn note_worker_settings(cohort: &Cohort, dry_run: bool) -> Result<(), Failure> {
    let live = match cohort.settings().await {
        Ok(live) => live,
        Err(e) => {
            tracing::debug!(error = %e, "live settings not readable; no note printed");
            return Ok(());
        }
    };
    if live.kill_switch.effective {
        eprintln!("cohort: note: the kill switch is on; it stops the scheduled worker only, and this manual run goes ahead");
    }
    if live.dry_run.effective && !dry_run {
        eprintln!("cohort: note: dry_run is on; it applies to the scheduled worker only, and this manual run changes rows (pass --dry-run to count only)");
    }
    Ok(())
}

fn print_preview(result: &cohort::PreviewResult) {
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
}

fn preview_json(result: &cohort::PreviewResult) -> serde_json::Value {
    json!({
        "tenant": result.tenant,
        "entities": result.entities,
        "failures": result.failures,
    })
}

pub(crate) async fn preview(
    cohort: &Cohort,
    policy: &PolicyFile,
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
            .preview_all(cohort.tenant_source().clone(), now)
            .await?;
        let mut failed = false;
        let mut docs = Vec::new();
        for p in &previews {
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
    let req = match &scope.tenant {
        Some(t) => {
            let mut r = PreviewRequest::tenanted(t, now);
            if let Some(j) = query_jurisdiction(cohort, policy, t).await? {
                r = r.jurisdiction(j);
            }
            r
        }
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

fn print_result(result: &SweepResult) {
    finish_progress();
    outln!(
        "Run {} ({}{}) for {}: {}",
        result.run_id,
        if result.dry_run { "dry run, " } else { "" },
        result.kind.as_str(),
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
    for n in &result.not_reached {
        outln!("not reached: {} ({}): {}", n.entity, n.entity_id, n.reason);
    }
}

fn exit_for(statuses: impl IntoIterator<Item = RunStatus>) -> Result<(), Failure> {
    let mut code = 0;
    for s in statuses {
        code = code.max(match s {
            RunStatus::Succeeded => 0,
            RunStatus::PartiallyFailed => 3,
            _ => 1,
        });
    }
    if code == 0 {
        Ok(())
    } else {
        Err(Failure::Status(if code == 3 { 3 } else { 1 }))
    }
}

/// Exit code of one pass: 0 succeeded, 3 partially failed, 1 failed or
/// cancelled, 2 refused as bad input before its run existed.
fn pass_code(pass: &PassOutcome) -> u8 {
    match pass {
        PassOutcome::Ran(r) => match r.status {
            RunStatus::Succeeded => 0,
            RunStatus::PartiallyFailed => 3,
            _ => 1,
        },
        PassOutcome::NotStarted(f) if f.kind.is_bad_input() => 2,
        _ => 1,
    }
}

/// `sweep --all-tenants`: 0 when every pass succeeded; 3 when some passes
/// did their work and others failed (a run partially failed, or a pass
/// could not start); when no pass succeeded at all, 2 if every pass was
/// refused as bad input, else 1.
fn all_tenants_code(passes: &[PassOutcome]) -> u8 {
    let codes: Vec<u8> = passes.iter().map(pass_code).collect();
    if codes.iter().all(|c| *c == 0) {
        0
    } else if codes.iter().any(|c| *c == 0 || *c == 3) {
        3
    } else if codes.iter().all(|c| *c == 2) {
        2
    } else {
        1
    }
}

pub(crate) async fn sweep(
    cohort: &Cohort,
    policy: &PolicyFile,
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
        for t in &result.conflicting_duplicates {
            eprintln!(
                "cohort: tenant {t:?} is listed more than once with different jurisdictions; its first listing was used"
            );
        }
        if json {
            let docs: Vec<serde_json::Value> = result
                .passes
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
            print_json(&serde_json::Value::Array(docs));
        } else {
            for p in &result.passes {
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
        // A cancelled command did not sweep every tenant: it failed.
        if cancelled.is_cancelled() {
            eprintln!("cohort: cancelled; later passes were not run");
            return Err(Failure::Status(1));
        }
        return match all_tenants_code(&result.passes) {
            0 => Ok(()),
            code => Err(Failure::Status(code)),
        };
    }
    let mut req = match &scope.tenant {
        Some(t) => SweepRequest::tenanted(t, now),
        None => SweepRequest::tenantless(now),
    }
    .dry_run(dry_run)
    .allow_future_now(allow_future_now)
    .cancellation(cancel);
    if let Some(t) = &scope.tenant {
        if let Some(j) = query_jurisdiction(cohort, policy, t).await? {
            req = req.jurisdiction(j);
        }
    }
    let result = cohort.sweep(req).await?;
    if json {
        print_json(&serde_json::to_value(&result).expect("result serialises"));
    } else {
        print_result(&result);
    }
    exit_for([result.status])
}

pub(crate) async fn erase(
    cohort: &Cohort,
    policy: &PolicyFile,
    json: bool,
    tenant: Option<&str>,
    scope: cohort::erasure::ErasureScope,
    now: Option<&str>,
    (dry_run, allow_future_now): (bool, bool),
) -> Result<(), Failure> {
    let now = parse_time(now, "--now")?;
    note_worker_settings(cohort, dry_run).await?;
    let cancel = Cancel::new();
    crate::services::cancel_on_signal(&cancel, "cancelling; the open batch will be rolled back");
    let jurisdiction = match tenant {
        Some(t) => query_jurisdiction(cohort, policy, t).await?,
        None => None,
    };
    let mut req = match tenant {
        Some(t) => cohort::erasure::ErasureRequest::tenanted(t, scope, now),
        None => cohort::erasure::ErasureRequest::tenantless(scope, now),
    }
    .dry_run(dry_run)
    .allow_future_now(allow_future_now)
    .cancellation(cancel);
    if let Some(j) = jurisdiction {
        req = req.jurisdiction(j);
    }
    let result = cohort.erase(req).await?;
    if json {
        print_json(&serde_json::to_value(&result).expect("result serialises"));
    } else {
        print_result(&result);
    }
    exit_for([result.status])
}

/// Hold rows with entity names (the id when the entity is no longer declared).
async fn hold_rows(cohort: &Cohort, holds: &[Hold]) -> Result<Vec<Vec<String>>, Failure> {
    let model = cohort.ready().await?;
    Ok(holds
        .iter()
        .map(|h| {
            vec![
                h.hold_id.to_string(),
                model
                    .entity(h.retention_entity_id)
                    .map(|e| e.name.clone())
                    .unwrap_or_else(|| h.retention_entity_id.to_string()),
                h.record_id.clone(),
                h.tenant_id.clone().unwrap_or_default(),
                if h.active { "yes" } else { "no" }.to_string(),
                h.expires_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
                h.reason.clone(),
            ]
        })
        .collect())
}

const HOLD_HEADERS: [&str; 7] = [
    "HOLD", "ENTITY", "RECORD", "TENANT", "ACTIVE", "EXPIRES", "REASON",
];

async fn entity_id(cohort: &Cohort, id_or_name: &str) -> Result<Uuid, Failure> {
    let model = cohort.ready().await?;
    model
        .find_entity(id_or_name)
        .map(|e| e.id)
        .ok_or_else(|| bad(format!("no retained entity with id or name {id_or_name:?}")))
}

pub(crate) async fn holds(cohort: &Cohort, json: bool, cmd: &HoldsCommand) -> Result<(), Failure> {
    match cmd {
        HoldsCommand::Create {
            entity,
            record,
            tenant,
            reason,
            expires_at,
            hold_id,
        } => {
            let mut req = HoldRequest::new(entity_id(cohort, entity).await?, record, reason);
            if let Some(t) = tenant {
                req = req.tenant(t);
            }
            if let Some(e) = expires_at {
                req = req.expires_at(parse_time(Some(e), "--expires-at")?);
            }
            if let Some(id) = hold_id {
                req = req.hold_id(*id);
            }
            let hold = cohort.create_hold(req).await?;
            if json {
                print_json(&serde_json::to_value(&hold).expect("hold serialises"));
            } else {
                outln!("Hold {} placed.\n", hold.hold_id);
                outln!(
                    "{}",
                    table(&HOLD_HEADERS, &hold_rows(cohort, &[hold]).await?)
                );
            }
        }
        HoldsCommand::List {
            entity,
            tenant,
            active,
        } => {
            let mut filter = HoldFilter::all().active_only(*active);
            if let Some(e) = entity {
                filter = filter.entity(entity_id(cohort, e).await?);
            }
            if let Some(t) = tenant {
                filter = filter.tenant(t);
            }
            let holds = cohort.list_holds(&filter).await?;
            if json {
                print_json(&serde_json::to_value(&holds).expect("holds serialise"));
            } else {
                outln!(
                    "{}",
                    table(&HOLD_HEADERS, &hold_rows(cohort, &holds).await?)
                );
            }
        }
        HoldsCommand::Release { hold_id } => {
            let hold = cohort.release_hold(*hold_id).await?;
            if json {
                print_json(&serde_json::to_value(&hold).expect("hold serialises"));
            } else {
                outln!("Hold {} released.", hold.hold_id);
            }
        }
    }
    Ok(())
}

pub(crate) async fn runs(cohort: &Cohort, json: bool, cmd: &RunsCommand) -> Result<(), Failure> {
    match cmd {
        RunsCommand::List { limit } => {
            let runs = cohort.list_runs(*limit).await?;
            if json {
                print_json(&serde_json::to_value(&runs).expect("runs serialise"));
            } else {
                let rows: Vec<Vec<String>> = runs
                    .iter()
                    .map(|r| {
                        vec![
                            r.run_id.to_string(),
                            r.kind.as_str().to_string(),
                            r.status.as_str().to_string(),
                            if r.dry_run { "yes" } else { "no" }.to_string(),
                            r.tenant.clone().unwrap_or_else(|| "(tenantless)".into()),
                            r.started_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                            r.settled_at
                                .map(|s| {
                                    let ms = (s - r.started_at).num_milliseconds().max(0);
                                    format!("{}.{:03} s", ms / 1000, ms % 1000)
                                })
                                .unwrap_or_else(|| "running".into()),
                            r.affected.to_string(),
                        ]
                    })
                    .collect();
                outln!(
                    "{}",
                    table(
                        &[
                            "RUN",
                            "KIND",
                            "STATUS",
                            "DRY RUN",
                            "TENANT",
                            "STARTED (UTC)",
                            "DURATION",
                            "AFFECTED"
                        ],
                        &rows
                    )
                );
            }
            Ok(())
        }
        RunsCommand::Show { run_id } => {
            let run = cohort.show_run(cohort.find_run(run_id).await?).await?;
            if json {
                print_json(&serde_json::to_value(&run).expect("run serialises"));
            } else {
                print_result(&run);
            }
            Ok(())
        }
    }
}
