//! Opt-in partition purge (`partitions = "drop"`): before a purge's row
//! path, each whole partition whose upper bound is at or before the cutoff
//! is detached and dropped in a transaction of its own, audited in the
//! entity's summary with its row count (and, when the category asks for
//! per-row detail, one detail row per row, written first in the same
//! transaction).
//!
//! A partition is dropped only when, with it locked against writes (so no hold can
//! be placed on its rows meanwhile: hold creation locks its target row),
//! none of its rows is under an active hold. A held partition stays with
//! its held rows, and every other row of it is purged in one statement
//! under the same lock, audited the same way. Partitions that straddle the
//! cutoff go through the row path. The entity
//! must have no row handlers (they need each row's capture); validation
//! checks the table's partitioning, foreign keys and ownership at start-up.
//!
//! A tenant-scoped entity's partitions are looked at in each tenant's
//! pass, and one goes only when every row in it is due for its own tenant
//! (`tenants_due`). That relies on the same `EXCLUSIVE` lock (no row can
//! be written into the partition between reading its tenants and the
//! drop) and on the policy's tenant directory and rules as the run
//! resolved them at its `now`; a tenant outside the directory keeps the
//! partition.
//!
//! The locks are waited for `partition_lock_timeout` at most: the
//! partition's, the parent's catalog entry while another run detaches a
//! partition, and the hold gate while a subject hold is being placed. When
//! one is not granted in time (a long query on the table, say), the
//! partition and every row from its lower bound up are left for the next
//! run: the row path of this run stops below that bound, so those rows are
//! not deleted one by one just because a report was running.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::counts::active_hold_keys;
use super::ctx::RunCtx;
use super::work::{stop_from, Stop, Work};
use crate::base::ident::QualifiedName;
use crate::domain::rules::AuditDetail;
use crate::domain::rules::Strategy;
use crate::sql::partitions as statements;
use crate::sql::BoundHolds;

/// What partition purge left to the row path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowPath {
    /// Every row past the cutoff that is still there.
    UpToCutoff,
    /// Only rows before this anchor: a partition starting there could not
    /// be locked in time, so it and everything after it waits for the
    /// next run.
    Before(DateTime<Utc>),
    /// Nothing: the first partition that could not be locked has no lower
    /// bound (`MINVALUE`).
    Nothing,
}

/// An expired partition: its upper bound is at or before the cutoff.
struct Expired {
    table: QualifiedName,
    lower: Option<DateTime<Utc>>,
    upper: DateTime<Utc>,
}

/// Whether partition purge applies to this work: a sweep's purge (not a
/// dry run, never an erasure) of an entity that opted in and has no row
/// handlers.
pub(crate) fn applies(ctx: &RunCtx<'_>, work: &Work<'_>) -> bool {
    let e = work.entity;
    // Never for erasure: a partition holds every subject's rows.
    // A tenant-scoped entity in its tenant's pass: a partition goes only
    // when every tenant's rows in it are due (`tenants_due`).
    ctx.spec.kind == crate::run::RunKind::Sweep
        && e.partitions == crate::domain::model::Partitions::Drop
        && work.rule.strategy() == Strategy::Purge
        && !ctx.spec.dry_run
        && e.tenant.is_some() == ctx.spec.tenant.is_some()
        && work.stage.is_none()
        && work.cutoff.is_some()
        && ctx.cx.handlers.get(&e.id).is_none_or(|h| h.is_empty())
}

