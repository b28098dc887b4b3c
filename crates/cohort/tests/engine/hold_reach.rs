//! A hold keeps its reach (RS-042), attacked as a database writer without
//! Cohort's secrets would: a superuser narrowing an active subject hold in
//! place (another subject, an earlier expiry, another tenant), under
//! `session_replication_role = replica` too, deleting or truncating it,
//! taking a release back. The database refuses each; a change forced past
//! the trigger is refused at startup, stops every batch, and `verify`
//! names it; `cohort migrate` puts the trigger back.

use crate::support;

use cohort::chain::BreakKind;
use cohort::holds::HoldRequest;
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, EntityDeclaration, RunStatus, SweepRequest};
use sqlx::PgPool;
use support::*;
use uuid::Uuid;

const S: &str = "dddddddd-0000-0000-0000-00000000000d";
const CONTACT_ID: &str = "5a5a5a5a-0000-4000-8000-0000000000c1";

const TABLES: &str = r#"
CREATE SCHEMA app;
CREATE TABLE app.contacts (id bigint PRIMARY KEY, created_at timestamptz, user_id uuid);
INSERT INTO app.contacts VALUES
  (1, '2026-01-10', 'dddddddd-0000-0000-0000-00000000000d'),
  (2, '2026-01-11', 'dddddddd-0000-0000-0000-00000000000d'),
  (3, '2026-01-12', 'dddddddd-0000-0000-0000-00000000000d'),
  (4, '2026-01-13', 'dddddddd-0000-0000-0000-00000000000d');
"#;

fn builder(pool: &PgPool) -> cohort::CohortBuilder {
    Cohort::builder(pool.clone())
        .config(test_config())
        .rules(
            StaticRuleProvider::builder()
                .category("contacts", RetentionRule::new(days(30), Strategy::Purge))
                .build()
                .unwrap(),
        )
        .declaration(
            EntityDeclaration::new("Contact", CONTACT_ID)
                .category("contacts")
                .anchor("created_at")
                .table("app.contacts")
                .subject("user_id", None)
                .tenantless(),
        )
}

async fn setup() -> (cohort_pgtemp::TestDatabase, Cohort, Uuid) {
    let db = migrated_db().await;
    exec(db.pool(), TABLES).await;
    let cohort = builder(db.pool()).build().await.unwrap();
    let hold = cohort
        .create_hold(HoldRequest::subject(S, "litigation"))
        .await
        .unwrap()
        .hold_id;
    (db, cohort, hold)
}

/// Runs `sql` in a transaction of its own (rolled back when it fails) as
/// the test database's owner, a superuser; the SQLSTATE it failed with.
async fn refused(pool: &PgPool, sql: &str) -> Option<String> {
    let mut tx = pool.begin().await.unwrap();
    let r = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut *tx)
        .await;
    match r {
        Ok(_) => {
            tx.commit().await.unwrap();
            None
        }
        Err(e) => {
            let code = e
                .as_database_error()
                .and_then(|d| d.code())
                .map(|c| c.into_owned());
            tx.rollback().await.unwrap();
            Some(code.unwrap_or_else(|| format!("not a database error: {e}")))
        }
    }
}

async fn contacts(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM app.contacts").await
}

#[tokio::test]
async fn no_writer_can_narrow_delete_or_unrelease_a_hold_and_the_sweep_keeps_its_rows() {
    let (db, cohort, hold) = setup().await;
    let pool = db.pool();
    for attack in [
        "UPDATE public.retention_hold SET subject_uuid = gen_random_uuid()",
        "SET LOCAL session_replication_role = replica; \
         UPDATE public.retention_hold SET subject_uuid = gen_random_uuid()",
        "UPDATE public.retention_hold SET subject_text = 'someone else', subject_citext = 'someone else'",
        "UPDATE public.retention_hold SET subject_int = 7",
        "UPDATE public.retention_hold SET subject_kind = 'other'",
        "UPDATE public.retention_hold SET tenant_id = 'another tenant'",
        "UPDATE public.retention_hold SET expires_at = created_at + interval '1 second'",
        "UPDATE public.retention_hold SET created_at = created_at - interval '1 day'",
        "UPDATE public.retention_hold SET reason = 'nothing'",
        "UPDATE public.retention_hold SET released_at = created_at - interval '1 day'",
        "DELETE FROM public.retention_hold",
        "SET LOCAL session_replication_role = replica; DELETE FROM public.retention_hold",
        "TRUNCATE public.retention_hold",
    ] {
        assert_eq!(
            refused(pool, attack).await.as_deref(),
            Some("CH002"),
            "{attack}"
        );
    }
    let swept = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(swept.status, RunStatus::Succeeded);
    assert_eq!(contacts(pool).await, 4, "the hold kept the person's rows");
    assert!(cohort.verify_chain(None).await.unwrap().intact);

    // A release through Cohort is the one change allowed, once.
    cohort.release_hold(hold).await.unwrap();
    for attack in [
        "UPDATE public.retention_hold SET released_at = NULL",
        "UPDATE public.retention_hold SET released_at = now() + interval '1 day'",
        "UPDATE public.retention_hold SET subject_uuid = gen_random_uuid()",
    ] {
        assert_eq!(
            refused(pool, attack).await.as_deref(),
            Some("CH002"),
            "{attack}"
        );
    }
    // Control: what the trigger refuses is what it must; a released hold
    // goes (the pruner's delete), and the sweep now takes the rows.
    cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(contacts(pool).await, 0);
    assert_eq!(
        refused(pool, "DELETE FROM public.retention_hold").await,
        None
    );
}

