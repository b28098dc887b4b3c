//! Cohort runs with a least-privilege role: no superuser, no DDL rights,
//! only the grants the README documents.

mod support;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::holds::HoldRequest;
use cohort::{Cohort, RunStatus, SweepRequest};
use support::*;

#[tokio::test]
async fn a_least_privilege_role_can_validate_sweep_hold_and_erase() {
    let db = engine_db().await;
    let role = format!("cohort_app_{}", &db.name()[db.name().len() - 12..]);
    // The README's grants, nothing more.
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
    let options = db.connect_options().username(&role).password("app-secret");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect_with(options)
        .await
        .unwrap();
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

    let mut b = Cohort::builder(pool.clone())
        .config(test_config())
        .rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let cohort = b.build().await.unwrap();
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
