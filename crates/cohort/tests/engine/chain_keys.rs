//! The ledger's chain keyed (RS-043), attacked as a database writer
//! without `COHORT_LEDGER_KEY` would: a run deleted and covered by a
//! forged checkpoint (hashed as the server hashes, or with a MAC under
//! another key), a link re-dated, links appended after the keyed part
//! without a MAC. `verify` with the key names each; a process without the
//! key (or with another) is refused before it writes a link.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use chrono::Utc;
use cohort::chain::{
    self, BreakKind, CheckpointRecord, LedgerKey, LinkKind, PruneCutoffs, PrunedLink,
};
use cohort::holds::HoldRequest;
use cohort::{Cohort, SweepRequest};
use sqlx::{PgPool, Row};
use support::*;
use uuid::Uuid;

fn key() -> LedgerKey {
    LedgerKey::from_hex(&"4c".repeat(32)).unwrap()
}

fn other_key() -> LedgerKey {
    LedgerKey::from_hex(&"99".repeat(32)).unwrap()
}

fn keyed_config(key: Option<LedgerKey>) -> cohort::CohortConfig {
    cohort::CohortConfig {
        ledger_key: key,
        ..test_config()
    }
}

async fn build(pool: &PgPool, key: Option<LedgerKey>) -> Result<Cohort, cohort::Error> {
    let mut b = Cohort::builder(pool.clone())
        .config(keyed_config(key))
        .rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    b.build().await
}

/// The newest link: (link_id, link).
async fn head(pool: &PgPool) -> (i64, String) {
    let r =
        sqlx::query("SELECT link_id, link FROM public.ledger_link ORDER BY link_id DESC LIMIT 1")
            .fetch_one(pool)
            .await
            .unwrap();
    (r.get("link_id"), r.get("link"))
}

/// A keyed chain with two sweeps and a hold placed and released on it;
/// the handle and the runs.
async fn keyed_history(db: &cohort_pgtemp::TestDatabase) -> (Cohort, Vec<Uuid>) {
    assert_eq!(
        keyer(db.pool(), key()).key_chain().await.unwrap(),
        Some(2),
        "the key link follows the start"
    );
    let cohort = build(db.pool(), Some(key())).await.unwrap();
    let mut runs = Vec::new();
    for tenant in [TENANT_A, TENANT_B] {
        runs.push(
            cohort
                .sweep(SweepRequest::tenanted(tenant, now()))
                .await
                .unwrap()
                .run_id,
        );
    }
    let hold = cohort
        .create_hold(HoldRequest::new(
            Uuid::parse_str(GLOBAL_ID).unwrap(),
            "1",
            "litigation",
        ))
        .await
        .unwrap()
        .hold_id;
    cohort.release_hold(hold).await.unwrap();
    (cohort, runs)
}

#[db_test(engine)]
async fn a_process_is_refused_before_it_links_anything_without_the_chains_key(db: TestDatabase) {
    // A key given for a chain not keyed yet is refused, not ignored.
    let err = build(db.pool(), Some(key())).await.unwrap_err();
    assert!(err.to_string().contains("not keyed yet"), "{err}");
    // Control: no key, no keyed chain: a process starts.
    build(db.pool(), None).await.unwrap();

    keyer(db.pool(), key()).key_chain().await.unwrap();
    assert_eq!(
        keyer(db.pool(), key()).key_chain().await.unwrap(),
        None,
        "keyed once"
    );
    assert!(keyer(db.pool(), other_key()).key_chain().await.is_err());
    assert_eq!(
        build_unvalidated(db.pool()).chain_key_id().await.unwrap(),
        Some(key().id())
    );
    let err = build(db.pool(), None).await.unwrap_err();
    assert!(err.to_string().contains("COHORT_LEDGER_KEY"), "{err}");
    let err = build(db.pool(), Some(other_key())).await.unwrap_err();
    assert!(err.to_string().contains(&key().id()), "{err}");
    build(db.pool(), Some(key())).await.unwrap();
}

