//! The background services in a host process (the library's `spawn`): a
//! failing tenant and a database outage do not stop the worker, the
//! process's own kill switch flips without a restart, and the history
//! pruner keeps what it must keep and stops on the kill switch.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::time::Duration;

use cohort::policy::TenantEntry;
use cohort::rules::{
    CategoryCapabilities, ResolutionContext, ResolveError, RetentionRule, RuleProvider,
};
use cohort::services::{
    OccurrenceOutcome, PruneRequest, PrunerConfig, ServiceEvent, Services, WorkerConfig,
};
use cohort::settings::Setting;
use cohort::{Cohort, TenantSource};
use sqlx::PgPool;
use support::*;

const FAILING: &str = "ffffffff-0000-0000-0000-00000000000f";
const PANICKING: &str = "eeeeeeee-0000-0000-0000-00000000000e";

/// The engine fixture's rules, failing for one tenant.
struct FailsForTenant;

#[cohort::async_trait]
impl RuleProvider for FailsForTenant {
    fn capabilities(&self, category: &str) -> Option<CategoryCapabilities> {
        rules().capabilities(category)
    }

    async fn resolve(&self, ctx: &ResolutionContext) -> Result<RetentionRule, ResolveError> {
        if ctx.tenant.tenant_id.as_deref() == Some(FAILING) {
            return Err(ResolveError::Provider("rules service unavailable".into()));
        }
        if ctx.tenant.tenant_id.as_deref() == Some(PANICKING) {
            panic!("a rule provider with a bug");
        }
        rules().resolve(ctx).await
    }
}

fn entry(id: &str) -> TenantEntry {
    TenantEntry::new(id)
}

async fn cohort_with(db: &cohort_pgtemp::TestDatabase, config: cohort::CohortConfig) -> Cohort {
    cohort_on(db.pool().clone(), config).await
}

async fn cohort_on(pool: PgPool, config: cohort::CohortConfig) -> Cohort {
    let mut b = Cohort::builder(pool)
        .config(config)
        .rules(FailsForTenant)
        .tenant_source(TenantSource::List(vec![
            entry(TENANT_A),
            entry(FAILING),
            entry(TENANT_B),
        ]));
    for d in engine_entities() {
        b = b.declaration(d);
    }
    b.build().await.unwrap()
}

/// (occurrence, tenant, status) of scheduled runs, in start order.
async fn scheduled(pool: &PgPool) -> Vec<(chrono::DateTime<chrono::Utc>, Option<String>, String)> {
    sqlx::query_as(
        "SELECT occurrence, tenant_id, status FROM public.sweep_run WHERE trigger = 'scheduled' ORDER BY started_at",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Occurrences after `after` with their four passes settled: `tenant`'s
/// run with `status`, every other run succeeded.
async fn settled_occurrences(
    pool: &PgPool,
    after: chrono::DateTime<chrono::Utc>,
    (tenant, status): (&str, &str),
) -> usize {
    let runs = scheduled(pool).await;
    let mut by: std::collections::BTreeMap<_, Vec<(Option<String>, String)>> = Default::default();
    for (o, t, s) in runs.into_iter().filter(|r| r.0 > after) {
        by.entry(o).or_default().push((t, s));
    }
    by.values()
        .filter(|passes| {
            passes.len() == 4
                && passes.iter().all(|(t, s)| {
                    if t.as_deref() == Some(tenant) {
                        s == status
                    } else {
                        s == "succeeded"
                    }
                })
        })
        .count()
}

/// Whether an occurrence after `after` has its four passes settled, the
/// failing tenant's run partially failed and every other run succeeded.
async fn complete_occurrences(pool: &PgPool, after: chrono::DateTime<chrono::Utc>) -> bool {
    // Every entity's rule failed: the run settles with each failure
    // recorded, and the next pass goes on.
    settled_occurrences(pool, after, (FAILING, "partially_failed")).await > 0
}

/// FAILURE-007, TENANT-001 (worker side): a tenant whose rule provider
/// errors is logged and the other tenants and the tenantless pass still
/// run, at every occurrence; a database outage during the worker's life
/// (the server stopped for three seconds, then started again) is logged
/// and the next occurrence after it succeeds. The host's task never stops.
#[tokio::test]
async fn a_failing_tenant_and_a_database_outage_do_not_stop_the_worker() {
    // A server of this test's own, to stop and start.
    let mut cluster = cohort_pgtemp::Cluster::start().await.unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(2))
        .connect(cluster.url())
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    cohort::schema::migrate(&mut conn, "public").await.unwrap();
    drop(conn);
    exec(&pool, ENGINE_TABLES).await;
    let cohort = cohort_on(pool.clone(), test_config()).await;
    let services = Services::new(&cohort)
        .unwrap()
        .worker(Some(WorkerConfig::new("* * * * * *").unwrap()))
        .spawn();
    let epoch = chrono::DateTime::<chrono::Utc>::MIN_UTC;
    wait_until("a complete occurrence", Duration::from_secs(20), || {
        complete_occurrences(&pool, epoch)
    })
    .await;
    let order: Vec<Option<String>> = scheduled(&pool)
        .await
        .into_iter()
        .take(4)
        .map(|r| r.1)
        .collect();
    assert_eq!(
        order,
        [Some(TENANT_A), Some(FAILING), Some(TENANT_B), None].map(|t| t.map(str::to_owned)),
        "tenants in order, then the tenantless pass"
    );

    // The outage: the server stops (every session cut) for three seconds.
    let down: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&pool)
        .await
        .unwrap();
    cluster.restart(Duration::from_secs(3)).await.unwrap();
    let back: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT pg_postmaster_start_time()")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(!services.is_finished(), "the worker survived the outage");
    let during = scheduled(&pool)
        .await
        .into_iter()
        .filter(|r| r.0 > down + chrono::TimeDelta::seconds(1) && r.0 < back)
        .count();
    assert_eq!(during, 0, "the occurrences of the outage really failed");
    wait_until(
        "a complete occurrence after the outage",
        Duration::from_secs(40),
        || complete_occurrences(&pool, back),
    )
    .await;
    let report = services.shutdown().await;
    assert!(report.clean(), "{report:?}");
    assert_eq!(report.stopped, ["worker", "maintenance"]);
    assert_eq!(
        advisory_locks(&pool).await,
        0,
        "no lock outlives the worker"
    );
}

