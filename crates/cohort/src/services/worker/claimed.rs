//! Running one claimed pass: its run, its lock kept alive, a panic or a
//! failure before the run recorded, and the claim settled.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::orphans::{record_not_started, settle_orphans};
use super::AbortOnDrop;
use crate::base::cancel::Cancel;
use crate::base::locks::LockKey;
use crate::context::{Context, Ready};
use crate::error::Result;
use crate::run::{RunStatus, Trigger};
use crate::sql;
use crate::sql::occurrences;
use uuid::Uuid;

/// An occurrence as written for every replica: its id, its passes, and
/// the kind (dry or real) and policy it is of.
pub(super) struct Shared {
    pub(super) id: Uuid,
    pub(super) at: DateTime<Utc>,
    pub(super) passes: i32,
    pub(super) dry_run: bool,
    pub(super) fingerprint: String,
}

/// A pass this replica holds: its lock is held on `conn` until the claim
/// (`token`) is settled.
pub(super) struct Claimed {
    pub(super) conn: crate::sql::locks::Held,
    pub(super) pass: i32,
    pub(super) spec: crate::run::passes::Pass,
    pub(super) attempts: i32,
    pub(super) token: Uuid,
}

/// Ends a claim: done (with its run), or back to pending; releases the
/// pass's lock in the same statement when `conn` holds it (`holds_lock`).
/// Returns whether the lock was released.
#[allow(clippy::too_many_arguments)]
pub(super) async fn settle_claim(
    cx: &Context,
    occurrence: &Shared,
    conn: &mut sqlx::PgConnection,
    pass: i32,
    token: Uuid,
    run_id: Option<Uuid>,
    done: bool,
    holds_lock: bool,
) -> Result<bool> {
    let (_, unlocked): (i64, Option<bool>) = occurrences::settle(
        &cx.config.schema,
        occurrences::Settle {
            occurrence_id: occurrence.id,
            pass,
            token,
            run_id,
            done,
            lock: holds_lock.then(|| LockKey::Pass(occurrence.id, pass).text()),
        },
    )
    .query_as()
    .fetch_one(&mut *conn)
    .await?;
    Ok(unlocked == Some(true))
}

/// Runs a claimed pass and settles the claim: done, or back to pending
/// when its run was cancelled (another replica sweeps it again, whole).
/// The pass's lock is released with the claim; if its session was lost
/// meanwhile, the claim is settled on a fresh connection (only if no
/// replica took it over) and the occurrence fails.
pub(super) async fn run_claimed(
    cx: &Arc<Context>,
    ready: &Ready<'_>,
    occurrence: &Shared,
    mut claimed: Claimed,
    cancel: &Cancel,
) -> Result<()> {
    let position = crate::run::OccurrencePass {
        at: occurrence.at,
        pass: claimed.pass,
        passes: occurrence.passes,
    };
    let (end, lost) = match claimed.spec.failure() {
        Some(failure) => {
            tracing::error!(occurrence = %occurrence.at, position = failure.position, error = %failure.error, "scheduled pass cannot run; the other passes go on");
            let text = format!("pass: did not start: kind=invalid_input {}", failure.error);
            let run_id = record_not_started(ready, None, position, occurrence.dry_run, &text).await;
            (
                PassEnd {
                    run_id,
                    cancelled: false,
                },
                None,
            )
        }
        None => {
            run_pass(
                cx,
                ready,
                &mut claimed.conn,
                &claimed.spec,
                position,
                occurrence.dry_run,
                cancel,
            )
            .await
        }
    };
    let done = !end.cancelled;
    if lost.is_none() {
        let settled = settle_claim(
            cx,
            occurrence,
            &mut claimed.conn,
            claimed.pass,
            claimed.token,
            end.run_id,
            done,
            true,
        )
        .await;
        if matches!(settled, Ok(true)) {
            drop(claimed.conn.into_inner());
        }
        // Otherwise dropping `Held` closes the session, releasing the lock.
        return settled.map(drop);
    }
    // The claim's session is gone (and its lock with it): settle on
    // another connection; a replica that took the pass over meanwhile
    // holds another token, and this changes nothing.
    let mut fresh = cx.pool.acquire().await?;
    settle_claim(
        cx,
        occurrence,
        &mut fresh,
        claimed.pass,
        claimed.token,
        end.run_id,
        done,
        false,
    )
    .await?;
    Err(lost.expect("checked").into())
}

