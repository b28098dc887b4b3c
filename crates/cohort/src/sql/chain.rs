//! Statements of the ledger's hash chain ([`crate::domain::chain`]): the records a
//! link covers, read back; the append under the chain's lock; the walk of
//! `cohort verify`.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::statement::Statement;
use super::tables::CohortTable;
use crate::base::ident::SqlText;
use crate::base::locks::LockKey;

/// The run columns a run's record covers.
pub(crate) const RUN_COLUMNS: &str =
    "run_id, kind, trigger, dry_run, tenant_id, status, logical_now, \
     started_at, settled_at, error, failures, occurrence, occurrence_pass, occurrence_passes, \
     policy_fingerprint, erasure_subject_kind";

/// The summary columns a run's record covers (and `run_id`).
pub(crate) const SUMMARY_COLUMNS: &str = "summary_id, run_id, retention_entity_id, entity_type, \
     category, tenant_id, strategy, stage, affected_count, held_count, held_by_subject_count, \
     skipped_count, null_anchor_count, kept_by_legal_min_count, kept_by_policy_count, cutoff, \
     resolved_period, legal_min, rule_source, rule_reason, error, batch_size, note, paused, \
     throttled_ms, lag_waited_ms, dead_tuples_before, dead_tuples_after, table_bytes_before, \
     table_bytes_after, vacuumed";

/// The hold columns a hold's records cover.
pub(crate) const HOLD_COLUMNS: &str =
    "hold_id, retention_entity_id, record_id, tenant_id, reason, \
     created_at, expires_at, released_at, subject_kind, subject_text, subject_citext, \
     subject_uuid::text AS subject_uuid, subject_int::text AS subject_int, journal_entry, \
     journal_hash";

/// The link columns `verify` reads.
const LINK_COLUMNS: &str =
    "link_id, kind, subject_id, record, digest, prev, link, covers, linked_at, mac";

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
    let mut sql = SqlText::new("SELECT ");
    sql.push(RUN_COLUMNS)
        .push(" FROM ")
        .table(&table(schema, CohortTable::SweepRun))
        .push(" WHERE run_id = ANY($1::uuid[])");
    Statement::new(sql, (ids,))
}

/// The summaries of the runs of `$1`, by run and summary.
pub(crate) fn summaries(schema: &str, ids: Vec<Uuid>) -> Statement<(Vec<Uuid>,)> {
    let mut sql = SqlText::new("SELECT ");
    sql.push(SUMMARY_COLUMNS)
        .push(" FROM ")
        .table(&table(schema, CohortTable::EntitySummary))
        .push(" WHERE run_id = ANY($1::uuid[]) ORDER BY run_id, summary_id");
    Statement::new(sql, (ids,))
}

/// The holds of `$1`.
pub(crate) fn holds(schema: &str, ids: Vec<Uuid>) -> Statement<(Vec<Uuid>,)> {
    let mut sql = SqlText::new("SELECT ");
    sql.push(HOLD_COLUMNS)
        .push(" FROM ")
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

/// The journal entries the chain's hold links recorded: columns `hold`
/// and `journal` (`SEQ:HASH`), for `restore-check`.
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
    let mut sql = SqlText::new(
        "SELECT e.event_id, e.request_id, e.state, e.at, e.run_id, e.detail, e.recorded_by FROM ",
    );
    sql.table(&table(schema, CohortTable::ErasureRequestEvent))
        .push(" e WHERE e.event_id = ANY($1::int8[])");
    Statement::new(sql, (ids,))
}

/// The requests of `$1`: columns of [`crate::domain::chain::RequestPart`].
pub(crate) fn requests(schema: &str, ids: Vec<Uuid>) -> Statement<(Vec<Uuid>,)> {
    let mut sql = SqlText::new(
        "SELECT r.request_id, r.reference, r.tenant_id, r.subject_hash, r.state, r.received_at, \
         r.due_at, r.completed_at FROM ",
    );
    sql.table(&table(schema, CohortTable::ErasureRequest))
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