/// Advisory locks held by any session of the database.
async fn advisory_locks(pool: &PgPool) -> i64 {
    count(
        pool,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .await
}

/// A pass whose user code panics (here a rule provider) fails that pass
/// only: its run is settled failed at once, the other tenants and the
/// tenantless pass run, later occurrences run, and no advisory lock is
/// left behind in the pool.
#[db_test(engine)]
async fn a_panicking_pass_fails_alone_and_leaves_no_lock_behind(db: TestDatabase) {
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(FailsForTenant)
        // Listed in other spellings: every run, also the one recorded for
        // the pass that panicked before its run existed, names the tenant
        // canonically.
        .tenant_source(TenantSource::List(vec![
            entry(&TENANT_A.to_uppercase()),
            entry(&format!("{{{}}}", PANICKING.to_uppercase())),
            entry(&format!("urn:uuid:{TENANT_B}")),
        ]));
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let cohort = b.build().await.unwrap();
    let services = Services::new(&cohort)
        .unwrap()
        .worker(Some(WorkerConfig::new("* * * * * *").unwrap()))
        .spawn();
    // Two occurrences with their four passes settled: the panicking one
    // failed (recovered), the rest succeeded.
    wait_until(
        "two complete occurrences",
        Duration::from_secs(30),
        || async {
            let epoch = chrono::DateTime::<chrono::Utc>::MIN_UTC;
            settled_occurrences(db.pool(), epoch, (PANICKING, "failed")).await >= 2
        },
    )
    .await;
    let reason: String =
        sqlx::query_scalar("SELECT error FROM public.sweep_run WHERE tenant_id = $1 LIMIT 1")
            .bind(PANICKING)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert!(reason.contains("panicked"), "{reason}");
    assert_eq!(
        count(
            db.pool(),
            &format!(
                "SELECT count(*) FROM public.sweep_run WHERE tenant_id NOT IN ('{TENANT_A}', '{TENANT_B}', '{PANICKING}')"
            )
        )
        .await,
        0,
        "every run names its tenant canonically"
    );
    let report = services.shutdown().await;
    assert!(report.clean(), "{report:?}");
    assert_eq!(advisory_locks(db.pool()).await, 0);
}

/// The process's own kill switch (configuration, flipped at run time
/// through `Cohort::switches`) stops later occurrences without a restart.
#[db_test(engine)]
async fn the_process_kill_switch_flips_without_a_restart(db: TestDatabase) {
    let cohort = cohort_with(&db, test_config()).await;
    let services = Services::new(&cohort)
        .unwrap()
        .worker(Some(WorkerConfig::new("* * * * * *").unwrap()));
    let mut events = services.subscribe();
    let services = services.spawn();
    let epoch = chrono::DateTime::<chrono::Utc>::MIN_UTC;
    wait_until("a complete occurrence", Duration::from_secs(20), || {
        complete_occurrences(db.pool(), epoch)
    })
    .await;
    cohort.switches().set(Setting::KillSwitch, true);
    let live = cohort.settings().await.unwrap();
    assert!(live.kill_switch.effective && live.kill_switch.process && !live.kill_switch.database);
    // An occurrence that starts with the switch on runs no pass (one in
    // progress may finish first), and neither does the next: nothing ran
    // in between.
    let skipped = |e: &ServiceEvent| {
        matches!(
            e,
            ServiceEvent::Occurrence {
                outcome: OccurrenceOutcome::KillSwitch { passes: 0 },
                ..
            }
        )
    };
    next_event(&mut events, Duration::from_secs(20), skipped).await;
    let before = scheduled(db.pool()).await.len();
    next_event(&mut events, Duration::from_secs(20), skipped).await;
    assert_eq!(scheduled(db.pool()).await.len(), before);
    cohort.switches().set(Setting::KillSwitch, false);
    let off = chrono::Utc::now();
    wait_until(
        "an occurrence after the switch is off",
        Duration::from_secs(20),
        || complete_occurrences(db.pool(), off - chrono::TimeDelta::seconds(1)),
    )
    .await;
    // dry_run set in the database reaches the running worker too.
    cohort.set_setting(Setting::DryRun, true).await.unwrap();
    wait_until("a dry scheduled run", Duration::from_secs(20), || async {
        count(
            db.pool(),
            "SELECT count(*) FROM public.sweep_run WHERE trigger = 'scheduled' AND dry_run AND tenant_id IS NULL AND status = 'succeeded'",
        )
        .await
            >= 1
    })
    .await;
    assert!(services.shutdown().await.clean());
}

/// Old ledger rows written the way runs write them.
const HISTORY: &str = r#"
INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, started_at, settled_at) VALUES
  ('00000000-0000-0000-0000-000000000001', 'sweep', 'manual', false, 'succeeded', now(), now() - interval '200 days', now() - interval '200 days'),
  ('00000000-0000-0000-0000-000000000002', 'sweep', 'manual', false, 'succeeded', now(), now() - interval '200 days', now() - interval '200 days'),
  ('00000000-0000-0000-0000-000000000003', 'erasure', 'manual', false, 'failed', now(), now() - interval '200 days', now() - interval '200 days'),
  ('00000000-0000-0000-0000-000000000004', 'sweep', 'manual', false, 'succeeded', now(), now() - interval '1 day', now() - interval '1 day'),
  ('00000000-0000-0000-0000-000000000005', 'sweep', 'manual', false, 'started', now(), now() - interval '200 days', NULL);