/// What a preview says of the partitions a sweep would drop for this
/// work (the same conditions as [`applies`], for a sweep that is not a dry
/// run): `None` when partition purge would not apply or no partition has
/// expired. Reads the catalog only.
pub(crate) async fn preview_note(
    cx: &crate::context::Context,
    conn: &mut PgConnection,
    work: &Work<'_>,
    tenant_pass: bool,
) -> Result<Option<String>, sqlx::Error> {
    let e = work.entity;
    let would = e.partitions == crate::domain::model::Partitions::Drop
        && work.rule.strategy() == Strategy::Purge
        && e.tenant.is_some() == tenant_pass
        && work.stage.is_none()
        && cx.handlers.get(&e.id).is_none_or(|h| h.is_empty());
    let Some(cutoff) = work.cutoff.filter(|_| would) else {
        return Ok(None);
    };
    let expired = expired_partitions(conn, &e.table, cutoff).await?;
    if expired.is_empty() {
        return Ok(None);
    }
    let names: Vec<String> = expired
        .iter()
        .map(|p| p.table.display_plain().to_string())
        .collect();
    Ok(Some(format!(
        "partitions = \"drop\": {} partition(s) wholly before the cutoff would be dropped whole: {} (one with a held row stays, and its other rows are purged{})",
        names.len(),
        names.join(", "),
        if e.tenant.is_some() {
            "; one holding rows a tenant's rule keeps stays, and its due rows go by the row path"
        } else {
            ""
        }
    )))
}

/// Drops every expired partition without a held row, and purges the other
/// rows of those with one; returns what the row path must still do. Rows
/// purged are added to `out.affected`.
pub(crate) async fn drop_expired(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    summary_id: i64,
    out: &mut crate::run::EntityOutcome,
) -> std::result::Result<RowPath, Stop> {
    let e = work.entity;
    let cutoff = work.cutoff.expect("checked by applies");
    let expired = expired_partitions(conn, &e.table, cutoff)
        .await
        .map_err(stop_from)?;
    let mut cutoffs = TenantCutoffs::default();
    // Empty partitions dropped are named once, together.
    let mut empty: Vec<String> = Vec::new();
    for partition in expired {
        if ctx.spec.cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        let (n, tenants) = match drop_one(ctx, conn, work, summary_id, &partition, &mut cutoffs)
            .await?
        {
            Dropped::Rows(n) | Dropped::Purged(n) => (n, None),
            Dropped::Tenants(n, tenants) => (n, Some(tenants)),
            Dropped::Gone | Dropped::Kept => continue,
            Dropped::LockTimeout => {
                tracing::warn!(
                    entity = %e.name,
                    partition = %partition.table.display_plain(),
                    lock_timeout_ms = ctx.cx.config.partition_lock_timeout().as_millis() as u64,
                    "could not lock the partition in time; it and every row after its lower bound are left for the next run"
                );
                return Ok(match partition.lower {
                    Some(lower) => RowPath::Before(lower.min(cutoff)),
                    None => RowPath::Nothing,
                });
            }
        };
        out.affected += n;
        let name = partition.table.display_plain().to_string();
        ctx.recorder
            .partition_purged(e, &name, n, tenants.as_deref(), out.affected);
        match tenants {
            Some(_) if n == 0 => empty.push(name),
            Some(tenants) => out.partition_notes.push(format!(
                "partition {} dropped whole with {n} rows, each due under its own tenant's rule: {tenants}",
                partition.table.display_plain()
            )),
            None => {}
        }
    }
    if !empty.is_empty() {
        out.partition_notes.push(format!(
            "{} empty partition(s) dropped (no row in them): {}",
            empty.len(),
            empty.join(", ")
        ));
    }
    Ok(RowPath::UpToCutoff)
}

/// The parent's partitions (plain or themselves partitioned, never a
/// tree holding a foreign table, whose rows live elsewhere, nor one being
/// detached concurrently) whose upper bound is at or before the cutoff,
/// oldest first (a `-infinity` lower bound reads as none). A bound is read back through the
/// session that printed it, so its date style always parses; `DEFAULT` and
/// `MAXVALUE` partitions never qualify.
async fn expired_partitions(
    conn: &mut PgConnection,
    parent: &QualifiedName,
    cutoff: DateTime<Utc>,
) -> Result<Vec<Expired>, sqlx::Error> {
    let rows = statements::expired(parent.schema.clone(), parent.name.clone(), cutoff)
        .query_as::<statements::ExpiredRow>()
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| Expired {
            table: QualifiedName::new(r.schema, r.name),
            lower: r.lower,
            upper: r.upper,
        })
        .collect())
}

