//! Statements of the ledger's hash chain ([`crate::domain::chain`]): the records a
//! link covers, read back; the append under the chain's lock; the walk of
//! `cohort verify`.

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use uuid::Uuid;

use super::statement::Statement;
use super::tables::CohortTable;
use crate::base::ident::SqlText;
use crate::base::locks::LockKey;

/// Declares the row a chain record is built from and the columns it
/// selects, once: a field is a column (`name: Type`, or `name: Type =
/// "expression"` for a column read through a cast), so a column is
/// selected exactly when it is read. Which columns of a table a record
/// covers, and why the others are not, is held against the table contract
/// by this module's tests.
macro_rules! covered_row {
    ($(#[$meta:meta])* $row:ident, $columns:ident {
        $($field:ident: $ty:ty $(= $expr:literal)?),+ $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Debug, sqlx::FromRow)]
        pub(crate) struct $row {
            $(pub(crate) $field: $ty,)+
        }

        /// The select list of the row above, field by field.
        pub(crate) const $columns: &[&str] = &[$(covered_row!(@column $field $($expr)?)),+];
    };
    (@column $field:ident) => { stringify!($field) };
    (@column $field:ident $expr:literal) => { concat!($expr, " AS ", stringify!($field)) };
}

covered_row! {
    /// A `sweep_run` row as a run's record covers it.
    RunRow, RUN_COLUMNS {
        run_id: Uuid,
        kind: String,
        trigger: String,
        dry_run: bool,
        tenant_id: Option<String>,
        status: String,
        logical_now: DateTime<Utc>,
        started_at: DateTime<Utc>,
        settled_at: Option<DateTime<Utc>>,
        error: Option<String>,
        failures: Option<serde_json::Value>,
        occurrence: Option<DateTime<Utc>>,
        occurrence_pass: Option<i32>,
        occurrence_passes: Option<i32>,
        policy_fingerprint: Option<String>,
        erasure_subject_kind: Option<String>,
    }
}

covered_row! {
    /// A `sweep_run_entity_summary` row as its run's record covers it.
    SummaryRow, SUMMARY_COLUMNS {
        summary_id: i64,
        run_id: Uuid,
        retention_entity_id: Uuid,
        entity_type: String,
        category: String,
        tenant_id: Option<String>,
        strategy: String,
        stage: Option<i16>,
        affected_count: i64,
        held_count: i64,
        held_by_subject_count: i64,
        skipped_count: i64,
        null_anchor_count: i64,
        kept_by_legal_min_count: i64,
        kept_by_policy_count: i64,
        cutoff: Option<DateTime<Utc>>,
        resolved_period: PgInterval,
        legal_min: Option<PgInterval>,
        rule_source: Option<String>,
        rule_reason: Option<String>,
        error: Option<String>,
        batch_size: Option<i32>,
        note: Option<String>,
        paused: bool,
        throttled_ms: Option<i64>,
        lag_waited_ms: Option<i64>,
        dead_tuples_before: Option<i64>,
        dead_tuples_after: Option<i64>,
        table_bytes_before: Option<i64>,
        table_bytes_after: Option<i64>,
        vacuumed: Option<String>,
    }
}

covered_row! {
    /// A `retention_hold` row as its placing's and release's records
    /// cover it.
    HoldRow, HOLD_COLUMNS {
        hold_id: Uuid,
        retention_entity_id: Option<Uuid>,
        record_id: Option<String>,
        tenant_id: Option<String>,
        reason: String,
        created_at: DateTime<Utc>,
        expires_at: Option<DateTime<Utc>>,
        released_at: Option<DateTime<Utc>>,
        subject_kind: Option<String>,
        subject_text: Option<String>,
        subject_citext: Option<String>,
        subject_uuid: Option<String> = "subject_uuid::text",
        subject_int: Option<String> = "subject_int::text",
        journal_entry: Option<i64>,
        journal_hash: Option<String>,
    }
}

covered_row! {
    /// An `erasure_request_event` row (a line of a request's history) as
    /// its link's record covers it.
    RequestEventRow, REQUEST_EVENT_COLUMNS {
        event_id: i64,
        request_id: Uuid,
        state: String,
        at: DateTime<Utc>,
        run_id: Option<Uuid>,
        detail: String,
        recorded_by: String,
    }
}