INSERT INTO public.sweep_run_entity_summary (run_id, retention_entity_id, entity_type, category, strategy, affected_count, resolved_period)
SELECT run_id, 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'Note', 'notes', 'purge', 1, interval '30 days' FROM public.sweep_run;
INSERT INTO public.sweep_run_row_detail (run_id, retention_entity_id, entity_type, record_id, action)
SELECT run_id, 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'Note', 'r-' || right(run_id::text, 1), 'purge' FROM public.sweep_run;
-- Run 1: delivered work; run 2: pending work; run 3: dead-lettered work.
INSERT INTO public.sweep_row_handler_status (row_detail_id, run_id, handler_id, phase, status)
SELECT row_detail_id, run_id, 'h', 'immediate',
       CASE right(run_id::text, 1) WHEN '1' THEN 'succeeded' WHEN '2' THEN 'pending' ELSE 'dead_lettered' END
FROM public.sweep_run_row_detail WHERE right(run_id::text, 1) IN ('1', '2', '3');
INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, reason, created_at, expires_at, released_at) VALUES
  ('10000000-0000-0000-0000-000000000001', 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'active', 'r', now() - interval '300 days', NULL, NULL),
  ('10000000-0000-0000-0000-000000000002', 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'released-long-ago', 'r', now() - interval '300 days', NULL, now() - interval '200 days'),
  ('10000000-0000-0000-0000-000000000003', 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'released-yesterday', 'r', now() - interval '300 days', NULL, now() - interval '1 day'),
  ('10000000-0000-0000-0000-000000000004', 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'expired-long-ago', 'r', now() - interval '300 days', now() - interval '200 days', NULL),
  ('10000000-0000-0000-0000-000000000005', 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'expires-later', 'r', now() - interval '300 days', now() + interval '10 days', NULL);
"#;

fn prune_config(batch: u32) -> cohort::CohortConfig {
    let mut c = test_config();
    c.prune.runs_older_than = Some(days(90));
    c.prune.inactive_holds_older_than = Some(days(90));
    c.prune.batch_size = batch;
    c
}

async fn ids(pool: &PgPool, sql: &'static str) -> Vec<String> {
    sqlx::query_scalar(sql).fetch_all(pool).await.unwrap()
}

