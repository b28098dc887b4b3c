//! Legal holds: validation on creation, scope, activity by the database
//! clock, and protection under every strategy.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::holds::{HoldFilter, HoldRequest};
use cohort::{Error, SweepRequest};
use support::*;
use uuid::Uuid;

fn id(s: &str) -> Uuid {
    Uuid::parse_str(s).unwrap()
}

async fn note_id(pool: &sqlx::PgPool, tenant: &str, label: &str) -> Uuid {
    sqlx::query_scalar(
        "SELECT id FROM app.notes WHERE tenant_id = $1::uuid AND body = $1 || ':' || $2",
    )
    .bind(tenant)
    .bind(label)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn ticket_id(pool: &sqlx::PgPool, label: &str) -> Uuid {
    sqlx::query_scalar(
        "SELECT id FROM app.tickets WHERE tenant_id = $1::uuid AND subject = 'ticket ' || $2",
    )
    .bind(TENANT_A)
    .bind(label)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn contact_id(pool: &sqlx::PgPool, label: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT id FROM app.contacts WHERE tenant_id = $1::uuid AND full_name = 'Person ' || $2",
    )
    .bind(TENANT_A)
    .bind(label)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[db_test(engine)]
async fn active_holds_protect_rows_from_every_strategy_and_are_counted(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let note = note_id(db.pool(), TENANT_A, "45d").await;
    let ticket = ticket_id(db.pool(), "45d").await;
    let contact = contact_id(db.pool(), "45d").await;
    for (entity, record) in [
        (NOTE_ID, note.to_string()),
        (TICKET_ID, ticket.to_string()),
        (CONTACT_ID, contact.to_string()),
    ] {
        cohort
            .create_hold(HoldRequest::new(id(entity), record, "litigation #1").tenant(TENANT_A))
            .await
            .unwrap();
    }
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    for name in ["Note", "Contact", "Ticket"] {
        let e = result.entity(name).unwrap();
        assert_eq!((e.affected, e.held), (2, 1), "{name}");
    }
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM app.notes WHERE id = '{note}'")
        )
        .await,
        1
    );
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM app.tickets WHERE id = '{ticket}' AND NOT is_deleted")
        )
        .await,
        1
    );
    assert_eq!(count(db.pool(), &format!("SELECT count(*) FROM app.contacts WHERE id = {contact} AND anonymised_at IS NULL AND email IS NOT NULL")).await, 1);
    let (_, _, _, summaries) = ledger(db.pool(), result.run_id).await;
    for name in ["Note", "Contact", "Ticket"] {
        let s = summaries.iter().find(|s| s.0 == name).unwrap();
        assert_eq!((s.2, s.3), (2, 1), "{name}");
    }
}

