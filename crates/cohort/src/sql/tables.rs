//! The one definition of Cohort's own tables: names, columns, types and the
//! schema version. Migrations create exactly this; validation checks exactly
//! this; runtime SQL names tables through [`CohortTable`].

use crate::base::ident::QualifiedName;

/// The schema version the code expects. Migrations record it on
/// `sweep_run` as the table comment `cohort schema version N`.
pub const SCHEMA_VERSION: u32 = 20;

/// The schema version the ledger's hash chain starts at (migration 19):
/// `verify`, `report` and the chain's operations need at least it.
pub(crate) const CHAIN_SINCE_VERSION: u32 = 19;

/// The prefix of the version comment on `sweep_run`.
pub(crate) const VERSION_COMMENT_PREFIX: &str = "cohort schema version ";

/// The comment of the marker `sweep_run` a schema move leaves behind: a
/// one-column table (`moved_to`) that no migration or run can mistake for
/// an install, so a process still configured with the old schema stops
/// instead of starting an empty ledger there.
pub(crate) const MOVED_COMMENT: &str = "cohort tables moved to another schema";

/// One of Cohort's thirteen tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CohortTable {
    /// One row per sweep or erasure run.
    SweepRun,
    /// Per-entity totals of a run.
    EntitySummary,
    /// Optional per-row audit.
    RowDetail,
    /// The durable row-handler queue.
    HandlerStatus,
    /// Legal holds.
    Hold,
    /// Live settings shared by every replica (`kill_switch`, `dry_run`).
    Setting,
    /// The processes that sweep, with their handlers and a heartbeat.
    Peer,
    /// One row per scheduled occurrence (time, kind and policy) a worker
    /// replica started.
    Occurrence,
    /// The passes of each occurrence, claimed by replicas.
    OccurrencePass,
    /// Live pacing: pauses and limits per entity (and `*` for all).
    Pacing,
    /// Erasure requests: reference, subject (until completed), state, due
    /// date and the parts still waiting.
    ErasureRequest,
    /// Every state change of an erasure request.
    ErasureRequestEvent,
    /// The ledger's hash chain: one link per settled run, hold placed or
    /// released, and pruning checkpoint.
    LedgerLink,
}

/// A column of a Cohort table as the catalog reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnContract {
    /// Column name.
    pub name: &'static str,
    /// Type as `pg_catalog.format_type` prints it.
    pub sql_type: &'static str,
    /// Whether NULL is allowed.
    pub nullable: bool,
}

macro_rules! col {
    ($name:literal, $ty:expr, $nullable:literal) => {
        ColumnContract {
            name: $name,
            sql_type: $ty,
            nullable: $nullable,
        }
    };
}

const UUID: &str = "uuid";
const TEXT: &str = "text";
const BOOL: &str = "boolean";
const TSTZ: &str = "timestamp with time zone";
const BIGINT: &str = "bigint";
const INT: &str = "integer";
const SMALLINT: &str = "smallint";
const INTERVAL: &str = "interval";
const JSONB: &str = "jsonb";

impl CohortTable {
    /// All thirteen, in creation order (referenced tables first).
    pub const ALL: [CohortTable; 13] = [
        CohortTable::SweepRun,
        CohortTable::EntitySummary,
        CohortTable::RowDetail,
        CohortTable::HandlerStatus,
        CohortTable::Hold,
        CohortTable::Setting,
        CohortTable::Peer,
        CohortTable::Occurrence,
        CohortTable::OccurrencePass,
        CohortTable::Pacing,
        CohortTable::ErasureRequest,
        CohortTable::ErasureRequestEvent,
        CohortTable::LedgerLink,
    ];

    /// The table's name.
    pub fn name(self) -> &'static str {
        match self {
            CohortTable::SweepRun => "sweep_run",
            CohortTable::EntitySummary => "sweep_run_entity_summary",
            CohortTable::RowDetail => "sweep_run_row_detail",
            CohortTable::HandlerStatus => "sweep_row_handler_status",
            CohortTable::Hold => "retention_hold",
            CohortTable::Setting => "retention_setting",
            CohortTable::Peer => "retention_peer",
            CohortTable::Occurrence => "sweep_occurrence",
            CohortTable::OccurrencePass => "sweep_occurrence_pass",
            CohortTable::Pacing => "retention_pacing",
            CohortTable::ErasureRequest => "erasure_request",
            CohortTable::ErasureRequestEvent => "erasure_request_event",
            CohortTable::LedgerLink => "ledger_link",
        }
    }

    /// The table qualified with Cohort's schema.
    pub fn qualified(self, schema: &str) -> QualifiedName {
        QualifiedName::new(schema, self.name())
    }

    /// The columns the code relies on.
    pub fn columns(self) -> &'static [ColumnContract] {
        match self {
            CohortTable::SweepRun => SWEEP_RUN_COLUMNS,
            CohortTable::EntitySummary => ENTITY_SUMMARY_COLUMNS,
            CohortTable::RowDetail => ROW_DETAIL_COLUMNS,
            CohortTable::HandlerStatus => HANDLER_STATUS_COLUMNS,
            CohortTable::Hold => HOLD_COLUMNS,
            CohortTable::Setting => SETTING_COLUMNS,
            CohortTable::Peer => PEER_COLUMNS,
            CohortTable::Occurrence => OCCURRENCE_COLUMNS,
            CohortTable::OccurrencePass => OCCURRENCE_PASS_COLUMNS,
            CohortTable::Pacing => PACING_COLUMNS,
            CohortTable::ErasureRequest => ERASURE_REQUEST_COLUMNS,
            CohortTable::ErasureRequestEvent => ERASURE_REQUEST_EVENT_COLUMNS,
            CohortTable::LedgerLink => LEDGER_LINK_COLUMNS,
        }
    }
}

