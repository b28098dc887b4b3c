//! `cohort runs`: the ledger read back.

use clap::Subcommand;
use cohort::history::{RecordEvent, RunLine};
use cohort::Cohort;

use crate::output::{print_json, table};
use crate::Failure;

use super::sweep::print_result;

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
    /// What happened to one record across runs, oldest first (from the
    /// details of per-row audit and of rows set aside).
    Record {
        /// The entity's name or id.
        entity: String,
        /// The record's id, in the entity's key type.
        record: String,
    },
}

/// `cohort runs`: the runs listed, one run shown, or one record's history,
/// as a table or as JSON.
pub(crate) async fn runs(cohort: &Cohort, json: bool, cmd: &RunsCommand) -> Result<(), Failure> {
    match cmd {
        RunsCommand::List { limit } => {
            let runs = cohort.list_runs(*limit).await?;
            if json {
                print_json(&serde_json::to_value(&runs).expect("runs serialise"));
            } else {
                print_runs(&runs);
            }
            Ok(())
        }
        RunsCommand::Record { entity, record } => {
            let entity_id = super::entity_id(cohort, entity).await?;
            let events = cohort.record_history(entity_id, record).await?;
            if json {
                print_json(&serde_json::to_value(&events).expect("events serialise"));
            } else {
                print_record(entity, record, &events);
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

/// `cohort runs list` as a table, one run a line.
fn print_runs(runs: &[RunLine]) {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.run_id.to_string(),
                r.kind.as_str().to_string(),
                r.trigger.as_str().to_string(),
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
                "TRIGGER",
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

/// `cohort runs record` as a table, one event a line, or a line saying
/// the ledger has no detail of the record.
fn print_record(entity: &str, record: &str, events: &[RecordEvent]) {
    if events.is_empty() {
        outln!(
            "no detail of record {record} of {entity} in the ledger (details are written for categories with per-row audit)"
        );
        return;
    }
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                e.recorded_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                e.action.clone(),
                e.run_id.to_string(),
                e.kind.as_str().to_string(),
                e.trigger.as_str().to_string(),
                e.status.as_str().to_string(),
                e.tenant.clone().unwrap_or_else(|| "(tenantless)".into()),
            ]
        })
        .collect();
    outln!(
        "{}",
        table(
            &[
                "RECORDED (UTC)",
                "ACTION",
                "RUN",
                "KIND",
                "TRIGGER",
                "STATUS",
                "TENANT"
            ],
            &rows
        )
    );
}
