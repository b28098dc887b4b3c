//! Guarded deletion: the application's own deletes, made safe against
//! legal holds.
//!
//! Give the entity, the tenant and every record id about to be deleted.
//! Cohort canonicalises the ids, opens its own transaction, locks the target
//! rows `FOR UPDATE` in key order (the lock that conflicts with hold
//! creation's `FOR KEY SHARE` and with the sweep's batches), then checks for
//! active holds in a new statement. If any target is held, the transaction
//! is rolled back and [`Guarded::Protected`] names the held ids; the
//! callback is not called. Otherwise the callback runs on the same
//! transaction: success commits, an error rolls back and is returned as
//! [`Error::Callback`]. A hold created concurrently either commits first
//! (and the deletion is refused) or waits for the deletion to commit (and
//! then finds the row gone).
//!
//! An application that already has its own transaction open uses
//! [`crate::Cohort::guard_deletion`] instead: the same locks and check, in
//! that transaction, and the application deletes and commits.

use std::future::Future;
use std::pin::Pin;

use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection};
use uuid::Uuid;

use crate::base::ident::SqlText;
use crate::context::Ready;
use crate::error::{Error, Result};
use crate::sql::{bind_array, KeyType, KeyValue, LockedRow, RecordRow};

/// The error type callbacks return.
pub type CallbackError = Box<dyn std::error::Error + Send + Sync>;

/// The future a callback returns, borrowing Cohort's transaction.
pub type CallbackFuture<'c, T> =
    Pin<Box<dyn Future<Output = std::result::Result<T, CallbackError>> + Send + 'c>>;

/// What the application is about to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardedDeletion {
    /// The retained entity's durable id.
    pub(crate) entity_id: Uuid,
    /// The tenant owning every target (`None` for tenantless entities).
    pub(crate) tenant: Option<String>,
    /// Every record id about to be deleted.
    pub(crate) record_ids: Vec<String>,
}

impl GuardedDeletion {
    /// A deletion of `record_ids` of the entity.
    pub fn new(entity_id: Uuid, record_ids: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            entity_id,
            tenant: None,
            record_ids: record_ids.into_iter().map(Into::into).collect(),
        }
    }

    /// Sets the owning tenant.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }
}

/// The outcome of a guarded deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Guarded<T> {
    /// No target was held; the callback ran and its transaction committed.
    Completed(T),
    /// Some targets are held (canonical ids); nothing ran, nothing changed.
    Protected {
        /// The held record ids.
        held: Vec<String>,
    },
}

pub(crate) async fn delete<T, F>(
    cx: &Ready<'_>,
    req: GuardedDeletion,
    callback: F,
) -> Result<Guarded<T>>
where
    F: for<'c> FnOnce(&'c mut PgConnection) -> CallbackFuture<'c, T>,
{
    let target = Target::resolve(cx, &req).await?;
    let mut conn = cx.pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
    let held = match lock_and_check(&target, &mut SqlxSession(&mut tx)).await {
        Ok(held) => held,
        Err(e) => {
            let _ = tx.rollback().await;
            return Err(e);
        }
    };
    if !held.is_empty() {
        tx.rollback().await?;
        return Ok(Guarded::Protected { held });
    }
    match callback(&mut tx).await {
        Ok(value) => {
            tx.commit().await?;
            Ok(Guarded::Completed(value))
        }
        Err(e) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::warn!(error = %rollback, "rolling back after a failed guarded-deletion callback failed");
            }
            Err(Error::Callback(e))
        }
    }
}

/// The guard for a deletion in the caller's own transaction: the same
/// locks and hold check, on the caller's connection. Refused unless the
/// transaction is READ COMMITTED: under REPEATABLE READ or SERIALIZABLE the
/// hold check would read the transaction's first snapshot and could miss a
/// hold committed while the lock waited.
pub(crate) async fn guard_in(
    cx: &Ready<'_>,
    tx: &mut PgConnection,
    req: GuardedDeletion,
) -> Result<Guarded<()>> {
    guard_on(cx, &mut SqlxSession(tx), req).await
}

/// [`guard_in`] on any session (sqlx, or SeaORM's transaction).
pub(crate) async fn guard_on(
    cx: &Ready<'_>,
    session: &mut dyn GuardSession,
    req: GuardedDeletion,
) -> Result<Guarded<()>> {
    let target = Target::resolve(cx, &req).await?;
    let isolation = session.isolation().await?;
    if isolation != "read committed" {
        return Err(Error::Refused(format!(
            "guarding a deletion needs a READ COMMITTED transaction, not {isolation}: under it the \
             hold check could miss a hold committed while the rows' locks were awaited"
        )));
    }
    let held = lock_and_check(&target, session).await?;
    Ok(if held.is_empty() {
        Guarded::Completed(())
    } else {
        Guarded::Protected { held }
    })
}

