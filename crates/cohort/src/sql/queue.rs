//! The handler queue's statements (`sweep_row_handler_status`): their text
//! is built once for Cohort's schema, and each is run through a method
//! that takes its typed parameters (see `statement`).

use uuid::Uuid;

use super::statement::{Args, Params, Statement};
use crate::base::ident::{QualifiedName, SqlText};
use crate::sql::tables::CohortTable;

/// The queue's statements.
#[derive(Debug, Clone)]
pub(crate) struct QueuePlan {
    /// Queues work for mutated rows, in the batch transaction. `$1`
    /// row-detail ids (int8[]), `$2` run id, `$3` handler ids (text[]), `$4`
    /// priorities (int4[]), `$5` phases (text[]), `$6` payloads (jsonb[]),
    /// `$7` whether each requires the earlier handlers to succeed (bool[]).
    enqueue: SqlText,
    /// Records rows a handler's `on_before` failed for, in the batch
    /// transaction: one row detail each with the action `skipped`, and the
    /// failing handler's work hanging from it, dead-lettered at once with
    /// its sanitised reason, no attempt and no payload. `$1` run id, `$2`
    /// entity id, `$3` entity name, `$4` tenant, then one element per row:
    /// `$5` record ids (text[]), `$6` handler ids (text[]), `$7` priorities
    /// (int4[]), `$8` phases (text[]), `$9` reasons (text[]), `$10` whether
    /// each requires the earlier handlers (bool[]).
    dead_letter_skipped: SqlText,
    /// Claims due work: pending and due, or in flight with an expired claim
    /// (a reclaim, counted as an attempt); `after_sweep_settled` work only
    /// once its run settled; a row's handler only when every handler before
    /// it (priority, then identity) is terminal, and, for work that
    /// requires the earlier handlers, none of them is dead-lettered. A CTE locks the candidates
    /// with `FOR UPDATE SKIP LOCKED` before the update, so concurrent
    /// dispatchers never claim the same work. Only work of entities this
    /// dispatcher has handlers for is claimed, so dispatchers of different
    /// processes (an application's, `cohort dispatch`) leave each other's
    /// work alone. `$1` limit, `$2` claim time-out in seconds (float8), `$3`
    /// entity ids with handlers (uuid[]), `$4` `entity|handler` keys that
    /// only live peers register (text[], never claimed here). Returns the
    /// claimed work.
    claim: SqlText,
    /// Settles a delivery that succeeded, fenced by its claim. `$1` id,
    /// `$2` claim token. Returns the row-detail id when it settled.
    succeed: SqlText,
    /// Settles a failed delivery, fenced: back to pending at `$4` seconds
    /// from now, or dead-lettered when `$5` is true. `$1` id, `$2` claim
    /// token, `$3` sanitised error. Returns the row-detail id.
    fail: SqlText,
    /// Puts claimed work back, due now: a delivery stopped by shutdown
    /// after the grace period. Its attempt counts, so work that never
    /// finishes within a grace period still reaches `max_attempts`.
    release: SqlText,
    /// Clears the payloads of a row once all its handlers succeeded (a dead
    /// letter keeps its payload for a retry). `$1` row-detail id.
    clear_payloads: SqlText,
    /// Backstop scrub of payloads older than `$1` seconds. Returns the count.
    scrub: SqlText,
    /// Runs left `started` for longer than `$1` seconds.
    stale_runs: SqlText,
    /// Settles a stale run failed. `$1` run id, `$2` error. Returns its
    /// kind and trigger when it settled it.
    recover_run: SqlText,
    /// Work not delivered yet: pending (due later or now) and in flight.
    outstanding: SqlText,
}

impl QueuePlan {
    pub(crate) fn build(schema: &str) -> Self {
        let hs = CohortTable::HandlerStatus.qualified(schema);
        let run = CohortTable::SweepRun.qualified(schema);
        let detail = CohortTable::RowDetail.qualified(schema);
        let t = Tables { hs, run, detail };
        QueuePlan {
            enqueue: enqueue(&t),
            dead_letter_skipped: dead_letter_skipped(&t),
            claim: claim(&t),
            succeed: succeed(&t),
            fail: fail(&t),
            release: release(&t),
            clear_payloads: clear_payloads(&t),
            scrub: scrub(&t),
            stale_runs: stale_runs(&t),
            recover_run: recover_run(&t),
            outstanding: outstanding(&t),
        }
    }
}