/// Whether any row of the partition is under an active hold. Driven from
/// the entity's active holds (few) through the key index, not by reading
/// every row; with very many holds, or one that cannot be a key of the
/// record key's type, every row's key is compared instead.
///
/// `holds` are the entity's active holds as [`active_hold_keys`] read them.
async fn held(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    partition: &QualifiedName,
    holds: Option<&BoundHolds>,
) -> Result<bool, sqlx::Error> {
    let e = work.entity;
    let facts = &ctx.ready.model.facts[&e.id];
    let keys = match holds {
        Some(h) if h.is_empty() => return Ok(false),
        Some(h) => Some((facts.record, h.clone())),
        None => None,
    };
    let params = statements::Held { entity: e.id, keys };
    let hold = &ctx.ready.plans[&e.id].held;
    statements::held(partition, e, &facts.casts, hold, params)
        .query_scalar()
        .fetch_one(conn)
        .await
}

enum Dropped {
    /// Dropped whole, with this many rows.
    Rows(u64),
    /// Held: these rows, the ones no hold protects, were purged in one
    /// statement; the partition stays with its held rows.
    Purged(u64),
    /// Another run dropped it first.
    Gone,
    /// Some rows of it are not due for their own tenant (see
    /// `tenants_due`): it stays, and the row path takes this tenant's.
    Kept,
    /// A partition of several tenants dropped whole, with this many rows
    /// (of every tenant, named with their counts).
    Tenants(u64, String),
    LockTimeout,
}

/// Locks, re-checks, audits, detaches and drops one partition in one
/// transaction.
///
/// The partition is first locked `EXCLUSIVE`: reads go on, but no row of
/// it can be written or locked (so no hold can be placed) until the
/// commit. The hold re-check, the count and any detail rows happen under
/// that lock, and the table-wide `ACCESS EXCLUSIVE` lock that `DETACH`
/// needs is taken only at the end, for the detach and the drop: queries on
/// the rest of the table wait for milliseconds, not for the count.
async fn drop_one(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    summary_id: i64,
    partition: &Expired,
    cutoffs: &mut TenantCutoffs,
) -> std::result::Result<Dropped, Stop> {
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED)
        .await
        .map_err(stop_from)?;
    if let Some(outcome) = lock_partition(ctx, &mut tx, work, partition).await? {
        tx.rollback().await.map_err(stop_from)?;
        return Ok(outcome);
    }
    // A tenant-scoped entity: every row of the partition must be due for
    // its own tenant before any of them goes with it (the held path below
    // purges every unheld row too).
    let tenants = if work.entity.tenant.is_some() {
        match tenants_due(ctx, &mut tx, work, partition, cutoffs).await? {
            Some(t) => Some(t),
            None => {
                tx.rollback().await.map_err(stop_from)?;
                return Ok(Dropped::Kept);
            }
        }
    } else {
        None
    };
    // The lock is held: a hold committed before it was granted is visible
    // to this new statement; any later one waits for the commit and then
    // finds no row to hold.
    let holds = active_hold_keys(&mut tx, ctx.ready, work.entity)
        .await
        .map_err(stop_from)?;
    if held(ctx, &mut tx, work, &partition.table, holds.as_ref())
        .await
        .map_err(stop_from)?
    {
        let (n, first) = purge_unheld(ctx, &mut tx, work, partition).await?;
        commit_rows(ctx, (summary_id, &work.entity.name), tx, n).await?;
        emit_details(ctx, conn, work, first).await;
        return Ok(Dropped::Purged(n.max(0) as u64));
    }
    let counted = tenants.as_ref().map(|(_, n)| *n);
    let (n, first_detail) = count_and_detail(ctx, &mut tx, work, partition, counted).await?;
    let detach = statements::detach(&work.entity.table, &partition.table).raw();
    if let Err(err) = detach.execute(&mut *tx).await {
        let outcome = not_now(&err).ok_or_else(|| stop_from(err))?;
        tx.rollback().await.map_err(stop_from)?;
        return Ok(outcome);
    }
    statements::drop(&partition.table)
        .raw()
        .execute(&mut *tx)
        .await
        .map_err(stop_from)?;
    commit_rows(ctx, (summary_id, &work.entity.name), tx, n).await?;
    emit_details(ctx, conn, work, first_detail).await;
    Ok(match tenants {
        Some((t, _)) => Dropped::Tenants(n.max(0) as u64, t),
        None => Dropped::Rows(n.max(0) as u64),
    })
}

