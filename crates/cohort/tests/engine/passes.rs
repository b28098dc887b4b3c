//! Sweeping every tenant (TENANT-001): first-seen order with one pass per
//! tenant however its id is spelled, a failing pass that does not stop the
//! rest (also one that fails before its run exists), one tenantless pass at
//! the end only when there are tenantless entities, and cancellation that
//! stops later passes.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::sync::{Arc, Mutex};

use cohort::policy::TenantEntry;
use cohort::rules::{
    CategoryCapabilities, ResolutionContext, ResolveError, RetentionRule, RuleProvider,
};
use cohort::{
    Cancel, Cohort, Error, ErrorKind, PassOutcome, RunStatus, SweepAllRequest, TenantSource,
};
use support::*;

fn entry(id: &str, jurisdiction: Option<&str>) -> TenantEntry {
    let entry = TenantEntry::new(id);
    match jurisdiction {
        Some(j) => entry.jurisdiction(j),
        None => entry,
    }
}

/// The engine fixture's rules, recording every tenant resolved and
/// cancelling `cancel` when it resolves for `cancel_at`.
struct Recording {
    inner: cohort::rules::StaticRuleProvider,
    seen: Arc<Mutex<Vec<Option<String>>>>,
    cancel_at: Option<(String, Cancel)>,
}

#[cohort::async_trait]
impl RuleProvider for Recording {
    fn capabilities(&self, category: &str) -> Option<CategoryCapabilities> {
        self.inner.capabilities(category)
    }

    async fn resolve(&self, ctx: &ResolutionContext) -> Result<RetentionRule, ResolveError> {
        {
            let mut seen = self.seen.lock().unwrap();
            if seen.last() != Some(&ctx.tenant.tenant_id) {
                seen.push(ctx.tenant.tenant_id.clone());
            }
        }
        if let Some((t, cancel)) = &self.cancel_at {
            if ctx.tenant.tenant_id.as_deref() == Some(t.as_str()) {
                cancel.cancel();
            }
        }
        self.inner.resolve(ctx).await
    }
}

async fn cohort_with(
    db: &cohort_pgtemp::TestDatabase,
    seen: Arc<Mutex<Vec<Option<String>>>>,
    cancel_at: Option<(String, Cancel)>,
) -> Cohort {
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(Recording {
            inner: rules(),
            seen,
            cancel_at,
        });
    for d in engine_entities() {
        b = b.declaration(d);
    }
    b.build().await.unwrap()
}

#[db_test(engine)]
async fn every_tenant_once_in_first_seen_order_then_the_tenantless_pass(db: TestDatabase) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let cohort = cohort_with(&db, seen.clone(), None).await;
    let list = vec![
        entry(&TENANT_B.to_uppercase(), Some("EU")),
        entry("not-a-uuid", None),
        entry(TENANT_A, None),
        // Tenant B again, spelled differently, with another jurisdiction.
        entry(&TENANT_B.replace('-', ""), Some("US")),
        entry(&format!("{{{TENANT_A}}}"), None),
    ];
    let result = cohort
        .sweep_all(SweepAllRequest::new(TenantSource::List(list), now()))
        .await
        .unwrap();
    assert_eq!(result.passes.len(), 4, "B, the bad id, A, tenantless");
    let tenants: Vec<(Option<String>, Option<u64>)> = result
        .passes
        .iter()
        .map(|p| match p {
            PassOutcome::Ran(r) => (r.tenant.clone(), None),
            PassOutcome::NotStarted(f) => (f.tenant.clone(), f.position),
            _ => unreachable!(),
        })
        .collect();
    // The bad entry is named by its position (its value is never shown).
    assert_eq!(
        tenants,
        vec![
            (Some(TENANT_B.to_string()), None),
            (None, Some(2)),
            (Some(TENANT_A.to_string()), None),
            (None, None)
        ]
    );
    // The bad tenant failed before its run existed and did not stop the rest.
    let failed: Vec<_> = result.not_started().collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].kind, ErrorKind::InvalidInput);
    assert!(
        failed[0].error.contains("not a valid tenant id"),
        "{failed:?}"
    );
    assert!(!failed[0].error.contains("not-a-uuid"), "{failed:?}");
    assert!(result.runs().all(|r| r.status == RunStatus::Succeeded));
    assert_eq!(
        result.conflicting_duplicates,
        vec![TENANT_B.replace('-', "")]
    );
    // Passes ran one after another, in that order.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![Some(TENANT_B.to_string()), Some(TENANT_A.to_string()), None]
    );
    let runs: Vec<_> = result.runs().collect();
    assert!(runs[0].settled_at <= Some(runs[1].started_at));
    assert!(runs[1].settled_at <= Some(runs[2].started_at));
    // Three runs in the ledger: nothing for the pass that never started.
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM public.sweep_run").await,
        3
    );
}

