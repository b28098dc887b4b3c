//! The ledger's hash chain on a real server (RS-035): every settled run
//! and every hold placed or released is a link; `verify` finds a count
//! changed, a run deleted, a run inserted and links reordered, and names
//! the first; pruning leaves the chain checkable; concurrent settles make
//! one gapless chain; a head recorded earlier catches a rewrite.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use chrono::Duration;
use cohort::chain::{
    self, BreakKind, ChainHead, ChainReport, ExpectedHead, HoldRecord, LinkKind, ReleaseRecord,
    RunRecord,
};
use cohort::holds::HoldRequest;
use cohort::services::{PruneRequest, PrunerConfig};
use cohort::{Cohort, SweepRequest};
use sqlx::PgPool;
use support::*;
use uuid::Uuid;

/// A link as stored.
#[derive(Debug, Clone)]
struct Link {
    link_id: i64,
    kind: String,
    subject_id: Option<Uuid>,
    record: String,
    digest: String,
    prev: String,
    link: String,
}

async fn links(pool: &PgPool) -> Vec<Link> {
    use sqlx::Row;
    sqlx::query(
        "SELECT link_id, kind, subject_id, record, digest, prev, link FROM public.ledger_link ORDER BY link_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| Link {
        link_id: r.get("link_id"),
        kind: r.get("kind"),
        subject_id: r.get("subject_id"),
        record: r.get("record"),
        digest: r.get("digest"),
        prev: r.get("prev"),
        link: r.get("link"),
    })
    .collect()
}

/// Deletes a run and everything hanging from it, as a person with write
/// access could (not the pruner: no checkpoint).
async fn delete_run_by_hand(pool: &PgPool, run_id: Uuid) {
    exec(
        pool,
        &format!(
            "DELETE FROM public.sweep_row_handler_status WHERE run_id = '{run_id}';
             DELETE FROM public.sweep_run_row_detail WHERE run_id = '{run_id}';
             DELETE FROM public.sweep_run_entity_summary WHERE run_id = '{run_id}';
             DELETE FROM public.sweep_run WHERE run_id = '{run_id}';"
        ),
    )
    .await;
}

/// The chain walked; the warning every unkeyed chain carries (see
/// `chain_keys.rs`) is checked there and left out here.
async fn verify(cohort: &Cohort) -> ChainReport {
    let mut r = cohort.verify_chain(None).await.unwrap();
    assert_eq!(r.keyed_from, None);
    let before = r.warnings.len();
    r.warnings.retain(|w| !w.contains("the chain is not keyed"));
    assert_eq!(before, r.warnings.len() + 1, "{:?}", r.warnings);
    r
}

/// Two sweeps (tenants A and B), a hold placed on a global row and released.
async fn history(db: &cohort_pgtemp::TestDatabase) -> (Cohort, Vec<Uuid>, Uuid) {
    let cohort = engine_cohort(db).await;
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
    (cohort, runs, hold)
}

fn kind(k: &str) -> LinkKind {
    LinkKind::parse(k).unwrap()
}

