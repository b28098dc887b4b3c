//! Erasure's work: the subject's rows per entity, with the statements
//! built for the subject columns that apply.

use super::executor::execute;
use super::resolve::{check_now, pass_of, rule_for, PassScope};
use super::work::{RunSpec, Work};
use super::{failure, EntityFailure, ErasureResult, NotReached, RunKind, Trigger};
use crate::context::{Context, Prepared, Ready};
use crate::domain::erasure::ErasureRequest;
use crate::domain::model::EntityDescriptor;
use crate::domain::rules::{RetentionRule, Strategy};
use crate::domain::tenants::TenantFacts;
use crate::error::{Error, Result};
use crate::sql::{ErasurePlan, KeyValue, Scope};
use chrono::{DateTime, Utc};

pub(crate) async fn erase(cx: &Ready<'_>, req: ErasureRequest) -> Result<ErasureResult> {
    let ready = cx.plans();
    check_now(cx, req.now, !req.dry_run, req.allow_future_now).await?;
    let (pass, tenant_facts) = pass_of(ready, &req.tenancy)?;
    if !req.dry_run {
        if let Some(refused) =
            crate::validate::hash_key_missing(&cx.config, pass.entities.iter().copied())
        {
            return Err(refused);
        }
    }
    let scope = &req.scope;
    check_scope(ready, scope)?;

    let mut not_reached = outside_tenancy(ready, &pass, scope);
    let mut works = Vec::new();
    for e in &pass.entities {
        match subject_columns(ready, e, scope) {
            Ok(columns) if columns.is_empty() => {}
            Ok(columns) => {
                works.push(entity_work(cx, ready, e, &req, &pass, &tenant_facts, columns).await?)
            }
            Err(why) => not_reached.push(why),
        }
    }
    // No entity has a column that can hold the subject.
    if works.is_empty() {
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
    let run = execute(
        cx,
        RunSpec {
            kind: RunKind::Erasure,
            trigger: Trigger::Manual,
            dry_run: req.dry_run,
            tenant: pass.tenant,
            now: req.now,
            cancel: req.cancel,
            occurrence: None,
            erasure_kind: scope.kind.clone(),
        },
        works,
    )
    .await?;
    Ok(ErasureResult {
        run,
        not_reached,
        request: None,
    })
}

/// Whether a subject column holds the request's kind of subject: one of
/// its kind, or one that declares no kind (it holds the subject whatever
/// its kind).
fn reaches(
    s: &crate::domain::model::SubjectColumn,
    scope: &crate::domain::erasure::ErasureScope,
) -> bool {
    crate::validate::requests::reaches(s, scope.kind.as_deref())
}

/// Whether the entity holds the request's kind of subject.
fn in_request(e: &EntityDescriptor, scope: &crate::domain::erasure::ErasureScope) -> bool {
    e.subjects.iter().any(|s| reaches(s, scope))
}

/// Entities holding the subject's kind of data that this request cannot
/// reach for its tenancy: reported, never passed over in silence.
fn outside_tenancy(
    ready: &Prepared,
    pass: &PassScope<'_>,
    scope: &crate::domain::erasure::ErasureScope,
) -> Vec<NotReached> {
    ready
        .model
        .ordered()
        .filter(|e| in_request(e, scope) && e.tenant.is_some() != pass.tenant.is_some())
        .map(|e| NotReached {
            entity_id: e.id,
            entity: e.name.clone(),
            reason: if e.tenant.is_none() {
                "tenantless: a tenant's erasure does not reach it; erase the subject's tenantless rows with a tenantless request (ErasureRequest::tenantless, `cohort erase --tenantless`)".into()
            } else {
                "tenant-scoped: a tenantless erasure does not reach it; erase the subject in each tenant (ErasureRequest::tenanted, `cohort erase --tenant T`)".into()
            },
        })
        .collect()
}

/// The subject columns of `e` this request reaches and whose type the
/// subject parses as, with the subject in each column's type (empty: the
/// entity holds no such column). An entity whose columns of the kind all
/// refuse the subject's format is not reached, and says why.
fn subject_columns(
    ready: &Prepared,
    e: &EntityDescriptor,
    scope: &crate::domain::erasure::ErasureScope,
) -> std::result::Result<Vec<(String, KeyValue)>, NotReached> {
    let facts = &ready.model.facts[&e.id];
    let columns: Vec<(String, KeyValue)> = e
        .subjects
        .iter()
        .filter(|s| reaches(s, scope))
        .filter_map(|s| {
            let ty = facts.subjects[&s.column];
            ty.parse(&scope.subject).ok().map(|v| (s.column.clone(), v))
        })
        .collect();
    if !columns.is_empty() || !in_request(e, scope) {
        return Ok(columns);
    }
    Err(NotReached {
        entity_id: e.id,
        entity: e.name.clone(),
        reason: format!(
            "the subject is not a valid value for its subject column(s) ({}), so no row can match",
            e.subjects
                .iter()
                .filter(|s| reaches(s, scope))
                .map(|s| s.column.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// One entity's work for the erasure: its rule (the final stage, or the
/// one the request names), refused outright when it soft-deletes without
/// leave or names a stage the category lacks (nothing is written); the
/// entity fails alone when its rule cannot be resolved or a `{tenant}`
/// literal does not fit. `columns`: the subject columns the request
/// reaches, with the subject in each column's type.
async fn entity_work<'a>(
    cx: &Context,
    ready: &'a Prepared,
    e: &'a EntityDescriptor,
    req: &ErasureRequest,
    pass: &PassScope<'a>,
    tenant_facts: &TenantFacts,
    columns: Vec<(String, KeyValue)>,
) -> Result<std::result::Result<Work<'a>, EntityFailure>> {
    let facts = &ready.model.facts[&e.id];
    let batch = i64::from(cx.config.sweep_batch_size.first());
    let rule = match rule_for(cx, ready, e, pass.tenant.as_deref(), tenant_facts, req.now).await {
        Ok(rule) => rule,
        Err(d) => return Ok(Err(failure(e.id, &e.name, &d))),
    };
    let (rule, cutoff) = erasure_rule(e, rule, &req.scope, req.now)?;
    let strategy = rule.strategy();
    if let Err(d) = super::sweep::literal_fits(ready, e, strategy, pass.keys.get(&e.id)) {
        return Ok(Err(failure(e.id, &e.name, &d)));
    }
    let subject_columns: Vec<String> = columns.iter().map(|(c, _)| c.clone()).collect();
    let scope = Scope::Erasure {
        tenant: pass.keys.get(&e.id).cloned(),
        cutoff,
        subject: columns.into_iter().map(|(_, v)| v).collect(),
    };
    let statements = ErasurePlan::build(
        e,
        &ready.plans[&e.id],
        strategy,
        &facts.casts,
        &subject_columns,
        cutoff.is_some(),
    );
    Ok(Ok(Work {
        entity: e,
        stage: None,
        cutoff,
        period_cutoff: None,
        statements: std::sync::Arc::new(statements.into_statements()),
        parallelism: 1,
        scope,
        // An erasure's batches keep the first size.
        batch_size: batch,
        auto_batch: false,
        literals: super::sweep::render_literals(
            &ready.plans[&e.id],
            e,
            req.now,
            pass.tenant.as_deref(),
        ),
        rule,
    }))
}

/// The rule an erasure applies to an entity, and its legal minimum's
/// cutoff: the final stage of a category in stages, or the stage the
/// request names; refused when it soft-deletes without leave; an
/// archiving entity's rule deletes.
fn erasure_rule(
    e: &EntityDescriptor,
    rule: RetentionRule,
    scope: &crate::domain::erasure::ErasureScope,
    now: DateTime<Utc>,
) -> Result<(RetentionRule, Option<DateTime<Utc>>)> {
    // A category in stages is erased the way its last stage leaves a
    // row, or the stage the request names.
    let rule = match scope.stage {
        None => rule.final_stage(),
        Some(n) => rule.stage(usize::from(n)).ok_or_else(|| {
            Error::InvalidInput(format!(
                "stage {n}: category {:?} of {} has {} stage(s)",
                e.category,
                e.name,
                rule.later_stages().len() + 1
            ))
        })?,
    };
    if rule.strategy() == Strategy::SoftDelete && !scope.allow_soft_delete {
        return Err(Error::Refused(format!(
            "{} soft-deletes (category {:?}); erasure by soft delete must be allowed explicitly (allow_soft_delete / --allow-soft-delete)",
            e.name, e.category
        )));
    }
    let cutoff = rule
        .erasure_cutoff(now)
        .map_err(|err| Error::InvalidInput(format!("{}: {err}", e.name)))?;
    // An erasure deletes an archiving entity's rows of the subject: it
    // never copies a person's rows into the archive on their request
    // (copies archived earlier are reached through the archive table's
    // own entity, which validation requires when they keep a subject).
    let rule = if rule.strategy() == Strategy::Archive {
        rule.with_strategy(Strategy::Purge)
    } else {
        rule
    };
    Ok((rule, cutoff))
}

/// The request's subject and kind: a subject is given; a kind, when
/// given, is not empty; with kinds on either side, the subject's kind is
/// one the subject columns declare. (Without kinds, a subject no column
/// can hold is reported per entity: the pass decides which entities count.)
fn check_scope(ready: &Prepared, scope: &crate::domain::erasure::ErasureScope) -> Result<()> {
    if scope.subject.trim().is_empty() {
        return Err(Error::InvalidInput("an erasure needs a subject".into()));
    }
    if scope.kind.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err(Error::InvalidInput(
            "an erasure kind must not be empty".into(),
        ));
    }
    let kinds_declared = ready
        .model
        .entities
        .iter()
        .any(|e| e.subjects.iter().any(|s| s.kind.is_some()));
    if kinds_declared || scope.kind.is_some() {
        ready.model.check_subject(
            &scope.subject,
            scope.kind.as_deref(),
            "ErasureScope::kind, `cohort erase --kind KIND`",
        )?;
    }

    Ok(())
}
