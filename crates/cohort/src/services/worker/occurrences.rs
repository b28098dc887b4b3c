//! One occurrence shared among the replicas: written once or joined, its
//! passes claimed one at a time, taken over when a replica is lost.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::base::cancel::Cancel;
use crate::base::locks::LockKey;
use crate::context::{Context, Ready};
use crate::domain::schedule::{decide, next_occurrence, Decision};
use crate::error::{Error, Result};
use crate::schema::CohortTable;
use crate::sql::{locks, occurrences};
use uuid::Uuid;

use super::super::events::OccurrenceOutcome as Occurrence;
use super::claimed::{run_claimed, settle_claim, Claimed, Shared};
use super::orphans::recover_orphans;
use super::{db_now, latest_run, WorkerConfig, LOCK_POLL};

/// What a replica found when it came to an occurrence.
enum Joined {
    /// Its passes are under way (or about to be): take some.
    Shared(Shared),
    /// Every pass is done (or a replica from before shared occurrences
    /// ran it to its last pass).
    Completed,
    /// A later occurrence was started: this one was missed.
    Missed,
}

/// Finds the occurrence of this kind and policy, or writes it with its
/// passes. The first replica to arrive lists the tenants once, for every
/// replica, under a transaction lock the others wait on.
async fn join(
    cx: &Ready<'_>,
    prepared: &crate::context::Prepared,
    at: DateTime<Utc>,
    dry_run: bool,
) -> Result<Joined> {
    let schema = &cx.config.schema;
    let fingerprint = crate::run::peers::fingerprint(cx, prepared);
    let key = || occurrences::Key {
        at,
        dry_run,
        fingerprint: fingerprint.clone(),
    };
    let table = CohortTable::SweepRun.qualified(schema);
    let mut tx = cx.pool.begin().await?;
    locks::xact_lock(LockKey::Worker(&table))
        .query()
        .execute(&mut *tx)
        .await?;
    let found: Option<(Uuid, i32, bool)> = occurrences::find(schema, key())
        .query_as()
        .fetch_optional(&mut *tx)
        .await?;
    if let Some((id, passes, completed)) = found {
        tx.commit().await?;
        if completed {
            return Ok(Joined::Completed);
        }
        return Ok(Joined::Shared(Shared {
            id,
            at,
            passes,
            dry_run,
            fingerprint,
        }));
    }
    let later: bool = occurrences::later_started(schema, key())
        .query_scalar()
        .fetch_one(&mut *tx)
        .await?;
    if later {
        tx.commit().await?;
        return Ok(Joined::Missed);
    }
    // Runs without an occurrence record come from a replica of schema
    // version 9 or older: as it ran to its last pass, it is done.
    if decide(latest_run(cx, &mut tx, dry_run, at).await?) == Decision::Skip {
        tx.commit().await?;
        return Ok(Joined::Completed);
    }
    let (id, passes) = write_occurrence(cx, prepared, &mut tx, key()).await?;
    tx.commit().await?;
    Ok(Joined::Shared(Shared {
        id,
        at,
        passes,
        dry_run,
        fingerprint,
    }))
}

/// Lists the tenants once and writes the occurrence with its passes, in
/// the first replica's transaction. Returns its id and how many passes.
async fn write_occurrence(
    cx: &Ready<'_>,
    prepared: &crate::context::Prepared,
    tx: &mut sqlx::PgConnection,
    key: occurrences::Key,
) -> Result<(Uuid, i32)> {
    let schema = &cx.config.schema;
    let list = crate::run::passes::pass_list(cx, prepared, &cx.tenant_source).await?;
    let passes = i32::try_from(list.passes.len()).map_err(|_| {
        Error::InvalidInput(format!(
            "an occurrence of {} passes is more than the ledger can number",
            list.passes.len()
        ))
    })?;
    let id = Uuid::new_v4();
    occurrences::insert(
        schema,
        occurrences::Insert {
            occurrence_id: id,
            at: key.at,
            dry_run: key.dry_run,
            fingerprint: key.fingerprint,
            passes,
            created_by: crate::run::peers::process_name(),
        },
    )
    .query()
    .execute(&mut *tx)
    .await?;
    let specs = serde_json::to_value(&list.passes).expect("passes serialise");
    occurrences::insert_passes(
        schema,
        occurrences::InsertPasses {
            occurrence_id: id,
            specs,
        },
    )
    .query()
    .execute(&mut *tx)
    .await?;
    Ok((id, passes))
}

/// What a replica can do next for an occurrence.
enum Next {
    /// Run this pass.
    Run(Box<Claimed>),
    /// Every pass left is being run by a live replica (or was just
    /// released): look again shortly.
    Wait,
    /// Every pass is done.
    Done,
}

/// The pass to run, holding `conn` (with the pass's lock) until settled;
/// `spec` is the pass as stored.
fn run_next(
    conn: crate::sql::locks::Held,
    pass: i32,
    spec: serde_json::Value,
    attempts: i32,
    token: Uuid,
) -> Result<Next> {
    let spec = serde_json::from_value(spec).map_err(|e| {
        Error::Migration(format!("a pass of a shared occurrence cannot be read: {e}"))
    })?;
    Ok(Next::Run(Box::new(Claimed {
        conn,
        pass,
        spec,
        attempts,
        token,
    })))
}

