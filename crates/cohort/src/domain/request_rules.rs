//! The rules of an erasure request, apart from the database: which terms
//! open one, when it is due, whether a reference's request is the one
//! asked for again, and which state an attempt leaves it in. `run::requests`
//! reads and writes; everything it decides is decided here.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::erasure::ErasureRequest;
use crate::domain::erasure_requests::{
    Due, PartReason, RequestRecord, RequestState, Terms, WaitingPart, DEFAULT_DUE_DAYS,
    MAX_REFERENCE_CHARS,
};
use crate::domain::outcome::{ErasureResult, RunStatus};
use crate::domain::rules::Period;
use crate::error::{Error, Result};

/// How long a part kept by a NULL anchor or a reference waits before the
/// maintenance pass looks again.
pub(crate) const RECHECK_AFTER: chrono::Duration = chrono::Duration::days(1);

/// Checks a request's terms before anything is written: not a dry run, a
/// reference without surrounding spaces or control characters, a due
/// date's reason not empty.
pub(crate) fn check_terms(dry_run: bool, terms: &Terms) -> Result<()> {
    if dry_run {
        return Err(Error::InvalidInput(
            "a dry run opens no erasure request: drop the reference (--reference) or the dry run (--dry-run)".into(),
        ));
    }
    let reference = terms.reference.as_str();
    if reference.trim().is_empty() || reference.trim() != reference {
        return Err(Error::InvalidInput(format!(
            "erasure request reference {reference:?}: it must not be empty or start or end with spaces"
        )));
    }
    if reference.chars().count() > MAX_REFERENCE_CHARS || reference.chars().any(char::is_control) {
        return Err(Error::InvalidInput(format!(
            "erasure request reference {reference:?}: at most {MAX_REFERENCE_CHARS} characters, none of them control characters"
        )));
    }
    if terms
        .due_reason
        .as_deref()
        .is_some_and(|r| r.trim().is_empty())
    {
        return Err(Error::InvalidInput(
            "a due date's reason must not be empty".into(),
        ));
    }
    Ok(())
}

/// When a request is due: its terms' due date (30 days after it was
/// received by default), which must be after it was received.
pub(crate) fn due_at(terms: &Terms, now: DateTime<Utc>) -> Result<DateTime<Utc>> {
    let due_at = terms
        .due
        .unwrap_or(Due::After(
            Period::from_days(DEFAULT_DUE_DAYS).expect("30 days"),
        ))
        .at(now)?;
    if due_at <= now {
        return Err(Error::InvalidInput(format!(
            "erasure request {:?}: due {} is not after the request's time {}",
            terms.reference,
            due_at.to_rfc3339(),
            now.to_rfc3339()
        )));
    }
    Ok(due_at)
}

