//! Legal holds: create, list, release; expiry by `expires_at`. A hold is
//! active while it is neither released nor expired, judged by the
//! database clock (not a run's logical time).
//!
//! The tenant is checked when a hold is created (only the row's own tenant
//! may hold it); from then on the hold protects the record — entity and
//! record id — whatever happens to the row: moved to another tenant, it is
//! still counted held, and left alone, by every tenant's sweep and erasure.
//!
//! Creation validates everything that would make a hold silently protect
//! nothing: the entity must be registered, the record id is parsed and
//! canonicalised with the key column's type, the tenant must own the row
//! (tenantless entities take no tenant), and the row must exist. The
//! existence check and the insert happen under a row lock on the target
//! (`FOR KEY SHARE`), which conflicts with the sweep's `FOR UPDATE`: either
//! the hold commits first and every later mutation sees it, or the hold
//! waits for the batch holding the row and then finds it gone (purged) or
//! changed.
//!
//! A subject hold relies on two more things. After locking the subject's
//! rows it takes the hold gate exclusive before its insert
//! (`locks::HOLD_GATE_CLASS`), which every batch takes shared between its
//! row locks and its re-check: a row that became the subject's after the
//! hold's lock statement is either re-checked after the hold commits or
//! changed by a batch the hold waited for. And every batch finds holds
//! written while it ran through `written_xid`, stamped by a trigger that
//! fires for every writer and is checked at startup (see `sql::sweep::fused`).

use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

use crate::context::Ready;
use crate::error::{Error, Result};
use crate::sql::ledger;

mod place;

pub(crate) use place::{create, create_journaled};

/// A request to place a hold: on one record, or on a subject (a person)
/// and everything that holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRequest {
    /// The hold's id (choose one to make creation idempotent to retry).
    pub(crate) hold_id: Uuid,
    /// What it protects.
    pub(crate) target: Target,
    /// A subject hold's kind (refused on a record hold).
    pub(crate) kind: Option<String>,
    /// Record holds: the owning tenant (`None` for tenantless entities).
    /// Subject holds: the tenant whose rows it protects (`None`: every
    /// tenant's, and the tenantless entities').
    pub(crate) tenant_id: Option<String>,
    /// Why (e.g. "Litigation hold - case #12345"). Required.
    pub(crate) reason: String,
    /// When the hold was placed (normally now).
    pub(crate) created_at: DateTime<Utc>,
    /// When it lapses by itself, if ever.
    pub(crate) expires_at: Option<DateTime<Utc>>,
}

/// What a hold request names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// One record: the retained entity's durable id and the record id as
    /// text (canonicalised with the key column's type).
    Record {
        retention_entity_id: Uuid,
        record_id: String,
    },
    /// A subject (a person's identifier, as given).
    Subject { subject: String },
}

impl HoldRequest {
    /// A hold on one record, created now, with a new id, no tenant and no
    /// expiry.
    pub fn new(
        retention_entity_id: Uuid,
        record_id: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self::on(
            Target::Record {
                retention_entity_id,
                record_id: record_id.into(),
            },
            reason.into(),
        )
    }

    /// A hold on a subject: it protects every row of every entity whose
    /// subject columns (of the hold's kind, or of none) equal `subject`,
    /// rows created later included, from sweeps, erasure, guarded deletion
    /// and partition purge, until it is released or expires. Created now,
    /// with a new id, every tenant and no expiry; name the kind with
    /// [`kind`](Self::kind) when subject columns declare kinds.
    ///
    /// ```
    /// use cohort::holds::HoldRequest;
    ///
    /// let hold = HoldRequest::subject("4b0a6c56-4b7e-4a53-9d4f-1f2d1a3c5e77", "Litigation hold - case #12345")
    ///     .kind("user")
    ///     .tenant("acme");
    /// # let _ = hold;
    /// ```
    pub fn subject(subject: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::on(
            Target::Subject {
                subject: subject.into(),
            },
            reason.into(),
        )
    }

    fn on(target: Target, reason: String) -> Self {
        Self {
            hold_id: Uuid::new_v4(),
            target,
            kind: None,
            tenant_id: None,
            reason,
            created_at: Utc::now(),
            expires_at: None,
        }
    }

    /// A subject hold's kind (`user`, `email`, ...). Refused at creation on
    /// a record hold.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Sets the owning tenant (record hold) or the tenant whose rows the
    /// hold protects (subject hold).
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant_id = Some(tenant.into());
        self
    }

    /// Sets the expiry (any offset; stored as UTC).
    pub fn expires_at<Tz: TimeZone>(mut self, at: DateTime<Tz>) -> Self {
        self.expires_at = Some(at.with_timezone(&Utc));
        self
    }

    /// Sets the hold id.
    pub fn hold_id(mut self, id: Uuid) -> Self {
        self.hold_id = id;
        self
    }

    /// Sets the creation time (any offset; stored as UTC).
    pub fn created_at<Tz: TimeZone>(mut self, at: DateTime<Tz>) -> Self {
        self.created_at = at.with_timezone(&Utc);
        self
    }
}

/// What a stored hold protects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HoldTarget {
    /// One record of one entity.
    Record,
    /// Every row holding a subject.
    Subject,
}

