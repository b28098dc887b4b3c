//! The journal attacked (RS-043) as a writer of its storage or of the
//! database without `COHORT_JOURNAL_KEY` would: its last line removed
//! after a hold's row went, an entry appended that releases a hold, a
//! drill on another cluster replaying into production's journal, the
//! database's chain cut short. `restore-check`, `replay` and `verify` name
//! each, and nothing they refuse releases a hold.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::holds::HoldRequest;
use cohort::journal::{JournalConfig, JournalKey, FILE_NAME};
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, EntityDeclaration, ErrorKind};
use cohort_pgtemp::Cluster;
use sqlx::PgPool;
use support::*;
use uuid::Uuid;

const CONTACT_ID: &str = "6b6b6b6b-0000-4000-8000-0000000000a7";

const TABLES: &str = r#"
CREATE SCHEMA app;
CREATE TABLE app.contacts (id bigint PRIMARY KEY, created_at timestamptz NOT NULL, user_id uuid NOT NULL);
INSERT INTO app.contacts VALUES
  (1, now() - interval '400 days', '00000000-0000-4000-8000-0000000000a0'),
  (2, now() - interval '400 days', '00000000-0000-4000-8000-0000000000a1');
"#;

fn key() -> JournalKey {
    JournalKey::from_hex(&"5e".repeat(32)).unwrap()
}

async fn handle(pool: &PgPool, journal: &std::path::Path) -> Cohort {
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
        .journal(JournalConfig::dir(journal).key(key()))
        .build()
        .await
        .unwrap()
}

async fn hold(cohort: &Cohort, record: &str) -> Uuid {
    cohort
        .create_hold(HoldRequest::new(
            Uuid::parse_str(CONTACT_ID).unwrap(),
            record,
            "claim of 2026-12",
        ))
        .await
        .unwrap()
        .hold_id
}