#[db_test(engine)]
async fn holds_stop_protecting_at_expiry_or_release_judged_by_the_database_clock(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let expired = note_id(db.pool(), TENANT_A, "45d").await;
    let released = note_id(db.pool(), TENANT_A, "400d").await;
    let active = note_id(db.pool(), TENANT_A, "past-cutoff").await;
    let long_ago = chrono::DateTime::parse_from_rfc3339("2020-01-01T00:00:00Z").unwrap();
    let just_gone = chrono::DateTime::parse_from_rfc3339("2021-01-01T00:00:00Z").unwrap();
    // A hold placed long ago that has since expired (inserted as history: creating
    // an already-expired hold through the API is refused).
    let refused = cohort
        .create_hold(
            HoldRequest::new(id(NOTE_ID), expired.to_string(), "expired")
                .tenant(TENANT_A)
                .created_at(long_ago)
                .expires_at(just_gone),
        )
        .await;
    assert!(
        matches!(&refused, Err(Error::InvalidInput(m)) if m.contains("already past")),
        "{refused:?}"
    );
    sqlx::query("INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, tenant_id, reason, created_at, expires_at) VALUES (gen_random_uuid(), $1, $2, $3, 'expired', $4, $5)")
        .bind(id(NOTE_ID))
        .bind(expired.to_string())
        .bind(TENANT_A)
        .bind(long_ago)
        .bind(just_gone)
        .execute(db.pool())
        .await
        .unwrap();
    let r = cohort
        .create_hold(
            HoldRequest::new(id(NOTE_ID), released.to_string(), "to release").tenant(TENANT_A),
        )
        .await
        .unwrap();
    // Expires far in the future of the database clock, though before the sweep's logical time.
    let far = chrono::DateTime::parse_from_rfc3339("2999-01-01T00:00:00Z").unwrap();
    cohort
        .create_hold(
            HoldRequest::new(id(NOTE_ID), active.to_string(), "active")
                .tenant(TENANT_A)
                .expires_at(far),
        )
        .await
        .unwrap();
    let released_hold = cohort.release_hold(r.hold_id).await.unwrap();
    assert!(!released_hold.active && released_hold.released_at.is_some());
    assert!(
        matches!(cohort.release_hold(r.hold_id).await, Err(Error::Conflict(m)) if m.contains("already released"))
    );
    assert!(
        matches!(cohort.release_hold(Uuid::new_v4()).await, Err(Error::NotFound(m)) if m.contains("no hold"))
    );

    let active_holds = cohort
        .list_holds(&HoldFilter::all().active_only(true))
        .await
        .unwrap();
    assert_eq!(active_holds.len(), 1);
    assert_eq!(active_holds[0].record_id, Some(active.to_string()));
    assert_eq!(
        cohort
            .list_holds(&HoldFilter::default())
            .await
            .unwrap()
            .len(),
        3
    );

    // A sweep whose logical time is far ahead still honours the hold that is active by the database clock.
    let future = chrono::DateTime::parse_from_rfc3339("3000-01-01T00:00:00Z").unwrap();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, future).allow_future_now(true))
        .await
        .unwrap();
    assert_eq!(result.entity("Note").unwrap().held, 1);
    assert_eq!(labels(db.pool(), "SELECT split_part(body, ':', 2) FROM app.notes WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a'").await, vec!["null".to_string(), "past-cutoff".to_string()]);
}

#[db_test(engine)]
async fn holds_are_scoped_by_entity_record_and_tenant_with_canonical_ids(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    // Global (tenantless, bigint key) record 4 and Contact (tenant A) record 4 share the id text "4".
    let global = cohort
        .create_hold(HoldRequest::new(id(GLOBAL_ID), " 0004 ", "tenantless hold"))
        .await
        .unwrap();
    assert_eq!(
        global.record_id.as_deref(),
        Some("4"),
        "integer ids are canonicalised"
    );
    assert_eq!(global.tenant_id, None);
    let note = note_id(db.pool(), TENANT_A, "400d").await;
    let upper = note.to_string().to_uppercase();
    let h = cohort
        .create_hold(
            HoldRequest::new(id(NOTE_ID), upper, "upper-case uuid").tenant(TENANT_A.to_uppercase()),
        )
        .await
        .unwrap();
    assert_eq!(
        (h.record_id.as_deref().unwrap(), h.tenant_id.as_deref()),
        (note.to_string().as_str(), Some(TENANT_A))
    );

    let contact4: (String, bool) =
        sqlx::query_as("SELECT full_name, anonymised_at IS NULL FROM app.contacts WHERE id = 4")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(contact4, ("Person 45d".to_string(), true));
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    // Contact 4 is eligible and not held (the hold names another entity).
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.contacts WHERE id = 4 AND anonymised_at IS NOT NULL"
        )
        .await,
        1
    );
    assert_eq!(result.entity("Contact").unwrap().held, 0);
    assert_eq!(result.entity("Note").unwrap().held, 1);
    let tenantless = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(
        (tenantless.entities[0].affected, tenantless.entities[0].held),
        (2, 1)
    );
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.globals WHERE id = 4").await,
        1
    );
}