/// The new due date of a request moved to `due` for `reason` at `now`:
/// refused without a reason, for a completed request, and for a date
/// already past.
pub(crate) fn moved_due(
    current: &RequestRecord,
    due: Due,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>> {
    if reason.trim().is_empty() {
        return Err(Error::InvalidInput(
            "moving a due date needs a reason (--reason)".into(),
        ));
    }
    if current.state == RequestState::Completed {
        return Err(Error::Conflict(format!(
            "erasure request {:?} is completed; its due date stays",
            current.reference
        )));
    }
    let due_at = due.at(current.received_at)?;
    if due_at <= now {
        return Err(Error::InvalidInput(format!(
            "due {} is in the past (the database clock reads {})",
            due_at.to_rfc3339(),
            now.to_rfc3339()
        )));
    }
    Ok(due_at)
}

/// The line of history a request opened at `due_at` starts with.
pub(crate) fn opened_detail(terms: &Terms, due_at: DateTime<Utc>) -> String {
    format!(
        "opened: due {}{}",
        due_at.to_rfc3339(),
        terms
            .due_reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default(),
    )
}

/// The line of history that moves a due date from `from` to `to`.
pub(crate) fn due_moved_detail(from: DateTime<Utc>, to: DateTime<Utc>, reason: &str) -> String {
    format!(
        "due date moved from {} to {}: {reason}",
        from.to_rfc3339(),
        to.to_rfc3339()
    )
}

/// The dates a line of history moved a due date between, in microseconds
/// (as the ledger stores them); `None` for any other line.
pub(crate) fn due_moved_in(detail: &str) -> Option<(i64, i64)> {
    let rest = detail.strip_prefix("due date moved from ")?;
    let (from, rest) = rest.split_once(" to ")?;
    let (to, _reason) = rest.split_once(": ")?;
    let micros = |t: &str| {
        DateTime::parse_from_rfc3339(t)
            .ok()
            .map(|t| t.with_timezone(&Utc).timestamp_micros())
    };
    Some((micros(from)?, micros(to)?))
}

/// Whether the reference's existing request is the one `req` asks for
/// (same tenant, kind and subject), and may run again (not completed).
/// `canonical` spells a stored tenant the way `req`'s is spelled.
pub(crate) fn same_request(
    existing: &RequestRecord,
    req: &ErasureRequest,
    hash: &str,
    terms: &Terms,
    canonical: impl Fn(&str) -> Option<String>,
) -> Result<()> {
    let r = &existing.reference;
    if existing.state == RequestState::Completed {
        return Err(Error::Conflict(format!(
            "erasure request {r:?} was completed at {}; open a new request with another reference",
            existing
                .completed_at
                .map(|t| t.to_rfc3339())
                .unwrap_or_default()
        )));
    }
    if existing.subject_hash != hash
        // Requests opened before tenants were recorded canonically may
        // hold another spelling of the same tenant.
        || existing.tenant.as_deref().map(|t| canonical(t).unwrap_or_else(|| t.to_owned()))
            != req.tenancy.tenant
        || existing.kind != req.scope.kind
    {
        return Err(Error::Conflict(format!(
            "erasure request {r:?} exists for another subject, tenant or kind; a reference names one request"
        )));
    }
    if terms.due.is_some() || terms.note.is_some() {
        return Err(Error::InvalidInput(format!(
            "erasure request {r:?} exists: run it again without --due or --note, and move its due date with `cohort erase-requests extend {r} --due … --reason …`"
        )));
    }
    Ok(())
}

/// A request state as the ledger spells it; an unknown one is a ledger
/// this version does not read.
pub(crate) fn parse_state(state: &str) -> Result<RequestState> {
    RequestState::parse(state).ok_or_else(|| {
        Error::Migration(format!(
            "unknown erasure request state {state:?} in the ledger"
        ))
    })
}

/// Whether a request's state may go from `from` to `to` between two
/// consecutive lines of its history, as Cohort writes them: an attempt
/// starts (in progress) from open, waiting or failed, or again from in
/// progress when a lost process left it there, and ends completed, waiting
/// or failed; every other line (a due date moved, a replay's note) keeps
/// the state; nothing leaves completed. A step outside these is a state
/// changed by hand and linked by the next line.
pub(crate) fn step_allowed(from: RequestState, to: RequestState) -> bool {
    use RequestState::*;
    from == to
        || matches!(
            (from, to),
            (Open | Waiting | Failed, InProgress) | (InProgress, Completed | Waiting | Failed)
        )
}

/// What is wrong with a request's step from the state `from` (its earlier
/// linked line) to `to` (this line), when `moves_due` says whether this
/// line moves its due date: `None` when Cohort writes such a step.
pub(crate) fn step_refused(from: &str, to: &str, moves_due: bool) -> Option<String> {
    let (Some(a), Some(b)) = (RequestState::parse(from), RequestState::parse(to)) else {
        return Some(format!(
            "its state went from {from:?} to {to:?}, not both states"
        ));
    };
    if moves_due && a != b {
        return Some(format!(
            "its state went from {from} to {to} at a line that moves its due date, which keeps the state"
        ));
    }
    (!step_allowed(a, b)).then(|| {
        format!(
            "its state went from {from} to {to}, a step no line of Cohort's takes (an attempt goes from open, waiting or failed to in_progress, and from in_progress to completed, waiting or failed)"
        )
    })
}

/// A change of a request's state, with what the request row and its line
/// of history record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transition {
    pub(crate) state: RequestState,
    pub(crate) resume_at: Option<DateTime<Utc>>,
    pub(crate) parts: Vec<WaitingPart>,
    pub(crate) run_id: Option<Uuid>,
    pub(crate) error: Option<String>,
    /// The line of history.
    pub(crate) detail: String,
    /// An attempt starting (it records the attempt's snapshot).
    pub(crate) starting: bool,
}