/// A stored hold.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Hold {
    /// Hold id.
    pub hold_id: Uuid,
    /// What it protects: a record or a subject.
    pub target: HoldTarget,
    /// Record holds: the retained entity's id.
    #[serde(rename = "entity_id")]
    pub retention_entity_id: Option<Uuid>,
    /// Record holds: the canonical record id.
    pub record_id: Option<String>,
    /// Subject holds: the subject as it was given (personal data: the
    /// console never shows it).
    pub subject: Option<String>,
    /// Subject holds: the subject's kind, when it has one.
    pub subject_kind: Option<String>,
    /// Record holds: the owning tenant. Subject holds: the tenant whose
    /// rows it protects (`None`: every tenant's).
    #[serde(rename = "tenant")]
    pub tenant_id: Option<String>,
    /// Why.
    pub reason: String,
    /// When it was placed.
    pub created_at: DateTime<Utc>,
    /// When it lapses.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was released.
    pub released_at: Option<DateTime<Utc>>,
    /// Whether it protects its rows now (database clock).
    pub active: bool,
}

impl From<ledger::HoldRow> for Hold {
    fn from(r: ledger::HoldRow) -> Self {
        Hold {
            hold_id: r.hold_id,
            target: if r.subject_text.is_some() {
                HoldTarget::Subject
            } else {
                HoldTarget::Record
            },
            retention_entity_id: r.retention_entity_id,
            record_id: r.record_id,
            subject: r.subject_text,
            subject_kind: r.subject_kind,
            tenant_id: r.tenant_id,
            reason: r.reason,
            created_at: r.created_at,
            expires_at: r.expires_at,
            released_at: r.released_at,
            active: r.active,
        }
    }
}

/// Which holds to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HoldFilter {
    /// Only this entity's holds.
    pub(crate) entity_id: Option<Uuid>,
    /// Only this tenant's holds (canonical text).
    pub(crate) tenant: Option<String>,
    /// Only holds active now.
    pub(crate) active_only: bool,
    /// At most this many (oldest first); `None`: all.
    pub(crate) limit: Option<i64>,
}

impl HoldFilter {
    /// Every hold.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only this entity's holds.
    pub fn entity(mut self, entity_id: Uuid) -> Self {
        self.entity_id = Some(entity_id);
        self
    }

    /// Only holds placed for this tenant (any spelling of its id).
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Only holds active now (database clock).
    pub fn active_only(mut self, active_only: bool) -> Self {
        self.active_only = active_only;
        self
    }

    /// At most `limit` holds (1..=10000; the oldest first). Unlimited by
    /// default.
    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = Some(limit);
        self
    }
}

/// Whether the record is held now (`as_of` `None`, database clock) or was
/// (will be) held at `as_of`.
pub(crate) async fn is_held(
    cx: &Ready<'_>,
    entity_id: Uuid,
    record_id: &str,
    as_of: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<bool> {
    let ready = cx.plans();
    let entity = ready.model.requested_entity(entity_id)?;
    let record = ready.model.facts[&entity.id].record_key(&entity.name, record_id)?;
    let plan = &ready.plans[&entity.id];
    let row = plan
        .targets
        .is_held_query(entity.id, &record, as_of)
        .fetch_one(&cx.pool)
        .await?;
    Ok(crate::sql::Targets::read_is_held(&row)?)
}

pub(crate) async fn list(cx: &Ready<'_>, filter: &HoldFilter) -> Result<Vec<Hold>> {
    if let Some(n) = filter.limit.filter(|n| !(1..=10_000).contains(n)) {
        return Err(Error::InvalidInput(format!(
            "a hold list limit must be between 1 and 10000, not {n}"
        )));
    }
    let ready = cx.plans();
    let tenant = filter.tenant.as_deref().map(|t| {
        ready
            .model
            .tenant_identity()
            .canonical(t)
            .unwrap_or_else(|| t.to_owned())
    });
    let listed = ledger::ListHolds {
        entity_id: filter.entity_id,
        tenant,
        active_only: filter.active_only,
        limit: filter.limit,
    };
    let rows = ready
        .ledger
        .list_holds(listed)
        .query_as::<ledger::HoldRow>()
        .fetch_all(&cx.pool)
        .await?;
    Ok(rows.into_iter().map(Hold::from).collect())
}

pub(crate) async fn release(cx: &Ready<'_>, hold_id: Uuid) -> Result<Hold> {
    release_journaled(cx, hold_id, true).await
}

/// Releases a hold; with `journal` (and a journal configured) the release
/// is journaled once the database has it (a release the journal misses
/// only keeps the hold after a restore).
pub(crate) async fn release_journaled(
    cx: &Ready<'_>,
    hold_id: Uuid,
    journal: bool,
) -> Result<Hold> {
    let ready = cx.plans();
    let pool = &cx.pool;
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
    let chain = (cx.config.schema.as_str(), cx.config.ledger_key.as_ref());
    let released = crate::run::chain::release_hold(&mut tx, ready, chain, hold_id).await?;
    if let Some(row) = released {
        let hold = Hold::from(row);
        tx.commit().await?;
        if let (true, Some(j), Some(at)) = (journal, &cx.journal, hold.released_at) {
            let record = crate::domain::journal::Record::HoldReleased {
                hold_id,
                released_at: at,
            };
            let appended = j.append(pool, &cx.config.schema, record).await;
            if let Err(e) = appended {
                tracing::error!(%hold_id, error = %e, "journaling a hold's release failed; after a restore the hold would stay");
                return Err(e);
            }
        }
        return Ok(hold);
    }
    drop(tx);
    let existing = ready
        .ledger
        .get_hold(hold_id)
        .query()
        .fetch_optional(pool)
        .await?;
    Err(match existing {
        Some(_) => Error::Conflict(format!("hold {hold_id} is already released")),
        None => Error::NotFound(format!("no hold with id {hold_id}")),
    })
}
