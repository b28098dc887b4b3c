//! Right to erasure: one data subject's rows, on request.
//!
//! Rows match when any of the entity's subject columns (narrowed by the
//! scope's kind, if given) equals the subject exactly, in the tenant, with
//! no active hold, and — only when the rule has a positive legal minimum —
//! an anchor strictly before `now - legal_min` (NULL anchors are then
//! blocked and counted). The ordinary period never delays erasure. The
//! entity's own strategy is applied: purge deletes, anonymise scrubs, soft
//! delete only when the scope opts in (otherwise the request is refused
//! before anything is written). The result accounts for every entity with
//! subject columns for the request: affected, held, kept by the legal
//! minimum, NULL anchor, kept by policy (`exempt`), or not reached and why
//! ([`crate::SweepResult::not_reached`]).
//!
//! Candidates are locked with `FOR UPDATE` (erasure waits for rows other
//! transactions hold, rather than skipping them); a row whose subject or
//! tenant changed while we waited no longer matches, and the mutation
//! statement re-checks subject, tenant, hold, legal minimum and anchor once
//! more. Runs, batches, audit and failure isolation are those of a sweep.

use chrono::{DateTime, FixedOffset, Utc};
use tokio_util::sync::CancellationToken;

use crate::cohort::Cohort;
use crate::engine::{execute, rule_for, tenant_keys, Arg, RunSpec, Work};
use crate::error::{Error, Result};
use crate::rules::Strategy;
use crate::run::{failure, NotReached, RunKind, SweepResult, Trigger};
use crate::sql::plan::ErasurePlan;
use crate::sql::KeyValue;

/// Whose data to erase, and how far the request reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErasureScope {
    subject: String,
    kind: Option<String>,
    allow_soft_delete: bool,
}

impl ErasureScope {
    /// Every subject column matching `subject` exactly (uuid, integer or
    /// text, compared in each column's own type).
    pub fn new(subject: impl Into<String>) -> Self {
        Self {
            subject: subject.into(),
            kind: None,
            allow_soft_delete: false,
        }
    }

    /// Only subject columns declared with this kind (e.g. `user`).
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Accept soft deletion as erasure for categories that soft-delete.
    pub fn allow_soft_delete(mut self, allow: bool) -> Self {
        self.allow_soft_delete = allow;
        self
    }
}

/// An erasure request for one tenant (or the tenantless entities).
#[derive(Debug, Clone)]
pub struct ErasureRequest {
    tenant: Option<String>,
    jurisdiction: Option<String>,
    scope: ErasureScope,
    now: DateTime<Utc>,
    dry_run: bool,
    cancel: CancellationToken,
}

impl ErasureRequest {
    /// Erases the subject's rows of `tenant`'s tenant-scoped entities.
    pub fn tenanted(
        tenant: impl Into<String>,
        scope: ErasureScope,
        now: DateTime<FixedOffset>,
    ) -> Self {
        Self::new(Some(tenant.into()), scope, now)
    }

    /// Erases the subject's rows of the tenantless entities.
    pub fn tenantless(scope: ErasureScope, now: DateTime<FixedOffset>) -> Self {
        Self::new(None, scope, now)
    }

    fn new(tenant: Option<String>, scope: ErasureScope, now: DateTime<FixedOffset>) -> Self {
        Self {
            tenant,
            jurisdiction: None,
            scope,
            now: now.with_timezone(&Utc),
            dry_run: false,
            cancel: CancellationToken::new(),
        }
    }

    /// Counts what would be erased and writes the audit trail, changing no row.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// The tenant's jurisdiction, passed to the rule provider (overrides by
    /// jurisdiction can raise the legal minimum or change the strategy).
    pub fn jurisdiction(mut self, jurisdiction: impl Into<String>) -> Self {
        self.jurisdiction = Some(jurisdiction.into());
        self
    }

    /// Cancellation, as for sweeps.
    pub fn cancellation(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }
}

