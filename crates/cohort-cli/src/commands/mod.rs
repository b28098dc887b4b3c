//! The commands that work on a policy's data: `preview`, `sweep`, `erase`
//! (sweep.rs), `erase-requests` (requests.rs), `holds` (holds.rs), `runs`
//! (history.rs), `dispatch` and `dead-letters` (queue.rs); the progress bar (progress.rs) and what they
//! share (here). Exit codes are mapped in one place, `crate::exit`.

pub(crate) mod audit;
mod history;
mod holds;
mod progress;
mod queue;
mod requests;
pub(crate) mod setup;
mod sweep;

pub(crate) use history::{runs, RunsCommand};
pub(crate) use holds::{holds, HoldsCommand};
pub(crate) use progress::{finish_progress, progress_wanted, Progress};
pub(crate) use queue::{dead_letters, dispatch, DeadLettersCommand};
pub(crate) use requests::{requests, RequestTerms, RequestsCommand};
pub(crate) use sweep::{erase_with, preview, sweep, EraseArgs};

use chrono::{DateTime, FixedOffset, Utc};
use clap::Args;
use cohort::{Cohort, Error};
use uuid::Uuid;

use crate::Failure;

/// `cohort new-id`: a new random id, for a hold or a request.
pub(crate) fn new_id(json: bool) -> Result<(), Failure> {
    let id = Uuid::new_v4();
    if json {
        crate::output::print_json(&serde_json::json!({ "id": id }));
    } else {
        outln!("{id}");
    }
    Ok(())
}

/// `cohort erase`: its terms checked before the database is opened.
pub(crate) async fn erase(cli: &crate::Cli, args: &EraseArgs) -> Result<(), Failure> {
    let terms = RequestTerms::new(&args.reference, &args.due, &args.due_reason, &args.note)?;
    let (cohort, _) = crate::open::open(cli).await?;
    erase_with(&cohort, cli.json, args, terms).await
}

/// `cohort dispatch`: the dispatcher, with the policy's handlers.
pub(crate) async fn dispatch_command(cli: &crate::Cli, once: bool) -> Result<(), Failure> {
    let (cohort, policy) = crate::open::open_with(cli, true, false).await?;
    dispatch(&cohort, &policy, cli.json, once).await
}

/// `--tenant T`, `--tenantless` or `--all-tenants`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct SweepScope {
    /// The tenant whose tenant-scoped entities are swept (a negative
    /// number is a value).
    #[arg(long, allow_negative_numbers = true)]
    tenant: Option<String>,
    /// Sweep the tenantless entities.
    #[arg(long)]
    tenantless: bool,
    /// Sweep every tenant of the policy file in order, then the tenantless entities.
    #[arg(long)]
    all_tenants: bool,
}

pub(super) fn bad(msg: impl Into<String>) -> Failure {
    Failure::Input(Error::InvalidInput(msg.into()))
}

pub(super) fn parse_time(text: Option<&str>, what: &str) -> Result<DateTime<FixedOffset>, Failure> {
    match text {
        None => Ok(Utc::now().fixed_offset()),
        Some(t) => DateTime::parse_from_rfc3339(t)
            .map_err(|e| bad(format!("{what} {t:?} is not an RFC 3339 time: {e}"))),
    }
}

/// Worker-only settings do not change a manual run: say so when they are
/// on (in the configuration or the database). Only a note: when the
/// settings cannot be read (a role without access to them), the run goes
/// ahead as requested.
pub(super) async fn note_worker_settings(cohort: &Cohort, dry_run: bool) -> Result<(), Failure> {
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

pub(super) async fn entity_id(cohort: &Cohort, id_or_name: &str) -> Result<Uuid, Failure> {
    let model = cohort.ready().await?;
    model
        .find_entity(id_or_name)
        .map(|e| e.id)
        .ok_or_else(|| bad(format!("no retained entity with id or name {id_or_name:?}")))
}