/// The row's tenant as Cohort stores tenants (`None`: tenantless).
fn tenant_text(
    ctx: &RunCtx<'_>,
    e: &crate::domain::model::EntityDescriptor,
) -> Option<crate::base::ident::SqlText> {
    let column = e.tenant.as_deref()?;
    let ty = ctx.ready.model.facts[&e.id]
        .tenant
        .expect("tenanted entity");
    Some(crate::sql::canonical_text(column, ty))
}

/// Each tenant's cutoff for the entity, resolved once per sweep of it
/// (whatever the number of partitions), or why its rows never go with a
/// partition: not in the tenant directory, a rule that does not resolve
/// or does not purge. A tenant's own bad entry keeps the partitions that
/// hold its rows; it never fails the entity.
#[derive(Default)]
struct TenantCutoffs(BTreeMap<String, Result<DateTime<Utc>, &'static str>>);

impl TenantCutoffs {
    async fn of(
        &mut self,
        ctx: &RunCtx<'_>,
        e: &crate::domain::model::EntityDescriptor,
        tenant: &str,
    ) -> Result<DateTime<Utc>, &'static str> {
        if let Some(known) = self.0.get(tenant) {
            return *known;
        }
        let cutoff = Self::resolve(ctx, e, tenant).await;
        self.0.insert(tenant.to_owned(), cutoff);
        cutoff
    }

    async fn resolve(
        ctx: &RunCtx<'_>,
        e: &crate::domain::model::EntityDescriptor,
        tenant: &str,
    ) -> Result<DateTime<Utc>, &'static str> {
        let identity = ctx.ready.model.tenant_identity();
        let listed = ctx
            .ready
            .tenants
            .iter()
            .find(|t| identity.canonical(&t.id).as_deref() == Some(tenant))
            .ok_or("a row's tenant is not in the tenant directory")?;
        let facts = ctx
            .ready
            .tenant_facts(Some(&listed.id), None, None)
            .map_err(|_| "a tenant's directory entry does not resolve")?;
        let rule =
            super::resolve::rule_for(ctx.cx, ctx.ready, e, Some(tenant), &facts, ctx.spec.now)
                .await
                .map_err(|_| "a tenant's rule does not resolve")?;
        if rule.strategy() != Strategy::Purge {
            return Err("a tenant's rule does not purge");
        }
        rule.sweep_cutoff(ctx.spec.now)
            .map_err(|_| "a tenant's cutoff is out of range")
    }
}

/// Whether every row of a locked partition of a tenant-scoped entity is
/// due for its own tenant: each tenant present is in the tenant directory
/// (`[[tenant]]`; a row of a tenant Cohort does not sweep keeps the
/// partition), its rule for the entity purges, and the partition's upper
/// bound is at or before that rule's cutoff (so no tenant's override or
/// legal minimum keeps a row of it). `Some`: the tenants with their row
/// counts, for the run's note, and the partition's row count; `None`: it
/// stays.
async fn tenants_due(
    ctx: &RunCtx<'_>,
    tx: &mut PgConnection,
    work: &Work<'_>,
    partition: &Expired,
    cutoffs: &mut TenantCutoffs,
) -> std::result::Result<Option<(String, i64)>, Stop> {
    let e = work.entity;
    let text = tenant_text(ctx, e).expect("tenanted entity");
    let rows = statements::tenants_in(&partition.table, &text)
        .query_as::<statements::TenantRowsRow>()
        .fetch_all(&mut *tx)
        .await
        .map_err(stop_from)?;
    let mut named = Vec::with_capacity(rows.len());
    let mut total = 0;
    for r in rows {
        let (tenant, n) = (r.tenant, r.n);
        let keeps = |why: &str| {
            tracing::info!(entity = %e.name, partition = %partition.table.display_plain(), why, "partition of several tenants kept: its rows go by the row path");
        };
        let Some(tenant) = tenant else {
            keeps("a row has no tenant");
            return Ok(None);
        };
        match cutoffs.of(ctx, e, &tenant).await {
            Ok(cutoff) if partition.upper <= cutoff => {}
            Ok(_) => {
                keeps("a tenant's rule keeps some of its rows");
                return Ok(None);
            }
            Err(why) => {
                keeps(why);
                return Ok(None);
            }
        }
        named.push(format!("{tenant} ({n} rows)"));
        total += n;
    }
    Ok(Some((named.join(", "), total)))
}