#[db_test(engine)]
async fn a_keyed_chain_verifies_with_its_key_and_names_every_link_written_without_it(
    db: TestDatabase,
) {
    let pool = db.pool();
    let (cohort, runs) = keyed_history(&db).await;
    let clean = cohort.verify_chain(None).await.unwrap();
    assert!(clean.intact, "{:?}", clean.breaks);
    assert_eq!((clean.keyed_from, clean.macs_checked), (Some(2), true));
    assert!(clean.warnings.is_empty(), "{:?}", clean.warnings);
    let macs = count(
        pool,
        "SELECT count(*) FROM public.ledger_link WHERE link_id > 1 AND mac IS NULL",
    )
    .await;
    assert_eq!(macs, 0, "every link after the start carries a MAC");

    // B1: a run deleted by SQL, covered by a checkpoint hashed as the
    // server hashed links before the chain was keyed.
    let run = runs[0];
    let (run_link, run_digest): (i64, String) =
        sqlx::query_as("SELECT link_id, digest FROM public.ledger_link WHERE subject_id = $1")
            .bind(run)
            .fetch_one(pool)
            .await
            .unwrap();
    exec(
        pool,
        &format!(
            "DELETE FROM public.sweep_run_row_detail WHERE run_id = '{run}';
             DELETE FROM public.sweep_run_entity_summary WHERE run_id = '{run}';
             DELETE FROM public.sweep_run WHERE run_id = '{run}';"
        ),
    )
    .await;
    let record = chain::canonical(&CheckpointRecord {
        cutoffs: PruneCutoffs {
            succeeded_before: Some(chain::micros(Utc::now())),
            ..PruneCutoffs::default()
        },
        pruned: vec![PrunedLink {
            link_id: run_link,
            digest: run_digest,
        }],
    });
    let digest = chain::digest(&record);
    let (head_id, prev) = head(pool).await;
    let forged = head_id + 1;
    let link = chain::link_hash(&prev, forged, LinkKind::Checkpoint, None, &digest);
    sqlx::query(
        "INSERT INTO public.ledger_link (link_id, kind, record, digest, prev, link, covers) \
         VALUES ($1, 'checkpoint', $2, $3, $4, $5, ARRAY[$6]::int8[])",
    )
    .bind(forged)
    .bind(&record)
    .bind(&digest)
    .bind(&prev)
    .bind(&link)
    .bind(run_link)
    .execute(pool)
    .await
    .unwrap();
    let r = cohort.verify_chain(None).await.unwrap();
    let b = forged_break(&r, forged);
    assert!(b.detail.contains("no MAC"), "{}", b.detail);
    // So the checkpoint stands for nothing, and the run is missing.
    let first = r.first_break().unwrap();
    assert_eq!(
        (first.link_id, first.kind),
        (Some(run_link), BreakKind::Missing),
        "{first}"
    );

    // The same link with a MAC under another key, hashed as keyed links are.
    let linked_at: chrono::DateTime<Utc> =
        sqlx::query_scalar("SELECT linked_at FROM public.ledger_link WHERE link_id = $1")
            .bind(forged)
            .fetch_one(pool)
            .await
            .unwrap();
    let keyed = chain::keyed_link_hash(
        &prev,
        forged,
        LinkKind::Checkpoint,
        None,
        &digest,
        chain::micros(linked_at),
    );
    sqlx::query("UPDATE public.ledger_link SET link = $2, mac = $3 WHERE link_id = $1")
        .bind(forged)
        .bind(&keyed)
        .bind(other_key().mac(&keyed))
        .execute(pool)
        .await
        .unwrap();
    let r = cohort.verify_chain(None).await.unwrap();
    let b = forged_break(&r, forged);
    assert!(b.detail.contains("MAC does not hold"), "{}", b.detail);

    // Without the key, verify cannot tell that link from a real one, and
    // says it did not check MACs.
    let unkeyed = build_unvalidated(pool);
    let r = unkeyed.verify_chain(None).await.unwrap();
    assert!(r.intact, "{:?}", r.breaks);
    assert!(!r.macs_checked);
    assert!(
        r.warnings.iter().any(|w| w.contains("MACs were not")),
        "{:?}",
        r.warnings
    );

    // A real link re-dated: its hash covers its time.
    exec(
        pool,
        &format!("DELETE FROM public.ledger_link WHERE link_id = {forged}"),
    )
    .await;
    exec(
        pool,
        "UPDATE public.ledger_link SET linked_at = linked_at - interval '800 days' WHERE link_id = 4",
    )
    .await;
    let r = cohort.verify_chain(None).await.unwrap();
    let b = r
        .breaks
        .iter()
        .find(|b| b.link_id == Some(4))
        .unwrap_or_else(|| panic!("{:?}", r.breaks));
    assert_eq!(b.kind, BreakKind::Changed, "{b}");
    assert!(b.detail.contains("contents and time"), "{}", b.detail);
}

