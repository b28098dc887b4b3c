//! Metrics, through the [`metrics`] facade. The names and labels are a
//! public contract (dashboards and alerts are written against them):
//!
//! | name | type | labels |
//! |---|---|---|
//! | `cohort_rows_total` | counter | `entity`, `strategy`, `outcome` (`affected`, `held`, `skipped`, `null_anchor`) |
//! | `cohort_runs_total` | counter | `kind`, `trigger`, `status` (also runs recorded failed without running: a scheduled pass that could not start, a run recovered after its owner was lost) |
//! | `cohort_run_duration_seconds` | histogram | `kind` |
//! | `cohort_batch_duration_seconds` | histogram | |
//! | `cohort_sweep_throttled_seconds_total` | counter | `entity`, `reason` (`rate`, `replica_lag`, `paused`) |
//! | `cohort_replica_lag_seconds` | gauge | |
//! | `cohort_handler_deliveries_total` | counter | `handler`, `outcome` (`delivered`, `failed`, `dead_lettered`) |
//! | `cohort_handler_queue_depth` | gauge | `state` (`pending`, `in_flight`) |
//! | `cohort_dead_letters` | gauge | |
//! | `cohort_tenant_rows_unusable_total` | counter | |
//! | `cohort_peers` | gauge | `state` (`same_policy`, `other_policy`, `alive`, `stale`) |
//! | `cohort_peer_conflicts_total` | counter | `entity` |
//! | `cohort_last_success_timestamp_seconds` | gauge | `kind` (`sweep`, `erasure`) |
//! | `cohort_entity_backlog_age_seconds` | gauge | `entity` |
//! | `cohort_next_occurrence_timestamp_seconds` | gauge | |
//! | `cohort_erasure_requests` | gauge | `state` (`open`, `in_progress`, `waiting`, `completed`, `failed`) |
//! | `cohort_erasure_requests_overdue` | gauge | |
//!
//! The whole contract, with each series' meaning, is `docs/metrics.md`.
//!
//! Cohort only records; the application (or `cohort worker
//! --metrics-addr`) installs a recorder and exports. Without a recorder
//! every call is a no-op. Rows are counted for real runs only: a dry run
//! changes nothing, so it adds to `cohort_runs_total` and the run duration
//! but not to `cohort_rows_total`. `affected` grows as each batch commits;
//! `held`, `skipped` and `null_anchor` are added once per entity and run,
//! when the entity's summary is written (a row held for three runs counts
//! three times). The two queue gauges are read from the database by
//! [`crate::Cohort::queue_depth`], and the last successes by
//! [`crate::Cohort::last_success`], which set them: call them before each
//! scrape (the CLI's exporter does). Each sweep sets the backlog of the
//! entities it swept (one indexed read per entity after its summary); the
//! scheduled worker sets the next occurrence and, after each occurrence,
//! the last successes; its maintenance service sets `cohort_peers`.
//!
//! No label carries a row value: entity names, strategies, handler
//! identities, kinds, triggers, statuses and queue states only.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::outcome::{EntityOutcome, RunKind, RunStatus, Trigger};
use crate::domain::rules::Strategy;