/// Claims the first pending pass (`FOR UPDATE SKIP LOCKED`, so replicas
/// never wait on each other), or else takes over a claimed pass whose
/// replica was lost (its lock is free). A pending pass is locked by the
/// statement that claims it, so a claim other replicas can see always has
/// a live holder or a free lock.
async fn next_pass(cx: &Ready<'_>, occurrence: &Shared) -> Result<Next> {
    let schema = &cx.config.schema;
    let by = crate::run::peers::process_name();
    let token = Uuid::new_v4();
    let mut conn = crate::sql::locks::Held::new(cx.pool.acquire().await?);
    let pending = claim_pending(cx, occurrence, &mut conn, token, &by).await?;
    if let Some((pass, spec, attempts, locked)) = pending {
        if locked {
            return run_next(conn, pass, spec, attempts, token);
        }
        // A replica checking whether the pass lost its holder has its
        // lock for a moment: give the pass back.
        occurrences::unclaim(
            schema,
            occurrences::Unclaim {
                occurrence_id: occurrence.id,
                pass,
                token,
            },
        )
        .query()
        .execute(&mut *conn)
        .await?;
        drop(conn.into_inner());
        return Ok(Next::Wait);
    }
    let claimed: Vec<(i32, DateTime<Utc>)> = occurrences::claimed(
        schema,
        occurrences::Of {
            occurrence_id: occurrence.id,
        },
    )
    .query_as()
    .fetch_all(&mut *conn)
    .await?;
    for (pass, claimed_at) in claimed {
        let key = LockKey::Pass(occurrence.id, pass);
        if !locks::try_lock(&mut conn, key).await? {
            continue;
        }
        match take_over(cx, occurrence, &mut conn, pass, claimed_at, token, &by).await? {
            TakeOver::Taken(spec, attempts) => {
                return run_next(conn, pass, spec, attempts, token);
            }
            TakeOver::NotTaken => locks::unlock(&mut conn, key).await?,
            TakeOver::Settled => {}
        }
    }
    finish_or_wait(cx, occurrence, conn).await
}

/// Claims the first pending pass, locking it in the same statement:
/// its number, spec, attempts and whether its lock was taken.
async fn claim_pending(
    cx: &Context,
    occurrence: &Shared,
    conn: &mut crate::sql::locks::Held,
    token: Uuid,
    by: &str,
) -> Result<Option<(i32, serde_json::Value, i32, bool)>> {
    Ok(occurrences::claim_pending(
        &cx.config.schema,
        occurrences::Claim {
            occurrence_id: occurrence.id,
            token,
            by: by.to_owned(),
            lock_prefix: crate::base::locks::pass_prefix(occurrence.id),
        },
    )
    .query_as()
    .fetch_optional(&mut **conn)
    .await?)
}

/// No pass to take: the occurrence is complete when none is left (marked
/// so), otherwise its last passes are still running elsewhere.
async fn finish_or_wait(
    cx: &Context,
    occurrence: &Shared,
    mut conn: crate::sql::locks::Held,
) -> Result<Next> {
    let schema = &cx.config.schema;
    let of = || occurrences::Of {
        occurrence_id: occurrence.id,
    };
    let left: i64 = occurrences::remaining(schema, of())
        .query_scalar()
        .fetch_one(&mut *conn)
        .await?;
    if left > 0 {
        drop(conn.into_inner());
        return Ok(Next::Wait);
    }
    occurrences::complete(schema, of())
        .query()
        .execute(&mut *conn)
        .await?;
    drop(conn.into_inner());
    Ok(Next::Done)
}

/// What became of a claimed pass whose lock a replica took.
enum TakeOver {
    /// Run it (its spec and attempt number); its lock is held.
    Taken(serde_json::Value, i32),
    /// Settled, or its lost run is still ending: its lock is still held.
    NotTaken,
    /// Marked done with the run that finished it; its lock is released.
    Settled,
}

