//! Runs that lost their worker replica, and passes that failed before
//! their run existed: settled so the ledger says what happened.

use crate::context::Ready;
use crate::error::{Error, Result};
use crate::sql;
use uuid::Uuid;

/// Records a pass that failed before its run existed as a settled failed
/// run of its occurrence: what failed stays in the ledger, and the
/// occurrence still counts as run to its last pass (otherwise every
/// replica would sweep it again). A failure to record is only logged.
/// Returns the run's id when it was recorded.
pub(super) async fn record_not_started(
    cx: &Ready<'_>,
    tenant: Option<&str>,
    position: crate::run::OccurrencePass,
    dry_run: bool,
    text: &str,
) -> Option<Uuid> {
    let run_id = Uuid::new_v4();
    let recorded = async {
        let prepared = cx.plans();
        // The tenant as the ledger stores every other run's: canonical (an
        // id that cannot be a tenant, often why the pass failed, as listed).
        let identity = prepared.model.tenant_identity();
        let tenant = tenant.map(|t| identity.canonical(t).unwrap_or_else(|| t.to_string()));
        let failed = sql::ledger::InsertNotStarted {
            run_id,
            dry_run,
            tenant,
            occurrence: position.at,
            error: text.to_owned(),
            pass: position.pass,
            passes: position.passes,
            policy_fingerprint: crate::run::peers::fingerprint(cx, prepared),
        };
        let mut conn = cx.pool.acquire().await?;
        let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
        let chain = (cx.config.schema.as_str(), cx.config.ledger_key.as_ref());
        let settling = crate::run::chain::Settling::NotStarted(failed);
        crate::run::chain::settle_run(&mut tx, prepared, chain, run_id, settling).await?;
        tx.commit().await?;
        crate::domain::telemetry::run_recorded_failed("sweep", "scheduled");
        Ok::<_, Error>(())
    };
    match recorded.await {
        Ok(()) => Some(run_id),
        Err(e) => {
            tracing::warn!(error = %e, "could not record the pass that did not start");
            None
        }
    }
}

/// Settles `failed` every scheduled sweep left `started` whose run lock is
/// free: a live run holds its own lock from before it is written as
/// started, so such a run lost its owner. Returns (recovered, still
/// holding their lock: live, on this replica or another).
pub(super) async fn settle_orphans(cx: &Ready<'_>, reason: &str) -> Result<(u64, u64)> {
    let orphans: Vec<uuid::Uuid> = sql::worker::started_scheduled(&cx.config.schema)
        .query_scalar()
        .fetch_all(&cx.pool)
        .await?;
    let (mut recovered, mut live) = (0, 0);
    for run_id in orphans {
        match crate::services::rescuer::recover_run(cx, run_id, reason).await? {
            crate::services::rescuer::Recovery::Recovered => {
                tracing::warn!(%run_id, reason, "settled a scheduled run whose owner was lost as failed");
                recovered += 1;
            }
            crate::services::rescuer::Recovery::Settled => {}
            crate::services::rescuer::Recovery::Live => live += 1,
        }
    }
    Ok((recovered, live))
}

/// [`settle_orphans`] for runs whose worker replica was lost.
pub(super) async fn recover_orphans(cx: &Ready<'_>) -> Result<()> {
    let reason = "run: recovered: the worker running this scheduled occurrence stopped before it settled (owner lost)";
    settle_orphans(cx, reason).await.map(drop)
}