#[db_test(engine)]
async fn cancellation_stops_the_open_pass_and_skips_the_rest(db: TestDatabase) {
    let cancel = Cancel::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let cohort = cohort_with(
        &db,
        seen.clone(),
        Some((TENANT_B.to_string(), cancel.clone())),
    )
    .await;
    let list = vec![
        entry(TENANT_A, None),
        entry(TENANT_B, None),
        entry(OTHER_ID, None),
    ];
    let result = cohort
        .sweep_all(SweepAllRequest::new(TenantSource::List(list), now()).cancellation(cancel))
        .await
        .unwrap();
    let statuses: Vec<RunStatus> = result.runs().map(|r| r.status).collect();
    assert_eq!(statuses, vec![RunStatus::Succeeded, RunStatus::Cancelled]);
    assert_eq!(result.passes.len(), 2, "no pass after the cancellation");
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.notes WHERE tenant_id = 'bbbbbbbb-0000-0000-0000-00000000000b'"
        )
        .await,
        6,
        "the cancelled pass changed nothing"
    );
}

#[db_test(engine)]
async fn no_tenants_at_all_fails_loudly_and_the_tenantless_pass_still_runs(db: TestDatabase) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let cohort = cohort_with(&db, seen, None).await;
    let result = cohort
        .sweep_all(SweepAllRequest::new(TenantSource::Directory, now()))
        .await
        .unwrap();
    let failures: Vec<_> = result.not_started().collect();
    assert_eq!(failures.len(), 1, "{result:?}");
    assert!(
        failures[0].error.contains("no tenants to sweep"),
        "{result:?}"
    );
    assert_eq!(failures[0].kind, cohort::ErrorKind::InvalidInput);
    // The tenantless pass ran (the Global entity), and only it.
    let runs: Vec<_> = result.runs().collect();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].tenant, None);
    assert_eq!(runs[0].status, RunStatus::Succeeded);
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM public.sweep_run").await,
        1
    );

    // Only tenant-scoped entities: the tenants' passes and no tenantless run.
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules())
        .tenant(TENANT_A, None);
    for d in engine_entities()
        .into_iter()
        .filter(|d| d.name() != "Global")
    {
        b = b.declaration(d);
    }
    let cohort = b.build().await.unwrap();
    let result = cohort
        .sweep_all(SweepAllRequest::new(TenantSource::Directory, now()))
        .await
        .unwrap();
    assert_eq!(result.passes.len(), 1);
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM public.sweep_run WHERE tenant_id IS NULL"
        )
        .await,
        1,
        "no tenantless run beyond the first one"
    );

    // A tenants query of the wrong shape is bad input, before any run.
    let bad = cohort
        .sweep_all(SweepAllRequest::new(
            TenantSource::Query("SELECT 1, 2, 3, 4".into()),
            now(),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(&bad, Error::InvalidInput(m) if m.contains("one to three columns")),
        "{bad}"
    );
    // Ids in the column's own type, with or without a jurisdiction.
    let ok = cohort
        .sweep_all(SweepAllRequest::new(
            TenantSource::Query(format!("SELECT '{TENANT_A}'::uuid")),
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(ok.runs().count(), 1);
}

/// RS-026: a tenants query whose rows cannot all be tenants (NULL ids, ids
/// of another type, a jurisdiction that is not text): each bad row is a
/// pass that did not start, named by position; the others and the
/// tenantless pass run.
#[db_test(engine)]
async fn a_row_that_cannot_be_a_tenant_fails_only_itself(db: TestDatabase) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let cohort = cohort_with(&db, seen, None).await;
    let query = format!(
        "SELECT t, j FROM (VALUES ('{TENANT_A}', 'UK'), (NULL, 'UK'), ('x-not-a-tenant', NULL), ('{TENANT_B}', NULL), ('{}', 'UK')) v(t, j)",
        TENANT_A.to_uppercase()
    );
    let found = cohort
        .tenants(&TenantSource::Query(query.clone()))
        .await
        .unwrap();
    assert_eq!(found.rows, 5);
    assert_eq!(
        found.tenants.len(),
        2,
        "the upper-case spelling is the same tenant"
    );
    let positions: Vec<u64> = found.unusable.iter().map(|u| u.position).collect();
    assert_eq!(positions, [2, 3]);
    assert!(found
        .unusable
        .iter()
        .all(|u| !u.reason.contains("x-not-a-tenant")));
    let result = cohort
        .sweep_all(SweepAllRequest::new(TenantSource::Query(query), now()))
        .await
        .unwrap();
    let ran: Vec<Option<&str>> = result.runs().map(|r| r.tenant.as_deref()).collect();
    assert_eq!(ran, [Some(TENANT_A), Some(TENANT_B), None]);
    assert!(result.runs().all(|r| r.status == RunStatus::Succeeded));
    let failed: Vec<(Option<u64>, &str)> = result
        .not_started()
        .map(|f| (f.position, f.error.as_str()))
        .collect();
    assert_eq!(failed.len(), 2);
    assert_eq!(failed[0].0, Some(2));
    assert!(failed[0].1.contains("NULL"), "{failed:?}");
    assert_eq!(failed[1].0, Some(3));

    // A jurisdiction column that is not text fails every row, never the
    // tenantless pass.
    let result = cohort
        .sweep_all(SweepAllRequest::new(
            TenantSource::Query(format!("SELECT '{TENANT_A}', 42")),
            now(),
        ))
        .await
        .unwrap();
    let failure = result.not_started().next().unwrap();
    assert!(failure.error.contains("jurisdiction"), "{failure:?}");
    assert!(failure.error.contains("int4"), "{failure:?}");
    let ran: Vec<Option<&str>> = result.runs().map(|r| r.tenant.as_deref()).collect();
    assert_eq!(ran, [None], "the tenantless pass ran");
}