fn journal_lines(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(dir.join(FILE_NAME))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn write_lines(dir: &std::path::Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(dir.join(FILE_NAME), text).unwrap();
}

/// Deletes a hold's row as a restore to before it would (the reach
/// trigger set aside for it, as `pg_restore` would not meet it).
async fn lose_hold_row(pool: &PgPool, hold: Uuid) {
    exec(
        pool,
        &format!(
            "ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_reach;
             DELETE FROM public.retention_hold WHERE hold_id = '{hold}';
             ALTER TABLE public.retention_hold ENABLE ALWAYS TRIGGER retention_hold_reach;"
        ),
    )
    .await;
}

#[tokio::test]
async fn a_journal_cut_short_after_a_hold_was_lost_is_named_and_the_sweep_is_not_told_all_is_well()
{
    let db = migrated_db().await;
    let pool = db.pool();
    exec(pool, TABLES).await;
    let dir = tempfile::tempdir().unwrap();
    let cohort = handle(pool, dir.path()).await;
    hold(&cohort, "1").await;
    let second = hold(&cohort, "2").await;
    lose_hold_row(pool, second).await;
    // Control: the journal alone names the lost hold.
    let check = cohort.restore_check().await.unwrap();
    assert_eq!(check.holds_to_place, vec![second]);

    // The journal's last line removed: the lost hold's entry is gone too,
    // but the chain's link of the hold recorded that entry.
    let mut lines = journal_lines(dir.path());
    assert_eq!(lines.len(), 2);
    lines.pop();
    write_lines(dir.path(), &lines);
    let check = cohort.restore_check().await.unwrap();
    assert!(!check.is_clean());
    assert!(
        check.holds_to_place.is_empty(),
        "the journal no longer names it"
    );
    assert_eq!(check.journal_behind.len(), 1, "{:?}", check.journal_behind);
    assert!(
        check.journal_behind[0].contains(&format!("hold {second}"))
            && check.journal_behind[0].contains("entry 2")
            && check.journal_behind[0].contains("cut short"),
        "{}",
        check.journal_behind[0]
    );
    // verify names the hold the chain linked whose row is gone.
    let r = cohort.verify_chain(None).await.unwrap();
    assert!(
        r.breaks
            .iter()
            .any(|b| b.record == format!("hold {second}")),
        "{:?}",
        r.breaks
    );
}

#[db_test(migrated)]
async fn an_entry_appended_without_the_key_is_refused_and_releases_nothing(db: TestDatabase) {
    let pool = db.pool();
    exec(pool, TABLES).await;
    let dir = tempfile::tempdir().unwrap();
    let cohort = handle(pool, dir.path()).await;
    let held = hold(&cohort, "1").await;

    // A release entry appended by someone with the file but not the key:
    // linked to the last entry and hashed as entries are, with the key id
    // copied and the MAC left off (or made under another key).
    let lines = journal_lines(dir.path());
    let last: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    let forged_entry = |mac: Option<String>| {
        let mut e = serde_json::json!({
            "seq": 2,
            "at": "2026-12-07T00:00:00Z",
            "key_id": last["key_id"],
            "prev": last["hash"],
            "record": {"type": "hold_released", "hold_id": held, "released_at": "2026-12-07T00:00:00Z"},
            "hash": "",
        });
        let entry: cohort::journal::Entry = serde_json::from_value(e.clone()).unwrap();
        e["hash"] = serde_json::Value::String(entry.computed_hash());
        if let Some(m) = mac {
            e["mac"] = serde_json::Value::String(m);
        }
        e.to_string()
    };
    for mac in [None, Some("00".repeat(32))] {
        let mut forged = lines.clone();
        forged.push(forged_entry(mac));
        write_lines(dir.path(), &forged);
        let err = cohort.restore_check().await.unwrap_err();
        assert!(err.kind().is_bad_input(), "{err}");
        assert!(err.to_string().contains("entry 2"), "{err}");
        let err = cohort.replay(false).await.unwrap_err();
        assert!(err.to_string().contains("entry 2"), "{err}");
        assert_eq!(
            count(
                pool,
                "SELECT count(*) FROM public.retention_hold WHERE released_at IS NULL"
            )
            .await,
            1,
            "the hold stays in force"
        );
    }
    let _ = held;
}

#[tokio::test]
async fn a_drill_on_another_cluster_replays_onto_a_copy_and_never_into_the_journal() {
    // Production: a hold journaled, and the database's chain recorded.
    let db = migrated_db().await;
    exec(db.pool(), TABLES).await;
    let dir = tempfile::tempdir().unwrap();
    let production = handle(db.pool(), dir.path()).await;
    let held = hold(&production, "1").await;
    // And an erasure request, journaled too: a replay runs it again, and
    // journals that attempt's states where it reads (the copy).
    let erased = production
        .erase(
            ErasureRequest::tenantless(
                ErasureScope::new("00000000-0000-4000-8000-0000000000a1"),
                now(),
            )
            .reference("SAR-D1"),
        )
        .await
        .unwrap();
    assert_eq!(erased.run.entities[0].affected, 1);
    let before = journal_lines(dir.path());

    // The drill: another cluster (its own system identifier), the same
    // journal directory, none of the holds.
    let other = Cluster::start().await.unwrap();
    let pool = PgPool::connect_with(other.connect_options()).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    cohort::schema::migrate(&mut conn, "public").await.unwrap();
    drop(conn);
    exec(&pool, TABLES).await;
    let drill = handle(&pool, dir.path()).await;
    let check = drill.restore_check().await.unwrap();
    assert_eq!(check.holds_to_place, vec![held], "what a drill must replay");
    let err = drill.replay(false).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    assert!(err.to_string().contains("--journal-copy"), "{err}");
    assert_eq!(journal_lines(dir.path()), before, "nothing appended");

    let copy = tempfile::tempdir().unwrap();
    let copy_dir = copy.path().join("journal");
    let replayed = drill.replay_onto_copy(false, &copy_dir).await.unwrap();
    assert_eq!(replayed.holds_placed, vec![held]);
    assert_eq!(
        replayed.requests_run,
        vec![("SAR-D1".to_owned(), "completed".to_owned())]
    );
    assert!(replayed.check.is_clean(), "{:?}", replayed.check.describe());
    assert_eq!(
        journal_lines(dir.path()),
        before,
        "production's journal untouched"
    );
    assert!(
        journal_lines(&copy_dir).len() > before.len(),
        "the copy took the replay"
    );
}

#[db_test(migrated)]
async fn the_journal_records_the_chain_and_verify_names_links_cut_from_its_end(db: TestDatabase) {
    let pool = db.pool();
    exec(pool, TABLES).await;
    let dir = tempfile::tempdir().unwrap();
    let cohort = handle(pool, dir.path()).await;
    let held = hold(&cohort, "1").await;
    cohort.release_hold(held).await.unwrap();
    // The release is journaled after its transaction: its entry recorded
    // the chain with the release linked.
    let last: serde_json::Value =
        serde_json::from_str(journal_lines(dir.path()).last().unwrap()).unwrap();
    let recorded = last["chain"].as_str().unwrap().to_owned();
    let (link_id, _) = recorded.split_once(':').unwrap();
    let r = cohort.verify_chain(None).await.unwrap();
    assert!(r.intact, "{:?}", r.breaks);
    assert!(cohort.restore_check().await.unwrap().is_clean());

    // The chain's end cut off: the release's link. The journal's record of
    // the chain names it (the hold's row also shows a release without a
    // link, but a link cut from the end of a run of settles would leave
    // nothing else behind).
    exec(
        pool,
        &format!("DELETE FROM public.ledger_link WHERE link_id >= {link_id}"),
    )
    .await;
    let r = cohort.verify_chain(None).await.unwrap();
    let b = r
        .breaks
        .iter()
        .find(|b| b.detail.contains("journal entry"))
        .unwrap_or_else(|| panic!("{:?}", r.breaks));
    assert_eq!(b.link_id, Some(link_id.parse().unwrap()), "{b}");
    let check = cohort.restore_check().await.unwrap();
    assert!(check.chain_behind.is_some(), "{:?}", check.describe());
}