/// The columns of [`CohortTable::SweepRun`] the code relies on.
const SWEEP_RUN_COLUMNS: &[ColumnContract] = &[
    col!("run_id", UUID, false),
    col!("kind", TEXT, false),
    col!("trigger", TEXT, false),
    col!("dry_run", BOOL, false),
    col!("tenant_id", TEXT, true),
    col!("status", TEXT, false),
    col!("logical_now", TSTZ, false),
    col!("started_at", TSTZ, false),
    col!("settled_at", TSTZ, true),
    col!("error", TEXT, true),
    col!("failures", JSONB, true),
    col!("occurrence", TSTZ, true),
    col!("occurrence_pass", INT, true),
    col!("occurrence_passes", INT, true),
    col!("policy_fingerprint", TEXT, true),
    col!("erasure_subject_kind", TEXT, true),
];

/// The columns of [`CohortTable::EntitySummary`] the code relies on.
const ENTITY_SUMMARY_COLUMNS: &[ColumnContract] = &[
    col!("summary_id", BIGINT, false),
    col!("run_id", UUID, false),
    col!("retention_entity_id", UUID, false),
    col!("entity_type", TEXT, false),
    col!("category", TEXT, false),
    col!("tenant_id", TEXT, true),
    col!("strategy", TEXT, false),
    col!("affected_count", BIGINT, false),
    col!("held_count", BIGINT, false),
    col!("skipped_count", BIGINT, false),
    col!("null_anchor_count", BIGINT, false),
    col!("cutoff", TSTZ, true),
    col!("resolved_period", INTERVAL, false),
    col!("legal_min", INTERVAL, true),
    col!("rule_source", TEXT, true),
    col!("rule_reason", TEXT, true),
    col!("error", TEXT, true),
    col!("updated_at", TSTZ, false),
    col!("kept_by_legal_min_count", BIGINT, false),
    col!("kept_by_policy_count", BIGINT, false),
    col!("held_by_subject_count", BIGINT, false),
    col!("stage", SMALLINT, true),
    col!("batch_size", INT, true),
    col!("note", TEXT, true),
    col!("dead_tuples_before", BIGINT, true),
    col!("dead_tuples_after", BIGINT, true),
    col!("table_bytes_before", BIGINT, true),
    col!("table_bytes_after", BIGINT, true),
    col!("vacuumed", TEXT, true),
    col!("throttled_ms", BIGINT, true),
    col!("paused", BOOL, false),
    col!("lag_waited_ms", BIGINT, true),
];

/// The columns of [`CohortTable::Pacing`] the code relies on.
const PACING_COLUMNS: &[ColumnContract] = &[
    col!("entity_type", TEXT, false),
    col!("paused", BOOL, false),
    col!("max_rows_per_second", INT, true),
    col!("max_replica_lag", INTERVAL, true),
    col!("updated_at", TSTZ, false),
    col!("updated_by", TEXT, false),
];

/// The columns of [`CohortTable::ErasureRequest`] the code relies on.
const ERASURE_REQUEST_COLUMNS: &[ColumnContract] = &[
    col!("request_id", UUID, false),
    col!("reference", TEXT, false),
    col!("tenant_id", TEXT, true),
    col!("subject_kind", TEXT, true),
    col!("subject_text", TEXT, true),
    col!("subject_hash", TEXT, false),
    col!("allow_soft_delete", BOOL, false),
    col!("stage", INT, true),
    col!("note", TEXT, true),
    col!("state", TEXT, false),
    col!("received_at", TSTZ, false),
    col!("due_at", TSTZ, false),
    col!("due_reason", TEXT, true),
    col!("attempted_at", TSTZ, true),
    col!("resume_at", TSTZ, true),
    col!("completed_at", TSTZ, true),
    col!("last_run_id", UUID, true),
    col!("waiting", JSONB, false),
    col!("error", TEXT, true),
    col!("updated_at", TSTZ, false),
    col!("attempt_snapshot", "pg_snapshot", true),
    col!("journal_entry", BIGINT, true),
    col!("journal_hash", TEXT, true),
];

/// The columns of [`CohortTable::ErasureRequestEvent`] the code relies on.
const ERASURE_REQUEST_EVENT_COLUMNS: &[ColumnContract] = &[
    col!("event_id", BIGINT, false),
    col!("request_id", UUID, false),
    col!("state", TEXT, false),
    col!("at", TSTZ, false),
    col!("run_id", UUID, true),
    col!("detail", TEXT, false),
    col!("recorded_by", TEXT, false),
];

