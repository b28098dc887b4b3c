//! `cohort restore-check`, `cohort replay` and the worker's refusal to
//! start on a restored database not yet replayed (see `cohort::restore`).

use cohort::{Cohort, Error};

use crate::output::print_json;
use crate::Failure;

/// `restore-check`: exit 0 when the database knows everything the journal
/// holds, 1 when something is missing, 2 on bad input (no journal, a
/// broken chain, a wrong key).
pub(crate) async fn check(cohort: &Cohort, json: bool) -> Result<(), Failure> {
    let check = cohort.restore_check().await?;
    if json {
        print_json(&serde_json::to_value(&check).expect("the check serialises"));
    } else {
        outln!(
            "The journal's {} entries check out (head {}).",
            check.entries,
            check.head.as_deref().unwrap_or("-")
        );
        if check.entries_without_mac > 0 {
            outln!(
                "{} entries were written before entries carried MACs: a writer without the key could have written those.",
                check.entries_without_mac
            );
        }
        for r in &check.resolved {
            eprintln!("cohort: warning: resolved: {r}");
        }
        if check.is_clean() {
            outln!("The database knows everything the journal holds.");
        } else {
            for line in check.describe() {
                outln!("missing: {line}");
            }
            outln!("Run `cohort replay` (see docs/erasure.md, \"After a restore\").");
        }
    }
    if check.is_clean() {
        Ok(())
    } else {
        Err(Failure::Status(1))
    }
}

/// `replay [--dry-run] [--journal-copy DIR]`: exit 0 once nothing is
/// missing, 1 while something still is (a dry run exits 1 when there is
/// work to do), 2 when refused (another cluster's journal without a copy).
pub(crate) async fn replay(
    cohort: &Cohort,
    json: bool,
    dry_run: bool,
    journal_copy: Option<&std::path::Path>,
) -> Result<(), Failure> {
    let report = match journal_copy {
        Some(dir) => cohort.replay_onto_copy(dry_run, dir).await?,
        None => cohort.replay(dry_run).await?,
    };
    if let (Some(dir), false) = (journal_copy, json) {
        outln!(
            "Replaying onto the journal's copy in {} (the configured journal is not written).",
            dir.display()
        );
    }
    if json {
        print_json(&serde_json::to_value(&report).expect("the report serialises"));
    } else {
        // One hold or request a line.
        let verb = if dry_run { "would be" } else { "was" };
        for h in &report.holds_placed {
            outln!("hold {h} {verb} placed again");
        }
        for h in &report.holds_released {
            outln!("hold {h} {verb} released again");
        }
        for r in &report.requests_restored {
            outln!("erasure request {r} {verb} restored from the journal");
        }
        for (r, state) in &report.requests_run {
            outln!("erasure request {r} was run again: {state}");
        }
        for s in &report.skipped {
            outln!("skipped: {s}");
        }
        if report.check.is_clean() {
            outln!("The database knows everything the journal holds.");
        } else {
            for line in report.check.describe() {
                outln!("still missing: {line}");
            }
        }
    }
    if report.check.is_clean() {
        Ok(())
    } else {
        Err(Failure::Status(1))
    }
}

/// The worker does not start on a database that lacks what the journal
/// holds, unless told to (`--ignore-restore-gap`).
pub(crate) async fn refuse_gap(cohort: &Cohort, ignore: bool) -> Result<(), Failure> {
    if !cohort.has_journal() {
        return Ok(());
    }
    let check = cohort.restore_check().await?;
    if check.is_clean() {
        return Ok(());
    }
    if ignore {
        tracing::warn!(
            gaps = check.describe().len(),
            "the database lacks what the journal holds; starting anyway (--ignore-restore-gap)"
        );
        return Ok(());
    }
    Err(Failure::Input(Error::Refused(format!(
        "the database lacks what the journal holds (restored from a backup?): {}; run `cohort replay`, or start with --ignore-restore-gap",
        check.describe().join("; ")
    ))))
}