#[db_test(engine)]
async fn bad_hold_requests_are_refused_and_change_nothing(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let note = note_id(db.pool(), TENANT_A, "45d").await.to_string();
    let missing = Uuid::new_v4().to_string();
    let past = chrono::DateTime::parse_from_rfc3339("2001-01-01T00:00:00Z").unwrap();
    let existing = cohort
        .create_hold(HoldRequest::new(id(NOTE_ID), note.clone(), "first").tenant(TENANT_A))
        .await
        .unwrap();
    let cases: Vec<(HoldRequest, &str)> = vec![
        (
            HoldRequest::new(Uuid::new_v4(), note.clone(), "x").tenant(TENANT_A),
            "is not the id of a registered retained entity",
        ),
        (
            HoldRequest::new(id(NOTE_ID), "not-a-uuid", "x").tenant(TENANT_A),
            "is not a valid uuid",
        ),
        (
            HoldRequest::new(id(NOTE_ID), missing.clone(), "x").tenant(TENANT_A),
            "does not exist",
        ),
        (
            HoldRequest::new(id(NOTE_ID), note.clone(), "x").tenant(TENANT_B),
            "does not belong to tenant",
        ),
        (
            HoldRequest::new(id(NOTE_ID), note.clone(), "x"),
            "needs the row's tenant",
        ),
        (
            HoldRequest::new(id(NOTE_ID), note.clone(), "x").tenant("tenant-a"),
            "tenant for Note",
        ),
        (
            HoldRequest::new(id(GLOBAL_ID), "1", "x").tenant(TENANT_A),
            "must not name a tenant",
        ),
        (HoldRequest::new(id(GLOBAL_ID), "99", "x"), "does not exist"),
        (
            HoldRequest::new(id(GLOBAL_ID), "1.5", "x"),
            "is not a valid bigint",
        ),
        (
            HoldRequest::new(id(NOTE_ID), note.clone(), "   ").tenant(TENANT_A),
            "needs a reason",
        ),
        (
            HoldRequest::new(id(NOTE_ID), note.clone(), "x")
                .tenant(TENANT_A)
                .expires_at(past),
            "must expire after it is created",
        ),
        (
            HoldRequest::new(id(NOTE_ID), note.clone(), "x")
                .tenant(TENANT_A)
                .hold_id(existing.hold_id),
            "already exists",
        ),
    ];
    let before = table_digest(db.pool(), "public.retention_hold").await;
    for (req, fragment) in cases {
        match cohort.create_hold(req.clone()).await {
            Err(e) if e.kind().is_bad_input() => {
                assert!(e.to_string().contains(fragment), "{req:?}: {e}");
                // Retrying a create with the same id is recognisable.
                if fragment == "already exists" {
                    assert_eq!(e.kind(), cohort::ErrorKind::Conflict);
                }
            }
            other => panic!("{req:?} gave {other:?}"),
        }
    }
    assert_eq!(
        table_digest(db.pool(), "public.retention_hold").await,
        before
    );
}

#[db_test(engine)]
async fn a_hold_whose_creation_holds_the_row_lock_makes_the_sweep_skip_the_row(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let note = note_id(db.pool(), TENANT_A, "45d").await;
    // Another session locks the row the way hold creation does and has not committed yet.
    let mut other = db.connect().await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query("SELECT 1 FROM app.notes WHERE id = $1 FOR KEY SHARE")
        .bind(note)
        .execute(&mut other)
        .await
        .unwrap();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(
        result.entity("Note").unwrap().affected,
        2,
        "the locked row is skipped, not waited for"
    );
    sqlx::query("INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, tenant_id, reason) VALUES (gen_random_uuid(), $1, $2, $3, 'late')")
        .bind(id(NOTE_ID))
        .bind(note.to_string())
        .bind(TENANT_A)
        .execute(&mut other)
        .await
        .unwrap();
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    let again = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(
        (
            again.entity("Note").unwrap().affected,
            again.entity("Note").unwrap().held
        ),
        (0, 1)
    );
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM app.notes WHERE id = '{note}'")
        )
        .await,
        1
    );
}