/// RS-017: the pruner deletes old settled runs with their summaries, row
/// details and finished handler work, and holds inactive for longer than
/// the limit; it keeps recent runs, unsettled runs, any run with pending
/// handler work, recent and active holds. `--dry-run` counts only. The
/// schema itself refuses to delete queued work with its run.
#[db_test(engine)]
async fn the_pruner_keeps_pending_work_and_active_holds(db: TestDatabase) {
    exec(db.pool(), HISTORY).await;
    let config = prune_config(1);
    let cohort = cohort_with(&db, config.clone()).await;
    let pruner = PrunerConfig::from_config(&config).unwrap().unwrap();
    let dry = cohort
        .prune(PruneRequest::new(pruner.clone()).dry_run(true))
        .await
        .unwrap();
    assert_eq!((dry.runs, dry.holds, dry.runs_kept_for_handlers), (2, 2, 1));
    let runs = "SELECT right(run_id::text, 1) FROM public.sweep_run ORDER BY 1";
    let holds = "SELECT record_id FROM public.retention_hold ORDER BY 1";
    assert_eq!(
        ids(db.pool(), runs).await.len(),
        5,
        "a dry run deletes nothing"
    );
    // Queued work cannot be deleted with its run, even by hand.
    let e = sqlx::query(
        "DELETE FROM public.sweep_run WHERE run_id = '00000000-0000-0000-0000-000000000002'",
    )
    .execute(db.pool())
    .await
    .unwrap_err();
    assert!(e.to_string().contains("foreign key"), "{e}");

    let r = cohort
        .prune(PruneRequest::new(pruner.clone()))
        .await
        .unwrap();
    assert_eq!(
        (r.runs, r.summaries, r.row_details, r.handler_work, r.holds),
        (2, 2, 2, 2, 2)
    );
    // The dry run counted exactly what the real pass deleted.
    assert_eq!(
        (
            dry.runs,
            dry.summaries,
            dry.row_details,
            dry.handler_work,
            dry.holds
        ),
        (r.runs, r.summaries, r.row_details, r.handler_work, r.holds)
    );
    assert_eq!(ids(db.pool(), runs).await, ["2", "4", "5"]);
    assert_eq!(
        ids(db.pool(), holds).await,
        ["active", "expires-later", "released-yesterday"]
    );
    let pending: i64 = count(
        db.pool(),
        "SELECT count(*) FROM public.sweep_row_handler_status WHERE status = 'pending'",
    )
    .await;
    assert_eq!(pending, 1, "queued work untouched");
    // Once its work is delivered, the last old run goes too.
    exec(
        db.pool(),
        "UPDATE public.sweep_row_handler_status SET status = 'succeeded'",
    )
    .await;
    let r = cohort
        .prune(PruneRequest::new(pruner.clone()))
        .await
        .unwrap();
    assert_eq!(r.runs, 1);
    assert_eq!(ids(db.pool(), runs).await, ["4", "5"]);
}

/// RS-017, RS-023: the pruner deletes the worker's shared occurrences
/// written before the run limit, with their passes, in batches, but never
/// the newest occurrence (a replica may still be deciding about it) nor a
/// recent one; the dry run counts exactly what the pass deletes.
#[db_test(engine)]
async fn the_pruner_deletes_old_occurrences_with_their_passes_but_never_the_newest(
    db: TestDatabase,
) {
    exec(
        db.pool(),
        "INSERT INTO public.sweep_occurrence (occurrence_id, occurrence, dry_run, policy_fingerprint, passes, created_at, created_by, completed_at) VALUES
          ('00000000-0000-0000-0000-0000000000a1', '2026-01-01', false, 'fp', 2, now() - interval '200 days', 'h:1', now() - interval '200 days'),
          ('00000000-0000-0000-0000-0000000000a2', '2026-01-02', true, 'fp', 1, now() - interval '100 days', 'h:1', NULL),
          ('00000000-0000-0000-0000-0000000000a3', '2026-01-03', false, 'fp', 1, now() - interval '10 days', 'h:1', now() - interval '10 days'),
          ('00000000-0000-0000-0000-0000000000a4', '2026-01-04', false, 'fp', 1, now() - interval '100 days', 'h:1', NULL);
         INSERT INTO public.sweep_occurrence_pass (occurrence_id, pass, spec, status) VALUES
          ('00000000-0000-0000-0000-0000000000a1', 1, '{\"kind\": \"tenantless\"}', 'done'),
          ('00000000-0000-0000-0000-0000000000a1', 2, '{\"kind\": \"tenantless\"}', 'done'),
          ('00000000-0000-0000-0000-0000000000a2', 1, '{\"kind\": \"tenantless\"}', 'pending'),
          ('00000000-0000-0000-0000-0000000000a3', 1, '{\"kind\": \"tenantless\"}', 'done'),
          ('00000000-0000-0000-0000-0000000000a4', 1, '{\"kind\": \"tenantless\"}', 'claimed');",
    )
    .await;
    let config = prune_config(1);
    let cohort = cohort_with(&db, config.clone()).await;
    let pruner = PrunerConfig::from_config(&config).unwrap().unwrap();
    let occurrences =
        "SELECT right(occurrence_id::text, 2) FROM public.sweep_occurrence ORDER BY 1";
    let passes = "SELECT right(occurrence_id::text, 2) || '/' || pass FROM public.sweep_occurrence_pass ORDER BY 1";
    let dry = cohort
        .prune(PruneRequest::new(pruner.clone()).dry_run(true))
        .await
        .unwrap();
    assert_eq!(dry.occurrences, 2);
    assert_eq!(
        ids(db.pool(), occurrences).await.len(),
        4,
        "a dry run deletes nothing"
    );
    let r = cohort.prune(PruneRequest::new(pruner)).await.unwrap();
    assert_eq!(r.occurrences, dry.occurrences);
    // The two old ones went, in batches of one, with their passes; the
    // recent one and the newest (old as it is) stay with theirs.
    assert_eq!(ids(db.pool(), occurrences).await, ["a3", "a4"]);
    assert_eq!(ids(db.pool(), passes).await, ["a3/1", "a4/1"]);
}

