//! When the worker runs: cron schedules, the next occurrence by the
//! database's clock, what a replica does with an occurrence others may have
//! run, and how long it waits after failures. Pure: the worker
//! (`services::worker`) reads the clock and the ledger and asks these.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::outcome::RunStatus;

/// Parses a schedule: five cron fields (minute first), six (second
/// first), or a nickname such as `@daily`; evaluated in UTC.
pub(crate) fn parse_schedule(schedule: &str) -> std::result::Result<croner::Cron, String> {
    let fields = schedule.split_whitespace().count();
    let nickname = fields == 1 && schedule.trim_start().starts_with('@');
    if !(nickname || fields == 5 || fields == 6) {
        return Err(format!(
            "schedule {schedule:?} is not a valid cron expression: expected five fields (minute hour day month weekday), six (second first) or a nickname such as @daily, not {fields}"
        ));
    }
    schedule
        .parse::<croner::Cron>()
        .map_err(|e| format!("schedule {schedule:?} is not a valid cron expression: {e}"))
}

/// The first occurrence of `schedule` strictly after both the database's
/// `now` and the occurrence this replica ran last (a replica never runs
/// one occurrence twice, even if the database clock were to step back).
pub(crate) fn next_occurrence(
    schedule: &croner::Cron,
    db_now: DateTime<Utc>,
    last: Option<DateTime<Utc>>,
) -> Option<DateTime<Utc>> {
    use chrono::{SubsecRound, Timelike};
    // Cron has whole seconds: search from the whole second (the search is
    // exclusive, so an occurrence at exactly that second is past).
    let from = last.map_or(db_now, |l| l.max(db_now)).trunc_subsecs(0);
    schedule
        .find_next_occurrence(&from, false)
        .ok()
        .map(|t| t.with_nanosecond(0).unwrap_or(t))
}

/// What a replica holding the occurrence lock does with an occurrence,
/// given the latest Scheduled run of the same kind for it (or a later
/// one): its status, and which pass of how many it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// No run for it yet.
    Run,
    /// Its latest run lost its owner (`Started` while nobody holds the
    /// lock), was cancelled, or was not its last pass (the owner stopped
    /// between passes): sweep it again, every pass.
    Rerun,
    /// It ran to its last pass (settled Succeeded, PartiallyFailed or
    /// Failed; failures are retried at the next occurrence).
    Skip,
}

/// The latest scheduled run of an occurrence, as [`decide`] needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Latest {
    pub(crate) status: RunStatus,
    pub(crate) pass: i32,
    pub(crate) passes: i32,
}

pub(crate) fn decide(latest: Option<Latest>) -> Decision {
    match latest {
        None => Decision::Run,
        Some(l) => match l.status {
            RunStatus::Started | RunStatus::Cancelled => Decision::Rerun,
            RunStatus::Succeeded
            | RunStatus::PartiallyFailed
            | RunStatus::Failed
            | RunStatus::Paused
                if l.pass < l.passes =>
            {
                Decision::Rerun
            }
            RunStatus::Succeeded
            | RunStatus::PartiallyFailed
            | RunStatus::Failed
            | RunStatus::Paused => Decision::Skip,
        },
    }
}

/// How long to wait before trying again after `failures` failed
/// iterations in a row (the database unreachable, say): 1 s doubling to
/// at most 60 s.
pub(crate) fn retry_delay(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(6);
    Duration::from_secs((1u64 << exponent).min(60))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn next_occurrence_follows_the_database_clock_and_never_repeats() {
        let daily: croner::Cron = "0 2 * * *".parse().unwrap();
        let every5s: croner::Cron = "*/5 * * * * *".parse().unwrap();
        let cases: &[(&croner::Cron, &str, Option<&str>, &str)] = &[
            // (schedule, database now, last run, expected next)
            (&daily, "2026-11-30T01:59:59Z", None, "2026-11-30T02:00:00Z"),
            // Exactly at an occurrence: that one is past, the next is due.
            (&daily, "2026-11-30T02:00:00Z", None, "2026-12-01T02:00:00Z"),
            // Missed occurrences are skipped, not caught up.
            (
                &daily,
                "2026-12-03T11:00:00Z",
                Some("2026-11-30T02:00:00Z"),
                "2026-12-04T02:00:00Z",
            ),
            // A database clock that stepped back never repeats the last run.
            (
                &every5s,
                "2026-11-30T10:00:03Z",
                Some("2026-11-30T10:00:05Z"),
                "2026-11-30T10:00:10Z",
            ),
            (
                &every5s,
                "2026-11-30T10:00:04.999Z",
                None,
                "2026-11-30T10:00:05Z",
            ),
            (
                &every5s,
                "2026-11-30T10:00:05.001Z",
                None,
                "2026-11-30T10:00:10Z",
            ),
            // Month and year ends.
            (&daily, "2026-12-31T23:00:00Z", None, "2027-01-01T02:00:00Z"),
        ];
        for (schedule, now, last, want) in cases {
            assert_eq!(
                next_occurrence(schedule, at(now), last.map(at)),
                Some(at(want)),
                "now {now}, last {last:?}"
            );
        }
    }

    #[test]
    fn the_decision_reruns_only_interrupted_occurrences() {
        let l = |status, pass, passes| {
            Some(Latest {
                status,
                pass,
                passes,
            })
        };
        use RunStatus::*;
        let cases = [
            (None, Decision::Run),
            // Owner lost mid-pass, or stopped by shutdown: again, whole.
            (l(Started, 3, 3), Decision::Rerun),
            (l(Started, 1, 3), Decision::Rerun),
            (l(Cancelled, 3, 3), Decision::Rerun),
            // Owner lost between passes.
            (l(Succeeded, 1, 3), Decision::Rerun),
            (l(PartiallyFailed, 2, 3), Decision::Rerun),
            // It ran to its last pass, whatever that pass's outcome.
            (l(Succeeded, 3, 3), Decision::Skip),
            (l(PartiallyFailed, 3, 3), Decision::Skip),
            (l(Failed, 3, 3), Decision::Skip),
            // A paused entity waits for the next occurrence after resume.
            (l(Paused, 3, 3), Decision::Skip),
            (l(Paused, 1, 3), Decision::Rerun),
            (l(Succeeded, 1, 1), Decision::Skip),
        ];
        for (latest, want) in cases {
            assert_eq!(decide(latest), want, "{latest:?}");
        }
    }

    #[test]
    fn retry_delay_doubles_and_saturates() {
        let got: Vec<u64> = [0, 1, 2, 3, 6, 7, 8, 100, u32::MAX]
            .iter()
            .map(|&n| retry_delay(n).as_secs())
            .collect();
        assert_eq!(got, [1, 1, 2, 4, 32, 60, 60, 60, 60]);
    }
}