/// The tables the statements name.
struct Tables {
    hs: QualifiedName,
    run: QualifiedName,
    detail: QualifiedName,
}

/// The statement of [`QueuePlan::enqueue`].
fn enqueue(t: &Tables) -> SqlText {
    let mut enqueue = SqlText::new("INSERT INTO ");
    enqueue.table(&t.hs).push(
        " (row_detail_id, run_id, handler_id, priority, phase, captured_payload, requires_earlier) \
         SELECT u.d, $2, u.h, u.p, u.ph, u.pl, u.re FROM ROWS FROM (pg_catalog.unnest($1::int8[]), \
         pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::int4[]), \
         pg_catalog.unnest($5::text[]), pg_catalog.unnest($6::jsonb[]), \
         pg_catalog.unnest($7::bool[])) AS u(d, h, p, ph, pl, re)",
    );
    enqueue
}

/// The statement of [`QueuePlan::dead_letter_skipped`].
fn dead_letter_skipped(t: &Tables) -> SqlText {
    let mut dead_letter_skipped = SqlText::new("WITH f AS (SELECT * FROM ROWS FROM (");
    dead_letter_skipped
        .push(
            "pg_catalog.unnest($5::text[]), pg_catalog.unnest($6::text[]), \
             pg_catalog.unnest($7::int4[]), pg_catalog.unnest($8::text[]), \
             pg_catalog.unnest($9::text[]), pg_catalog.unnest($10::bool[])) \
             AS u(record_id, handler_id, priority, phase, reason, requires_earlier)), \
             d AS (INSERT INTO ",
        )
        .table(&t.detail)
        .push(
            " (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) \
             SELECT $1, $2, $3, f.record_id, $4, 'skipped' FROM f \
             RETURNING row_detail_id, record_id) \
             INSERT INTO ",
        )
        .table(&t.hs)
        .push(
            " (row_detail_id, run_id, handler_id, priority, phase, status, attempts, \
               last_error, requires_earlier) \
             SELECT d.row_detail_id, $1, f.handler_id, f.priority, f.phase, 'dead_lettered', 0, \
               f.reason, f.requires_earlier \
             FROM d JOIN f ON f.record_id = d.record_id",
        );
    dead_letter_skipped
}

/// One piece of claimed work, as [`QueuePlan::claim`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ClaimedRow {
    pub(crate) handler_status_id: i64,
    pub(crate) row_detail_id: i64,
    pub(crate) handler_id: String,
    pub(crate) attempts: i32,
    pub(crate) claim_token: Uuid,
    pub(crate) captured_payload: Option<serde_json::Value>,
    pub(crate) scrubbed: bool,
    pub(crate) run_id: Uuid,
    pub(crate) retention_entity_id: Uuid,
    pub(crate) record_id: String,
    pub(crate) tenant_id: Option<String>,
    pub(crate) action: String,
    /// The run's kind.
    pub(crate) kind: String,
}

/// What [`QueuePlan::outstanding`] counts.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct OutstandingRow {
    pub(crate) pending: i64,
    pub(crate) in_flight: i64,
}

