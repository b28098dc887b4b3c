//! Statements of `sweep_occurrence` and `sweep_occurrence_pass`: the
//! occurrences worker replicas share, and the passes they claim.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::statement::{Args, Params, Statement};
use crate::base::ident::SqlText;
use crate::sql::tables::CohortTable;

/// One occurrence of one kind (dry or real) under one policy.
#[derive(Debug)]
pub(crate) struct Key {
    pub(crate) at: DateTime<Utc>,
    pub(crate) dry_run: bool,
    pub(crate) fingerprint: String,
}

impl Params for Key {
    fn bind(self, q: Args) -> Args {
        q.bind(self.at).bind(self.dry_run).bind(self.fingerprint)
    }
}

/// Columns: `occurrence_id`, `passes`, `completed` (boolean).
pub(crate) fn find(schema: &str, params: Key) -> Statement<Key> {
    let mut sql =
        SqlText::new("SELECT occurrence_id, passes, completed_at IS NOT NULL AS completed FROM ");
    sql.table(&CohortTable::Occurrence.qualified(schema))
        .push(" WHERE occurrence = $1 AND dry_run = $2 AND policy_fingerprint = $3");
    Statement::new(sql, params)
}

/// Whether a later occurrence of the same kind and policy was started
/// (one column, boolean): this one was missed.
pub(crate) fn later_started(schema: &str, params: Key) -> Statement<Key> {
    let mut sql = SqlText::new("SELECT EXISTS (SELECT 1 FROM ");
    sql.table(&CohortTable::Occurrence.qualified(schema))
        .push(" WHERE occurrence > $1 AND dry_run = $2 AND policy_fingerprint = $3)");
    Statement::new(sql, params)
}

/// A new occurrence.
#[derive(Debug)]
pub(crate) struct Insert {
    pub(crate) occurrence_id: Uuid,
    pub(crate) at: DateTime<Utc>,
    pub(crate) dry_run: bool,
    pub(crate) fingerprint: String,
    pub(crate) passes: i32,
    pub(crate) created_by: String,
}

impl Params for Insert {
    fn bind(self, q: Args) -> Args {
        q.bind(self.occurrence_id)
            .bind(self.at)
            .bind(self.dry_run)
            .bind(self.fingerprint)
            .bind(self.passes)
            .bind(self.created_by)
    }
}