/// Failed runs kept longer than successes: with successes pruned after 30
/// days and failures after a year, a 60-day-old success goes while
/// 60-day-old failed, partially failed and cancelled runs stay, and a
/// 400-day-old failure goes. The dry run counts exactly what the pass
/// deletes; `runs_older_than` (both limits at once) combined with either
/// is refused before anything is deleted.
#[db_test(engine)]
async fn failed_runs_are_kept_longer_than_successes(db: TestDatabase) {
    exec(
        db.pool(),
        "INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, started_at, settled_at, error) VALUES
          ('00000000-0000-0000-0000-000000000001', 'sweep', 'manual', false, 'succeeded', now(), now() - interval '60 days', now() - interval '60 days', NULL),
          ('00000000-0000-0000-0000-000000000002', 'sweep', 'manual', false, 'failed', now(), now() - interval '60 days', now() - interval '60 days', 'run: x'),
          ('00000000-0000-0000-0000-000000000003', 'sweep', 'manual', false, 'partially_failed', now(), now() - interval '60 days', now() - interval '60 days', 'entity x: y'),
          ('00000000-0000-0000-0000-000000000004', 'erasure', 'manual', false, 'cancelled', now(), now() - interval '60 days', now() - interval '60 days', NULL),
          ('00000000-0000-0000-0000-000000000005', 'sweep', 'manual', false, 'failed', now(), now() - interval '400 days', now() - interval '400 days', 'run: x'),
          ('00000000-0000-0000-0000-000000000006', 'sweep', 'manual', false, 'succeeded', now(), now() - interval '10 days', now() - interval '10 days', NULL);",
    )
    .await;
    let mut config = test_config();
    config.prune.succeeded_runs_older_than = Some(days(30));
    config.prune.failed_runs_older_than = Some("1y".parse().unwrap());
    let cohort = cohort_with(&db, config.clone()).await;
    let pruner = PrunerConfig::from_config(&config).unwrap().unwrap();
    let dry = cohort
        .prune(PruneRequest::new(pruner.clone()).dry_run(true))
        .await
        .unwrap();
    let r = cohort
        .prune(PruneRequest::new(pruner.clone()))
        .await
        .unwrap();
    assert_eq!((dry.runs, r.runs), (2, 2));
    assert!(r.succeeded_runs_before.unwrap() > r.failed_runs_before.unwrap());
    let runs = "SELECT right(run_id::text, 1) FROM public.sweep_run ORDER BY 1";
    assert_eq!(ids(db.pool(), runs).await, ["2", "3", "4", "6"]);

    // The shorthand alone sets both limits: the 60-day failures go too.
    let mut both = test_config();
    both.prune.runs_older_than = Some(days(30));
    let pruner = PrunerConfig::from_config(&both).unwrap().unwrap();
    assert_eq!(
        cohort
            .prune(PruneRequest::new(pruner.clone()))
            .await
            .unwrap()
            .runs,
        3
    );
    assert_eq!(ids(db.pool(), runs).await, ["6"]);

    // Combined with a specific limit it is refused: nothing is built.
    both.prune.failed_runs_older_than = Some(days(400));
    let e = PrunerConfig::from_config(&both).unwrap_err();
    assert!(
        e.to_string().contains("replace it with the two of them"),
        "{e}"
    );
    assert!(Cohort::builder(db.pool().clone())
        .config(both)
        .rules(rules())
        .build()
        .await
        .is_err());
    assert_eq!(ids(db.pool(), runs).await, ["6"]);
}