/// `cohort_erasure_requests{state}`: erasure requests in each state, read
/// by [`crate::Cohort::erasure_request_counts`].
pub const ERASURE_REQUESTS: &str = "cohort_erasure_requests";
/// `cohort_erasure_requests_overdue`: erasure requests not completed and
/// past their due date.
pub const ERASURE_REQUESTS_OVERDUE: &str = "cohort_erasure_requests_overdue";
/// `cohort_rows_total{entity,strategy,outcome}`.
pub const ROWS_TOTAL: &str = "cohort_rows_total";
/// `cohort_runs_total{kind,trigger,status}`.
pub const RUNS_TOTAL: &str = "cohort_runs_total";
/// `cohort_run_duration_seconds{kind}`.
pub const RUN_DURATION_SECONDS: &str = "cohort_run_duration_seconds";
/// `cohort_sweep_throttled_seconds_total{entity,reason}`: time sweeps
/// were held back (reason `rate`: waited for `max_rows_per_second`;
/// `replica_lag`: waited for a standby under `max_replica_lag`; `paused`:
/// the time an entity stayed paused, counted by each sweep that skipped it).
pub const SWEEP_THROTTLED_SECONDS_TOTAL: &str = "cohort_sweep_throttled_seconds_total";
/// `cohort_replica_lag_seconds`: the largest standby replay lag the last
/// sweep under `max_replica_lag` read (0 when every standby had caught up,
/// or none was streaming).
pub const REPLICA_LAG_SECONDS: &str = "cohort_replica_lag_seconds";
/// `cohort_batch_duration_seconds`.
pub const BATCH_DURATION_SECONDS: &str = "cohort_batch_duration_seconds";
/// `cohort_handler_deliveries_total{handler,outcome}`.
pub const HANDLER_DELIVERIES_TOTAL: &str = "cohort_handler_deliveries_total";
/// `cohort_handler_queue_depth{state}`.
pub const HANDLER_QUEUE_DEPTH: &str = "cohort_handler_queue_depth";
/// `cohort_dead_letters`.
pub const DEAD_LETTERS: &str = "cohort_dead_letters";
/// `cohort_tenant_rows_unusable_total`: rows of the tenant source that
/// could not be tenants (each failed only its own pass).
pub const TENANT_ROWS_UNUSABLE_TOTAL: &str = "cohort_tenant_rows_unusable_total";
/// `cohort_peers{state}`: live peers by whether their policy is this
/// process's (`same_policy`) or not (`other_policy`), as last read.
pub const PEERS: &str = "cohort_peers";
/// `cohort_peer_conflicts_total{entity}`: entities left alone because a
/// live peer has a handler for them that this process lacks.
pub const PEER_CONFLICTS_TOTAL: &str = "cohort_peer_conflicts_total";

/// `cohort_last_success_timestamp_seconds{kind}`: the settle time (Unix
/// seconds) of the last successful real (not dry) run of each kind, as the
/// ledger has it.
pub const LAST_SUCCESS_TIMESTAMP_SECONDS: &str = "cohort_last_success_timestamp_seconds";
/// `cohort_entity_backlog_age_seconds{entity}`: after this process's last
/// sweep of the entity, how far past its cutoff the oldest row still
/// eligible is (0 when none; the worst tenant and stage).
pub const ENTITY_BACKLOG_AGE_SECONDS: &str = "cohort_entity_backlog_age_seconds";
/// `cohort_next_occurrence_timestamp_seconds`: the next occurrence (Unix
/// seconds) of the worker's schedule.
pub const NEXT_OCCURRENCE_TIMESTAMP_SECONDS: &str = "cohort_next_occurrence_timestamp_seconds";

/// Every metric name Cohort records: what `docs/metrics.md` documents.
pub const ALL: &[&str] = &[
    ROWS_TOTAL,
    RUNS_TOTAL,
    RUN_DURATION_SECONDS,
    BATCH_DURATION_SECONDS,
    SWEEP_THROTTLED_SECONDS_TOTAL,
    REPLICA_LAG_SECONDS,
    HANDLER_DELIVERIES_TOTAL,
    HANDLER_QUEUE_DEPTH,
    DEAD_LETTERS,
    TENANT_ROWS_UNUSABLE_TOTAL,
    PEERS,
    PEER_CONFLICTS_TOTAL,
    LAST_SUCCESS_TIMESTAMP_SECONDS,
    ENTITY_BACKLOG_AGE_SECONDS,
    NEXT_OCCURRENCE_TIMESTAMP_SECONDS,
    ERASURE_REQUESTS,
    ERASURE_REQUESTS_OVERDUE,
];

