//! Cohort runs with a least-privilege role: no superuser, no DDL rights,
//! only the grants docs/migrations.md documents (*Minimal grants*).

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::holds::HoldRequest;
use cohort::{Cohort, RunStatus, SweepRequest};
use support::*;

#[db_test(engine)]
async fn a_least_privilege_role_can_validate_sweep_hold_and_erase(db: TestDatabase) {
    let role = format!("cohort_app_{}", &db.name()[db.name().len() - 12..]);
    // The documented grants (docs/migrations.md), nothing more.
    exec(
        db.pool(),
        &format!(
            "CREATE ROLE {role} LOGIN PASSWORD 'app-secret' NOSUPERUSER NOCREATEDB NOCREATEROLE;
         REVOKE CREATE ON SCHEMA public FROM PUBLIC;
         GRANT USAGE ON SCHEMA public, app TO {role};
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
         GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA app TO {role};"
        ),
    )
    .await;
    let pool = pool_as(&db, &role, "app-secret", 3).await;
    let superuser: bool =
        sqlx::query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(!superuser);
    // No DDL at runtime: the role could not even create a table.
    assert!(sqlx::query("CREATE TABLE public.nope (id int)")
        .execute(&pool)
        .await
        .is_err());

    let cohort = engine_cohort_on(pool.clone(), test_config()).await;
    let note: uuid::Uuid = sqlx::query_scalar("SELECT id FROM app.notes WHERE body = $1")
        .bind(format!("{TENANT_A}:45d"))
        .fetch_one(&pool)
        .await
        .unwrap();
    cohort
        .create_hold(
            HoldRequest::new(
                uuid::Uuid::parse_str(NOTE_ID).unwrap(),
                note.to_string(),
                "least privilege",
            )
            .tenant(TENANT_A),
        )
        .await
        .unwrap();
    let sweep = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(sweep.status, RunStatus::Succeeded, "{sweep:?}");
    assert_eq!(
        (
            sweep.entity("Note").unwrap().affected,
            sweep.entity("Note").unwrap().held
        ),
        (2, 1)
    );
    let erase = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_B,
            ErasureScope::new("cccccccc-0000-0000-0000-00000000000c"),
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(erase.status, RunStatus::Succeeded);
    assert_eq!(
        erase.entity("Contact").unwrap().affected,
        6,
        "every tenant-B contact carries that subject"
    );
    assert_eq!(cohort.list_runs(10).await.unwrap().len(), 2);
    // Roles are cluster-wide: leave none behind on a shared server.
    pool.close().await;
    exec(
        db.pool(),
        &format!("DROP OWNED BY {role}; DROP ROLE {role};"),
    )
    .await;
}

/// RS-006 for the background services and the console: with the documented
/// grants every part's check passes and the services start and stop; a
/// read-only role may run the console but nothing that writes, and a role
/// missing one grant is told exactly which, before anything starts.
#[tokio::test]
async fn every_part_checks_its_grants_before_it_starts() {
    use cohort::services::{Access, PrunerConfig, Services, WorkerConfig};
    let db = engine_db().await;
    let suffix = &db.name()[db.name().len() - 12..];
    let (full, reader, nodelete) = (
        format!("cohort_full_{suffix}"),
        format!("cohort_read_{suffix}"),
        format!("cohort_nodel_{suffix}"),
    );
    exec(
        db.pool(),
        &format!(
            "CREATE ROLE {full} LOGIN PASSWORD 'pw' NOSUPERUSER;
             CREATE ROLE {reader} LOGIN PASSWORD 'pw' NOSUPERUSER;
             CREATE ROLE {nodelete} LOGIN PASSWORD 'pw' NOSUPERUSER;
             GRANT USAGE ON SCHEMA public, app TO {full}, {reader}, {nodelete};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {full}, {nodelete};
             GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA app TO {full};
             GRANT SELECT ON ALL TABLES IN SCHEMA public, app TO {reader};
             GRANT SELECT, UPDATE ON ALL TABLES IN SCHEMA app TO {nodelete};"
        ),
    )
    .await;
    let handle = |role: String| {
        let db = &db;
        async move {
            let pool = pool_as(db, &role, "pw", 6).await;
            let config = cohort::CohortConfig {
                prune: cohort::config::PruneConfig {
                    runs_older_than: Some("400d".parse().unwrap()),
                    ..Default::default()
                },
                ..test_config()
            };
            engine_cohort_on(pool, config).await
        }
    };
    let services = |cohort: &Cohort| {
        Services::new(cohort)
            .unwrap()
            .worker(Some(WorkerConfig::new("0 0 3 * * *").unwrap()))
            .dispatcher(true)
            .pruner(PrunerConfig::from_config(cohort.config()).unwrap())
    };

    // The documented grants: everything passes; the services start and stop.
    let cohort = handle(full.clone()).await;
    cohort
        .check_grants(&[
            Access::Runs,
            Access::Dispatcher,
            Access::Pruner,
            Access::Console,
        ])
        .await
        .unwrap();
    // The live settings: read and set with the same grants.
    cohort
        .set_setting(cohort::settings::Setting::KillSwitch, true)
        .await
        .unwrap();
    assert!(cohort.settings().await.unwrap().kill_switch.effective);
    cohort
        .set_setting(cohort::settings::Setting::KillSwitch, false)
        .await
        .unwrap();
    let s = services(&cohort);
    s.check_grants().await.unwrap();
    let report = s.try_spawn().unwrap().shutdown().await;
    assert!(report.clean(), "{report:?}");

    // Read-only: the console, nothing else; every missing grant is listed.
    let cohort = handle(reader.clone()).await;
    cohort.check_grants(&[Access::Console]).await.unwrap();
    // It reads the live settings; setting one is refused by the server.
    assert!(!cohort.settings().await.unwrap().kill_switch.effective);
    let refused = cohort
        .set_setting(cohort::settings::Setting::KillSwitch, true)
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("permission denied"),
        "{refused}"
    );
    let e = services(&cohort).check_grants().await.unwrap_err();
    let text = e.to_string();
    assert!(e.kind().is_bad_input(), "{e}");
    for expected in [
        "lacks",
        "GRANT INSERT ON public.sweep_run is missing (needed by sweeps and erasure)",
        "GRANT DELETE ON app.notes is missing (needed by purge of Note",
        "GRANT UPDATE ON app.tickets is missing (needed by soft_delete of Ticket",
        "GRANT UPDATE ON public.sweep_row_handler_status is missing (needed by the dispatcher; the maintenance service)",
        "GRANT DELETE ON public.sweep_run is missing (needed by the pruner)",
    ] {
        assert!(text.contains(expected), "{expected:?} not in:\n{text}");
    }
    assert!(!text.contains("GRANT SELECT"), "{text}");

    // One grant short: named alone.
    let cohort = handle(nodelete.clone()).await;
    let e = cohort.check_grants(&[Access::Runs]).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("GRANT DELETE ON app.notes is missing"),
        "{text}"
    );
    assert!(
        text.contains("GRANT DELETE ON app.globals is missing"),
        "{text}"
    );
    assert!(!text.contains("UPDATE ON"), "{text}");
    assert_eq!(
        ledger_rows(db.pool(), "public").await,
        0,
        "a check wrote something"
    );

    exec(
        db.pool(),
        &format!(
            "DROP OWNED BY {full}, {reader}, {nodelete}; DROP ROLE {full}; DROP ROLE {reader}; DROP ROLE {nodelete};"
        ),
    )
    .await;
}