covered_row! {
    /// An `erasure_request` row as the links of its history cover it.
    RequestRow, REQUEST_COLUMNS {
        request_id: Uuid,
        reference: String,
        tenant_id: Option<String>,
        subject_hash: String,
        state: String,
        received_at: DateTime<Utc>,
        due_at: DateTime<Utc>,
        completed_at: Option<DateTime<Utc>>,
        subject_kind: Option<String>,
        stage: Option<i32>,
        allow_soft_delete: bool,
    }
}

/// `SELECT` and the columns, `prefix` before each (`e.`, or nothing).
fn select(columns: &[&'static str], prefix: &'static str) -> SqlText {
    let mut sql = SqlText::new("SELECT ");
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            sql.push(", ");
        }
        sql.push(prefix).push(c);
    }
    sql
}

/// `(run_id, digest)` of each run's row details.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DetailsRow {
    pub(crate) run_id: Uuid,
    pub(crate) rows: i64,
    pub(crate) sha256: String,
}

/// The link columns `verify` reads.
const LINK_COLUMNS: &str =
    "link_id, kind, subject_id, record, digest, prev, link, covers, linked_at, mac";

/// One link as [`links_after`] returns it ([`LINK_COLUMNS`]).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct LinkRow {
    pub(crate) link_id: i64,
    pub(crate) kind: String,
    #[sqlx(rename = "subject_id")]
    pub(crate) subject: Option<Uuid>,
    pub(crate) record: String,
    pub(crate) digest: String,
    pub(crate) prev: String,
    pub(crate) link: String,
    pub(crate) covers: Vec<i64>,
    pub(crate) linked_at: DateTime<Utc>,
    pub(crate) mac: Option<String>,
}

/// The chain's head as [`head`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct HeadRow {
    pub(crate) link_id: i64,
    pub(crate) link: String,
    pub(crate) linked_at: DateTime<Utc>,
}

impl From<HeadRow> for crate::domain::chain::ChainHead {
    fn from(r: HeadRow) -> Self {
        Self {
            link_id: r.link_id,
            link: r.link,
            linked_at: r.linked_at,
        }
    }
}

fn table(schema: &str, t: CohortTable) -> crate::base::ident::QualifiedName {
    t.qualified(schema)
}

/// One appender at a time, for the rest of the transaction (which must be
/// READ COMMITTED, so the head read after it is the newest committed).
pub(crate) fn lock(schema: &str) -> Statement<(String,)> {
    super::locks::xact_lock(LockKey::Chain(&table(schema, CohortTable::LedgerLink)))
}

/// The runs of `$1`.
pub(crate) fn runs(schema: &str, ids: Vec<Uuid>) -> Statement<(Vec<Uuid>,)> {
    let mut sql = select(RUN_COLUMNS, "");
    sql.push(" FROM ")
        .table(&table(schema, CohortTable::SweepRun))
        .push(" WHERE run_id = ANY($1::uuid[])");
    Statement::new(sql, (ids,))
}

/// The summaries of the runs of `$1`, by run and summary.
pub(crate) fn summaries(schema: &str, ids: Vec<Uuid>) -> Statement<(Vec<Uuid>,)> {
    let mut sql = select(SUMMARY_COLUMNS, "");
    sql.push(" FROM ")
        .table(&table(schema, CohortTable::EntitySummary))
        .push(" WHERE run_id = ANY($1::uuid[]) ORDER BY run_id, summary_id");
    Statement::new(sql, (ids,))
}

/// The holds of `$1`.
pub(crate) fn holds(schema: &str, ids: Vec<Uuid>) -> Statement<(Vec<Uuid>,)> {
    let mut sql = select(HOLD_COLUMNS, "");
    sql.push(" FROM ")
        .table(&table(schema, CohortTable::Hold))
        .push(" WHERE hold_id = ANY($1::uuid[])");
    Statement::new(sql, (ids,))
}

/// The values of [`append`].
#[derive(Debug)]
pub(crate) struct Append {
    /// `$1`: the link's kind.
    pub(crate) kind: &'static str,
    /// `$2`: the run or hold it stands for.
    pub(crate) subject: Option<Uuid>,
    /// `$3`: the record's canonical text.
    pub(crate) record: String,
    /// `$4`: its digest.
    pub(crate) digest: String,
    /// `$5`: the links a checkpoint covers.
    pub(crate) covers: Vec<i64>,
}

impl super::statement::Params for Append {
    fn bind(self, q: super::statement::Args) -> super::statement::Args {
        q.bind(self.kind)
            .bind(self.subject)
            .bind(self.record)
            .bind(self.digest)
            .bind(self.covers)
    }
}