/// Registers the help text of every metric with the installed recorder.
/// Call once after installing it; harmless to call again.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        ROWS_TOTAL,
        "Rows by what a real run did with them: affected, held, skipped, null_anchor."
    );
    describe_counter!(RUNS_TOTAL, "Settled runs by kind, trigger and status.");
    describe_counter!(
        SWEEP_THROTTLED_SECONDS_TOTAL,
        Unit::Seconds,
        "Time sweeps were held back, by entity and reason (rate: max_rows_per_second; replica_lag: max_replica_lag; paused: cohort pause)."
    );
    describe_gauge!(
        REPLICA_LAG_SECONDS,
        Unit::Seconds,
        "The largest standby replay lag a sweep under max_replica_lag last read."
    );
    describe_histogram!(
        RUN_DURATION_SECONDS,
        Unit::Seconds,
        "Wall time of settled runs, from the Started row to settlement."
    );
    describe_histogram!(
        BATCH_DURATION_SECONDS,
        Unit::Seconds,
        "Wall time of committed batches (lock, mutation, audit, commit)."
    );
    describe_counter!(
        HANDLER_DELIVERIES_TOTAL,
        "Row-handler deliveries recorded, by handler and outcome."
    );
    describe_gauge!(
        HANDLER_QUEUE_DEPTH,
        "Row-handler work not delivered yet, by state, as last read."
    );
    describe_gauge!(
        DEAD_LETTERS,
        "Dead-lettered row-handler work, as last read."
    );
    describe_gauge!(
        PEERS,
        "Peer records by state: same_policy and other_policy count the other live processes; alive counts every live record (this process's too); stale the silent ones not yet removed."
    );
    describe_counter!(
        PEER_CONFLICTS_TOTAL,
        "Entities a run left alone because a live peer has a handler for them that this process lacks."
    );
    describe_gauge!(
        LAST_SUCCESS_TIMESTAMP_SECONDS,
        Unit::Seconds,
        "Settle time (Unix seconds) of the last successful real run of each kind, as the ledger has it."
    );
    describe_gauge!(
        ENTITY_BACKLOG_AGE_SECONDS,
        Unit::Seconds,
        "After the last sweep of each entity: how far past its cutoff the oldest row still eligible is (0 when none)."
    );
    describe_gauge!(
        NEXT_OCCURRENCE_TIMESTAMP_SECONDS,
        Unit::Seconds,
        "The next occurrence (Unix seconds) of the worker's schedule."
    );
    describe_gauge!(
        ERASURE_REQUESTS,
        "Erasure requests in each state (open, in_progress, waiting, completed, failed)."
    );
    describe_gauge!(
        ERASURE_REQUESTS_OVERDUE,
        "Erasure requests not completed and past their due date."
    );
    describe_counter!(
        TENANT_ROWS_UNUSABLE_TOTAL,
        "Rows of the tenant source (tenants_query or directory) that could not be tenants; each failed only its own pass."
    );
}

/// Suggested histogram buckets (seconds) for the two duration histograms:
/// from a millisecond batch to an hour-long run.
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0,
];

pub(crate) fn rows(entity: &str, strategy: Strategy, outcome: &'static str, n: u64) {
    if n > 0 {
        metrics::counter!(ROWS_TOTAL, "entity" => entity.to_owned(), "strategy" => strategy.as_str(), "outcome" => outcome)
            .increment(n);
    }
}

/// An entity's end-of-run counts (its affected rows were counted as each
/// batch or partition drop committed).
pub(crate) fn entity_settled(out: &EntityOutcome) {
    rows(&out.entity, out.strategy, "held", out.held);
    rows(&out.entity, out.strategy, "skipped", out.skipped);
    rows(&out.entity, out.strategy, "null_anchor", out.null_anchor);
}

pub(crate) fn run_settled(kind: RunKind, trigger: Trigger, status: RunStatus, took: Duration) {
    metrics::counter!(RUNS_TOTAL, "kind" => kind.as_str(), "trigger" => trigger.as_str(), "status" => status.as_str())
        .increment(1);
    metrics::histogram!(RUN_DURATION_SECONDS, "kind" => kind.as_str()).record(took.as_secs_f64());
}

