//! CDC markers (RS-029) on a real logical replication slot: with
//! `cdc_marker = true` every mutating batch transaction of a sweep and of
//! an erasure carries exactly one transactional logical decoding message
//! (prefix `cohort`, JSON content naming the run, entity, strategy and
//! rows), and application transactions carry none; without it no
//! transaction does.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::collections::BTreeMap;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::{Cohort, RunStatus, SweepRequest};
use cohort_pgtemp::Cluster;
use sqlx::PgPool;
use support::*;

/// One decoded transaction: its messages with the `cohort` prefix, and
/// its row changes to the application's tables (schema `app`).
#[derive(Debug, Default)]
struct Decoded {
    markers: Vec<serde_json::Value>,
    app_changes: usize,
    /// Row changes to the partitioned table's schema, `part`.
    part_changes: usize,
}

/// Every transaction the slot decoded since the last read, by xid, in
/// commit order (`test_decoding` with xids).
async fn decoded(pool: &PgPool) -> Vec<(i64, Decoded)> {
    // The harness's clusters commit asynchronously, and decoding reads
    // only WAL that is flushed: a synchronous commit that wrote WAL
    // flushes everything before it (a transaction that wrote none would
    // commit asynchronously whatever the setting).
    exec(
        pool,
        "CREATE TABLE IF NOT EXISTS public.cdc_flush (x int); \
         BEGIN; SET LOCAL synchronous_commit = on; INSERT INTO public.cdc_flush VALUES (1); COMMIT;",
    )
    .await;
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "SELECT xid::text::int8, data FROM pg_logical_slot_get_changes('cohort_cdc', NULL, NULL, \
           'include-xids', '1', 'skip-empty-xacts', '1')",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut order: Vec<i64> = Vec::new();
    let mut by_xid: BTreeMap<i64, Decoded> = BTreeMap::new();
    for (xid, data) in rows {
        if !order.contains(&xid) {
            order.push(xid);
        }
        let t = by_xid.entry(xid).or_default();
        if let Some(rest) = data.strip_prefix("message: transactional: 1 prefix: cohort, ") {
            let content = rest
                .split_once("content:")
                .unwrap_or_else(|| panic!("no content in {data}"))
                .1;
            t.markers.push(serde_json::from_str(content).unwrap());
        } else if data.starts_with("message:") {
            panic!("an unexpected message: {data}");
        } else if data.starts_with("table app.") {
            t.app_changes += 1;
        } else if data.starts_with("table part.") {
            t.part_changes += 1;
        }
    }
    order
        .into_iter()
        .map(|x| (x, by_xid.remove(&x).unwrap()))
        .collect()
}

/// A cluster of the test's own that decodes (`wal_level = logical`),
/// migrated, seeded with `tables`, with the slot `cohort_cdc`
/// (`test_decoding`) created after the seed.
async fn decoding_server(tables: &str) -> (Cluster, PgPool) {
    let cluster =
        Cluster::start_with_settings("wal_level=logical;max_replication_slots=4;max_wal_senders=4")
            .await
            .unwrap();
    let pool = PgPool::connect(cluster.url()).await.unwrap();
    cohort::schema::migrate(&mut pool.acquire().await.unwrap(), "public")
        .await
        .unwrap();
    exec(&pool, tables).await;
    exec(
        &pool,
        "SELECT pg_create_logical_replication_slot('cohort_cdc', 'test_decoding')",
    )
    .await;
    (cluster, pool)
}