/// Locks the partition against writes and locks (waiting
/// `partition_lock_timeout` at most), checks it is still this parent's
/// and wholly expired, and takes the hold gate shared. `Some`: what to
/// report instead (the lock was not granted in time, or the partition is
/// gone); the caller rolls back.
async fn lock_partition(
    ctx: &RunCtx<'_>,
    tx: &mut PgConnection,
    work: &Work<'_>,
    partition: &Expired,
) -> std::result::Result<Option<Dropped>, Stop> {
    let timeout_ms = ctx
        .cx
        .config
        .partition_lock_timeout()
        .as_millis()
        .to_string();
    statements::set_lock_timeout(format!("{timeout_ms}ms"))
        .query()
        .execute(&mut *tx)
        .await
        .map_err(stop_from)?;
    let lock = statements::lock_exclusive(&partition.table).raw();
    if let Err(err) = lock.execute(&mut *tx).await {
        return not_now(&err).map(Some).ok_or_else(|| stop_from(err));
    }
    // Still this parent's partition, still wholly expired (not detached
    // and attached again with other bounds since it was listed)? The
    // catalog read waits for a detach of another partition under way (its
    // lock on the parent), within the same time-out.
    let cutoff = work.cutoff.expect("checked by applies");
    let still = match expired_partitions(&mut *tx, &work.entity.table, cutoff).await {
        Ok(list) => list.iter().any(|p| p.table == partition.table),
        Err(err) => return not_now(&err).map(Some).ok_or_else(|| stop_from(err)),
    };
    if !still {
        return Ok(Some(Dropped::Gone));
    }
    // The hold gate, shared: a subject hold whose lock statement ran
    // before a row of this partition became the subject's has either
    // committed (and the re-check below sees it) or waits for this
    // transaction (see `locks::HOLD_GATE_CLASS`). Waiting for it longer
    // than the time-out is "not now" too, like the partition's own lock.
    let gate = ctx.ready.ledger.hold_gate().query().execute(&mut *tx).await;
    if let Err(err) = gate {
        return not_now(&err).map(Some).ok_or_else(|| stop_from(err));
    }
    Ok(None)
}

/// The detail rows the category asks for (per-row audit), or `None`.
fn partition_details(ctx: &RunCtx<'_>, work: &Work<'_>) -> Option<statements::Details> {
    let e = work.entity;
    (work.rule.audit() == AuditDetail::PerRow).then(|| statements::Details {
        run_id: ctx.run_id,
        entity: e.id,
        entity_name: e.name.clone(),
        action: Strategy::Purge.as_str(),
    })
}

/// A partition with a held row: its held rows stay, and with them the
/// partition; every other row goes in one statement, under the lock that
/// keeps new holds out. Returns how many, and the first detail row's id.
async fn purge_unheld(
    ctx: &RunCtx<'_>,
    tx: &mut PgConnection,
    work: &Work<'_>,
    partition: &Expired,
) -> std::result::Result<(i64, Option<i64>), Stop> {
    let e = work.entity;
    tracing::info!(entity = %e.name, partition = %partition.table.display_plain(), "partition holds a row under an active hold; its other rows are purged in one statement and the partition stays");
    let params = statements::PurgeUnheld {
        entity: e.id,
        details: partition_details(ctx, work),
    };
    let row = statements::purge_unheld(
        &ctx.cx.config.schema,
        &partition.table,
        &ctx.ready.model.facts[&e.id].casts.key_text(e),
        tenant_text(ctx, e).as_ref(),
        &ctx.ready.plans[&e.id].held,
        params,
    )
    .query_as::<statements::PurgedRow>()
    .fetch_one(&mut *tx)
    .await
    .map_err(stop_from)?;
    Ok((row.n, row.first))
}