pub(crate) fn insert(schema: &str, params: Insert) -> Statement<Insert> {
    let mut sql = SqlText::new("INSERT INTO ");
    sql.table(&CohortTable::Occurrence.qualified(schema)).push(
        " (occurrence_id, occurrence, dry_run, policy_fingerprint, passes, created_by) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    );
    Statement::new(sql, params)
}

/// The passes of a new occurrence, numbered from 1 in the order given
/// (`specs`, a JSON array of objects; a tenant's has its `id`).
#[derive(Debug)]
pub(crate) struct InsertPasses {
    pub(crate) occurrence_id: Uuid,
    pub(crate) specs: serde_json::Value,
}

impl Params for InsertPasses {
    fn bind(self, q: Args) -> Args {
        q.bind(self.occurrence_id).bind(self.specs)
    }
}

pub(crate) fn insert_passes(schema: &str, params: InsertPasses) -> Statement<InsertPasses> {
    let mut sql = SqlText::new("INSERT INTO ");
    sql.table(&CohortTable::OccurrencePass.qualified(schema))
        .push(
            " (occurrence_id, pass, spec, tenant_id) \
         SELECT $1, p.ord::int4, p.spec, p.spec ->> 'id' \
         FROM pg_catalog.jsonb_array_elements($2::jsonb) WITH ORDINALITY AS p(spec, ord)",
        );
    Statement::new(sql, params)
}

/// A replica's claim on a pass: its token (new for each claim), who it
/// is (for people reading the table), and the text its pass locks start
/// with (`locks::pass_prefix`).
#[derive(Debug)]
pub(crate) struct Claim {
    pub(crate) occurrence_id: Uuid,
    pub(crate) token: Uuid,
    pub(crate) by: String,
    pub(crate) lock_prefix: String,
}

impl Params for Claim {
    fn bind(self, q: Args) -> Args {
        q.bind(self.occurrence_id)
            .bind(self.token)
            .bind(self.by)
            .bind(self.lock_prefix)
    }
}

/// Claims the first pending pass no other replica is claiming and takes
/// its session lock in the same statement (columns `pass`, `spec`,
/// `attempts`, `locked`); none when no pass is pending. `locked` is false
/// only while another replica checks the pass for a lost holder: the
/// claim is then given back ([`unclaim`]).
///
/// The pass is chosen by an uncorrelated scalar subquery, which the
/// executor runs once (an InitPlan) whatever plan the statistics lead to:
/// at most one pass is claimed and locked. (Joined as a subquery in
/// `FROM`, the choice could land on the inner side of a nested loop and
/// run again for every row of the occurrence, each run skipping the rows
/// this statement had just claimed and returning the next: after an
/// `ANALYZE` taken before the occurrence's passes existed, one claim took
/// every pending pass and held all their locks.)
pub(crate) fn claim_pending(schema: &str, params: Claim) -> Statement<Claim> {
    let table = CohortTable::OccurrencePass.qualified(schema);
    let mut sql = SqlText::new("UPDATE ");
    sql.table(&table)
        .push(
            " AS p SET status = 'claimed', attempts = p.attempts + 1, claim_token = $2, \
               claimed_by = $3, claimed_at = pg_catalog.clock_timestamp() \
             WHERE p.occurrence_id = $1 AND p.status = 'pending' AND p.pass = (SELECT c.pass FROM ",
        )
        .table(&table)
        .push(
            " AS c WHERE c.occurrence_id = $1 AND c.status = 'pending' ORDER BY c.pass LIMIT 1 \
               FOR UPDATE SKIP LOCKED) \
             RETURNING p.pass, p.spec, p.attempts, \
               pg_catalog.pg_try_advisory_lock(pg_catalog.hashtextextended($4 || p.pass::text, 0)) AS locked",
        );
    Statement::new(sql, params)
}

/// A claim given back unrun (its lock could not be taken).
#[derive(Debug)]
pub(crate) struct Unclaim {
    pub(crate) occurrence_id: Uuid,
    pub(crate) pass: i32,
    pub(crate) token: Uuid,
}

impl Params for Unclaim {
    fn bind(self, q: Args) -> Args {
        q.bind(self.occurrence_id).bind(self.pass).bind(self.token)
    }
}

pub(crate) fn unclaim(schema: &str, params: Unclaim) -> Statement<Unclaim> {
    let mut sql = SqlText::new("UPDATE ");
    sql.table(&CohortTable::OccurrencePass.qualified(schema))
        .push(
            " SET status = 'pending', attempts = attempts - 1, claim_token = NULL \
         WHERE occurrence_id = $1 AND pass = $2 AND claim_token = $3 AND status = 'claimed'",
        );
    Statement::new(sql, params)
}

/// An occurrence.
#[derive(Debug)]
pub(crate) struct Of {
    pub(crate) occurrence_id: Uuid,
}

impl Params for Of {
    fn bind(self, q: Args) -> Args {
        q.bind(self.occurrence_id)
    }
}

/// The passes claimed now (columns `pass`, `claimed_at`), in order: each
/// is running, or lost its replica (its lock is free).
pub(crate) fn claimed(schema: &str, params: Of) -> Statement<Of> {
    let mut sql = SqlText::new("SELECT pass, claimed_at FROM ");
    sql.table(&CohortTable::OccurrencePass.qualified(schema))
        .push(" WHERE occurrence_id = $1 AND status = 'claimed' ORDER BY pass");
    Statement::new(sql, params)
}

/// Passes not yet done (one column, bigint).
pub(crate) fn remaining(schema: &str, params: Of) -> Statement<Of> {
    let mut sql = SqlText::new("SELECT pg_catalog.count(*) FROM ");
    sql.table(&CohortTable::OccurrencePass.qualified(schema))
        .push(" WHERE occurrence_id = $1 AND status <> 'done'");
    Statement::new(sql, params)
}

/// A claimed pass taken over from a replica that was lost.
#[derive(Debug)]
pub(crate) struct TakeOver {
    pub(crate) occurrence_id: Uuid,
    pub(crate) pass: i32,
    pub(crate) token: Uuid,
    pub(crate) by: String,
}

impl Params for TakeOver {
    fn bind(self, q: Args) -> Args {
        q.bind(self.occurrence_id)
            .bind(self.pass)
            .bind(self.token)
            .bind(self.by)
    }
}

/// Takes over a pass still claimed (columns `spec`, `attempts`); none when
/// it was settled meanwhile.
pub(crate) fn take_over(schema: &str, params: TakeOver) -> Statement<TakeOver> {
    let mut sql = SqlText::new("UPDATE ");
    sql.table(&CohortTable::OccurrencePass.qualified(schema))
        .push(
            " SET attempts = attempts + 1, claim_token = $3, claimed_by = $4, \
           claimed_at = pg_catalog.clock_timestamp() \
         WHERE occurrence_id = $1 AND pass = $2 AND status = 'claimed' \
         RETURNING spec, attempts",
        );
    Statement::new(sql, params)
}

/// The end of a claim: the pass is done (with the run that did it, if one
/// exists), or back to pending for another replica (`done` false: its run
/// was cancelled). Only the claim holding `token` settles it. The pass's
/// lock (`$6`, its text) is released in the same statement; a replica
/// that takes the lock before this commits waits for the row, then sees
/// the pass settled.
#[derive(Debug)]
pub(crate) struct Settle {
    pub(crate) occurrence_id: Uuid,
    pub(crate) pass: i32,
    pub(crate) token: Uuid,
    pub(crate) run_id: Option<Uuid>,
    pub(crate) done: bool,
    /// `None` on a connection that does not hold the lock (the claim's
    /// session was lost): nothing is released.
    pub(crate) lock: Option<String>,
}

impl Params for Settle {
    fn bind(self, q: Args) -> Args {
        q.bind(self.occurrence_id)
            .bind(self.pass)
            .bind(self.token)
            .bind(self.run_id)
            .bind(self.done)
            .bind(self.lock)
    }
}

/// Columns: `settled` (bigint, 1 when this claim settled it), `unlocked`
/// (NULL when no lock was named).
pub(crate) fn settle(schema: &str, params: Settle) -> Statement<Settle> {
    let mut sql = SqlText::new("WITH s AS (UPDATE ");
    sql.table(&CohortTable::OccurrencePass.qualified(schema))
        .push(
            " SET status = CASE WHEN $5 THEN 'done' ELSE 'pending' END, \
           run_id = COALESCE($4, run_id), \
           claim_token = CASE WHEN $5 THEN claim_token END \
         WHERE occurrence_id = $1 AND pass = $2 AND claim_token = $3 AND status = 'claimed' \
         RETURNING 1) \
         SELECT (SELECT pg_catalog.count(*) FROM s) AS settled, \
           pg_catalog.pg_advisory_unlock(pg_catalog.hashtextextended($6, 0)) AS unlocked",
        );
    Statement::new(sql, params)
}

/// Marks an occurrence completed once every pass is done (rows affected:
/// 1 the first time).
pub(crate) fn complete(schema: &str, params: Of) -> Statement<Of> {
    let mut sql = SqlText::new("UPDATE ");
    sql.table(&CohortTable::Occurrence.qualified(schema))
        .push(
            " SET completed_at = pg_catalog.clock_timestamp() \
             WHERE occurrence_id = $1 AND completed_at IS NULL \
               AND NOT EXISTS (SELECT 1 FROM ",
        )
        .table(&CohortTable::OccurrencePass.qualified(schema))
        .push(" WHERE occurrence_id = $1 AND status <> 'done')");
    Statement::new(sql, params)
}

/// One pass of an occurrence, as its runs record it.
#[derive(Debug)]
pub(crate) struct PassRuns {
    pub(crate) at: DateTime<Utc>,
    pub(crate) pass: i32,
    pub(crate) dry_run: bool,
    pub(crate) fingerprint: String,
}

impl Params for PassRuns {
    fn bind(self, q: Args) -> Args {
        q.bind(self.at)
            .bind(self.pass)
            .bind(self.dry_run)
            .bind(self.fingerprint)
    }
}

/// The runs of one pass still `started` (column `run_id`).
pub(crate) fn started_of_pass(schema: &str, params: PassRuns) -> Statement<PassRuns> {
    let mut sql = SqlText::new("SELECT run_id FROM ");
    sql.table(&CohortTable::SweepRun.qualified(schema)).push(
        " WHERE status = 'started' AND trigger = 'scheduled' AND kind = 'sweep' \
           AND occurrence = $1 AND occurrence_pass = $2 AND dry_run = $3 \
           AND policy_fingerprint = $4",
    );
    Statement::new(sql, params)
}

/// The runs of one pass since a claim.
#[derive(Debug)]
pub(crate) struct FinishedRun {
    pub(crate) runs: PassRuns,
    pub(crate) since: DateTime<Utc>,
}

impl Params for FinishedRun {
    fn bind(self, q: Args) -> Args {
        self.runs.bind(q).bind(self.since)
    }
}

/// The run of one pass, started since `since` (`$5`), that ran to its end
/// (column `run_id`): settled, neither cancelled nor recovered after its
/// replica was lost. A pass with one is done.
pub(crate) fn finished_run(schema: &str, params: FinishedRun) -> Statement<FinishedRun> {
    let mut sql = SqlText::new("SELECT run_id FROM ");
    sql.table(&CohortTable::SweepRun.qualified(schema)).push(
        " WHERE trigger = 'scheduled' AND kind = 'sweep' \
           AND occurrence = $1 AND occurrence_pass = $2 AND dry_run = $3 \
           AND policy_fingerprint = $4 AND started_at >= $5 \
           AND status IN ('succeeded', 'partially_failed', 'failed') \
           AND (error IS NULL OR error NOT LIKE 'run: recovered:%') \
         ORDER BY started_at DESC LIMIT 1",
    );
    Statement::new(sql, params)
}