#[db_test(engine)]
async fn every_settled_run_and_hold_change_is_linked_from_the_migrations_start(db: TestDatabase) {
    // The migration wrote the start, hashed in SQL as the library hashes.
    let start = links(db.pool()).await;
    assert_eq!(start.len(), 1);
    assert_eq!((start[0].link_id, start[0].kind.as_str()), (1, "start"));
    assert!(
        start[0].record.contains(r#""runs_before":0"#),
        "{}",
        start[0].record
    );
    assert_eq!(chain::digest(&start[0].record), start[0].digest);
    assert_eq!(start[0].prev, chain::GENESIS);
    assert_eq!(
        chain::link_hash(chain::GENESIS, 1, LinkKind::Start, None, &start[0].digest),
        start[0].link
    );

    let (cohort, runs, hold) = history(&db).await;
    let all = links(db.pool()).await;
    let shape: Vec<_> = all
        .iter()
        .map(|l| (l.link_id, l.kind.as_str(), l.subject_id))
        .collect();
    assert_eq!(
        shape,
        vec![
            (1, "start", None),
            (2, "run", Some(runs[0])),
            (3, "run", Some(runs[1])),
            (4, "hold_placed", Some(hold)),
            (5, "hold_released", Some(hold)),
        ]
    );
    // Each link follows the one before, by the documented formula (the
    // server computed it; the library recomputes it here).
    for pair in all.windows(2) {
        let l = &pair[1];
        assert_eq!(l.prev, pair[0].link);
        assert_eq!(chain::digest(&l.record), l.digest);
        assert_eq!(
            chain::link_hash(&l.prev, l.link_id, kind(&l.kind), l.subject_id, &l.digest),
            l.link
        );
    }
    // A run's record carries its summaries, their counts, the rule they
    // applied and the policy's fingerprint; a hold's, no reason text.
    let run: RunRecord = serde_json::from_str(&all[1].record).unwrap();
    assert_eq!(run.run_id, runs[0]);
    assert_eq!(run.status, "succeeded");
    assert!(run.policy_fingerprint.is_some());
    assert!(!run.summaries.is_empty());
    assert!(run.summaries.iter().any(|s| s.affected_count > 0));
    let placed: HoldRecord = serde_json::from_str(&all[3].record).unwrap();
    assert_eq!(placed.reason, chain::salted(hold, "litigation"));
    assert!(!all[3].record.contains("litigation"));
    let released: ReleaseRecord = serde_json::from_str(&all[4].record).unwrap();
    assert_eq!(released.hold_id, hold);

    let report = verify(&cohort).await;
    assert!(report.intact, "{:?}", report.breaks);
    assert_eq!((report.links, report.records_checked), (5, 3));
    assert_eq!(report.runs_before_chain, 0);
    assert_eq!(report.holds_outside_chain, 0);
    let head = report.head.unwrap();
    assert_eq!(
        (head.link_id, head.link.as_str()),
        (5, all[4].link.as_str())
    );
    assert_eq!(cohort.chain_head(None).await.unwrap(), Some(head));
}

#[db_test(engine)]
async fn a_changed_count_is_named_and_so_is_every_later_attempt_to_hide_it(db: TestDatabase) {
    let (cohort, runs, _) = history(&db).await;
    assert!(verify(&cohort).await.intact);
    let summary: (i64, i64) = sqlx::query_as(
        "SELECT summary_id, affected_count FROM public.sweep_run_entity_summary \
         WHERE run_id = $1 AND affected_count > 0 ORDER BY summary_id LIMIT 1",
    )
    .bind(runs[0])
    .fetch_one(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "UPDATE public.sweep_run_entity_summary SET affected_count = affected_count + 1 WHERE summary_id = $1",
    )
    .bind(summary.0)
    .execute(db.pool())
    .await
    .unwrap();
    let r = verify(&cohort).await;
    assert!(!r.intact);
    let b = r.first_break().unwrap();
    assert_eq!(
        (b.link_id, b.kind, b.record.clone()),
        (Some(2), BreakKind::Changed, format!("run {}", runs[0]))
    );
    assert!(
        b.detail.contains(&format!(
            "affected_count: linked {}, now {}",
            summary.1,
            summary.1 + 1
        )),
        "{}",
        b.detail
    );
    assert_eq!(r.breaks.len(), 1, "only that record: {:?}", r.breaks);

    // The record edited to match: its digest gives it away.
    let link2 = links(db.pool()).await[1].clone();
    let mut edited: RunRecord = serde_json::from_str(&link2.record).unwrap();
    let s = edited
        .summaries
        .iter_mut()
        .find(|s| s.summary_id == summary.0)
        .unwrap();
    s.affected_count += 1;
    let edited = chain::canonical(&edited);
    sqlx::query("UPDATE public.ledger_link SET record = $1 WHERE link_id = 2")
        .bind(&edited)
        .execute(db.pool())
        .await
        .unwrap();
    let b = verify(&cohort).await.first_break().unwrap().clone();
    assert_eq!((b.link_id, b.kind), (Some(2), BreakKind::Changed));
    assert!(
        b.detail.contains("no longer matches its digest"),
        "{}",
        b.detail
    );

    // And the digest too: the link's hash.
    sqlx::query("UPDATE public.ledger_link SET digest = $1 WHERE link_id = 2")
        .bind(chain::digest(&edited))
        .execute(db.pool())
        .await
        .unwrap();
    let b = verify(&cohort).await.first_break().unwrap().clone();
    assert_eq!((b.link_id, b.kind), (Some(2), BreakKind::Changed));
    assert!(b.detail.contains("the link was edited"), "{}", b.detail);

    // And the hash: the next link no longer follows it.
    let hash = chain::link_hash(
        &link2.prev,
        2,
        LinkKind::Run,
        link2.subject_id,
        &chain::digest(&edited),
    );
    sqlx::query("UPDATE public.ledger_link SET link = $1 WHERE link_id = 2")
        .bind(hash)
        .execute(db.pool())
        .await
        .unwrap();
    let r = verify(&cohort).await;
    let b = r.first_break().unwrap();
    assert_eq!((b.link_id, b.kind), (Some(3), BreakKind::Reordered), "{b}");
}

#[db_test(engine)]
async fn a_deleted_run_is_missing_and_an_inserted_run_is_named(db: TestDatabase) {
    let (cohort, runs, _) = history(&db).await;
    assert!(verify(&cohort).await.intact);
    delete_run_by_hand(db.pool(), runs[1]).await;
    let r = verify(&cohort).await;
    let b = r.first_break().unwrap();
    assert_eq!(
        (b.link_id, b.kind, b.record.clone()),
        (Some(3), BreakKind::Missing, format!("run {}", runs[1]))
    );
    assert!(b.detail.contains("no checkpoint"), "{}", b.detail);

    // A run written into the ledger afterwards, with no link.
    let forged = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, started_at, settled_at) \
         VALUES ($1, 'sweep', 'manual', false, 'succeeded', now(), now(), now())",
    )
    .bind(forged)
    .execute(db.pool())
    .await
    .unwrap();
    let r = verify(&cohort).await;
    let inserted: Vec<_> = r
        .breaks
        .iter()
        .filter(|b| b.kind == BreakKind::Inserted)
        .collect();
    assert_eq!(inserted.len(), 1, "{:?}", r.breaks);
    assert_eq!(inserted[0].record, format!("run {forged}"));
    assert_eq!(inserted[0].link_id, None);

    // A link deleted outright leaves a gap.
    exec(
        db.pool(),
        "DELETE FROM public.ledger_link WHERE link_id = 4",
    )
    .await;
    let r = verify(&cohort).await;
    let gap = r
        .breaks
        .iter()
        .find(|b| b.link_id == Some(4))
        .expect("the gap");
    assert_eq!(gap.kind, BreakKind::Missing);
    assert!(gap.detail.contains("link 4 is gone"), "{}", gap.detail);
}