/// A database that revokes `EXECUTE` on functions from `PUBLIC` makes
/// every sweep batch fail at `retention_hold_recent` (nothing changed, but
/// nothing swept either). The grants check names that grant before
/// anything starts, and with it granted the same role sweeps.
#[tokio::test]
async fn a_role_without_execute_on_the_hold_recheck_is_told_before_it_sweeps() {
    use cohort::services::Access;
    let db = engine_db().await;
    let role = format!("cohort_noexec_{}", &db.name()[db.name().len() - 12..]);
    exec(
        db.pool(),
        &format!(
            "CREATE ROLE {role} LOGIN PASSWORD 'pw' NOSUPERUSER;
             GRANT USAGE ON SCHEMA public, app TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
             GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA app TO {role};
             REVOKE EXECUTE ON FUNCTION public.retention_hold_recent(uuid, pg_snapshot, bigint) FROM PUBLIC;"
        ),
    )
    .await;
    let pool = pool_as(&db, &role, "pw", 3).await;
    let cohort = engine_cohort_on(pool.clone(), test_config()).await;
    let notes = "SELECT count(*) FROM app.notes";
    let before = count(db.pool(), notes).await;

    // Without the check, the sweep reaches the function and fails there.
    let failed = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(failed.status, RunStatus::PartiallyFailed, "{failed:?}");
    let note = failed
        .failures
        .iter()
        .find(|f| f.entity == "Note")
        .unwrap_or_else(|| panic!("Note did not fail: {failed:?}"));
    // insufficient_privilege (the diagnostic keeps the code, not the text)
    assert!(note.error.contains("code=42501"), "{}", note.error);
    assert_eq!(failed.entity("Note").unwrap().affected, 0);
    assert_eq!(
        count(db.pool(), notes).await,
        before,
        "a failed batch changed rows"
    );

    // The check says so first, naming the grant as it must be written.
    let e = cohort.check_grants(&[Access::Runs]).await.unwrap_err();
    let text = e.to_string();
    assert!(e.kind().is_bad_input(), "{e}");
    assert!(
        text.contains(
            "GRANT EXECUTE ON FUNCTION public.retention_hold_recent(uuid, pg_snapshot, bigint) is missing \
             (needed by sweeps and erasure"
        ),
        "{text}"
    );
    assert!(text.contains("lacks 1 grant(s)"), "only that one: {text}");
    // The console does not call it.
    cohort.check_grants(&[Access::Console]).await.unwrap();

    // Granted as the check spelled it: the check passes and the sweep runs.
    exec(
        db.pool(),
        &format!(
            "GRANT EXECUTE ON FUNCTION public.retention_hold_recent(uuid, pg_snapshot, bigint) TO {role}"
        ),
    )
    .await;
    cohort.check_grants(&[Access::Runs]).await.unwrap();
    let swept = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(swept.status, RunStatus::Succeeded, "{swept:?}");
    assert!(swept.entity("Note").unwrap().affected > 0, "{swept:?}");
    assert!(count(db.pool(), notes).await < before);

    pool.close().await;
    exec(
        db.pool(),
        &format!("DROP OWNED BY {role}; DROP ROLE {role};"),
    )
    .await;
}