impl Transition {
    /// An attempt starts.
    pub(crate) fn started() -> Self {
        Transition {
            state: RequestState::InProgress,
            resume_at: None,
            parts: Vec::new(),
            run_id: None,
            error: None,
            detail: "attempt started".into(),
            starting: true,
        }
    }

    /// The attempt's erasure failed (refused, or its connection lost).
    pub(crate) fn failed(why: String) -> Self {
        Transition {
            state: RequestState::Failed,
            detail: format!("failed: {why}"),
            error: Some(why),
            starting: false,
            ..Transition::started()
        }
    }

    /// What an attempt's erasure leaves the request in: failed when the
    /// run did not succeed, completed when nothing was kept, else waiting
    /// for its kept parts (from the earliest time one can go).
    pub(crate) fn after(result: &ErasureResult, now: DateTime<Utc>) -> Self {
        let parts = parts_of(result);
        let changed: u64 = result.entities.iter().map(|e| e.affected).sum();
        let run_id = Some(result.run_id);
        if result.status != RunStatus::Succeeded {
            let why = format!(
                "run {} settled {}{}",
                result.run_id,
                result.status.as_str(),
                result
                    .failures
                    .iter()
                    .map(|f| format!("; {}: {}", f.entity, f.error))
                    .collect::<String>()
            );
            return Transition {
                run_id,
                resume_at: resume_at(&parts, now),
                parts,
                ..Transition::failed(why)
            };
        }
        let (state, detail) = if parts.is_empty() {
            (
                RequestState::Completed,
                format!(
                    "completed: {changed} row(s) changed by this attempt; the subject's identifier is cleared"
                ),
            )
        } else {
            (
                RequestState::Waiting,
                format!(
                    "waiting: {changed} row(s) changed by this attempt; kept: {}",
                    describe_parts(&parts)
                ),
            )
        };
        Transition {
            state,
            resume_at: resume_at(&parts, now),
            parts,
            run_id,
            error: None,
            detail,
            starting: false,
        }
    }
}

/// What an attempt kept, per entity and reason.
pub(crate) fn parts_of(result: &ErasureResult) -> Vec<WaitingPart> {
    let mut parts = Vec::new();
    for o in &result.entities {
        let mut part = |reason, rows: u64, until| {
            if rows > 0 {
                parts.push(WaitingPart {
                    entity_id: o.entity_id,
                    entity: o.entity.clone(),
                    reason,
                    rows,
                    until,
                });
            }
        };
        part(PartReason::Held, o.held, None);
        part(
            PartReason::LegalMinimum,
            o.kept_by_legal_min,
            o.kept_by_legal_min_until,
        );
        part(PartReason::NullAnchor, o.null_anchor, None);
        part(PartReason::Referenced, o.skipped, None);
    }
    parts
}

/// When the maintenance pass tries a waiting request again by the clock:
/// a legal minimum's part when it passes; a part kept by a NULL anchor or
/// a reference (which someone must fix, and Cohort cannot watch) a day
/// after this attempt, and every day after that until it goes. A held
/// part needs no time: the pass resumes it when a hold is released that
/// the attempt could not see released (see `sql::requests::to_resume`).
pub(crate) fn resume_at(parts: &[WaitingPart], now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let recheck = parts
        .iter()
        .any(|p| matches!(p.reason, PartReason::NullAnchor | PartReason::Referenced))
        .then(|| now + RECHECK_AFTER);
    parts
        .iter()
        .filter(|p| p.reason == PartReason::LegalMinimum)
        .filter_map(|p| p.until)
        .chain(recheck)
        .min()
}