/// RS-017: the background pruner stops after its batch when the kill
/// switch turns on, and does not start while it is on.
#[db_test(engine)]
async fn the_background_pruner_stops_on_the_kill_switch(db: TestDatabase) {
    exec(
        db.pool(),
        "INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, started_at, settled_at)
         SELECT gen_random_uuid(), 'sweep', 'manual', false, 'succeeded', now(), now() - interval '200 days', now() - interval '200 days'
         FROM generate_series(1, 3000)",
    )
    .await;
    let total = "SELECT count(*) FROM public.sweep_run";
    let cohort = cohort_with(&db, prune_config(1)).await;
    cohort.set_setting(Setting::KillSwitch, true).await.unwrap();
    let services = Services::new(&cohort).unwrap().worker(None);
    let mut events = services.subscribe();
    let services = services.spawn();
    let pass = |e: &ServiceEvent| matches!(e, ServiceEvent::PrunerPass(_));
    let ServiceEvent::PrunerPass(first) =
        next_event(&mut events, Duration::from_secs(20), pass).await
    else {
        unreachable!()
    };
    assert!(first.stopped && first.runs == 0, "{first:?}");
    assert_eq!(count(db.pool(), total).await, 3000, "no pruning while on");
    assert!(services.shutdown().await.clean());

    cohort
        .set_setting(Setting::KillSwitch, false)
        .await
        .unwrap();
    let services = Services::new(&cohort).unwrap().worker(None);
    let mut events = services.subscribe();
    let services = services.spawn();
    wait_until("pruning under way", Duration::from_secs(20), || async {
        count(db.pool(), total).await < 2990
    })
    .await;
    cohort.set_setting(Setting::KillSwitch, true).await.unwrap();
    // The pass stops after at most the batch in progress: it ends, stopped,
    // with rows left, and nothing is deleted after it ended.
    let ServiceEvent::PrunerPass(ended) =
        next_event(&mut events, Duration::from_secs(20), pass).await
    else {
        unreachable!()
    };
    assert!(ended.stopped, "{ended:?}");
    let stopped = count(db.pool(), total).await;
    assert!(stopped > 0, "the switch landed mid-pass");
    assert_eq!(
        stopped,
        3000 - ended.runs as i64,
        "pruning stopped where the pass said"
    );
    assert!(services.shutdown().await.clean());
}

/// A pass whose user code panics in the middle of its run (here a custom
/// anonymiser, called on the locked rows): the open batch is rolled back
/// by the server, the run left started is settled failed at once, and no
/// advisory lock (the run's or the occurrence's) is left in the pool.
#[tokio::test]
async fn a_pass_that_panics_mid_run_is_settled_failed_and_rolled_back() {
    use cohort::model::{AnonymiseMethod, CustomAnonymiser};
    let db = engine_db().await;
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules())
        .tenant_source(TenantSource::List(vec![entry(TENANT_A)]))
        .declaration(
            cohort::EntityDeclaration::new("Contact", CONTACT_ID)
                .category("contacts")
                .anchor("created_at")
                .table("app.contacts")
                .anonymise(
                    "email",
                    AnonymiseMethod::Custom(CustomAnonymiser::new::<Option<String>, _, _>(
                        "boom",
                        |_: &Option<String>| -> Option<String> {
                            panic!("an anonymiser with a bug")
                        },
                    )),
                ),
        )
        .build()
        .await
        .unwrap();
    let services = Services::new(&cohort)
        .unwrap()
        .worker(Some(WorkerConfig::new("* * * * * *").unwrap()))
        .try_spawn()
        .unwrap();
    wait_until("a failed scheduled run", Duration::from_secs(20), || async {
        count(
            db.pool(),
            "SELECT count(*) FROM public.sweep_run WHERE trigger = 'scheduled' AND status = 'failed' AND error LIKE '%panicked before it settled%'",
        )
        .await
            >= 1
    })
    .await;
    let report = services.shutdown().await;
    assert!(report.clean(), "{report:?}");
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.contacts WHERE anonymised_at IS NOT NULL OR email IS NULL"
        )
        .await,
        0,
        "the batch was rolled back"
    );
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM public.sweep_run WHERE status = 'started'"
        )
        .await,
        0
    );
    assert_eq!(advisory_locks(db.pool()).await, 0);
}

/// Runs left `started` by processes that died (every kind), handler work
/// of entities without handlers, and old captured payloads, written the
/// way runs write them; one recent example of each, which must stay.
const ABANDONED: &str = r#"
INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, started_at) VALUES
  ('00000000-0000-0000-0000-0000000000a1', 'sweep', 'manual', false, 'started', now(), now() - interval '2 hours'),
  ('00000000-0000-0000-0000-0000000000a2', 'erasure', 'manual', false, 'started', now(), now() - interval '2 hours'),
  ('00000000-0000-0000-0000-0000000000a3', 'sweep', 'scheduled', false, 'started', now(), now() - interval '2 hours'),
  ('00000000-0000-0000-0000-0000000000a4', 'erasure', 'manual', false, 'started', now(), now() - interval '10 minutes'),
  ('00000000-0000-0000-0000-0000000000a5', 'sweep', 'manual', false, 'started', now(), now() - interval '2 hours'),
  ('00000000-0000-0000-0000-0000000000b1', 'sweep', 'manual', false, 'started', now(), now() - interval '40 days');
