//! `cohort dispatch` and `cohort dead-letters`: the handler queue.

use clap::Subcommand;
use cohort::policy::PolicyFile;
use cohort::Cohort;
use serde_json::json;

use crate::output::{print_json, table, with_record_arrays};
use crate::Failure;

use super::*;

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
                print_json(&with_record_arrays(
                    &*cohort.ready().await?,
                    serde_json::to_value(&letters).expect("dead letters serialise"),
                ));
            } else {
                let rows: Vec<Vec<String>> = letters
                    .iter()
                    .map(|l| {
                        vec![
                            l.id.to_string(),
                            l.entity.clone(),
                            l.record_id.clone(),
                            l.action.clone(),
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
                            "ROW",
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