/// The statement of [`QueuePlan::claim`].
fn claim(t: &Tables) -> SqlText {
    let mut claim = SqlText::new("WITH c AS (SELECT h.handler_status_id FROM ");
    claim
        .table(&t.hs)
        .push(" h JOIN ")
        .table(&t.run)
        .push(" r ON r.run_id = h.run_id JOIN ")
        .table(&t.detail)
        .push(
            " d0 ON d0.row_detail_id = h.row_detail_id \
             WHERE d0.retention_entity_id = ANY($3::uuid[]) \
               AND NOT (d0.retention_entity_id::text || '|' || h.handler_id) = ANY($4::text[]) \
               AND ((h.status = 'pending' AND h.next_attempt_at <= pg_catalog.now()) \
                 OR (h.status = 'in_flight' AND h.claim_expires_at <= pg_catalog.now())) \
               AND (h.phase = 'immediate' OR r.status <> 'started') \
               AND NOT EXISTS (SELECT 1 FROM ",
        )
        .table(&t.hs)
        .push(
            " s WHERE s.row_detail_id = h.row_detail_id \
                 AND s.handler_status_id <> h.handler_status_id \
                 AND (s.status IN ('pending', 'in_flight') \
                   OR (h.requires_earlier AND s.status = 'dead_lettered')) \
                 AND (COALESCE(s.priority, 2147483647), s.handler_id COLLATE \"C\") \
                   < (COALESCE(h.priority, 2147483647), h.handler_id COLLATE \"C\")) \
             ORDER BY h.next_attempt_at, h.handler_status_id \
             LIMIT $1 FOR UPDATE OF h SKIP LOCKED) \
             UPDATE ",
        )
        .table(&t.hs)
        .push(
            " q SET status = 'in_flight', attempts = q.attempts + 1, \
               claim_token = pg_catalog.gen_random_uuid(), claimed_at = pg_catalog.now(), \
               claim_expires_at = pg_catalog.now() + pg_catalog.make_interval(secs => $2), \
               updated_at = pg_catalog.now() \
             FROM c, ",
        )
        .table(&t.detail)
        .push(" d, ")
        .table(&t.run)
        .push(
            " rk WHERE q.handler_status_id = c.handler_status_id \
               AND d.row_detail_id = q.row_detail_id AND rk.run_id = q.run_id \
             RETURNING q.handler_status_id, q.row_detail_id, q.handler_id, q.attempts, \
               q.claim_token, q.captured_payload, q.payload_scrubbed_at IS NOT NULL AS scrubbed, \
               q.run_id, d.retention_entity_id, d.record_id, d.tenant_id, d.action, rk.kind",
        );
    claim
}

/// The statement of [`QueuePlan::succeed`].
fn succeed(t: &Tables) -> SqlText {
    let mut succeed = SqlText::new("UPDATE ");
    succeed.table(&t.hs).push(
        " SET status = 'succeeded', claim_token = NULL, claim_expires_at = NULL, \
           last_error = NULL, updated_at = pg_catalog.now() \
         WHERE handler_status_id = $1 AND claim_token = $2 AND status = 'in_flight' \
         RETURNING row_detail_id",
    );
    succeed
}

/// The statement of [`QueuePlan::fail`].
fn fail(t: &Tables) -> SqlText {
    let mut fail = SqlText::new("UPDATE ");
    fail.table(&t.hs).push(
        " SET status = CASE WHEN $5 THEN 'dead_lettered' ELSE 'pending' END, \
           next_attempt_at = pg_catalog.now() + pg_catalog.make_interval(secs => $4), \
           claim_token = NULL, claim_expires_at = NULL, last_error = $3, \
           updated_at = pg_catalog.now() \
         WHERE handler_status_id = $1 AND claim_token = $2 AND status = 'in_flight' \
         RETURNING row_detail_id",
    );
    fail
}

/// The statement of [`QueuePlan::release`].
fn release(t: &Tables) -> SqlText {
    let mut release = SqlText::new("UPDATE ");
    release.table(&t.hs).push(
        " SET status = 'pending', next_attempt_at = pg_catalog.now(), \
           claim_token = NULL, claim_expires_at = NULL, updated_at = pg_catalog.now() \
         WHERE handler_status_id = $1 AND claim_token = $2 AND status = 'in_flight' \
         RETURNING row_detail_id",
    );
    release
}

/// The statement of [`QueuePlan::clear_payloads`].
fn clear_payloads(t: &Tables) -> SqlText {
    let mut clear_payloads = SqlText::new("UPDATE ");
    clear_payloads
        .table(&t.hs)
        .push(
            " SET captured_payload = NULL, updated_at = pg_catalog.now() \
             WHERE row_detail_id = $1 AND captured_payload IS NOT NULL \
               AND NOT EXISTS (SELECT 1 FROM ",
        )
        .table(&t.hs)
        .push(" s WHERE s.row_detail_id = $1 AND s.status IN ('pending', 'in_flight', 'dead_lettered'))");
    clear_payloads
}