/// The three statements of a guard, on whatever connection the caller's
/// transaction lives on.
#[async_trait::async_trait]
pub(crate) trait GuardSession: Send {
    /// `current_setting('transaction_isolation')`.
    async fn isolation(&mut self) -> Result<String>;
    /// Runs the entity's `guard_lock` with the keys bound as one typed
    /// array; returns (record, tenant) text per locked row.
    async fn lock(
        &mut self,
        sql: &SqlText,
        key_type: KeyType,
        keys: &[KeyValue],
    ) -> Result<Vec<(String, Option<String>)>>;
    /// Runs a statement without parameters or rows (the hold gate).
    async fn execute(&mut self, sql: &str) -> Result<()>;
    /// Runs the entity's `guard_held` (entity id, then the keys as one
    /// typed array): the held ones among the locked targets, as text.
    async fn held(
        &mut self,
        sql: &SqlText,
        entity: Uuid,
        key_type: KeyType,
        keys: &[KeyValue],
    ) -> Result<Vec<String>>;
}

/// A sqlx connection (inside a transaction).
pub(crate) struct SqlxSession<'c>(pub(crate) &'c mut PgConnection);

#[async_trait::async_trait]
impl GuardSession for SqlxSession<'_> {
    async fn isolation(&mut self) -> Result<String> {
        Ok(sqlx::query_scalar(crate::sql::ISOLATION_LEVEL)
            .fetch_one(&mut *self.0)
            .await?)
    }

    async fn lock(
        &mut self,
        sql: &SqlText,
        key_type: KeyType,
        keys: &[KeyValue],
    ) -> Result<Vec<(String, Option<String>)>> {
        let rows = bind_array(sqlx::query(sql.sql()), key_type, keys)
            .try_map(|r: PgRow| LockedRow::from_row(&r))
            .fetch_all(&mut *self.0)
            .await?;
        Ok(rows.into_iter().map(|r| (r.record, r.tenant)).collect())
    }

    async fn execute(&mut self, sql: &str) -> Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn held(
        &mut self,
        sql: &SqlText,
        entity: Uuid,
        key_type: KeyType,
        keys: &[KeyValue],
    ) -> Result<Vec<String>> {
        let rows = bind_array(sqlx::query(sql.sql()).bind(entity), key_type, keys)
            .try_map(|r: PgRow| RecordRow::from_row(&r))
            .fetch_all(&mut *self.0)
            .await?;
        Ok(rows.into_iter().map(|r| r.record).collect())
    }
}

/// A checked request: its entity's plan and facts, canonical keys and tenant.
struct Target {
    ready: std::sync::Arc<crate::context::Prepared>,
    entity_id: Uuid,
    keys: Vec<KeyValue>,
    tenant: Option<String>,
}

impl Target {
    /// Everything that can be checked without the database rows.
    async fn resolve(cx: &Ready<'_>, req: &GuardedDeletion) -> Result<Self> {
        let ready = cx.plans();
        let entity = ready.model.requested_entity(req.entity_id)?;
        let facts = &ready.model.facts[&entity.id];
        if req.record_ids.is_empty() {
            return Err(Error::InvalidInput(
                "a guarded deletion needs at least one record id".into(),
            ));
        }
        let mut keys: Vec<KeyValue> = req
            .record_ids
            .iter()
            .map(|r| facts.record_key(&entity.name, r))
            .collect::<Result<_>>()?;
        keys.sort();
        keys.dedup();
        let tenant = facts.request_tenant(&entity.name, req.tenant.as_deref())?;
        let entity_id = entity.id;
        Ok(Target {
            ready: std::sync::Arc::clone(ready),
            entity_id,
            keys,
            tenant,
        })
    }
}

/// Locks the target rows `FOR UPDATE` in key order, checks they exist and
/// belong to the tenant, then (a new statement, after the locks: it sees
/// every hold committed before them) returns the held ones: under a hold
/// on the record or on a subject the row holds.
async fn lock_and_check(target: &Target, session: &mut dyn GuardSession) -> Result<Vec<String>> {
    let ready = &target.ready;
    let entity = ready
        .model
        .entity(target.entity_id)
        .expect("resolved against this model");
    let facts = &ready.model.facts[&entity.id];
    let plan = &ready.plans[&entity.id];
    let rows = session
        .lock(&plan.targets.guard_lock, facts.record, &target.keys)
        .await?;
    let mut found_canonical = Vec::with_capacity(rows.len());
    for (record, owner) in rows {
        let owner = facts.canonical_owner(owner);
        if owner != target.tenant {
            return Err(Error::InvalidInput(format!(
                "record {record} of {} does not belong to tenant {}",
                entity.name,
                target.tenant.as_deref().unwrap_or("(none)")
            )));
        }
        found_canonical.push(facts.record.canonical_text(&record).unwrap_or_default());
    }
    let missing: Vec<String> = target
        .keys
        .iter()
        .map(KeyValue::canonical)
        .filter(|k| !found_canonical.contains(k))
        .collect();
    if !missing.is_empty() {
        return Err(Error::NotFound(format!(
            "records of {} do not exist: {}",
            entity.name,
            missing.join(", ")
        )));
    }
    // The hold gate, shared, between the locks and the re-check: a subject
    // hold being placed has committed (the re-check sees it) or waits for
    // this transaction (see `locks::HOLD_GATE_CLASS`).
    session.execute(ready.ledger.hold_gate().text()).await?;
    session
        .held(
            &plan.targets.guard_held,
            entity.id,
            facts.record,
            &target.keys,
        )
        .await
}