/// A run the ledger records as failed without this process having run it
/// to settlement (a scheduled pass that could not start, a run recovered
/// after its owner was lost): counted, with no duration.
pub(crate) fn run_recorded_failed(kind: &str, trigger: &str) {
    metrics::counter!(RUNS_TOTAL, "kind" => kind.to_owned(), "trigger" => trigger.to_owned(), "status" => "failed")
        .increment(1);
}

pub(crate) fn peer_conflict(entity: &str) {
    metrics::counter!(PEER_CONFLICTS_TOTAL, "entity" => entity.to_owned()).increment(1);
}

pub(crate) fn peers(same_policy: usize, other_policy: usize) {
    metrics::gauge!(PEERS, "state" => "same_policy").set(same_policy as f64);
    metrics::gauge!(PEERS, "state" => "other_policy").set(other_policy as f64);
}

/// Every peer record by heartbeat: `alive` (this process's own included)
/// and `stale` (silent longer than the peer timeout, not yet removed).
pub(crate) fn peer_census(alive: u64, stale: u64) {
    metrics::gauge!(PEERS, "state" => "alive").set(alive as f64);
    metrics::gauge!(PEERS, "state" => "stale").set(stale as f64);
}

/// The last successful real runs, as read from the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct LastSuccess {
    /// Settle time of the last successful real sweep (`None`: never).
    pub sweep: Option<DateTime<Utc>>,
    /// Settle time of the last successful real erasure (`None`: never).
    pub erasure: Option<DateTime<Utc>>,
}

/// The latest success recorded per kind, so that the gauge never moves
/// back (a slower read of the ledger racing a run that just settled).
static LAST_SUCCESS: Mutex<BTreeMap<&'static str, i64>> = Mutex::new(BTreeMap::new());

impl LastSuccess {
    /// Sets `cohort_last_success_timestamp_seconds{kind}` for each kind
    /// that has a success (a kind without one has no series).
    pub fn record(&self) {
        for (kind, at) in [
            (RunKind::Sweep, self.sweep),
            (RunKind::Erasure, self.erasure),
        ] {
            if let Some(at) = at {
                last_success(kind, at);
            }
        }
    }
}

/// A successful real run of `kind` settled at `at`.
pub(crate) fn last_success(kind: RunKind, at: DateTime<Utc>) {
    let micros = at.timestamp_micros();
    let mut seen = LAST_SUCCESS.lock().unwrap_or_else(|e| e.into_inner());
    let latest = seen.entry(kind.as_str()).or_insert(micros);
    *latest = (*latest).max(micros);
    metrics::gauge!(LAST_SUCCESS_TIMESTAMP_SECONDS, "kind" => kind.as_str())
        .set(*latest as f64 / 1e6);
}

/// How far behind retention is for one entity.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct EntityBacklog {
    /// The entity's display name.
    pub entity: String,
    /// Seconds from the oldest still-eligible row's anchor to its cutoff
    /// (0 when no row is eligible): the worst tenant and stage.
    pub age_seconds: f64,
    /// That row's anchor (`None` when no row is eligible).
    pub oldest: Option<DateTime<Utc>>,
    /// The tenant of that row's pass (`None`: tenantless, or none eligible).
    pub tenant: Option<String>,
}

/// Age in seconds of a backlog whose oldest row has anchor `oldest`,
/// measured against `cutoff` (never negative).
pub(crate) fn backlog_age(cutoff: DateTime<Utc>, oldest: Option<DateTime<Utc>>) -> f64 {
    oldest.map_or(0.0, |o| {
        ((cutoff - o).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6).max(0.0)
    })
}

/// Each entity's backlog per pass (tenant and stage), so the gauge shows
/// the worst pass: a tenant caught up does not hide one that is behind.
/// Each entry remembers the round (a worker occurrence) that measured it,
/// so a pass that no longer runs (a tenant gone from the source) stops
/// counting once a whole occurrence ran without it.
struct Backlogs {
    round: u64,
    entities: BTreeMap<String, BTreeMap<String, (f64, u64)>>,
}

static BACKLOG: Mutex<Backlogs> = Mutex::new(Backlogs {
    round: 0,
    entities: BTreeMap::new(),
});