#[tokio::test]
async fn a_narrowing_forced_past_the_trigger_is_refused_at_startup_stops_every_batch_and_verify_names_it(
) {
    let (db, cohort, hold) = setup().await;
    let pool = db.pool();
    // The attack works when the trigger is off: a table owner can do that.
    exec(
        pool,
        "ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_reach;
         UPDATE public.retention_hold SET subject_uuid = gen_random_uuid();",
    )
    .await;
    let err = builder(pool).build().await.unwrap_err();
    assert!(
        err.to_string().contains("retention_hold_reach")
            && err.to_string().contains("cohort migrate"),
        "{err}"
    );
    // A handle built before: its batch refuses to change a row.
    let swept = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_ne!(swept.status, RunStatus::Succeeded);
    assert_eq!(contacts(pool).await, 4, "no batch ran");
    let r = cohort.verify_chain(None).await.unwrap();
    let b = r.first_break().expect("the narrowed hold is named");
    assert_eq!(b.kind, BreakKind::Changed, "{b}");
    assert_eq!(b.record, format!("hold {hold}"), "{b}");
    assert!(b.detail.contains("forms"), "{}", b.detail);

    // `cohort migrate` on a current schema puts the trigger back; the hold
    // stays named by verify (its reach was changed while it was off).
    let mut conn = pool.acquire().await.unwrap();
    let report = cohort::schema::migrate(&mut conn, "public").await.unwrap();
    drop(report);
    builder(pool).build().await.unwrap();
    assert_eq!(
        refused(pool, "UPDATE public.retention_hold SET subject_uuid = NULL")
            .await
            .as_deref(),
        Some("CH002")
    );
    assert!(!cohort.verify_chain(None).await.unwrap().intact);
}

#[tokio::test]
async fn the_batch_check_distrusts_a_stamp_function_replaced_after_startup_and_refuses_without_the_reach_trigger(
) {
    let (db, _cohort, _hold) = setup().await;
    let pool = db.pool();
    let recent = || async {
        let mut tx = pool.begin().await.unwrap();
        let r = sqlx::query_scalar::<_, bool>(
            "SELECT public.retention_hold_recent($1::uuid, pg_current_snapshot(), 1)",
        )
        .bind(Uuid::parse_str(CONTACT_ID).unwrap())
        .fetch_one(&mut *tx)
        .await;
        tx.rollback().await.unwrap();
        r.map_err(|e| {
            e.as_database_error()
                .and_then(|d| d.code())
                .map(|c| c.into_owned())
                .unwrap_or_default()
        })
    };
    // Control: Cohort's own functions, nothing written since the snapshot.
    assert_eq!(recent().await, Ok(false));
    // Replaced by one that does not stamp, and the replacement committed
    // before the batch's snapshot (a worker's startup check long past):
    // no stamp is trusted, every locked row is checked again.
    exec(
        pool,
        "CREATE OR REPLACE FUNCTION public.retention_hold_stamp() RETURNS trigger
           LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
         AS $$ BEGIN RETURN NEW; END $$",
    )
    .await;
    assert_eq!(recent().await, Ok(true));
    // The reach trigger disabled: the batch fails before it changes a row.
    exec(
        pool,
        "ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_reach_truncate",
    )
    .await;
    assert_eq!(recent().await, Err("CH002".to_owned()));
    let mut conn = pool.acquire().await.unwrap();
    cohort::schema::migrate(&mut conn, "public").await.unwrap();
    assert_eq!(recent().await, Ok(false), "migrate put both back");
}
