//! Class E of the operations review (RS-024): replicas whose policies
//! differ never drop work silently. A real second process (services on
//! their own handle) registers its handlers with a heartbeat; a sweep by a
//! handle that lacks one of them leaves that entity alone, and sweeps it
//! again once the peer is gone.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::time::Duration;

use cohort::services::Services;
use cohort::{Cohort, SweepRequest};
use support::*;

fn policy(handlers: &str) -> String {
    format!(
        r#"
[[entity]]
name = "Note"
id = "{NOTE_ID}"
table = "app.notes"
category = "notes"
anchor = "created_at"

{handlers}

[[entity]]
name = "Global"
id = "{GLOBAL_ID}"
table = "app.globals"
category = "notes"
anchor = "created_at"
tenantless = true

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
"#
    )
}

async fn handle(db: &cohort_pgtemp::TestDatabase, handlers: &str) -> Cohort {
    let p = cohort::policy::PolicyFile::parse(&policy(handlers)).unwrap();
    Cohort::builder(db.pool().clone())
        .policy(p)
        .build()
        .await
        .unwrap()
}

async fn wait_for_peers(cohort: &Cohort, n: usize) {
    wait_until(&format!("{n} peers"), Duration::from_secs(20), async || {
        cohort.peers().await.unwrap().len() == n
    })
    .await;
}

const NOTES_A: &str =
    "SELECT count(*) FROM app.notes WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a'";

/// RS-024: the rolling deploy. The new replica (handler `crm-forget` on
/// notes) is running; the old one (no handler) sweeps: notes are left
/// alone with a clear failure (a dry run is not held back), while the new
/// replica sweeps them with their handler work. Once the new replica
/// stops, the old one sweeps notes again.
#[db_test(engine)]
async fn a_sweep_leaves_alone_an_entity_for_which_a_live_peer_has_a_handler_it_lacks(
    db: TestDatabase,
) {
    let new = handle(
        &db,
        "[[entity.handler]]\nname = \"crm-forget\"\ncommand = [\"true\"]",
    )
    .await;
    let old = handle(&db, "").await;
    let services = Services::new(&new)
        .unwrap()
        .worker(None)
        .pruner(None)
        .dispatcher(false)
        .try_spawn()
        .unwrap();
    wait_for_peers(&old, 1).await;
    let peers = old.peers().await.unwrap();
    assert!(!peers[0].same_policy, "the two policies differ");
    assert_eq!(
        peers[0].handlers[&NOTE_ID.parse::<uuid::Uuid>().unwrap()],
        ["crm-forget".to_string()].into()
    );
    assert!(new.peers().await.unwrap()[0].same_policy);

    let notes_before = table_digest(db.pool(), "app.notes").await;
    let result = old
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.status, cohort::RunStatus::PartiallyFailed);
    assert_eq!(result.failures.len(), 1);
    assert_eq!(result.failures[0].entity, "Note");
    assert!(
        result.failures[0].error.contains("handler_missing_here"),
        "{:?}",
        result.failures
    );
    assert_eq!(
        table_digest(db.pool(), "app.notes").await,
        notes_before,
        "no note touched"
    );
    // A dry run changes nothing anyway and is not refused.
    let dry = old
        .sweep(SweepRequest::tenanted(TENANT_A, now()).dry_run(true))
        .await
        .unwrap();
    assert!(dry.failures.is_empty(), "{:?}", dry.failures);
    // The replica with the handler sweeps notes, queuing its work.
    let swept = new
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(swept.failures.is_empty(), "{:?}", swept.failures);
    assert_eq!(swept.affected(), 3);
    let queued = count(
        db.pool(),
        "SELECT count(*) FROM public.sweep_row_handler_status WHERE handler_id = 'crm-forget'",
    )
    .await;
    assert_eq!(queued, 3, "every purged note has its crm-forget work");

    // The new replica stops (its record goes): the old one is no longer held back.
    assert!(services.shutdown().await.clean());
    assert!(old.peers().await.unwrap().is_empty());
    factory::notes(TENANT_A)
        .body("late")
        .insert(db.pool())
        .await;
    let before = count(db.pool(), NOTES_A).await;
    let result = old
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(result.failures.is_empty(), "{:?}", result.failures);
    assert_eq!(count(db.pool(), NOTES_A).await, before - 1);
}

/// RS-024: a peer whose heartbeat is older than the timeout (it died
/// without removing its record) holds nobody back.
#[db_test(engine)]
async fn a_dead_peer_holds_nobody_back(db: TestDatabase) {
    let old = handle(&db, "").await;
    exec(
        db.pool(),
        &format!(
            "INSERT INTO public.retention_peer (peer_id, host, pid, policy_fingerprint, handlers, heartbeat_at) \
             VALUES (gen_random_uuid(), 'gone', 1234, 'feedfeedfeedfeed', '{{\"{NOTE_ID}\": [\"crm-forget\"]}}', now() - interval '2 minutes')"
        ),
    )
    .await;
    assert!(old.peers().await.unwrap().is_empty());
    let result = old
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(result.failures.is_empty(), "{:?}", result.failures);
    assert_eq!(result.affected(), 3);
    // The same record, alive, holds the sweep back.
    exec(
        db.pool(),
        "UPDATE public.retention_peer SET heartbeat_at = now()",
    )
    .await;
    factory::notes(TENANT_A)
        .body("late")
        .insert(db.pool())
        .await;
    let result = old
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.failures.len(), 1, "{result:?}");
}

/// RS-024 (dispatcher side): a dispatcher lacking a handler that a live
/// peer registers for the same entity never claims that handler's work
/// (so it never dead-letters it as unknown); it delivers its own. Once the
/// peer is gone, such work is unknown everywhere and dead-letters.
#[db_test(engine)]
async fn a_dispatcher_leaves_a_live_peer_s_handler_work_alone(db: TestDatabase) {
    let both = "[[entity.handler]]\nname = \"audit\"\ncommand = [\"true\"]\n\n\
                [[entity.handler]]\nname = \"crm-forget\"\ncommand = [\"true\"]";
    let new = handle(&db, both).await;
    let old = handle(
        &db,
        "[[entity.handler]]\nname = \"audit\"\ncommand = [\"true\"]",
    )
    .await;
    let services = Services::new(&new)
        .unwrap()
        .worker(None)
        .pruner(None)
        .dispatcher(false)
        .try_spawn()
        .unwrap();
    wait_for_peers(&old, 1).await;
    let swept = new
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(swept.affected(), 3);
    let report = old.dispatcher().flush().await.unwrap();
    assert_eq!(
        (report.delivered, report.dead_lettered),
        (3, 0),
        "{report:?}"
    );
    let pending = "SELECT count(*) FROM public.sweep_row_handler_status WHERE handler_id = 'crm-forget' AND status = 'pending'";
    assert_eq!(
        count(db.pool(), pending).await,
        3,
        "the peer's work waits for the peer"
    );
    assert!(services.shutdown().await.clean());
    let report = old.dispatcher().flush().await.unwrap();
    assert_eq!(report.dead_lettered, 3, "{report:?}");
}