/// The columns of [`CohortTable::LedgerLink`] the code relies on.
const LEDGER_LINK_COLUMNS: &[ColumnContract] = &[
    col!("link_id", BIGINT, false),
    col!("kind", TEXT, false),
    col!("subject_id", UUID, true),
    col!("record", TEXT, false),
    col!("digest", TEXT, false),
    col!("prev", TEXT, false),
    col!("link", TEXT, false),
    col!("covers", "bigint[]", false),
    col!("linked_at", TSTZ, false),
    col!("mac", TEXT, true),
];

/// The columns of [`CohortTable::RowDetail`] the code relies on.
const ROW_DETAIL_COLUMNS: &[ColumnContract] = &[
    col!("row_detail_id", BIGINT, false),
    col!("run_id", UUID, false),
    col!("retention_entity_id", UUID, false),
    col!("entity_type", TEXT, false),
    col!("record_id", TEXT, false),
    col!("tenant_id", TEXT, true),
    col!("action", TEXT, false),
    col!("recorded_at", TSTZ, false),
];

/// The columns of [`CohortTable::HandlerStatus`] the code relies on.
const HANDLER_STATUS_COLUMNS: &[ColumnContract] = &[
    col!("handler_status_id", BIGINT, false),
    col!("row_detail_id", BIGINT, false),
    col!("run_id", UUID, false),
    col!("handler_id", TEXT, false),
    col!("priority", INT, true),
    col!("phase", TEXT, false),
    col!("status", TEXT, false),
    col!("attempts", INT, false),
    col!("next_attempt_at", TSTZ, false),
    col!("claim_token", UUID, true),
    col!("claimed_at", TSTZ, true),
    col!("claim_expires_at", TSTZ, true),
    col!("captured_payload", JSONB, true),
    col!("payload_scrubbed_at", TSTZ, true),
    col!("last_error", TEXT, true),
    col!("created_at", TSTZ, false),
    col!("updated_at", TSTZ, false),
    col!("requires_earlier", BOOL, false),
];

/// The columns of [`CohortTable::Hold`] the code relies on.
const HOLD_COLUMNS: &[ColumnContract] = &[
    col!("hold_id", UUID, false),
    col!("retention_entity_id", UUID, true),
    col!("record_id", TEXT, true),
    col!("tenant_id", TEXT, true),
    col!("reason", TEXT, false),
    col!("created_at", TSTZ, false),
    col!("expires_at", TSTZ, true),
    col!("released_at", TSTZ, true),
    col!("subject_kind", TEXT, true),
    col!("subject_text", TEXT, true),
    col!("subject_citext", TEXT, true),
    col!("subject_uuid", UUID, true),
    col!("subject_int", BIGINT, true),
    col!("written_xid", "xid8", false),
    col!("journal_entry", BIGINT, true),
    col!("journal_hash", TEXT, true),
];

/// The columns of [`CohortTable::Setting`] the code relies on.
const SETTING_COLUMNS: &[ColumnContract] = &[
    col!("name", TEXT, false),
    col!("enabled", BOOL, false),
    col!("updated_at", TSTZ, false),
    col!("updated_by", TEXT, false),
];

/// The columns of [`CohortTable::Peer`] the code relies on.
const PEER_COLUMNS: &[ColumnContract] = &[
    col!("peer_id", UUID, false),
    col!("host", TEXT, false),
    col!("pid", INT, false),
    col!("started_at", TSTZ, false),
    col!("heartbeat_at", TSTZ, false),
    col!("policy_fingerprint", TEXT, false),
    col!("handlers", JSONB, false),
];

/// The columns of [`CohortTable::Occurrence`] the code relies on.
const OCCURRENCE_COLUMNS: &[ColumnContract] = &[
    col!("occurrence_id", UUID, false),
    col!("occurrence", TSTZ, false),
    col!("dry_run", BOOL, false),
    col!("policy_fingerprint", TEXT, false),
    col!("passes", INT, false),
    col!("created_at", TSTZ, false),
    col!("created_by", TEXT, false),
    col!("completed_at", TSTZ, true),
];

/// The columns of [`CohortTable::OccurrencePass`] the code relies on.
const OCCURRENCE_PASS_COLUMNS: &[ColumnContract] = &[
    col!("occurrence_id", UUID, false),
    col!("pass", INT, false),
    col!("spec", JSONB, false),
    col!("tenant_id", TEXT, true),
    col!("status", TEXT, false),
    col!("attempts", INT, false),
    col!("claim_token", UUID, true),
    col!("claimed_by", TEXT, true),
    col!("claimed_at", TSTZ, true),
    col!("run_id", UUID, true),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_columns_nonempty() {
        let mut names: Vec<_> = CohortTable::ALL.iter().map(|t| t.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 13);
        for t in CohortTable::ALL {
            let mut cols: Vec<_> = t.columns().iter().map(|c| c.name).collect();
            let n = cols.len();
            cols.sort_unstable();
            cols.dedup();
            assert_eq!(cols.len(), n, "duplicate column in {}", t.name());
        }
    }
}