UPDATE public.sweep_run SET status = 'succeeded', settled_at = started_at + interval '1 second'
WHERE run_id = '00000000-0000-0000-0000-0000000000b1';
INSERT INTO public.sweep_run_row_detail (run_id, retention_entity_id, entity_type, record_id, action)
SELECT '00000000-0000-0000-0000-0000000000b1', 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'Note', 'r' || g, 'purge'
FROM generate_series(1, 4) g;
-- r1: work of a handler nobody registers, queued 2 hours ago; r2: the
-- same, queued a minute ago; r3: delivered long ago, payload kept 40 days;
-- r4: delivered, payload from yesterday.
INSERT INTO public.sweep_row_handler_status (row_detail_id, run_id, handler_id, phase, status, captured_payload, created_at)
SELECT row_detail_id, run_id, 'crm-forget', 'immediate',
       CASE record_id WHEN 'r1' THEN 'pending' WHEN 'r2' THEN 'pending' ELSE 'succeeded' END,
       '{"email": "person@example.com"}'::jsonb,
       now() - CASE record_id WHEN 'r1' THEN interval '2 hours' WHEN 'r2' THEN interval '1 minute'
                              WHEN 'r3' THEN interval '40 days' ELSE interval '1 day' END
FROM public.sweep_run_row_detail;
"#;

/// FAILURE-007, RS-010: the maintenance service runs with no handlers, no
/// schedule and no pruner: every kind of run left `started` past
/// `settle_timeout` with a free run lock is settled failed (a live run's
/// lock keeps it), work no registered handler can deliver is dead-lettered
/// with the reason once it has waited `settle_timeout`, and payloads past
/// `payload_retention` are scrubbed.
#[db_test(engine)]
async fn maintenance_settles_lost_runs_dead_letters_orphaned_work_and_scrubs_without_handlers(
    db: TestDatabase,
) {
    exec(db.pool(), ABANDONED).await;
    let cohort = cohort_with(&db, test_config()).await;
    // A live run (a5): its process holds the run lock.
    let mut holder = db.pool().acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtextextended('cohort.run:00000000-0000-0000-0000-0000000000a5', 0))")
        .execute(&mut *holder)
        .await
        .unwrap();
    let config = cohort::services::MaintenanceConfig::from_config(&test_config()).unwrap();
    let report = cohort.maintain(&config).await.unwrap();
    assert_eq!(report.recovered_runs, 3, "{report:?}");
    assert_eq!(report.orphaned_work, 1, "{report:?}");
    assert_eq!(report.scrubbed, 1, "{report:?}");
    let status = |id: &'static str| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT status FROM public.sweep_run WHERE run_id = $1::uuid",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    for old in [
        "00000000-0000-0000-0000-0000000000a1",
        "00000000-0000-0000-0000-0000000000a2",
        "00000000-0000-0000-0000-0000000000a3",
    ] {
        assert_eq!(status(old).await, "failed", "{old}");
    }
    assert_eq!(
        status("00000000-0000-0000-0000-0000000000a4").await,
        "started",
        "recent"
    );
    assert_eq!(
        status("00000000-0000-0000-0000-0000000000a5").await,
        "started",
        "live"
    );
    let work: Vec<(String, String, Option<String>, bool)> = sqlx::query_as(
        "SELECT d.record_id, h.status, h.last_error, h.captured_payload IS NOT NULL \
         FROM public.sweep_row_handler_status h JOIN public.sweep_run_row_detail d USING (row_detail_id) ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(work[0].1, "dead_lettered");
    assert!(work[0]
        .2
        .as_deref()
        .unwrap()
        .contains("no handler of this name is registered"));
    assert_eq!(work[1].1, "pending", "queued a minute ago: not yet");
    assert!(!work[2].3, "40-day-old payload scrubbed");
    assert!(work[3].3, "yesterday's payload kept");
    // Old work of a handler a live peer registers stays pending.
    exec(
        db.pool(),
        &format!(
            "INSERT INTO public.retention_peer (peer_id, host, pid, policy_fingerprint, handlers) \
             VALUES (gen_random_uuid(), 'peer', 4321, 'feedfeedfeedfeed', '{{\"{NOTE_ID}\": [\"crm-forget\"]}}'); \
             UPDATE public.sweep_row_handler_status SET created_at = now() - interval '3 hours' \
             WHERE status = 'pending'"
        ),
    )
    .await;
    // A second pass finds nothing more while the live run lives; once its
    // process is gone, it is settled too.
    let again = cohort.maintain(&config).await.unwrap();
    assert_eq!(again, cohort::services::MaintenanceReport::default());
    sqlx::query("SELECT pg_advisory_unlock(hashtextextended('cohort.run:00000000-0000-0000-0000-0000000000a5', 0))")
        .execute(&mut *holder)
        .await
        .unwrap();
    let after = cohort.maintain(&config).await.unwrap();
    assert_eq!(after.recovered_runs, 1);
}