fn set_worst(entity: &str, passes: &BTreeMap<String, (f64, u64)>) {
    let worst = passes.values().map(|(age, _)| *age).fold(0.0, f64::max);
    metrics::gauge!(ENTITY_BACKLOG_AGE_SECONDS, "entity" => entity.to_owned()).set(worst);
}

/// The backlog an entity's pass (`scope`: tenant and stage) left.
pub(crate) fn backlog(entity: &str, scope: String, age_seconds: f64) {
    let mut all = BACKLOG.lock().unwrap_or_else(|e| e.into_inner());
    let round = all.round;
    let passes = all.entities.entry(entity.to_owned()).or_default();
    passes.insert(scope, (age_seconds, round));
    set_worst(entity, passes);
}

/// A pass that ran without measuring the entity's backlog (the entity
/// failed or was held back): its last value stays, as part of this round.
pub(crate) fn backlog_unmeasured(entity: &str, scope: String) {
    let mut all = BACKLOG.lock().unwrap_or_else(|e| e.into_inner());
    let round = all.round;
    if let Some(entry) = all
        .entities
        .get_mut(entity)
        .and_then(|passes| passes.get_mut(&scope))
    {
        entry.1 = round;
    }
}

/// A worker occurrence starts: what its passes measure belongs to a new
/// round (returned, for [`backlog_round_done`]).
pub(crate) fn backlog_round_started() -> u64 {
    let mut all = BACKLOG.lock().unwrap_or_else(|e| e.into_inner());
    all.round += 1;
    all.round
}

/// Every pass of occurrence `round` ran: passes measured before it (that
/// it no longer has) stop counting, and their entities' gauges follow.
pub(crate) fn backlog_round_done(round: u64) {
    let mut all = BACKLOG.lock().unwrap_or_else(|e| e.into_inner());
    for (entity, passes) in all.entities.iter_mut() {
        let before = passes.len();
        passes.retain(|_, (_, measured)| *measured >= round);
        if passes.len() != before {
            set_worst(entity, passes);
        }
    }
}

/// The worker's next occurrence.
pub(crate) fn next_occurrence(at: DateTime<Utc>) {
    metrics::gauge!(NEXT_OCCURRENCE_TIMESTAMP_SECONDS).set(at.timestamp() as f64);
}

pub(crate) fn tenant_row_unusable() {
    metrics::counter!(TENANT_ROWS_UNUSABLE_TOTAL).increment(1);
}

/// Time a sweep waited between batches, by entity and reason (`rate`):
/// summed in this process to the microsecond, exported in whole seconds
/// (a counter counts in whole units; a wait is never lost, only shown
/// once its second is complete).
pub(crate) fn throttled(entity: &str, reason: &'static str, waited: Duration) {
    static WAITED_US: Mutex<BTreeMap<(String, &'static str), u64>> = Mutex::new(BTreeMap::new());
    let total = {
        let mut all = WAITED_US.lock().unwrap_or_else(|e| e.into_inner());
        let total = all.entry((entity.to_owned(), reason)).or_default();
        *total += waited.as_micros() as u64;
        *total
    };
    metrics::counter!(SWEEP_THROTTLED_SECONDS_TOTAL, "entity" => entity.to_owned(), "reason" => reason)
        .absolute(total / 1_000_000);
}

/// The largest standby lag a sweep just read.
pub(crate) fn replica_lag(lag: Duration) {
    metrics::gauge!(REPLICA_LAG_SECONDS).set(lag.as_secs_f64());
}

/// An entity found paused by a sweep: the time since its pause began that
/// this process has not counted yet is added under reason `paused`.
pub(crate) fn paused(entity: &str, since: DateTime<Utc>, now: DateTime<Utc>) {
    static COUNTED: Mutex<BTreeMap<String, DateTime<Utc>>> = Mutex::new(BTreeMap::new());
    let from = {
        let mut all = COUNTED.lock().unwrap_or_else(|e| e.into_inner());
        let counted = all.entry(entity.to_owned()).or_insert(since);
        let from = (*counted).max(since);
        *counted = now.max(from);
        from
    };
    if let Ok(waited) = (now - from).to_std() {
        throttled(entity, "paused", waited);
    }
}

pub(crate) fn batch(took: Duration) {
    metrics::histogram!(BATCH_DURATION_SECONDS).record(took.as_secs_f64());
}

pub(crate) fn delivery(handler: &str, outcome: &'static str) {
    metrics::counter!(HANDLER_DELIVERIES_TOTAL, "handler" => handler.to_owned(), "outcome" => outcome)
        .increment(1);
}

impl crate::domain::erasure_requests::RequestCounts {
    /// Sets `cohort_erasure_requests{state}` and
    /// `cohort_erasure_requests_overdue`.
    pub fn record(&self) {
        for (state, n) in &self.by_state {
            metrics::gauge!(ERASURE_REQUESTS, "state" => state.as_str()).set(*n as f64);
        }
        metrics::gauge!(ERASURE_REQUESTS_OVERDUE).set(self.overdue as f64);
    }
}

/// Row-handler work by state, read from the queue table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct QueueDepth {
    /// Waiting for delivery (due now or later, after a back-off).
    pub pending: u64,
    /// Claimed by a dispatcher and being delivered.
    pub in_flight: u64,
    /// Dead-lettered: waits for an operator.
    pub dead_lettered: u64,
}

