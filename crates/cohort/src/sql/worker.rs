//! Statements of the scheduled worker: which run of an occurrence came
//! last, which scheduled sweeps are still `started`, and the keep-alive on
//! the connection that holds the occurrence lock.

use chrono::{DateTime, Utc};

use super::statement::{Args, Params, Statement};
use crate::base::ident::SqlText;
use crate::sql::tables::CohortTable;

/// The latest Scheduled sweep of one kind (`dry_run`) for an occurrence at
/// `at` or later, by this policy (`fingerprint`) or from before schema
/// version 5 (no fingerprint: it counts for every policy).
#[derive(Debug)]
pub(crate) struct LatestScheduled {
    pub(crate) dry_run: bool,
    pub(crate) at: DateTime<Utc>,
    pub(crate) fingerprint: String,
}

impl Params for LatestScheduled {
    fn bind(self, q: Args) -> Args {
        q.bind(self.dry_run).bind(self.at).bind(self.fingerprint)
    }
}

/// Columns: `status`, `occurrence_pass`, `occurrence_passes`.
pub(crate) fn latest_scheduled(
    schema: &str,
    params: LatestScheduled,
) -> Statement<LatestScheduled> {
    let mut sql = SqlText::new("SELECT status, occurrence_pass, occurrence_passes FROM ");
    sql.table(&CohortTable::SweepRun.qualified(schema)).push(
        " WHERE kind = 'sweep' AND trigger = 'scheduled' AND dry_run = $1 AND occurrence >= $2 \
           AND (policy_fingerprint IS NULL OR policy_fingerprint = $3) \
         ORDER BY started_at DESC, run_id DESC LIMIT 1",
    );
    Statement::new(sql, params)
}

/// Every scheduled sweep still `started` (column `run_id`).
pub(crate) fn started_scheduled(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("SELECT run_id FROM ");
    sql.table(&CohortTable::SweepRun.qualified(schema))
        .push(" WHERE status = 'started' AND trigger = 'scheduled' AND kind = 'sweep'");
    Statement::new(sql, ())
}

/// A round trip on the connection holding the occurrence lock, so a lost
/// session is noticed between passes.
pub(crate) fn keepalive() -> Statement<()> {
    Statement::new(SqlText::new("SELECT 1"), ())
}