/// How a pass ended: its run (if one was written) and whether it was
/// cancelled (the pass goes back to pending).
struct PassEnd {
    run_id: Option<Uuid>,
    cancelled: bool,
}

/// How often the pass lock's session is used during a long pass, so
/// no idle time-out (a proxy's, `idle_session_timeout`) can end it.
const LOCK_KEEPALIVE: Duration = Duration::from_secs(30);

/// Runs one pass in its own task (a panic in user code, such as a rule
/// provider or an anonymiser, fails the pass, not the occurrence), keeping
/// the lock's session alive meanwhile. A pass that fails before its run
/// exists is recorded as a failed run, so the occurrence still counts as
/// run to its last pass. Returns how it ended, and the error that ended
/// the lock's session if it was lost meanwhile.
async fn run_pass(
    cx: &Arc<Context>,
    ready: &Ready<'_>,
    lock_conn: &mut sqlx::PgConnection,
    pass: &crate::run::passes::Pass,
    position: crate::run::OccurrencePass,
    dry_run: bool,
    cancel: &Cancel,
) -> (PassEnd, Option<sqlx::Error>) {
    let nothing = PassEnd {
        run_id: None,
        cancelled: false,
    };
    let Some(mut req) = crate::run::passes::pass_request(pass, position.at) else {
        return (nothing, None);
    };
    let tenant = req.tenancy.tenant.clone();
    req.dry_run = dry_run;
    req.trigger = Trigger::Scheduled;
    req.occurrence = Some(position);
    req.cancel = cancel.clone();
    let mut task = AbortOnDrop(tokio::spawn({
        let cx = Arc::clone(cx);
        async move { crate::run::sweep::sweep(&cx.ready().await?, req).await }
    }));
    let mut lost: Option<sqlx::Error> = None;
    let joined = loop {
        tokio::select! {
            joined = &mut task.0 => break joined,
            _ = tokio::time::sleep(LOCK_KEEPALIVE), if lost.is_none() => {
                if let Err(e) = sql::worker::keepalive().query().execute(&mut *lock_conn).await {
                    tracing::error!(error = %e, "lost the pass lock's session; another replica may take the pass over");
                    lost = Some(e);
                }
            }
        }
    };
    let shown = tenant.as_deref().unwrap_or("(tenantless)");
    let end = match joined {
        Ok(Ok(r)) => {
            match r.status {
                RunStatus::Succeeded => {
                    tracing::info!(tenant = shown, run_id = %r.run_id, affected = r.affected(), dry_run = r.dry_run, "scheduled pass succeeded")
                }
                status => {
                    tracing::error!(tenant = shown, run_id = %r.run_id, status = status.as_str(), failures = r.failures.len(), "scheduled pass did not succeed; the other passes go on")
                }
            }
            PassEnd {
                run_id: Some(r.run_id),
                cancelled: r.status == RunStatus::Cancelled,
            }
        }
        Ok(Err(e)) => {
            tracing::error!(tenant = shown, error = %e, "scheduled pass failed before its run started; the other passes go on");
            let text = format!("pass: did not start: kind={} {e}", e.kind().as_str());
            PassEnd {
                run_id: record_not_started(ready, tenant.as_deref(), position, dry_run, &text)
                    .await,
                cancelled: false,
            }
        }
        Err(e) => {
            tracing::error!(tenant = shown, error = %e, "scheduled pass panicked; the other passes go on");
            PassEnd {
                run_id: after_panic(ready, tenant.as_deref(), position, dry_run).await,
                cancelled: false,
            }
        }
    };
    (end, lost)
}

/// After a pass panicked: a run it had started is settled failed as soon
/// as its connection (closed as it unwound) has let go of its lock; if it
/// panicked before its run existed, that is recorded as a failed run
/// (whose id is returned).
async fn after_panic(
    cx: &Ready<'_>,
    tenant: Option<&str>,
    position: crate::run::OccurrencePass,
    dry_run: bool,
) -> Option<Uuid> {
    let reason = "run: recovered: the scheduled pass panicked before it settled";
    let mut recovered = 0;
    for _ in 0..20 {
        let Ok((done, live)) = settle_orphans(cx, reason).await else {
            break;
        };
        recovered += done;
        if live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if recovered > 0 {
        return None;
    }
    // It panicked before its run existed.
    let text = "pass: did not start: kind=panic the pass panicked (a rule provider, anonymiser or handler with a bug)";
    record_not_started(cx, tenant, position, dry_run, text).await
}