fn forged_break(r: &cohort::chain::ChainReport, link: i64) -> &cohort::chain::ChainBreak {
    let b = r
        .breaks
        .iter()
        .find(|b| b.link_id == Some(link))
        .unwrap_or_else(|| panic!("link {link} not named: {:?}", r.breaks));
    assert_eq!(b.kind, BreakKind::Changed, "{b}");
    b
}

/// What `cohort migrate` keys the chain with: a handle with the key and
/// nothing else.
fn keyer(pool: &PgPool, key: LedgerKey) -> Cohort {
    Cohort::builder(pool.clone())
        .config(keyed_config(Some(key)))
        .build_unvalidated()
        .unwrap()
}

fn build_unvalidated(pool: &PgPool) -> Cohort {
    let mut b = Cohort::builder(pool.clone())
        .config(keyed_config(None))
        .rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    b.build_unvalidated().unwrap()
}

#[db_test(engine)]
async fn an_unkeyed_chain_is_named_as_such_and_a_forged_release_before_its_hold_is_named(
    db: TestDatabase,
) {
    let pool = db.pool();
    let cohort = build(pool, None).await.unwrap();
    let hold = cohort
        .create_hold(HoldRequest::new(
            Uuid::parse_str(GLOBAL_ID).unwrap(),
            "1",
            "litigation",
        ))
        .await
        .unwrap()
        .hold_id;
    let r = cohort.verify_chain(None).await.unwrap();
    assert!(r.intact);
    assert_eq!(r.keyed_from, None);
    assert!(
        r.warnings.iter().any(|w| w.contains("not keyed")),
        "{:?}",
        r.warnings
    );
    // B2 on an unkeyed chain: a release linked by hand, dated 800 days
    // back, before the hold existed.
    let release = chain::canonical(&chain::ReleaseRecord {
        hold_id: hold,
        released_at: chain::micros(Utc::now() - chrono::Duration::days(800)),
    });
    let digest = chain::digest(&release);
    let (head_id, prev) = head(pool).await;
    let link = chain::link_hash(
        &prev,
        head_id + 1,
        LinkKind::HoldReleased,
        Some(hold),
        &digest,
    );
    sqlx::query(
        "INSERT INTO public.ledger_link (link_id, kind, subject_id, record, digest, prev, link) \
         VALUES ($1, 'hold_released', $2, $3, $4, $5, $6)",
    )
    .bind(head_id + 1)
    .bind(hold)
    .bind(&release)
    .bind(&digest)
    .bind(&prev)
    .bind(&link)
    .execute(pool)
    .await
    .unwrap();
    let r = cohort.verify_chain(None).await.unwrap();
    assert!(
        r.breaks
            .iter()
            .any(|b| b.link_id == Some(head_id + 1)
                && b.detail.contains("before the hold was placed")),
        "{:?}",
        r.breaks
    );
}