/// Appends a link after the newest (under [`lock`]). The link's hash is
/// computed here by the formula of [`crate::domain::chain::link_hash`] (the tests
/// hold the two to each other). Returns `link_id`; no row when the chain
/// has no link to follow, or its newest link is keyed (a MAC'd link is
/// only ever followed by another, written by [`append_keyed`]).
pub(crate) fn append(schema: &str, values: Append) -> Statement<Append> {
    let link = table(schema, CohortTable::LedgerLink);
    let mut sql = SqlText::new("INSERT INTO ");
    sql.table(&link)
        .push(
            " (link_id, kind, subject_id, record, digest, prev, link, covers) \
             SELECT h.link_id + 1, $1::text, $2::uuid, $3::text, $4::text, h.link, \
               pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(\
                 h.link || E'\\n' || (h.link_id + 1)::text || E'\\n' || $1::text || E'\\n' \
                 || COALESCE($2::uuid::text, '') || E'\\n' || $4::text, 'UTF8')), 'hex'), \
               $5::int8[] \
             FROM (SELECT link_id, link, mac FROM ",
        )
        .table(&link)
        .push(" ORDER BY link_id DESC LIMIT 1) h WHERE h.mac IS NULL RETURNING link_id");
    Statement::new(sql, values)
}

/// The newest link, read under [`lock`] by a keyed append: columns
/// `link_id`, `link` and `now`, the database clock the new link is dated
/// with.
pub(crate) fn keyed_head(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("SELECT link_id, link, pg_catalog.clock_timestamp() AS now FROM ");
    sql.table(&table(schema, CohortTable::LedgerLink))
        .push(" ORDER BY link_id DESC LIMIT 1");
    Statement::new(sql, ())
}

/// The values of [`append_keyed`]: a link the library hashed and signed.
#[derive(Debug)]
pub(crate) struct AppendKeyed {
    /// `$1`: its number.
    pub(crate) link_id: i64,
    /// `$2`: its kind.
    pub(crate) kind: &'static str,
    /// `$3`: the run or hold it stands for.
    pub(crate) subject: Option<Uuid>,
    /// `$4`: the record's canonical text.
    pub(crate) record: String,
    /// `$5`: its digest.
    pub(crate) digest: String,
    /// `$6`: the link before's hash.
    pub(crate) prev: String,
    /// `$7`: its hash ([`crate::domain::chain::keyed_link_hash`]).
    pub(crate) link: String,
    /// `$8`: the links a checkpoint covers.
    pub(crate) covers: Vec<i64>,
    /// `$9`: when it was linked (the time its hash covers).
    pub(crate) linked_at: DateTime<Utc>,
    /// `$10`: its MAC.
    pub(crate) mac: String,
}

impl super::statement::Params for AppendKeyed {
    fn bind(self, q: super::statement::Args) -> super::statement::Args {
        q.bind(self.link_id)
            .bind(self.kind)
            .bind(self.subject)
            .bind(self.record)
            .bind(self.digest)
            .bind(self.prev)
            .bind(self.link)
            .bind(self.covers)
            .bind(self.linked_at)
            .bind(self.mac)
    }
}

/// Appends a keyed link as the library computed it (under [`lock`], after
/// [`keyed_head`]); `ledger_link_pkey` refuses a number taken meanwhile.
pub(crate) fn append_keyed(schema: &str, values: AppendKeyed) -> Statement<AppendKeyed> {
    let mut sql = SqlText::new("INSERT INTO ");
    sql.table(&table(schema, CohortTable::LedgerLink)).push(
        " (link_id, kind, subject_id, record, digest, prev, link, covers, linked_at, mac) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8::int8[], $9, $10)",
    );
    Statement::new(sql, values)
}

/// The newest `key` link's record (which key the chain is keyed with),
/// or no row when the chain was never keyed.
/// The row of [`key_link`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct KeyLinkRow {
    pub(crate) link_id: i64,
    /// The link's record: a `chain::KeyRecord` as JSON.
    pub(crate) record: String,
}

pub(crate) fn key_link(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("SELECT link_id, record FROM ");
    sql.table(&table(schema, CohortTable::LedgerLink))
        .push(" WHERE kind = 'key' ORDER BY link_id DESC LIMIT 1");
    Statement::new(sql, ())
}