#[db_test(engine)]
async fn two_links_swapped_are_named_as_reordered(db: TestDatabase) {
    let (cohort, runs, _) = history(&db).await;
    assert!(verify(&cohort).await.intact);
    exec(
        db.pool(),
        "UPDATE public.ledger_link SET link_id = 1000 WHERE link_id = 2;
         UPDATE public.ledger_link SET link_id = 2 WHERE link_id = 3;
         UPDATE public.ledger_link SET link_id = 3 WHERE link_id = 1000;",
    )
    .await;
    let r = verify(&cohort).await;
    let b = r.first_break().unwrap();
    assert_eq!(
        (b.link_id, b.kind, b.record.clone()),
        (Some(2), BreakKind::Reordered, format!("run {}", runs[1]))
    );
    assert!(b.detail.contains("does not follow link 1"), "{}", b.detail);
}

/// Rewrites every link from 2 on as someone with write access to the whole
/// ledger could: each record through `edit`, each digest and hash again.
async fn rewrite(pool: &PgPool, edit: impl Fn(LinkKind, &str) -> String) {
    let all = links(pool).await;
    let mut prev = all[0].link.clone();
    for l in &all[1..] {
        let k = kind(&l.kind);
        let record = edit(k, &l.record);
        let digest = chain::digest(&record);
        let link = chain::link_hash(&prev, l.link_id, k, l.subject_id, &digest);
        sqlx::query(
            "UPDATE public.ledger_link SET record = $2, digest = $3, prev = $4, link = $5 WHERE link_id = $1",
        )
        .bind(l.link_id)
        .bind(&record)
        .bind(&digest)
        .bind(&prev)
        .bind(&link)
        .execute(pool)
        .await
        .unwrap();
        prev = link;
    }
}