async fn handle(pool: &PgPool, cdc_marker: bool) -> Cohort {
    Cohort::builder(pool.clone())
        .config(cohort::CohortConfig {
            cdc_marker,
            ..batches_of(2)
        })
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .declaration(engine_entities().remove(1))
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn every_retention_transaction_carries_one_marker_and_the_applications_none() {
    let (_cluster, pool) = decoding_server(ENGINE_TABLES).await;
    let cohort = handle(&pool, true).await;
    assert!(
        cohort
            .ready()
            .await
            .unwrap()
            .warnings
            .iter()
            .all(|w| !w.contains("wal_level")),
        "wal_level is logical here"
    );

    // The application's own change, then a sweep (3 notes past the
    // cutoff, in batches of 2) and an erasure (tenant B's contacts).
    exec(
        &pool,
        "INSERT INTO app.notes (tenant_id, created_at, body) \
           VALUES ('aaaaaaaa-0000-0000-0000-00000000000a', now(), 'app'); \
         DELETE FROM app.notes WHERE body = 'app'",
    )
    .await;
    let sweep = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(sweep.status, RunStatus::Succeeded);
    let erasure = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_B,
            ErasureScope::new("cccccccc-0000-0000-0000-00000000000c"),
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(erasure.run.status, RunStatus::Succeeded);
    let changed: u64 = sweep.entities.iter().map(|e| e.affected).sum::<u64>()
        + erasure.run.entities.iter().map(|e| e.affected).sum::<u64>();
    assert!(changed >= 5, "{changed}");

    let transactions = decoded(&pool).await;
    let application: Vec<&Decoded> = transactions
        .iter()
        .map(|(_, t)| t)
        .filter(|t| t.markers.is_empty() && t.app_changes > 0)
        .collect();
    assert_eq!(application.len(), 1, "{transactions:?}");
    assert_eq!(application[0].app_changes, 2, "the insert and the delete");
    let marked: Vec<&Decoded> = transactions
        .iter()
        .map(|(_, t)| t)
        .filter(|t| !t.markers.is_empty())
        .collect();
    // Exactly one marker each, naming its run and counting its rows.
    let mut marked_rows = 0;
    let mut batches_by_run: BTreeMap<String, usize> = BTreeMap::new();
    for t in &marked {
        assert_eq!(t.markers.len(), 1, "{t:?}");
        let m = &t.markers[0];
        let run = m["run_id"].as_str().unwrap().to_owned();
        assert!(
            run == sweep.run_id.to_string() || run == erasure.run.run_id.to_string(),
            "{m}"
        );
        assert_eq!(m["rows"].as_u64().unwrap() as usize, t.app_changes, "{m}");
        assert!(
            matches!(m["entity"].as_str(), Some("Note" | "Contact")),
            "{m}"
        );
        assert!(
            matches!(m["strategy"].as_str(), Some("purge" | "anonymise")),
            "{m}"
        );
        marked_rows += t.app_changes;
        *batches_by_run.entry(run).or_default() += 1;
    }
    assert_eq!(marked_rows as u64, changed);
    // Every transaction that changed the application's rows is the
    // application's own or a marked one.
    assert_eq!(
        transactions
            .iter()
            .filter(|(_, t)| t.app_changes > 0)
            .count(),
        marked.len() + 1
    );
    assert!(
        batches_by_run[&sweep.run_id.to_string()] >= 2,
        "{batches_by_run:?}"
    );

    // Off (the default): retention transactions carry no marker.
    let quiet = handle(&pool, false).await;
    let swept = quiet
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert!(swept.entities.iter().map(|e| e.affected).sum::<u64>() > 0);
    let transactions = decoded(&pool).await;
    assert!(
        transactions.iter().any(|(_, t)| t.app_changes > 0),
        "{transactions:?}"
    );
    assert!(
        transactions.iter().all(|(_, t)| t.markers.is_empty()),
        "{transactions:?}"
    );
}

/// Month partitions of `part.events`, 10 rows in each of January to May:
/// with a 30-day period at 2026-06-01 (cutoff 2026-05-02) January to April
/// are wholly expired (dropped) and May straddles the cutoff (its one
/// expired row goes by the row path); June is empty.
const PARTITIONED: &str = "CREATE SCHEMA part;
    CREATE TABLE part.events (id bigint NOT NULL, created_at timestamptz, body text)
        PARTITION BY RANGE (created_at);
    CREATE UNIQUE INDEX ON part.events (id, created_at);
    CREATE TABLE part.events_2026_01 PARTITION OF part.events FOR VALUES FROM ('2026-01-01Z') TO ('2026-02-01Z');
    CREATE TABLE part.events_2026_02 PARTITION OF part.events FOR VALUES FROM ('2026-02-01Z') TO ('2026-03-01Z');
    CREATE TABLE part.events_2026_03 PARTITION OF part.events FOR VALUES FROM ('2026-03-01Z') TO ('2026-04-01Z');
    CREATE TABLE part.events_2026_04 PARTITION OF part.events FOR VALUES FROM ('2026-04-01Z') TO ('2026-05-01Z');
    CREATE TABLE part.events_2026_05 PARTITION OF part.events FOR VALUES FROM ('2026-05-01Z') TO ('2026-06-01Z');
    CREATE TABLE part.events_2026_06 PARTITION OF part.events FOR VALUES FROM ('2026-06-01Z') TO ('2026-07-01Z');
    CREATE INDEX ON part.events (created_at);
    INSERT INTO part.events
      SELECT m * 100 + d, make_timestamptz(2026, m, d, 12, 0, 0, 'UTC'), 'event'
      FROM generate_series(1, 5) m, generate_series(1, 10) d;";

/// The policy file's `cdc_marker`, on a partition purge: each partition
/// dropped, and each batch of the straddling partition's rows, is one
/// marked transaction (a dropped partition's rows are not decoded; its
/// marker counts them).
#[tokio::test]
async fn a_partition_purge_marks_each_partition_and_each_batch() {
    let (_cluster, pool) = decoding_server(PARTITIONED).await;
    let policy = cohort::policy::PolicyFile::parse(
        r#"
[cohort]
cdc_marker = true
sweep_batch_size = 4

[[entity]]
name = "Event"
id = "6f1d2c55-2f0e-4e6c-9d59-5c0b6f3b8a22"
table = "part.events"
category = "events"
anchor = "created_at"
tenantless = true
partitions = "drop"

[[category]]
name = "events"
strategy = "purge"
period = "30d"
"#,
    )
    .unwrap();
    let cohort = Cohort::builder(pool.clone())
        .policy(policy)
        .build()
        .await
        .unwrap();
    let run = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    // January to April (40 rows) dropped; of May's rows (days 1..=10 at
    // noon) only day 1 is before the cutoff, 2026-05-02: the row path.
    let affected = run.entities[0].affected;
    assert_eq!(affected, 41, "{run:?}");

    let transactions = decoded(&pool).await;
    let marked: Vec<&Decoded> = transactions
        .iter()
        .map(|(_, t)| t)
        .filter(|t| !t.markers.is_empty())
        .collect();
    assert!(marked.iter().all(|t| t.markers.len() == 1), "{marked:?}");
    let rows: u64 = marked
        .iter()
        .map(|t| t.markers[0]["rows"].as_u64().unwrap())
        .sum();
    assert_eq!(rows, affected);
    for t in &marked {
        assert_eq!(t.markers[0]["run_id"], run.run_id.to_string());
        assert_eq!(t.markers[0]["entity"], "Event");
        assert_eq!(t.markers[0]["strategy"], "purge");
    }
    // Four partitions dropped, each in its own marked transaction, and
    // the row path's batches marked with the rows they deleted.
    let drops = marked
        .iter()
        .filter(|t| t.part_changes == 0 && t.markers[0]["rows"] == 10)
        .count();
    assert_eq!(drops, 4, "{marked:?}");
    for t in marked.iter().filter(|t| t.part_changes > 0) {
        assert_eq!(
            t.markers[0]["rows"].as_u64().unwrap() as usize,
            t.part_changes
        );
    }
}

/// A marker no consumer could read is advice: `cdc_marker` on a server
/// whose `wal_level` is not `logical` (the shared test cluster's, unless
/// `DATABASE_URL` names one that decodes).
#[db_test(engine)]
async fn cdc_markers_without_logical_decoding_are_advice(db: TestDatabase) {
    let level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(db.pool())
        .await
        .unwrap();
    let cohort = handle(db.pool(), true).await;
    let warnings = cohort.ready().await.unwrap().warnings.clone();
    let advised = warnings
        .iter()
        .any(|w| w.starts_with(&format!("cdc_marker is on, but wal_level is {level}")));
    assert_eq!(advised, level != "logical", "{level}: {warnings:?}");
    // Off, never.
    let quiet = handle(db.pool(), false).await;
    assert!(quiet
        .ready()
        .await
        .unwrap()
        .warnings
        .iter()
        .all(|w| !w.starts_with("cdc_marker")));
}