/// A partition about to be dropped: its rows counted, or, under per-row
/// audit, one detail row written per row before the rows go. Returns how
/// many, and the first detail row's id.
async fn count_and_detail(
    ctx: &RunCtx<'_>,
    tx: &mut PgConnection,
    work: &Work<'_>,
    partition: &Expired,
    counted: Option<i64>,
) -> std::result::Result<(i64, Option<i64>), Stop> {
    let Some(details) = partition_details(ctx, work) else {
        // Counted already, under the same lock, tenant by tenant.
        if let Some(n) = counted {
            return Ok((n, None));
        }
        let n = statements::count(&partition.table)
            .query_scalar()
            .fetch_one(&mut *tx)
            .await
            .map_err(stop_from)?;
        return Ok((n, None));
    };
    let schema = &ctx.cx.config.schema;
    let key_text = ctx.ready.model.facts[&work.entity.id]
        .casts
        .key_text(work.entity);
    let tenant = tenant_text(ctx, work.entity);
    let row = statements::insert_details(
        schema,
        &partition.table,
        &key_text,
        tenant.as_ref(),
        details,
    )
    .query_as::<statements::PurgedRow>()
    .fetch_one(&mut *tx)
    .await
    .map_err(stop_from)?;
    Ok((row.n, row.first))
}

/// Adds `n` purged rows to the entity's summary and commits (unless the
/// run was cancelled meanwhile: then nothing of the transaction stays).
async fn commit_rows(
    ctx: &RunCtx<'_>,
    (summary_id, entity): (i64, &str),
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    n: i64,
) -> std::result::Result<(), Stop> {
    let added = crate::sql::ledger::AddAffected {
        summary_id,
        rows: n,
        marker: ctx.cdc_marker(entity, Strategy::Purge, n),
    };
    ctx.ready
        .ledger
        .add_affected(added)
        .query()
        .execute(&mut *tx)
        .await
        .map_err(stop_from)?;
    if ctx.spec.cancel.is_cancelled() {
        tx.rollback().await.map_err(stop_from)?;
        return Err(Stop::Cancelled);
    }
    tx.commit().await.map_err(stop_from)?;
    Ok(())
}

/// Errors that mean "not this partition, not now": its locks were not
/// granted in time (or waiting for them deadlocked), or another run
/// detached or dropped it since it was listed.
fn not_now(err: &sqlx::Error) -> Option<Dropped> {
    match err.as_database_error().and_then(|d| d.code()).as_deref() {
        Some("55P03" | "40P01") => Some(Dropped::LockTimeout),
        Some("42P01" | "42809") => Some(Dropped::Gone),
        _ => None,
    }
}

/// Tells observers the committed detail rows of a purged partition from
/// `first` on (none without details or observers), a batch at a time
/// (best effort, like every observer event).
async fn emit_details(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    first: Option<i64>,
) {
    let Some(first) = first.filter(|_| ctx.recorder.hears_rows()) else {
        return;
    };
    let e = work.entity;
    let mut after = first;
    loop {
        let page = statements::DetailPage {
            from_id: after,
            run_id: ctx.run_id,
            entity: e.id,
            limit: i64::from(ctx.cx.config.sweep_batch_size.first()),
        };
        let rows = statements::detail_page(&ctx.cx.config.schema, page)
            .query_as::<statements::DetailRow>()
            .fetch_all(&mut *conn)
            .await;
        let rows = match rows {
            Ok(rows) if !rows.is_empty() => rows,
            Ok(_) => return,
            Err(err) => {
                tracing::warn!(entity = %e.name, error = %err, "reading a dropped partition's detail rows for observers failed");
                return;
            }
        };
        after = rows.last().map_or(after, |r| r.row_detail_id + 1);
        let ids = rows.into_iter().map(|r| r.record_id).collect();
        ctx.recorder.rows_changed(e, Strategy::Purge, None, ids);
    }
}