#[db_test(engine)]
async fn pruning_writes_a_checkpoint_and_a_recorded_head_catches_a_rewrite(db: TestDatabase) {
    let (cohort, runs, hold) = history(&db).await;
    let recorded: ChainHead = verify(&cohort).await.head.unwrap();

    // Backdate the history 200 days, rows and links alike: on its own the
    // chain cannot tell (it is whole), but the head an auditor wrote down
    // is no longer in it.
    exec(
        db.pool(),
        "UPDATE public.sweep_run SET started_at = started_at - interval '200 days', \
           settled_at = settled_at - interval '200 days';
         ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_reach;
         UPDATE public.retention_hold SET created_at = created_at - interval '200 days', \
           released_at = released_at - interval '200 days';
         ALTER TABLE public.retention_hold ENABLE ALWAYS TRIGGER retention_hold_reach;",
    )
    .await;
    let shift = Duration::days(200).num_microseconds().unwrap();
    rewrite(db.pool(), |k, record| match k {
        LinkKind::Run => {
            let mut r: RunRecord = serde_json::from_str(record).unwrap();
            r.started_at -= shift;
            r.settled_at = r.settled_at.map(|t| t - shift);
            chain::canonical(&r)
        }
        LinkKind::HoldPlaced => {
            let mut r: HoldRecord = serde_json::from_str(record).unwrap();
            r.created_at -= shift;
            chain::canonical(&r)
        }
        LinkKind::HoldReleased => {
            let mut r: ReleaseRecord = serde_json::from_str(record).unwrap();
            r.released_at -= shift;
            chain::canonical(&r)
        }
        _ => record.to_owned(),
    })
    .await;
    let alone = verify(&cohort).await;
    assert!(alone.intact, "{:?}", alone.breaks);
    let expected: ExpectedHead = recorded.spelling().parse().unwrap();
    let r = cohort.verify_chain(Some(expected)).await.unwrap();
    let b = r.first_break().unwrap();
    assert_eq!((b.link_id, b.kind), (Some(5), BreakKind::Changed), "{b}");
    assert!(
        b.detail.contains("no longer holds the head"),
        "{}",
        b.detail
    );

    // The pruner deletes the old runs and the old hold, and links a
    // checkpoint standing for their links: the chain still verifies.
    let mut config = test_config();
    config.prune.runs_older_than = Some(days(90));
    config.prune.inactive_holds_older_than = Some(days(90));
    let pruner = PrunerConfig::from_config(&config).unwrap().unwrap();
    let pruned = cohort.prune(PruneRequest::new(pruner)).await.unwrap();
    assert_eq!((pruned.runs, pruned.holds), (2, 1));
    let all = links(db.pool()).await;
    let tail: Vec<_> = all[5..].iter().map(|l| l.kind.as_str()).collect();
    assert_eq!(tail, vec!["checkpoint", "checkpoint"], "runs, then holds");
    assert!(all[5]
        .record
        .contains(&format!(r#""link_id":2,"digest":"{}""#, all[1].digest)));
    // Verified under the policy that pruned: its limits allow the
    // checkpoints' cutoffs, so no warning.
    let pruning = engine_cohort_on(db.pool().clone(), config.clone()).await;
    let after = verify(&pruning).await;
    assert!(after.intact, "{:?}", after.breaks);
    assert_eq!((after.records_pruned, after.records_checked), (4, 0));
    assert_eq!(after.checkpoints.len(), 2);
    assert!(after.checkpoints[0].succeeded_before.is_some());
    assert!(after.checkpoints[1].holds_before.is_some());
    assert!(after.warnings.is_empty(), "{:?}", after.warnings);
    let _ = (runs, hold);
    // Verified under a policy that prunes nothing (the handle without
    // [cohort.prune]): it allows no checkpoint, so each cutoff is warned of.
    let strict = verify(&cohort).await;
    assert!(strict.intact);
    let unexpected = strict
        .warnings
        .iter()
        .filter(|w| w.contains("does not prune"))
        .count();
    assert!(unexpected >= 2, "{:?}", strict.warnings);

    // A checkpoint cannot be dropped to hide a deletion.
    exec(
        db.pool(),
        "DELETE FROM public.ledger_link WHERE link_id = 7",
    )
    .await;
    let r = verify(&cohort).await;
    let kinds: Vec<_> = r.breaks.iter().map(|b| (b.link_id, b.kind)).collect();
    assert_eq!(
        kinds,
        vec![(Some(4), BreakKind::Missing), (Some(5), BreakKind::Missing)],
        "the hold's two links, no longer stood for: {:?}",
        r.breaks
    );
}

#[db_test(engine)]
async fn concurrent_settles_wait_for_the_chain_and_make_one_gapless_chain(db: TestDatabase) {
    let replicas = [
        engine_cohort_on(db.pool().clone(), test_config()).await,
        engine_cohort_on(db.pool().clone(), test_config()).await,
        engine_cohort_on(db.pool().clone(), test_config()).await,
    ];
    // The chain's lock, held by the test: every settle waits at it.
    let mut gate = db.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(r#"cohort.chain:"public"."ledger_link""#)
        .execute(&mut *gate)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for (i, c) in replicas.iter().enumerate() {
        for tenant in [TENANT_A, TENANT_B] {
            let c = c.clone();
            let _ = i;
            tasks.push(tokio::spawn(async move {
                c.sweep(SweepRequest::tenanted(tenant, now()).dry_run(true))
                    .await
                    .unwrap()
                    .run_id
            }));
        }
    }
    wait_until(
        "six settles to wait at the chain's lock",
        std::time::Duration::from_secs(60),
        async || {
            count(
                db.pool(),
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .await
                == 6
        },
    )
    .await;
    assert_eq!(
        links(db.pool()).await.len(),
        1,
        "none linked while the lock is held"
    );
    gate.rollback().await.unwrap();
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    let all = links(db.pool()).await;
    let numbers: Vec<i64> = all.iter().map(|l| l.link_id).collect();
    assert_eq!(numbers, (1..=7).collect::<Vec<_>>());
    let mut linked: Vec<Uuid> = all[1..].iter().filter_map(|l| l.subject_id).collect();
    linked.sort();
    ids.sort();
    assert_eq!(linked, ids);
    let r = verify(&replicas[0]).await;
    assert!(r.intact, "{:?}", r.breaks);
    assert_eq!(r.records_checked, 6);
}

#[db_test(engine)]
async fn verify_reads_with_select_only_and_refuses_a_ledger_before_the_chain(db: TestDatabase) {
    let (_, _, _) = history(&db).await;
    exec(
        db.pool(),
        "CREATE ROLE chain_auditor LOGIN PASSWORD 'a';
         GRANT USAGE ON SCHEMA public TO chain_auditor;
         GRANT SELECT ON ALL TABLES IN SCHEMA public TO chain_auditor;",
    )
    .await;
    let pool = pool_as(&db, "chain_auditor", "a", 2).await;
    let reader = Cohort::builder(pool)
        .config(test_config())
        .build_unvalidated()
        .unwrap();
    let r = reader.verify_chain(None).await.unwrap();
    assert!(r.intact, "{:?}", r.breaks);
    assert_eq!(r.links, 5);

    // A ledger still at version 18 has no chain: refused, named.
    let old = empty_db().await;
    let mut conn = old.pool().acquire().await.unwrap();
    for m in cohort::schema::migrations("public").unwrap() {
        if m.version <= 18 {
            sqlx::raw_sql(sqlx::AssertSqlSafe(m.sql))
                .execute(&mut *conn)
                .await
                .unwrap();
        }
    }
    let c = Cohort::builder(old.pool().clone())
        .config(test_config())
        .build_unvalidated()
        .unwrap();
    let e = c.verify_chain(None).await.unwrap_err();
    assert!(e.to_string().contains("version 18"), "{e}");
    assert!(e.to_string().contains("cohort migrate"), "{e}");
}

/// Appends a link by hand, as someone with write access could: the next
/// number, the head's hash as `prev`.
async fn append(pool: &PgPool, kind: LinkKind, record: &str, covers: &[i64]) {
    let head = links(pool).await.pop().unwrap();
    let id = head.link_id + 1;
    let digest = chain::digest(record);
    let link = chain::link_hash(&head.link, id, kind, None, &digest);
    sqlx::query(
        "INSERT INTO public.ledger_link (link_id, kind, record, digest, prev, link, covers) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(id)
    .bind(kind.as_str())
    .bind(record)
    .bind(&digest)
    .bind(&head.link)
    .bind(&link)
    .bind(covers)
    .execute(pool)
    .await
    .unwrap();
}

#[db_test(engine)]
async fn a_forged_checkpoint_is_named_when_its_cutoffs_miss_and_warned_of_against_the_policy(
    db: TestDatabase,
) {
    let (_, runs, _) = history(&db).await;
    // Run 2 deleted by hand, and a checkpoint appended for it that claims
    // a cutoff from before the run settled: the cutoff does not reach it.
    let victim = links(db.pool()).await[2].clone();
    delete_run_by_hand(db.pool(), runs[1]).await;
    let old = chrono::Utc::now() - Duration::days(400);
    let record = |before: chrono::DateTime<chrono::Utc>| {
        chain::canonical(&chain::CheckpointRecord {
            cutoffs: chain::PruneCutoffs {
                succeeded_before: Some(before.timestamp_micros()),
                ..Default::default()
            },
            pruned: vec![chain::PrunedLink {
                link_id: victim.link_id,
                digest: victim.digest.clone(),
            }],
        })
    };
    append(
        db.pool(),
        LinkKind::Checkpoint,
        &record(old),
        &[victim.link_id],
    )
    .await;
    let mut config = test_config();
    config.prune.runs_older_than = Some(days(90));
    let cohort = engine_cohort_on(db.pool().clone(), config).await;
    let r = verify(&cohort).await;
    let b = r.first_break().unwrap();
    assert_eq!(
        (b.link_id, b.kind, b.record.clone()),
        (Some(3), BreakKind::Missing, format!("run {}", runs[1]))
    );
    assert!(b.detail.contains("cutoffs do not reach it"), "{}", b.detail);
    assert_eq!(r.checkpoints.len(), 1);

    // A cutoff that reaches it, newer than the policy allows: the chain
    // holds, and verify warns.
    exec(
        db.pool(),
        "DELETE FROM public.ledger_link WHERE kind = 'checkpoint'",
    )
    .await;
    append(
        db.pool(),
        LinkKind::Checkpoint,
        &record(chrono::Utc::now()),
        &[victim.link_id],
    )
    .await;
    let r = verify(&cohort).await;
    assert!(r.intact, "{:?}", r.breaks);
    assert_eq!(r.records_pruned, 1);
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(
        r.warnings[0].contains("keeps them until"),
        "{}",
        r.warnings[0]
    );
    // A cutoff after the checkpoint itself: no pass writes that.
    exec(
        db.pool(),
        "DELETE FROM public.ledger_link WHERE kind = 'checkpoint'",
    )
    .await;
    append(
        db.pool(),
        LinkKind::Checkpoint,
        &record(chrono::Utc::now() + Duration::days(30)),
        &[victim.link_id],
    )
    .await;
    let r = verify(&cohort).await;
    assert!(
        r.breaks
            .iter()
            .any(|b| b.record == "checkpoint" && b.detail.contains("after the checkpoint itself")),
        "{:?}",
        r.breaks
    );
}