/// FAILURE-007: the services a host spawns with no schedule, no handlers
/// and no pruner still include maintenance, which settles a lost run.
#[db_test(engine)]
async fn the_maintenance_service_always_runs(db: TestDatabase) {
    exec(db.pool(), ABANDONED).await;
    let cohort = cohort_with(&db, test_config()).await;
    let services = Services::new(&cohort)
        .unwrap()
        .worker(None)
        .pruner(None)
        .dispatcher(false);
    assert_eq!(services.names(), ["maintenance"]);
    let handle = services.try_spawn().unwrap();
    wait_until("lost runs settled", Duration::from_secs(20), || async {
        count(
            db.pool(),
            "SELECT count(*) FROM public.sweep_run WHERE status = 'failed' AND error LIKE 'run: recovered%'",
        )
        .await
            == 4
    })
    .await;
    assert!(handle.shutdown().await.clean());
}

/// Work that must wait for an earlier handler's work of its row
/// (`requires_earlier`) can never run once that earlier handler is gone
/// from every live process: maintenance dead-letters the earlier work as
/// orphaned, then the work behind it, naming the earlier handler (it
/// stayed pending for good, and `retry --all` could not help). Work of the
/// same handler with nothing earlier in its way stays pending.
#[db_test(engine)]
async fn work_behind_a_removed_handlers_work_is_dead_lettered_with_the_reason(db: TestDatabase) {
    exec(
        db.pool(),
        &format!(
            "INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, started_at, settled_at)
             VALUES ('00000000-0000-0000-0000-0000000000c1', 'sweep', 'manual', false, 'succeeded', now(),
                     now() - interval '3 hours', now() - interval '3 hours');
             INSERT INTO public.sweep_run_row_detail (run_id, retention_entity_id, entity_type, record_id, action)
             SELECT '00000000-0000-0000-0000-0000000000c1', '{NOTE_ID}', 'Note', r, 'purge' FROM unnest(ARRAY['r1', 'r2']) r;
             INSERT INTO public.sweep_row_handler_status
               (row_detail_id, run_id, handler_id, priority, phase, status, requires_earlier, created_at)
             SELECT d.row_detail_id, d.run_id, w.handler, w.priority, 'immediate', 'pending', w.requires, now() - interval '2 hours'
             FROM public.sweep_run_row_detail d
             JOIN (VALUES ('r1', 'gone', 1, false), ('r1', 'later', 2, true), ('r2', 'later', 2, true))
               AS w(record, handler, priority, requires) ON w.record = d.record_id;
             INSERT INTO public.retention_peer (peer_id, host, pid, policy_fingerprint, handlers)
             VALUES (gen_random_uuid(), 'peer', 4321, 'feedfeedfeedfeed', '{{\"{NOTE_ID}\": [\"later\"]}}');"
        ),
    )
    .await;
    let cohort = cohort_with(&db, test_config()).await;
    let config = cohort::services::MaintenanceConfig::from_config(&test_config()).unwrap();
    let report = cohort.maintain(&config).await.unwrap();
    assert_eq!(report.orphaned_work, 2, "{report:?}");
    let work: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT d.record_id, h.handler_id, h.status, h.last_error \
         FROM public.sweep_row_handler_status h JOIN public.sweep_run_row_detail d USING (row_detail_id) \
         ORDER BY 1, h.priority",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        work.iter()
            .map(|w| (w.0.as_str(), w.1.as_str(), w.2.as_str()))
            .collect::<Vec<_>>(),
        [
            ("r1", "gone", "dead_lettered"),
            ("r1", "later", "dead_lettered"),
            ("r2", "later", "pending"),
        ]
    );
    assert!(work[0]
        .3
        .as_deref()
        .unwrap()
        .contains("no handler of this name is registered"));
    assert!(
        work[1]
            .3
            .as_deref()
            .unwrap()
            .contains("it requires the earlier handler gone's work for its row"),
        "{:?}",
        work[1].3
    );
    // Nothing more on a second pass.
    assert_eq!(cohort.maintain(&config).await.unwrap().orphaned_work, 0);
}