/// The links of the records of `$1` (runs, holds placed and released),
/// in link order: what a checkpoint stands for when they are deleted.
pub(crate) fn links_of(schema: &str, subjects: Vec<Uuid>) -> Statement<(Vec<Uuid>,)> {
    let mut sql = SqlText::new("SELECT link_id, digest FROM ");
    sql.table(&table(schema, CohortTable::LedgerLink)).push(
        " WHERE subject_id = ANY($1::uuid[]) \
           AND kind IN ('run', 'hold_placed', 'hold_released') ORDER BY link_id",
    );
    Statement::new(sql, (subjects,))
}

/// A page of links after `$1`, `$2` of them, in order.
pub(crate) fn links_after(schema: &str, after: i64, limit: i64) -> Statement<(i64, i64)> {
    let mut sql = SqlText::new("SELECT ");
    sql.push(LINK_COLUMNS)
        .push(" FROM ")
        .table(&table(schema, CohortTable::LedgerLink))
        .push(" WHERE link_id > $1 ORDER BY link_id LIMIT $2");
    Statement::new(sql, (after, limit))
}

/// The newest link linked at or before `$1` (any, when NULL): columns
/// `link_id`, `link`, `linked_at`.
pub(crate) fn head(schema: &str, at: Option<DateTime<Utc>>) -> Statement<(Option<DateTime<Utc>>,)> {
    let mut sql = SqlText::new("SELECT link_id, link, linked_at FROM ");
    sql.table(&table(schema, CohortTable::LedgerLink)).push(
        " WHERE $1::timestamptz IS NULL OR linked_at <= $1::timestamptz \
         ORDER BY link_id DESC LIMIT 1",
    );
    Statement::new(sql, (at,))
}

/// Settled runs since `$1` (the chain's start) without a link of their
/// own, oldest first, at most `$2`: columns `run_id`, `settled_at`.
pub(crate) fn unlinked_runs(
    schema: &str,
    since: DateTime<Utc>,
    limit: i64,
) -> Statement<(DateTime<Utc>, i64)> {
    let mut sql = SqlText::new("SELECT r.run_id, r.settled_at FROM ");
    sql.table(&table(schema, CohortTable::SweepRun))
        .push(
            " r WHERE r.settled_at IS NOT NULL AND r.settled_at >= $1 \
               AND NOT EXISTS (SELECT 1 FROM ",
        )
        .table(&table(schema, CohortTable::LedgerLink))
        .push(
            " l WHERE l.subject_id = r.run_id AND l.kind = 'run') \
             ORDER BY r.settled_at, r.run_id LIMIT $2",
        );
    Statement::new(sql, (since, limit))
}

/// How many runs were settled before `$1` (the chain's start).
pub(crate) fn runs_before(schema: &str, start: DateTime<Utc>) -> Statement<(DateTime<Utc>,)> {
    let mut sql = SqlText::new("SELECT pg_catalog.count(*)::int8 FROM ");
    sql.table(&table(schema, CohortTable::SweepRun))
        .push(" WHERE settled_at IS NOT NULL AND settled_at < $1");
    Statement::new(sql, (start,))
}

/// Holds without a link of their placing (one column, a count).
pub(crate) fn holds_outside(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("SELECT pg_catalog.count(*)::int8 FROM ");
    sql.table(&table(schema, CohortTable::Hold))
        .push(" h WHERE NOT EXISTS (SELECT 1 FROM ")
        .table(&table(schema, CohortTable::LedgerLink))
        .push(" l WHERE l.subject_id = h.hold_id AND l.kind = 'hold_placed')");
    Statement::new(sql, ())
}

/// Link `$1`'s hash (one column), no row when the chain has no such link.
pub(crate) fn link_hash_of(schema: &str, link_id: i64) -> Statement<(i64,)> {
    let mut sql = SqlText::new("SELECT link FROM ");
    sql.table(&table(schema, CohortTable::LedgerLink))
        .push(" WHERE link_id = $1");
    Statement::new(sql, (link_id,))
}

/// A hold's link and the journal entry it records, as [`journal_links`]
/// returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct JournalLinkRow {
    pub(crate) hold: Option<Uuid>,
    /// `SEQ:HASH`.
    pub(crate) journal: String,
}