/// The kept parts as a line of history says them.
pub(crate) fn describe_parts(parts: &[WaitingPart]) -> String {
    parts
        .iter()
        .map(|p| {
            let why = match p.reason {
                PartReason::Held => "held".to_owned(),
                PartReason::LegalMinimum => format!(
                    "legal minimum until {}",
                    p.until.map(|t| t.to_rfc3339()).unwrap_or_default()
                ),
                PartReason::NullAnchor => "NULL anchor".to_owned(),
                PartReason::Referenced => "still referenced".to_owned(),
            };
            format!("{} {} row(s) ({why})", p.entity, p.rows)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::erasure::ErasureScope;
    use crate::domain::outcome::{EntityFailure, EntityOutcome, RunKind, SweepResult, Trigger};
    use crate::domain::rules::Strategy;
    use chrono::TimeZone;

    fn at(day: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, day, 12, 0, 0).unwrap()
    }

    fn terms(reference: &str) -> Terms {
        Terms {
            reference: reference.into(),
            ..Terms::default()
        }
    }

    fn refusal(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(Error::InvalidInput(m)) | Err(Error::Conflict(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn terms_table() {
        let reason = |r: &str| Terms {
            due_reason: Some(r.into()),
            ..terms("SAR-1")
        };
        let long = "x".repeat(MAX_REFERENCE_CHARS + 1);
        let cases: Vec<(bool, Terms, Option<&str>)> = vec![
            (false, terms("SAR-1"), None),
            (false, terms(&"x".repeat(MAX_REFERENCE_CHARS)), None),
            (false, reason("statutory extension"), None),
            (
                true,
                terms("SAR-1"),
                Some("a dry run opens no erasure request"),
            ),
            (false, terms(""), Some("must not be empty")),
            (false, terms("   "), Some("must not be empty")),
            (false, terms(" SAR-1"), Some("start or end with spaces")),
            (false, terms("SAR-1\t"), Some("start or end with spaces")),
            (false, terms("SAR\n1"), Some("control characters")),
            (false, terms(&long), Some("at most 200 characters")),
            (
                false,
                reason("  "),
                Some("a due date's reason must not be empty"),
            ),
        ];
        for (dry_run, t, want) in cases {
            let got = check_terms(dry_run, &t);
            match want {
                None => assert!(got.is_ok(), "{:?}: {got:?}", t.reference),
                Some(w) => assert!(refusal(got).contains(w), "{:?}: want {w}", t.reference),
            }
        }
    }

    #[test]
    fn due_dates_default_to_thirty_days_and_must_come_after_receipt() {
        assert_eq!(due_at(&terms("a"), at(1)).unwrap(), at(31));
        let dated = |due| Terms {
            due: Some(due),
            ..terms("a")
        };
        let in_7 = Due::After(Period::from_days(7).unwrap());
        assert_eq!(due_at(&dated(in_7), at(1)).unwrap(), at(8));
        assert_eq!(due_at(&dated(Due::At(at(20))), at(1)).unwrap(), at(20));
        for past in [Due::At(at(1)), Due::At(at(2))] {
            let m = refusal(due_at(&dated(past), at(2)));
            assert!(m.contains("is not after the request's time"), "{m}");
        }
    }

    fn record(state: RequestState) -> RequestRecord {
        RequestRecord {
            request_id: Uuid::nil(),
            reference: "SAR-1".into(),
            tenant: Some("ACME".into()),
            kind: Some("customer".into()),
            subject: Some("42".into()),
            subject_hash: "h".into(),
            allow_soft_delete: false,
            stage: None,
            note: None,
            state,
            received_at: at(1),
            due_at: at(31),
            due_reason: None,
            attempted_at: None,
            resume_at: None,
            completed_at: (state == RequestState::Completed).then(|| at(3)),
            last_run_id: None,
            waiting: Vec::new(),
            error: None,
            overdue: false,
        }
    }

    #[test]
    fn a_due_date_moves_forward_with_a_reason_and_not_for_a_completed_request() {
        let later = Due::At(at(28));
        let open = record(RequestState::Waiting);
        assert_eq!(moved_due(&open, later, "extension", at(5)).unwrap(), at(28));
        let in_40 = Due::After(Period::from_days(40).unwrap());
        assert_eq!(
            moved_due(&open, in_40, "x", at(5)).unwrap(),
            at(1) + chrono::Duration::days(40)
        );
        let cases = [
            (open.clone(), later, " ", "needs a reason"),
            (record(RequestState::Completed), later, "x", "is completed"),
            (open.clone(), Due::At(at(4)), "x", "is in the past"),
            (open.clone(), Due::At(at(5)), "x", "is in the past"),
        ];
        for (current, due, reason, want) in cases {
            let m = refusal(moved_due(&current, due, reason, at(5)));
            assert!(m.contains(want), "{m} (want {want})");
        }
    }

    #[test]
    fn a_reference_names_one_request() {
        let scope = || ErasureScope::new("42").kind("customer");
        let acme = ErasureRequest::tenanted("ACME", scope(), at(5));
        let canonical = |t: &str| Some(t.to_uppercase());
        let existing = record(RequestState::Waiting);
        same_request(&existing, &acme, "h", &terms("SAR-1"), canonical).unwrap();
        // Stored under another spelling of the same tenant.
        let lower = RequestRecord {
            tenant: Some("acme".into()),
            ..existing.clone()
        };
        same_request(&lower, &acme, "h", &terms("SAR-1"), canonical).unwrap();
        let other_kind = ErasureRequest::tenanted("ACME", ErasureScope::new("42"), at(5));
        let globex = ErasureRequest::tenanted("GLOBEX", scope(), at(5));
        let noted = Terms {
            note: Some("again".into()),
            ..terms("SAR-1")
        };
        let cases: Vec<(RequestRecord, &ErasureRequest, &str, Terms, &str)> = vec![
            (
                record(RequestState::Completed),
                &acme,
                "h",
                terms("SAR-1"),
                "was completed at 2026-03-03",
            ),
            (
                existing.clone(),
                &acme,
                "other",
                terms("SAR-1"),
                "exists for another subject",
            ),
            (
                existing.clone(),
                &globex,
                "h",
                terms("SAR-1"),
                "exists for another subject",
            ),
            (
                existing.clone(),
                &other_kind,
                "h",
                terms("SAR-1"),
                "exists for another subject",
            ),
            (
                existing.clone(),
                &acme,
                "h",
                noted,
                "run it again without --due or --note",
            ),
        ];
        for (existing, req, hash, t, want) in cases {
            let m = refusal(same_request(&existing, req, hash, &t, canonical));
            assert!(m.contains(want), "{m} (want {want})");
        }
    }

    #[test]
    fn states_read_from_the_ledger_or_name_what_they_are_not() {
        for s in RequestState::ALL {
            assert_eq!(parse_state(s.as_str()).unwrap(), s);
        }
        match parse_state("paused") {
            Err(Error::Migration(m)) => assert!(m.contains("\"paused\""), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    /// An entity's outcome with the given changed and kept rows.
    fn outcome(
        name: &str,
        changed: u64,
        kept: [u64; 4],
        until: Option<DateTime<Utc>>,
    ) -> EntityOutcome {
        let [held, legal, null_anchor, referenced] = kept;
        EntityOutcome {
            entity_id: Uuid::nil(),
            entity: name.into(),
            category: "c".into(),
            strategy: Strategy::Purge,
            affected: changed,
            held,
            held_by_subject: 0,
            skipped: referenced,
            null_anchor,
            kept_by_legal_min: legal,
            kept_by_legal_min_until: until,
            kept_by_policy: 0,
            cutoff: None,
            period: Period::from_days(1).unwrap(),
            legal_min: None,
            stage: None,
            batch_size: None,
            note: None,
            table: None,
            throttled_ms: None,
            lag_waited_ms: None,
            paused: false,
            pacing_notes: Vec::new(),
            partition_notes: Vec::new(),
        }
    }

    fn result(status: RunStatus, entities: Vec<EntityOutcome>) -> ErasureResult {
        ErasureResult {
            run: SweepResult {
                run_id: Uuid::from_u128(7),
                kind: RunKind::Erasure,
                trigger: Trigger::Manual,
                status,
                dry_run: false,
                tenant: None,
                started_at: at(5),
                settled_at: Some(at(5)),
                entities,
                failures: Vec::new(),
                erasure_kind: None,
            },
            not_reached: Vec::new(),
            request: None,
        }
    }

    #[test]
    fn an_attempt_leaves_a_request_completed_waiting_or_failed() {
        let now = at(5);
        let all_gone = result(
            RunStatus::Succeeded,
            vec![outcome("orders", 3, [0; 4], None)],
        );
        let t = Transition::after(&all_gone, now);
        assert_eq!(
            (t.state, t.resume_at, t.parts.len()),
            (RequestState::Completed, None, 0)
        );
        assert!(t.detail.starts_with("completed: 3 row(s)"), "{}", t.detail);
        assert_eq!(t.run_id, Some(Uuid::from_u128(7)));

        let held = result(
            RunStatus::Succeeded,
            vec![outcome("orders", 1, [2, 0, 0, 0], None)],
        );
        let t = Transition::after(&held, now);
        assert_eq!((t.state, t.resume_at), (RequestState::Waiting, None));
        assert_eq!(
            t.detail,
            "waiting: 1 row(s) changed by this attempt; kept: orders 2 row(s) (held)"
        );

        let mut failed = result(
            RunStatus::Failed,
            vec![outcome("orders", 0, [0, 1, 0, 0], Some(at(9)))],
        );
        failed.run.failures.push(EntityFailure {
            entity_id: Uuid::nil(),
            entity: "invoices".into(),
            error: "lock timeout".into(),
        });
        let t = Transition::after(&failed, now);
        assert_eq!(
            (t.state, t.resume_at, t.parts.len()),
            (RequestState::Failed, Some(at(9)), 1)
        );
        let why = format!(
            "run {} settled failed; invoices: lock timeout",
            Uuid::from_u128(7)
        );
        assert_eq!(t.error.as_deref(), Some(why.as_str()));
        assert_eq!(t.detail, format!("failed: {why}"));
        assert!(!t.starting && Transition::started().starting);
    }

    #[test]
    fn kept_parts_resume_at_the_earliest_time_one_can_go() {
        let now = at(5);
        let recheck = now + RECHECK_AFTER;
        // [held, legal minimum, NULL anchor, referenced] per entity.
        let cases: Vec<(Vec<EntityOutcome>, usize, Option<DateTime<Utc>>)> = vec![
            (vec![outcome("a", 0, [1, 0, 0, 0], None)], 1, None),
            (
                vec![outcome("a", 0, [0, 1, 0, 0], Some(at(20)))],
                1,
                Some(at(20)),
            ),
            (
                vec![
                    outcome("a", 0, [0, 1, 0, 0], Some(at(20))),
                    outcome("b", 0, [0, 1, 0, 0], Some(at(9))),
                ],
                2,
                Some(at(9)),
            ),
            (vec![outcome("a", 0, [0, 0, 1, 0], None)], 1, Some(recheck)),
            (vec![outcome("a", 0, [0, 0, 0, 1], None)], 1, Some(recheck)),
            (
                vec![outcome("a", 0, [0, 1, 0, 1], Some(at(20)))],
                2,
                Some(recheck),
            ),
            (
                vec![outcome("a", 0, [0, 1, 0, 0], Some(at(6)))],
                1,
                Some(at(6)),
            ),
            (
                vec![outcome("a", 0, [1, 2, 3, 4], Some(at(6)))],
                4,
                Some(at(6)),
            ),
        ];
        for (entities, parts, want) in cases {
            let kept = parts_of(&result(RunStatus::Succeeded, entities));
            assert_eq!(kept.len(), parts, "{kept:?}");
            assert_eq!(resume_at(&kept, now), want, "{kept:?}");
        }
    }

    #[test]
    fn kept_parts_are_said_with_their_reasons() {
        let kept = parts_of(&result(
            RunStatus::Succeeded,
            vec![outcome("orders", 0, [1, 2, 3, 4], Some(at(6)))],
        ));
        assert_eq!(
            describe_parts(&kept),
            "orders 1 row(s) (held), orders 2 row(s) (legal minimum until 2026-03-06T12:00:00+00:00), \
             orders 3 row(s) (NULL anchor), orders 4 row(s) (still referenced)"
        );
        let terms = Terms {
            due_reason: Some("complex request".into()),
            ..terms("a")
        };
        assert_eq!(
            opened_detail(&terms, at(31)),
            "opened: due 2026-03-31T12:00:00+00:00 (complex request)"
        );
    }

    #[test]
    fn a_state_steps_only_as_an_attempt_takes_it() {
        use RequestState::*;
        let allowed = [
            (Open, InProgress),
            (Waiting, InProgress),
            (Failed, InProgress),
            (InProgress, InProgress),
            (InProgress, Completed),
            (InProgress, Waiting),
            (InProgress, Failed),
        ];
        for from in RequestState::ALL {
            for to in RequestState::ALL {
                let expected = from == to || allowed.contains(&(from, to));
                assert_eq!(step_allowed(from, to), expected, "{from:?} -> {to:?}");
                assert_eq!(
                    step_refused(from.as_str(), to.as_str(), false).is_none(),
                    expected,
                    "{from:?} -> {to:?}"
                );
            }
        }
        // The steps an attacker wants: work that must be done called
        // failed or done without an attempt.
        for (from, to) in [
            (Waiting, Failed),
            (Open, Completed),
            (Waiting, Completed),
            (Failed, Completed),
            (Completed, Waiting),
        ] {
            let why = step_refused(from.as_str(), to.as_str(), false).unwrap();
            assert!(
                why.contains(&format!("from {} to {}", from.as_str(), to.as_str())),
                "{why}"
            );
        }
        // A line moving the due date keeps the state, even a step an
        // attempt may take.
        assert!(step_refused("in_progress", "failed", true)
            .unwrap()
            .contains("moves its due date"));
        assert_eq!(step_refused("waiting", "waiting", true), None);
        assert!(step_refused("waiting", "gone", false)
            .unwrap()
            .contains("not both states"));
    }

    #[test]
    fn a_moved_due_date_reads_back_from_its_line_and_no_other_line_moves_one() {
        let (from, to) = (at(31), at(20) + chrono::Duration::days(40));
        let line = due_moved_detail(from, to, "complex: two systems");
        assert_eq!(
            due_moved_in(&line),
            Some((from.timestamp_micros(), to.timestamp_micros()))
        );
        let fine = Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap()
            + chrono::Duration::nanoseconds(1_234_567);
        let line = due_moved_detail(at(1), fine, "x");
        assert_eq!(
            due_moved_in(&line).map(|(_, to)| to),
            Some(fine.timestamp_micros())
        );
        for other in [
            "opened: due 2026-03-31T12:00:00+00:00",
            "attempt started",
            "due date moved from yesterday to tomorrow: x",
            "due date moved from 2026-03-31T12:00:00+00:00 to 2026-04-30T12:00:00+00:00",
        ] {
            assert_eq!(due_moved_in(other), None, "{other}");
        }
    }
}