/// The statement of [`QueuePlan::scrub`].
fn scrub(t: &Tables) -> SqlText {
    let mut scrub = SqlText::new("UPDATE ");
    scrub.table(&t.hs).push(
        " SET captured_payload = NULL, payload_scrubbed_at = pg_catalog.now() \
         WHERE captured_payload IS NOT NULL \
           AND created_at < pg_catalog.now() - pg_catalog.make_interval(secs => $1)",
    );
    scrub
}

/// The statement of [`QueuePlan::stale_runs`].
fn stale_runs(t: &Tables) -> SqlText {
    let mut stale_runs = SqlText::new("SELECT run_id FROM ");
    stale_runs.table(&t.run).push(
        " WHERE status = 'started' \
           AND started_at < pg_catalog.now() - pg_catalog.make_interval(secs => $1) \
         ORDER BY started_at",
    );
    stale_runs
}

/// The statement of [`QueuePlan::recover_run`].
fn recover_run(t: &Tables) -> SqlText {
    let mut recover_run = SqlText::new("UPDATE ");
    recover_run.table(&t.run).push(
        " SET status = 'failed', settled_at = pg_catalog.clock_timestamp(), \
           error = $2, failures = '[]'::jsonb \
         WHERE run_id = $1 AND status = 'started' RETURNING kind, trigger, settled_at",
    );
    recover_run
}

/// The statement of [`QueuePlan::outstanding`].
fn outstanding(t: &Tables) -> SqlText {
    let mut outstanding = SqlText::new(
        "SELECT pg_catalog.count(*) FILTER (WHERE status = 'pending') AS pending, \
                pg_catalog.count(*) FILTER (WHERE status = 'in_flight') AS in_flight FROM ",
    );
    outstanding.table(&t.hs);
    outstanding
}

/// Work for the mutated rows of one batch, one element per (row, handler).
#[derive(Debug)]
pub(crate) struct Enqueue {
    pub(crate) row_detail_ids: Vec<i64>,
    pub(crate) run_id: Uuid,
    pub(crate) handlers: Vec<String>,
    pub(crate) priorities: Vec<Option<i32>>,
    pub(crate) phases: Vec<&'static str>,
    pub(crate) payloads: Vec<serde_json::Value>,
    pub(crate) requires_earlier: Vec<bool>,
}

/// Rows a handler's `on_before` failed for, one element each (see
/// `QueuePlan::dead_letter_skipped`).
#[derive(Debug)]
pub(crate) struct DeadLetterSkipped {
    pub(crate) run_id: Uuid,
    pub(crate) entity_id: Uuid,
    pub(crate) entity: String,
    pub(crate) tenant: Option<String>,
    pub(crate) record_ids: Vec<String>,
    pub(crate) handlers: Vec<String>,
    pub(crate) priorities: Vec<Option<i32>>,
    pub(crate) phases: Vec<&'static str>,
    pub(crate) reasons: Vec<String>,
    pub(crate) requires_earlier: Vec<bool>,
}

impl Params for DeadLetterSkipped {
    fn bind(self, q: Args) -> Args {
        q.bind(self.run_id)
            .bind(self.entity_id)
            .bind(self.entity)
            .bind(self.tenant)
            .bind(self.record_ids)
            .bind(self.handlers)
            .bind(self.priorities)
            .bind(self.phases)
            .bind(self.reasons)
            .bind(self.requires_earlier)
    }
}

impl Params for Enqueue {
    fn bind(self, q: Args) -> Args {
        q.bind(self.row_detail_ids)
            .bind(self.run_id)
            .bind(self.handlers)
            .bind(self.priorities)
            .bind(self.phases)
            .bind(self.payloads)
            .bind(self.requires_earlier)
    }
}

/// A claim of due work.
#[derive(Debug)]
pub(crate) struct Claim {
    pub(crate) limit: i64,
    pub(crate) claim_timeout_secs: f64,
    /// Entities this dispatcher has handlers for.
    pub(crate) entities: Vec<Uuid>,
    /// `entity|handler` keys only live peers register (never claimed here).
    pub(crate) foreign: Vec<String>,
}