/// The journal entries the chain's hold links recorded ([`JournalLinkRow`]),
/// for `restore-check`.
pub(crate) fn journal_links(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new(
        "SELECT l.subject_id AS hold, \
         pg_catalog.jsonb_extract_path_text(l.record::jsonb, 'journal') AS journal FROM ",
    );
    sql.table(&table(schema, CohortTable::LedgerLink)).push(
        " l WHERE l.kind = 'hold_placed' \
           AND pg_catalog.jsonb_extract_path_text(l.record::jsonb, 'journal') IS NOT NULL \
         ORDER BY l.link_id",
    );
    Statement::new(sql, ())
}

/// The details of the runs of `$1`, digested per run as
/// [`crate::domain::chain::DetailsDigest`] says: columns `run_id`, `rows`,
/// `sha256` (runs without details have no row).
pub(crate) fn details_digests(schema: &str, ids: Vec<Uuid>) -> Statement<(Vec<Uuid>,)> {
    let mut sql = SqlText::new(
        "SELECT b.run_id, pg_catalog.sum(b.rows)::int8 AS rows, \
           pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(\
             pg_catalog.string_agg(b.h, '' ORDER BY b.n), 'UTF8')), 'hex') AS sha256 \
         FROM (SELECT x.run_id, x.n, pg_catalog.count(*) AS rows, \
                 pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(\
                   pg_catalog.string_agg(x.line, E'\\n' ORDER BY x.row_detail_id), 'UTF8')), 'hex') AS h \
               FROM (SELECT d.run_id, d.row_detail_id, \
                       (pg_catalog.row_number() OVER (PARTITION BY d.run_id ORDER BY d.row_detail_id) - 1) / 100000 AS n, \
                       d.retention_entity_id::text || E'\\t' || d.record_id || E'\\t' \
                         || COALESCE(d.tenant_id, '') || E'\\t' || d.action AS line \
                     FROM ",
    );
    sql.table(&table(schema, CohortTable::RowDetail))
        .push(" d WHERE d.run_id = ANY($1::uuid[])) x GROUP BY x.run_id, x.n) b GROUP BY b.run_id");
    Statement::new(sql, (ids,))
}

/// The history lines of `$1` (event ids): columns of
/// [`crate::domain::chain::RequestEventPart`] and `request_id`.
pub(crate) fn request_events(schema: &str, ids: Vec<i64>) -> Statement<(Vec<i64>,)> {
    let mut sql = select(REQUEST_EVENT_COLUMNS, "e.");
    sql.push(" FROM ")
        .table(&table(schema, CohortTable::ErasureRequestEvent))
        .push(" e WHERE e.event_id = ANY($1::int8[])");
    Statement::new(sql, (ids,))
}

/// The requests of `$1`: columns of [`crate::domain::chain::RequestPart`].
pub(crate) fn requests(schema: &str, ids: Vec<Uuid>) -> Statement<(Vec<Uuid>,)> {
    let mut sql = select(REQUEST_COLUMNS, "r.");
    sql.push(" FROM ")
        .table(&table(schema, CohortTable::ErasureRequest))
        .push(" r WHERE r.request_id = ANY($1::uuid[])");
    Statement::new(sql, (ids,))
}

/// History lines written after the first linked one and without a link
/// of their own (written by hand, or by a binary older than schema 20),
/// oldest first, at most `$1`: columns `event_id`, `request_id`.
pub(crate) fn unlinked_events(schema: &str, limit: i64) -> Statement<(i64,)> {
    let link = table(schema, CohortTable::LedgerLink);
    let mut sql = SqlText::new("SELECT e.event_id, e.request_id FROM ");
    sql.table(&table(schema, CohortTable::ErasureRequestEvent))
        .push(" e WHERE e.event_id > (SELECT pg_catalog.min(pg_catalog.jsonb_extract_path_text(l.record::jsonb, 'event', 'event_id')::int8) FROM ")
        .table(&link)
        .push(" l WHERE l.kind = 'request') AND NOT EXISTS (SELECT 1 FROM ")
        .table(&link)
        .push(
            " l WHERE l.kind = 'request' AND l.subject_id = e.request_id \
               AND pg_catalog.jsonb_extract_path_text(l.record::jsonb, 'event', 'event_id')::int8 = e.event_id) \
             ORDER BY e.event_id LIMIT $1",
        );
    Statement::new(sql, (limit,))
}