/// With the lock of a claimed pass taken (its replica was lost, or it
/// settled the pass a moment ago): settles the lost replica's run of it
/// failed, and takes the pass over (its spec and attempt number), unless
/// it was settled meanwhile, its run finished before its replica was lost
/// (the pass is then done with that run: a finished pass is never swept
/// again), or that run's session is still ending (try again shortly).
async fn take_over(
    cx: &Ready<'_>,
    occurrence: &Shared,
    conn: &mut sqlx::PgConnection,
    pass: i32,
    claimed_at: DateTime<Utc>,
    token: Uuid,
    by: &str,
) -> Result<TakeOver> {
    let schema = &cx.config.schema;
    let of_pass = || occurrences::PassRuns {
        at: occurrence.at,
        pass,
        dry_run: occurrence.dry_run,
        fingerprint: occurrence.fingerprint.clone(),
    };
    let started: Vec<Uuid> = occurrences::started_of_pass(schema, of_pass())
        .query_scalar()
        .fetch_all(&mut *conn)
        .await?;
    let reason = "run: recovered: the worker replica running this pass stopped before it settled (owner lost)";
    for run_id in started {
        match crate::services::rescuer::recover_run(cx, run_id, reason).await? {
            crate::services::rescuer::Recovery::Recovered => {
                tracing::warn!(%run_id, occurrence = %occurrence.at, pass, "settled the run of a pass whose replica was lost as failed");
            }
            crate::services::rescuer::Recovery::Settled => {}
            crate::services::rescuer::Recovery::Live => return Ok(TakeOver::NotTaken),
        }
    }
    let taken: Option<(serde_json::Value, i32)> = occurrences::take_over(
        schema,
        occurrences::TakeOver {
            occurrence_id: occurrence.id,
            pass,
            token,
            by: by.to_owned(),
        },
    )
    .query_as()
    .fetch_optional(&mut *conn)
    .await?;
    let Some(taken) = taken else {
        return Ok(TakeOver::NotTaken);
    };
    let finished: Option<Uuid> = occurrences::finished_run(
        schema,
        occurrences::FinishedRun {
            runs: of_pass(),
            since: claimed_at,
        },
    )
    .query_scalar()
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(run_id) = finished {
        tracing::info!(%run_id, occurrence = %occurrence.at, pass, "the pass's run had finished before its replica was lost; not swept again");
        settle_claim(cx, occurrence, conn, pass, token, Some(run_id), true, true).await?;
        return Ok(TakeOver::Settled);
    }
    tracing::warn!(occurrence = %occurrence.at, pass, attempt = taken.1, "took over a pass whose replica was lost; sweeping it again, whole");
    Ok(TakeOver::Taken(taken.0, taken.1))
}

/// One occurrence: write it or join it, then take its passes one at a
/// time until none is left; wait for passes other replicas run (taking
/// over any whose replica is lost) until the next occurrence is due.
pub(crate) async fn occurrence(
    cx: &Arc<Context>,
    config: &WorkerConfig,
    at: DateTime<Utc>,
    cancel: &Cancel,
) -> Result<Occurrence> {
    // Validation (first use) before anything is written.
    let ready = cx.ready().await?;
    let prepared = ready.plans();
    let give_up = next_occurrence(&config.schedule, at, None);
    let too_late = |now: DateTime<Utc>| give_up.is_some_and(|g| now >= g);
    if cancel.is_cancelled() {
        return Ok(Occurrence::Cancelled { passes: 0 });
    }
    let settings = cx.live_settings().await?;
    if settings.kill_switch.effective {
        tracing::warn!(occurrence = %at, "kill switch is on; occurrence skipped");
        return Ok(Occurrence::KillSwitch { passes: 0 });
    }
    let dry_run = settings.dry_run.effective;
    let shared = match join(&ready, prepared, at, dry_run).await? {
        Joined::Shared(shared) => shared,
        Joined::Completed => return Ok(Occurrence::AlreadyRan),
        Joined::Missed => {
            tracing::info!(occurrence = %at, "a later occurrence was started; skipped");
            return Ok(Occurrence::LockHeld);
        }
    };
    // Runs of earlier occurrences whose replica was lost.
    recover_orphans(&ready).await?;
    let round = crate::domain::telemetry::backlog_round_started();
    let (mut ran, mut rerun) = (0usize, false);
    loop {
        if cancel.is_cancelled() {
            return Ok(Occurrence::Cancelled { passes: ran });
        }
        if ran > 0 {
            let now = cx.live_settings().await?;
            if now.kill_switch.effective {
                tracing::warn!(occurrence = %at, passes = ran, "kill switch turned on; later passes skipped");
                return Ok(Occurrence::KillSwitch { passes: ran });
            }
            if now.dry_run.effective != dry_run {
                // One occurrence is of one kind: the rest runs at the next
                // occurrence as the setting now says.
                tracing::warn!(occurrence = %at, passes = ran, dry_run = now.dry_run.effective, "dry_run changed; later passes skipped");
                return Ok(Occurrence::DryRunChanged { passes: ran });
            }
        }
        match next_pass(&ready, &shared).await? {
            Next::Run(claimed) => {
                ran += 1;
                rerun |= claimed.attempts > 1;
                run_claimed(cx, &ready, &shared, *claimed, cancel).await?;
            }
            Next::Wait => {
                if too_late(db_now(&cx.pool).await?) {
                    tracing::info!(occurrence = %at, passes = ran, "other replicas still ran passes of this occurrence when the next was due; left to them");
                    return Ok(if ran > 0 {
                        Occurrence::Ran { passes: ran, rerun }
                    } else {
                        Occurrence::LockHeld
                    });
                }
                cancel.sleep(LOCK_POLL).await;
            }
            Next::Done => break,
        }
    }
    if ran == 0 {
        return Ok(Occurrence::AlreadyRan);
    }
    if ran == usize::try_from(shared.passes).unwrap_or(usize::MAX) {
        // This replica ran every pass: a backlog measured only by earlier
        // occurrences (a tenant no longer listed) stops counting.
        crate::domain::telemetry::backlog_round_done(round);
    }
    Ok(Occurrence::Ran { passes: ran, rerun })
}
