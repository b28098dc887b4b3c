//! `cohort pause ENTITY` and `cohort resume ENTITY`, and how the live
//! pacing rows print (here and in `settings show`).

use cohort::settings::LivePacing;
use cohort::Cohort;

use crate::output::{print_json, table};
use crate::Failure;

/// Pauses (or resumes) one entity's sweeps in the database, for every
/// replica, and prints every live pacing row.
pub(crate) async fn pause(
    cohort: &Cohort,
    json: bool,
    entity: &str,
    paused: bool,
) -> Result<(), Failure> {
    let rows = if paused {
        cohort.pause(entity).await?
    } else {
        cohort.resume(entity).await?
    };
    if json {
        print_json(&serde_json::json!(rows));
        return Ok(());
    }
    if paused {
        outln!("paused {entity}: every sweep skips it, or stops before its next batch (the open one commits), until `cohort resume {entity}`");
    } else {
        outln!("resumed {entity}: its next sweep goes on as usual");
    }
    print_rows(&rows);
    Ok(())
}

/// The live pacing rows as a table (nothing when there are none).
pub(crate) fn print_rows(rows: &[LivePacing]) {
    if rows.is_empty() {
        outln!("no live pacing (no entity paused, no limit set in the database)");
        return;
    }
    let or_none = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.entity
                    .clone()
                    .unwrap_or_else(|| "* (every entity)".into()),
                if r.paused { "paused" } else { "-" }.to_string(),
                or_none(r.max_rows_per_second.map(|n| n.to_string())),
                or_none(
                    r.max_replica_lag_ms
                        .map(|ms| format!("{}s", ms as f64 / 1000.0)),
                ),
                format!(
                    "{} by {}",
                    r.updated_at.format("%Y-%m-%d %H:%M:%S UTC"),
                    r.updated_by
                ),
            ]
        })
        .collect();
    outln!(
        "{}",
        table(
            &[
                "live pacing",
                "paused",
                "max_rows_per_second",
                "max_replica_lag",
                "set"
            ],
            &cells
        )
    );
}