/// The columns of a chained table that no record covers, each with why.
/// A writer without the ledger's key can change these without `verify`
/// noticing; every other column of the table is in a record (held by
/// `every_column_of_a_chained_table_is_covered_or_named_here`).
#[cfg(test)]
const NOT_COVERED: &[(CohortTable, &str, &str)] = &[
    (CohortTable::EntitySummary, "updated_at", "bookkeeping: when the row was last written while the run went on; the values it settled on are covered"),
    (CohortTable::Hold, "written_xid", "the writing transaction's id, stamped by a trigger for sweeps to see holds written while they ran; a dump and restore changes it"),
    (CohortTable::ErasureRequest, "subject_text", "the person's identifier, cleared on completion; subject_hash, which is covered, stands for it"),
    (CohortTable::ErasureRequest, "note", "free text that may name the person; not covered"),
    (CohortTable::ErasureRequest, "due_reason", "not covered by schema 20's record; the line of history that moved the due date is, with its reason in its detail"),
    (CohortTable::ErasureRequest, "attempted_at", "an attempt's working state; each attempt's outcome is a covered line of history"),
    (CohortTable::ErasureRequest, "resume_at", "an attempt's working state (as attempted_at)"),
    (CohortTable::ErasureRequest, "last_run_id", "an attempt's working state; the history line names the run"),
    (CohortTable::ErasureRequest, "waiting", "an attempt's working state; the history line's detail says what was kept"),
    (CohortTable::ErasureRequest, "error", "an attempt's working state; the history line's detail says why it failed"),
    (CohortTable::ErasureRequest, "attempt_snapshot", "an attempt's working state"),
    (CohortTable::ErasureRequest, "updated_at", "bookkeeping"),
    (CohortTable::ErasureRequest, "journal_entry", "the journal's own entry, checked against the journal by restore-check, not by the chain"),
    (CohortTable::ErasureRequest, "journal_hash", "as journal_entry"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn names(columns: &[&'static str]) -> Vec<&'static str> {
        columns
            .iter()
            .map(|c| c.rsplit(" AS ").next().unwrap_or(c))
            .collect()
    }

    /// What is wrong with `covered` and NOT_COVERED for `table`.
    fn problems(table: CohortTable, covered: &[&str]) -> Vec<String> {
        let contract: Vec<&str> = table.columns().iter().map(|c| c.name).collect();
        let not_covered: Vec<&str> = NOT_COVERED
            .iter()
            .filter(|(t, _, _)| *t == table)
            .map(|(_, c, _)| *c)
            .collect();
        let mut out = Vec::new();
        for c in &contract {
            let times = covered
                .iter()
                .chain(&not_covered)
                .filter(|x| *x == c)
                .count();
            if times != 1 {
                out.push(format!(
                    "{table:?}.{c}: {times} times in a record and NOT_COVERED; exactly once"
                ));
            }
        }
        for c in covered.iter().chain(&not_covered) {
            if !contract.contains(c) {
                out.push(format!("{table:?}.{c} is not a column of the table"));
            }
        }
        out
    }

    #[test]
    fn every_column_of_a_chained_table_is_covered_or_named_here() {
        let chained = [
            (CohortTable::SweepRun, names(RUN_COLUMNS)),
            (CohortTable::EntitySummary, names(SUMMARY_COLUMNS)),
            (CohortTable::Hold, names(HOLD_COLUMNS)),
            (
                CohortTable::ErasureRequestEvent,
                names(REQUEST_EVENT_COLUMNS),
            ),
            (CohortTable::ErasureRequest, names(REQUEST_COLUMNS)),
        ];
        for (table, covered) in &chained {
            let found = problems(*table, covered);
            assert!(found.is_empty(), "{found:#?}");
        }
        // A column left out of a record, or named twice, is found.
        let short: Vec<&str> = names(SUMMARY_COLUMNS).into_iter().skip(1).collect();
        assert_eq!(
            problems(CohortTable::EntitySummary, &short),
            ["EntitySummary.summary_id: 0 times in a record and NOT_COVERED; exactly once"]
        );
        let mut twice = names(HOLD_COLUMNS);
        twice.push("written_xid");
        assert_eq!(problems(CohortTable::Hold, &twice).len(), 1);
    }

    #[test]
    fn a_row_selects_exactly_its_fields() {
        let text = select(HOLD_COLUMNS, "");
        assert!(text
            .as_str()
            .starts_with("SELECT hold_id, retention_entity_id, "));
        assert!(text
            .as_str()
            .contains(", subject_uuid::text AS subject_uuid, "));
        let events = select(REQUEST_EVENT_COLUMNS, "e.");
        assert_eq!(
            events.as_str(),
            "SELECT e.event_id, e.request_id, e.state, e.at, e.run_id, e.detail, e.recorded_by"
        );
    }
}