impl Params for Claim {
    fn bind(self, q: Args) -> Args {
        q.bind(self.limit)
            .bind(self.claim_timeout_secs)
            .bind(self.entities)
            .bind(self.foreign)
    }
}

/// One claimed piece of work, fenced by its claim token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fenced {
    pub(crate) id: i64,
    pub(crate) token: Uuid,
}

impl Params for Fenced {
    fn bind(self, q: Args) -> Args {
        q.bind(self.id).bind(self.token)
    }
}

/// A failed delivery: back to pending after `retry_in_secs`, or
/// dead-lettered.
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) work: Fenced,
    pub(crate) error: String,
    pub(crate) retry_in_secs: f64,
    pub(crate) dead: bool,
}

impl Params for Fail {
    fn bind(self, q: Args) -> Args {
        self.work
            .bind(q)
            .bind(self.error)
            .bind(self.retry_in_secs)
            .bind(self.dead)
    }
}

/// A single value: a row-detail id, an age in seconds, …
#[derive(Debug, Clone, Copy)]
pub(crate) struct One<T>(pub(crate) T);

impl<T> Params for One<T>
where
    T: for<'a> sqlx::Encode<'a, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + 'static,
{
    fn bind(self, q: Args) -> Args {
        q.bind(self.0)
    }
}

/// Settling a run whose owner was lost.
#[derive(Debug)]
pub(crate) struct Recover {
    pub(crate) run_id: Uuid,
    pub(crate) reason: String,
}

impl Params for Recover {
    fn bind(self, q: Args) -> Args {
        q.bind(self.run_id).bind(self.reason)
    }
}

/// Dead-lettering work no known handler can deliver.
#[derive(Debug)]
pub(crate) struct Orphans {
    /// Known (entity, handler) pairs, as two arrays of one length.
    pub(crate) entities: Vec<Uuid>,
    pub(crate) handlers: Vec<String>,
    pub(crate) reason: &'static str,
    /// Only work older than this many seconds.
    pub(crate) older_than_secs: f64,
}

impl Params for Orphans {
    fn bind(self, q: Args) -> Args {
        q.bind(self.entities)
            .bind(self.handlers)
            .bind(self.reason)
            .bind(self.older_than_secs)
    }
}

impl QueuePlan {
    /// Queues work for mutated rows, in the batch transaction.
    pub(crate) fn enqueue(&self, p: Enqueue) -> Statement<Enqueue> {
        Statement::new(self.enqueue.clone(), p)
    }

    /// Records rows left by a failing `on_before` (see the field).
    pub(crate) fn dead_letter_skipped(&self, p: DeadLetterSkipped) -> Statement<DeadLetterSkipped> {
        Statement::new(self.dead_letter_skipped.clone(), p)
    }

    /// Claims due work (see the field); returns the claimed work.
    pub(crate) fn claim(&self, p: Claim) -> Statement<Claim> {
        Statement::new(self.claim.clone(), p)
    }

    /// Settles a delivery that succeeded; returns the row-detail id.
    pub(crate) fn succeed(&self, p: Fenced) -> Statement<Fenced> {
        Statement::new(self.succeed.clone(), p)
    }

    /// Settles a failed delivery; returns the row-detail id.
    pub(crate) fn fail(&self, p: Fail) -> Statement<Fail> {
        Statement::new(self.fail.clone(), p)
    }

    /// Puts claimed work back, due now.
    pub(crate) fn release(&self, p: Fenced) -> Statement<Fenced> {
        Statement::new(self.release.clone(), p)
    }

    /// Clears a row's payloads once all its handlers succeeded.
    pub(crate) fn clear_payloads(&self, row_detail_id: i64) -> Statement<One<i64>> {
        Statement::new(self.clear_payloads.clone(), One(row_detail_id))
    }

    /// Scrubs payloads older than `secs`.
    pub(crate) fn scrub(&self, secs: f64) -> Statement<One<f64>> {
        Statement::new(self.scrub.clone(), One(secs))
    }

    /// Runs left `started` longer than `secs` (column `run_id`).
    pub(crate) fn stale_runs(&self, secs: f64) -> Statement<One<f64>> {
        Statement::new(self.stale_runs.clone(), One(secs))
    }