impl QueueDepth {
    /// Sets `cohort_handler_queue_depth{state}` and `cohort_dead_letters`.
    pub fn record(&self) {
        metrics::gauge!(HANDLER_QUEUE_DEPTH, "state" => "pending").set(self.pending as f64);
        metrics::gauge!(HANDLER_QUEUE_DEPTH, "state" => "in_flight").set(self.in_flight as f64);
        metrics::gauge!(DEAD_LETTERS).set(self.dead_lettered as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_age_is_the_distance_past_the_cutoff_and_never_negative() {
        let cutoff = DateTime::parse_from_rfc3339("2026-03-01T00:00:00Z")
            .unwrap()
            .to_utc();
        let at = |s: &str| Some(DateTime::parse_from_rfc3339(s).unwrap().to_utc());
        for (oldest, want) in [
            (None, 0.0),
            (at("2026-03-01T00:00:00Z"), 0.0),
            (at("2026-02-28T23:59:59.5Z"), 0.5),
            (at("2026-02-27T00:00:00Z"), 172_800.0),
            // A row after the cutoff is not behind (it cannot be eligible).
            (at("2026-03-02T00:00:00Z"), 0.0),
        ] {
            assert_eq!(backlog_age(cutoff, oldest), want, "{oldest:?}");
        }
    }

    fn passes_of(entity: &str) -> Vec<(String, f64)> {
        let all = BACKLOG.lock().unwrap();
        all.entities
            .get(entity)
            .map(|p| p.iter().map(|(k, (age, _))| (k.clone(), *age)).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_pass_that_no_longer_runs_stops_counting_after_a_whole_occurrence() {
        let entity = "RoundsTestEntity";
        let first = backlog_round_started();
        backlog(entity, "t1/0".into(), 50.0);
        backlog(entity, "t2/0".into(), 10.0);
        backlog_round_done(first);
        assert_eq!(
            passes_of(entity),
            [("t1/0".to_string(), 50.0), ("t2/0".to_string(), 10.0)]
        );
        // The next occurrence no longer has t1 (gone from the source).
        let second = backlog_round_started();
        backlog(entity, "t2/0".into(), 20.0);
        // Until the occurrence is whole, t1 still counts.
        assert_eq!(passes_of(entity).len(), 2);
        backlog_round_done(second);
        assert_eq!(passes_of(entity), [("t2/0".to_string(), 20.0)]);
        // A pass that ran but could not measure (the entity failed) keeps
        // its last value.
        let third = backlog_round_started();
        backlog_unmeasured(entity, "t2/0".into());
        backlog_round_done(third);
        assert_eq!(passes_of(entity), [("t2/0".to_string(), 20.0)]);
    }
}