pub(crate) async fn erase(cohort: &Cohort, req: ErasureRequest) -> Result<SweepResult> {
    let ready = cohort.prepared().await?;
    let pass = tenant_keys(&ready, req.tenant.as_deref())?;
    let jurisdiction = ready.jurisdiction(pass.tenant.as_deref(), req.jurisdiction.as_deref())?;
    let scope = &req.scope;
    if scope.subject.trim().is_empty() {
        return Err(Error::InvalidInput("an erasure needs a subject".into()));
    }
    if scope.kind.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err(Error::InvalidInput(
            "an erasure kind must not be empty".into(),
        ));
    }
    let batch = i64::from(cohort.inner().config.sweep_batch_size);

    let mut works = Vec::new();
    let mut any_column = false;
    let in_request = |e: &crate::model::EntityDescriptor| {
        e.subjects
            .iter()
            .any(|s| scope.kind.is_none() || s.kind == scope.kind)
    };
    // Entities holding the subject's kind of data that this request cannot
    // reach are reported, never passed over in silence.
    let mut not_reached: Vec<NotReached> = ready
        .model
        .ordered()
        .filter(|e| in_request(e) && e.tenant.is_some() != pass.tenant.is_some())
        .map(|e| NotReached {
            entity_id: e.id,
            entity: e.name.clone(),
            reason: if e.tenant.is_none() {
                "tenantless: a tenant's erasure does not reach it; erase the subject's tenantless rows with a tenantless request (ErasureRequest::tenantless, `cohort erase --tenantless`)".into()
            } else {
                "tenant-scoped: a tenantless erasure does not reach it; erase the subject in each tenant (ErasureRequest::tenanted, `cohort erase --tenant T`)".into()
            },
        })
        .collect();
    for e in &pass.entities {
        let facts = &ready.model.facts[&e.id];
        // The subject columns this request reaches, with the subject in each column's type.
        let columns: Vec<(String, KeyValue)> = e
            .subjects
            .iter()
            .filter(|s| scope.kind.is_none() || s.kind == scope.kind)
            .filter_map(|s| {
                let ty = facts.subjects[&s.column];
                ty.parse(&scope.subject).ok().map(|v| (s.column.clone(), v))
            })
            .collect();
        if columns.is_empty() {
            if in_request(e) {
                not_reached.push(NotReached {
                    entity_id: e.id,
                    entity: e.name.clone(),
                    reason: format!(
                        "the subject is not a valid value for its subject column(s) ({}), so no row can match",
                        e.subjects
                            .iter()
                            .filter(|s| scope.kind.is_none() || s.kind == scope.kind)
                            .map(|s| s.column.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
            continue;
        }
        any_column = true;
        let rule = match rule_for(
            cohort,
            &ready,
            e,
            pass.tenant.as_deref(),
            jurisdiction.as_deref(),
            req.now,
        )
        .await
        {
            Ok(rule) => rule,
            Err(d) => {
                works.push(Err(failure(e.id, &e.name, &d)));
                continue;
            }
        };
        if rule.strategy() == Strategy::SoftDelete && !scope.allow_soft_delete {
            return Err(Error::InvalidInput(format!(
                "{} soft-deletes (category {:?}); erasure by soft delete must be allowed explicitly (allow_soft_delete / --allow-soft-delete)",
                e.name, e.category
            )));
        }
        let cutoff = rule
            .erasure_cutoff(req.now)
            .map_err(|err| Error::InvalidInput(format!("{}: {err}", e.name)))?;
        let strategy = rule.strategy();
        let subject_columns: Vec<String> = columns.iter().map(|(c, _)| c.clone()).collect();
        let mut values: Vec<Arg> = Vec::new();
        if let Some(t) = pass.keys.get(&e.id) {
            values.push(Arg::Key(t.clone()));
        }
        if let Some(c) = cutoff {
            values.push(Arg::Time(c));
        }
        values.extend(columns.into_iter().map(|(_, v)| Arg::Key(v)));
        let statements = ErasurePlan::build(
            e,
            &ready.plans[&e.id],
            strategy,
            &facts.casts,
            &subject_columns,
            cutoff.is_some(),
            &cohort.config().schema,
        );
        let mut lock_args = vec![Arg::Int8(batch)];
        lock_args.extend(values.iter().cloned());
        works.push(Ok(Work {
            entity: e,
            cutoff,
            lock: statements.lock,
            count_args: lock_args.clone(),
            lock_args,
            mutate: statements.mutate,
            mutate_args: values,
            counts: statements.counts,
            rule,
        }));
    }
    if !any_column {
        return Err(Error::InvalidInput(format!(
            "no erasure-subject column{} can hold the subject {}",
            scope
                .kind
                .as_deref()
                .map(|k| format!(" of kind {k:?}"))
                .unwrap_or_default(),
            "(check its format against the subject columns' types)"
        )));
    }
    let mut result = execute(
        cohort,
        &ready,
        RunSpec {
            kind: RunKind::Erasure,
            trigger: Trigger::Manual,
            dry_run: req.dry_run,
            tenant: pass.tenant,
            now: req.now,
            cancel: req.cancel,
        },
        works,
    )
    .await?;
    result.not_reached = not_reached;
    Ok(result)
}