    /// Settles a stale run failed; returns a [`super::ledger::SettledRow`].
    pub(crate) fn recover_run(&self, p: Recover) -> Statement<Recover> {
        Statement::new(self.recover_run.clone(), p)
    }

    /// Counts of pending and in-flight work.
    pub(crate) fn outstanding(&self) -> Statement<()> {
        Statement::new(self.outstanding.clone(), ())
    }
}

/// Dead-letters pending (or abandoned in-flight) work older than `$4`
/// seconds whose (entity, handler) is not among the known pairs
/// (`$1`, `$2`), with reason `$3`. Returns each one's handler.
pub(crate) fn orphans(schema: &str, p: Orphans) -> Statement<Orphans> {
    let hs = CohortTable::HandlerStatus.qualified(schema);
    let detail = CohortTable::RowDetail.qualified(schema);
    let mut sql = SqlText::new("UPDATE ");
    sql.table(&hs)
        .push(
            " q SET status = 'dead_lettered', claim_token = NULL, claim_expires_at = NULL, \
               last_error = $3, updated_at = pg_catalog.now() FROM ",
        )
        .table(&detail)
        .push(
            " d WHERE d.row_detail_id = q.row_detail_id \
               AND (q.status = 'pending' \
                 OR (q.status = 'in_flight' AND q.claim_expires_at <= pg_catalog.now())) \
               AND q.created_at < pg_catalog.now() - pg_catalog.make_interval(secs => $4) \
               AND (d.retention_entity_id, q.handler_id) NOT IN \
                 (SELECT e, h FROM ROWS FROM (pg_catalog.unnest($1::uuid[]), pg_catalog.unnest($2::text[])) AS r(e, h)) \
             RETURNING q.handler_id",
        );
    Statement::new(sql, p)
}

/// Dead-letters pending work older than `$4` seconds that requires the
/// earlier handlers' work (`requires_earlier`) while an earlier handler's
/// work for the same row is dead-lettered and that handler is not among
/// the known (entity, handler) pairs (`$1`, `$2`): it could never run,
/// since the earlier work can be retried only once its handler exists
/// again. The reason is `$3` formatted with the earlier handler's id.
/// Returns each one's handler.
pub(crate) fn stuck_behind_orphans(schema: &str, p: Orphans) -> Statement<Orphans> {
    let hs = CohortTable::HandlerStatus.qualified(schema);
    let detail = CohortTable::RowDetail.qualified(schema);
    let mut sql = SqlText::new("UPDATE ");
    // Each waiting item with its first blocker, found once.
    sql.table(&hs)
        .push(
            " q SET status = 'dead_lettered', claim_token = NULL, claim_expires_at = NULL, \
               updated_at = pg_catalog.now(), last_error = pg_catalog.format($3, b.blocker) \
             FROM (SELECT w.handler_status_id, (SELECT s.handler_id FROM ",
        )
        .table(&hs)
        .push(
            " s WHERE s.row_detail_id = w.row_detail_id \
                   AND s.handler_status_id <> w.handler_status_id \
                   AND s.status = 'dead_lettered' \
                   AND (COALESCE(s.priority, 2147483647), s.handler_id COLLATE \"C\") \
                     < (COALESCE(w.priority, 2147483647), w.handler_id COLLATE \"C\") \
                   AND (d.retention_entity_id, s.handler_id) NOT IN \
                     (SELECT e, h FROM ROWS FROM (pg_catalog.unnest($1::uuid[]), pg_catalog.unnest($2::text[])) AS r(e, h)) \
                 ORDER BY COALESCE(s.priority, 2147483647), s.handler_id COLLATE \"C\" LIMIT 1) AS blocker \
               FROM ",
        )
        .table(&hs)
        .push(" w JOIN ")
        .table(&detail)
        .push(
            " d ON d.row_detail_id = w.row_detail_id \
               WHERE w.requires_earlier AND w.status = 'pending' \
                 AND w.created_at < pg_catalog.now() - pg_catalog.make_interval(secs => $4)) b \
             WHERE q.handler_status_id = b.handler_status_id AND b.blocker IS NOT NULL \
               AND q.status = 'pending' \
             RETURNING q.handler_id",
        );
    Statement::new(sql, p)
}
