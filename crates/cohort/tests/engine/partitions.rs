//! Opt-in partition purge (`partitions = "drop"`) on a real server: whole
//! expired partitions are detached and dropped, audited with their row
//! counts; a partition holding a held row, an entity with handlers, and a
//! partition whose locks are busy all stay on the row path (or wait for the
//! next run); validation names what the table lacks.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL

use crate::support;
use cohort_test_macros::db_test;

use std::collections::BTreeSet;

use cohort::holds::HoldRequest;
use cohort::policy::PolicyFile;
use cohort::{Cohort, Error, SweepRequest};
use cohort_pgtemp::TestDatabase;
use sqlx::Row;
use support::*;

const EVENT_ID: &str = "c1d2e3f4-a5b6-4c7d-8e9f-0a1b2c3d4e5f";

/// Tenantless events purged after 30 days (summary audit); `audit` and
/// `extra` change the category and the entity.
fn policy(audit: &str, extra: &str) -> String {
    format!(
        r#"
[cohort]
partition_lock_timeout = "1s"

[[entity]]
name = "Event"
id = "{EVENT_ID}"
table = "app.events"
category = "events"
anchor = "created_at"
tenantless = true
partitions = "drop"
{extra}

[[category]]
name = "events"
strategy = "purge"
period = "30d"
audit = "{audit}"
"#
    )
}

/// `app.events`, range-partitioned by month on `created_at`, 2026-01 to
/// 2026-06 plus a default partition. `now()` is 2026-06-01, so the cutoff
/// is 2026-05-02: January to April are wholly expired, May straddles the
/// cutoff, June is young. Rows: 10 per month on days 1..=10 of months
/// 1..=5, ids `month*100 + day`; 3 rows with NULL anchor in the default
/// partition; 2 young rows in June.
const TABLES: &str = "CREATE SCHEMA app;
    CREATE TABLE app.events (id bigint NOT NULL, created_at timestamptz, body text)
        PARTITION BY RANGE (created_at);
    CREATE UNIQUE INDEX ON app.events (id, created_at);
    CREATE TABLE app.events_2026_01 PARTITION OF app.events FOR VALUES FROM ('2026-01-01Z') TO ('2026-02-01Z');
    CREATE TABLE app.events_2026_02 PARTITION OF app.events FOR VALUES FROM ('2026-02-01Z') TO ('2026-03-01Z');
    CREATE TABLE app.events_2026_03 PARTITION OF app.events FOR VALUES FROM ('2026-03-01Z') TO ('2026-04-01Z');
    CREATE TABLE app.events_2026_04 PARTITION OF app.events FOR VALUES FROM ('2026-04-01Z') TO ('2026-05-01Z');
    CREATE TABLE app.events_2026_05 PARTITION OF app.events FOR VALUES FROM ('2026-05-01Z') TO ('2026-06-01Z');
    CREATE TABLE app.events_2026_06 PARTITION OF app.events FOR VALUES FROM ('2026-06-01Z') TO ('2026-07-01Z');
    CREATE TABLE app.events_default PARTITION OF app.events DEFAULT;
    CREATE INDEX ON app.events (created_at);
    INSERT INTO app.events
      SELECT m * 100 + d, make_timestamptz(2026, m, d, 12, 0, 0, 'UTC'), 'event'
      FROM generate_series(1, 5) m, generate_series(1, 10) d;
    INSERT INTO app.events VALUES (901, NULL, 'no anchor'), (902, NULL, 'no anchor'), (903, NULL, 'no anchor'),
      (601, '2026-06-01T06:00:00Z', 'young'), (602, '2026-06-02T06:00:00Z', 'young');";

async fn setup(audit: &str, extra: &str) -> (TestDatabase, Cohort) {
    let db = migrated_db().await;
    exec(db.pool(), TABLES).await;
    let cohort = build(&db, &policy(audit, extra)).await.unwrap();
    (db, cohort)
}

async fn build(db: &TestDatabase, policy: &str) -> Result<Cohort, Error> {
    Cohort::builder(db.pool().clone())
        .policy(PolicyFile::parse(policy)?)
        .build()
        .await
}

async fn partitions(pool: &sqlx::PgPool) -> BTreeSet<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'app.events'::regclass",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

async fn ids(pool: &sqlx::PgPool) -> BTreeSet<i64> {
    sqlx::query_scalar("SELECT id FROM app.events")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// (affected, held, skipped, null_anchor) of the run's only summary.
async fn summary(pool: &sqlx::PgPool, run: uuid::Uuid) -> (i64, i64, i64, i64) {
    let r = sqlx::query(
        "SELECT affected_count, held_count, skipped_count, null_anchor_count \
         FROM public.sweep_run_entity_summary WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(pool)
    .await
    .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

fn expired_ids(months: std::ops::RangeInclusive<i64>) -> BTreeSet<i64> {
    months
        .flat_map(|m| (1..=10).map(move |d| m * 100 + d))
        .collect()
}

#[tokio::test]
async fn expired_partitions_are_dropped_whole_and_the_rest_goes_row_by_row() {
    let (db, cohort) = setup("summary", "").await;
    let before = ids(db.pool()).await;
    let result = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");

    // January to April are gone as tables; May, June and the default stay.
    let left = partitions(db.pool()).await;
    assert_eq!(
        left,
        ["events_2026_05", "events_2026_06", "events_default"]
            .map(String::from)
            .into()
    );
    // May straddles the cutoff (2026-05-02T00:00Z): its one older row
    // (2026-05-01 12:00) went through the row path.
    let mut gone = expired_ids(1..=4);
    gone.insert(501);
    let expected: BTreeSet<i64> = before.difference(&gone).copied().collect();
    assert_eq!(ids(db.pool()).await, expected);
    // One summary, exact: 40 dropped with their partitions + 1 by the row path.
    assert_eq!(summary(db.pool(), result.run_id).await, (41, 0, 0, 3));
    assert_eq!(result.entities[0].affected, 41);

    // A second run finds nothing more to do and drops nothing.
    let again = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(summary(db.pool(), again.run_id).await, (0, 0, 0, 3));
    assert_eq!(partitions(db.pool()).await, left);
}

#[tokio::test]
async fn a_partition_with_a_held_row_stays_and_only_its_unheld_rows_go() {
    let (db, cohort) = setup("per_row", "").await;
    let entity = uuid::Uuid::parse_str(EVENT_ID).unwrap();
    cohort
        .create_hold(HoldRequest::new(entity, "205", "litigation"))
        .await
        .unwrap();
    let result = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");

    let left = partitions(db.pool()).await;
    assert!(
        left.contains("events_2026_02"),
        "held partition kept: {left:?}"
    );
    for dropped in ["events_2026_01", "events_2026_03", "events_2026_04"] {
        assert!(
            !left.contains(dropped),
            "{dropped} should be dropped: {left:?}"
        );
    }
    let remaining = ids(db.pool()).await;
    assert!(remaining.contains(&205), "the held row is kept");
    for gone in expired_ids(1..=4).into_iter().filter(|id| *id != 205) {
        assert!(!remaining.contains(&gone), "{gone} should be purged");
    }
    // 39 unheld expired rows + May 1st; the held row counted as held.
    assert_eq!(summary(db.pool(), result.run_id).await, (40, 1, 0, 3));

    // Per-row audit: one detail per purged row, whichever path took it,
    // each record id exactly once.
    let details: Vec<String> = sqlx::query_scalar(
        "SELECT record_id FROM public.sweep_run_row_detail WHERE run_id = $1 ORDER BY record_id",
    )
    .bind(result.run_id)
    .fetch_all(db.pool())
    .await
    .unwrap();
    let mut expected: Vec<String> = expired_ids(1..=4)
        .into_iter()
        .filter(|id| *id != 205)
        .chain([501])
        .map(|id| id.to_string())
        .collect();
    expected.sort();
    assert_eq!(details, expected);
}

/// RS-014: a held partition's other rows go in one statement (one
/// transaction), not batch by batch through the row path, even with a
/// batch of two rows; exactly audited.
#[db_test(migrated)]
async fn a_held_partition_s_other_rows_go_in_one_statement(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    // Which transaction deleted each row of February.
    exec(
        db.pool(),
        "CREATE TABLE app.deleted (id bigint, xact xid8);
         CREATE FUNCTION app.record() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN INSERT INTO app.deleted VALUES (OLD.id, pg_current_xact_id()); RETURN OLD; END $$;
         CREATE TRIGGER record AFTER DELETE ON app.events_2026_02 FOR EACH ROW EXECUTE FUNCTION app.record();",
    )
    .await;
    let text = policy("per_row", "").replace(
        "partition_lock_timeout = \"1s\"",
        "partition_lock_timeout = \"1s\"\nsweep_batch_size = 2",
    );
    let cohort = build(&db, &text).await.unwrap();
    let entity = uuid::Uuid::parse_str(EVENT_ID).unwrap();
    cohort
        .create_hold(HoldRequest::new(entity, "205", "litigation"))
        .await
        .unwrap();
    let result = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");
    let (rows, transactions): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT xact) FROM app.deleted")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(
        (rows, transactions),
        (9, 1),
        "one statement, not batches of two"
    );
    assert!(partitions(db.pool()).await.contains("events_2026_02"));
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM app.events_2026_02")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(left, [205], "only the held row stays");
    // Audited exactly: one detail per purged row, the held one counted.
    assert_eq!(summary(db.pool(), result.run_id).await, (40, 1, 0, 3));
    let february: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM public.sweep_run_row_detail WHERE run_id = $1 AND record_id LIKE '2__'",
    )
    .bind(result.run_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(february, 9);
}

#[tokio::test]
async fn an_entity_with_handlers_goes_through_the_row_path() {
    let handler = r#"
[[entity.handler]]
name = "notify"
command = ["/bin/true"]
"#;
    let (db, cohort) = setup("summary", handler).await;
    let result = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");
    // No partition dropped: every handler needs its row's capture.
    assert_eq!(partitions(db.pool()).await.len(), 7);
    assert_eq!(summary(db.pool(), result.run_id).await, (41, 0, 0, 3));
    let queued: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM public.sweep_row_handler_status WHERE run_id = $1",
    )
    .bind(result.run_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(queued, 41, "one piece of work per purged row");
}

#[tokio::test]
async fn a_partition_whose_locks_are_busy_waits_for_the_next_run() {
    let (db, cohort) = setup("summary", "").await;
    // A long read of March holds its ACCESS SHARE lock: detaching March
    // cannot get its lock within the 1 s time-out.
    let mut reader = db.pool().acquire().await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT count(*) FROM app.events_2026_03;")
        .execute(&mut *reader)
        .await
        .unwrap();
    let result = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");
    let left = partitions(db.pool()).await;
    assert!(!left.contains("events_2026_01") && !left.contains("events_2026_02"));
    assert!(left.contains("events_2026_03") && left.contains("events_2026_04"));
    // Nothing from March on was touched row by row either: it waits.
    let remaining = ids(db.pool()).await;
    assert!(expired_ids(3..=4).is_subset(&remaining));
    assert!(remaining.contains(&501));
    // 20 dropped; the 21 rows left past the cutoff are reported skipped.
    assert_eq!(summary(db.pool(), result.run_id).await, (20, 0, 21, 3));

    sqlx::raw_sql("COMMIT").execute(&mut *reader).await.unwrap();
    let next = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(summary(db.pool(), next.run_id).await, (21, 0, 0, 3));
    assert!(!partitions(db.pool()).await.contains("events_2026_04"));
}

#[tokio::test]
async fn a_hold_placed_while_the_drop_waits_keeps_its_partition() {
    let (db, cohort) = setup("summary", "").await;
    // Another session places a hold on a January row the way Cohort does
    // (locking the row, then inserting the hold) and commits only while
    // the sweep, which did not see it when it looked, already waits for
    // January's locks: the re-check under those locks must see it.
    let mut placer = db.pool().acquire().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT id FROM app.events WHERE id = 105 FOR KEY SHARE; \
         INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, reason, created_at) \
         VALUES (gen_random_uuid(), '{EVENT_ID}', '105', 'late hold', now());"
    )))
    .execute(&mut *placer)
    .await
    .unwrap();
    let sweep = tokio::spawn({
        let cohort = cohort.clone();
        async move { cohort.sweep(SweepRequest::tenantless(now())).await }
    });
    // The sweep waits for January's locks (a real lock wait, not a guess
    // at how long it takes to get there).
    wait_for_lock_wait(db.pool()).await;
    sqlx::raw_sql("COMMIT").execute(&mut *placer).await.unwrap();
    let result = sweep.await.unwrap().unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");

    let left = partitions(db.pool()).await;
    assert!(left.contains("events_2026_01"), "{left:?}");
    assert!(!left.contains("events_2026_02"), "{left:?}");
    let remaining = ids(db.pool()).await;
    assert!(remaining.contains(&105), "the row held meanwhile is kept");
    assert!(!remaining.contains(&104) && !remaining.contains(&106));
    assert_eq!(summary(db.pool(), result.run_id).await, (40, 1, 0, 3));
}

#[tokio::test]
async fn dry_runs_count_and_drop_nothing() {
    let (db, _) = setup("summary", "").await;
    let mut p = PolicyFile::parse(&policy("summary", "")).unwrap();
    p.config.dry_run = true;
    let cohort = Cohort::builder(db.pool().clone())
        .policy(p)
        .build()
        .await
        .unwrap();
    let digest = table_digest(db.pool(), "app.events").await;
    let result = cohort
        .sweep(SweepRequest::tenantless(now()).dry_run(true))
        .await
        .unwrap();
    assert!(result.dry_run);
    assert_eq!(result.entities[0].affected, 41);
    assert_eq!(partitions(db.pool()).await.len(), 7);
    assert_eq!(table_digest(db.pool(), "app.events").await, digest);
}

#[db_test(migrated)]
async fn validation_names_what_partition_purge_needs(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.plain (id bigint PRIMARY KEY, created_at timestamptz);
         CREATE TABLE app.by_list (id bigint, kind text, created_at timestamptz) PARTITION BY LIST (kind);
         CREATE TABLE app.tenanted (id bigint, tenant_id uuid, created_at timestamptz,
             PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
         CREATE TABLE app.referenced (id bigint, created_at timestamptz,
             PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
         CREATE TABLE app.referenced_2026 PARTITION OF app.referenced FOR VALUES FROM ('2026-01-01Z') TO ('2027-01-01Z');
         CREATE TABLE app.child (id bigint PRIMARY KEY, ref_id bigint, ref_at timestamptz,
             FOREIGN KEY (ref_id, ref_at) REFERENCES app.referenced (id, created_at));
",
    )
    .await;
    let entity = |name: &str, id: &str, table: &str, extra: &str| {
        format!(
            "[[entity]]\nname = \"{name}\"\nid = \"{id}\"\ntable = \"{table}\"\ncategory = \"events\"\n\
             anchor = \"created_at\"\npartitions = \"drop\"\n{extra}\n"
        )
    };
    let text = [
        entity(
            "Plain",
            "10000000-0000-4000-8000-000000000001",
            "app.plain",
            "tenantless = true",
        ),
        entity(
            "ByList",
            "10000000-0000-4000-8000-000000000002",
            "app.by_list",
            "tenantless = true",
        ),
        entity(
            "Tenanted",
            "10000000-0000-4000-8000-000000000003",
            "app.tenanted",
            "",
        ),
        entity(
            "Referenced",
            "10000000-0000-4000-8000-000000000004",
            "app.referenced",
            "tenantless = true",
        ),
        "[[category]]\nname = \"events\"\nstrategy = \"purge\"\nperiod = \"30d\"\n".to_string(),
    ]
    .concat();
    let err = build(&db, &text).await.unwrap_err();
    let Error::Validation(problems) = &err else {
        panic!("expected validation problems, got {err}");
    };
    let text = problems.to_string();
    for expected in [
        "Plain: partitions = \"drop\" needs a partitioned table, but app.plain is not one",
        "ByList: partitions = \"drop\" needs app.by_list range-partitioned on the anchor alone",
        "it is partitioned by LIST (\"kind\")",
        "Referenced: partitions = \"drop\": foreign key \"child_ref_id_ref_at_fkey\" of app.child references app.referenced",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    // A tenant column is no refusal: its partitions go when every tenant's
    // rows are due (composite_keys.rs).
    assert!(!text.contains("Tenanted:"), "{text}");
    assert_eq!(ledger_rows(db.pool(), "public").await, 0);

    // A category that never purges makes the setting pointless: refused.
    let anonymise = format!(
        "{}[[category]]\nname = \"events\"\nstrategy = \"soft_delete\"\nperiod = \"30d\"\n",
        entity(
            "Plain",
            "10000000-0000-4000-8000-000000000001",
            "app.referenced",
            "tenantless = true\nsoft_delete = \"created_at\""
        )
    );
    let err = build(&db, &anonymise).await.unwrap_err();
    assert!(err.to_string().contains("never purges"), "{err}");

    // Without partition purge (or with a category that may anonymise or
    // soft-delete) a key unique only with the anchor is not enough.
    let rows_only = format!(
        "{}[[category]]\nname = \"events\"\nstrategy = \"purge\"\nperiod = \"30d\"\n",
        entity(
            "Rows",
            "10000000-0000-4000-8000-000000000006",
            "app.referenced",
            "tenantless = true"
        )
        .replace("partitions = \"drop\"\n", "")
    );
    let err = build(&db, &rows_only).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("accepted only with partitions = \"drop\" and a category that only purges"),
        "{err}"
    );

    // The newcomer's audit_log: partitioned by month, a tenant column and
    // the key (id, created_at). The message points at the composite record
    // key that retains it (composite_keys.rs), not at partition purge,
    // which would be refused next for the tenant column.
    let tenanted_rows = format!(
        "{}[[category]]\nname = \"events\"\nstrategy = \"purge\"\nperiod = \"30d\"\n",
        entity(
            "Tenanted",
            "10000000-0000-4000-8000-000000000003",
            "app.tenanted",
            ""
        )
        .replace("partitions = \"drop\"\n", "")
    );
    let err = build(&db, &tenanted_rows).await.unwrap_err().to_string();
    assert!(
        err.contains("declare the primary key as a composite record key, record_id = [\"id\", \"logged_at\"]"),
        "{err}"
    );
    assert!(
        !err.contains("accepted only with partitions = \"drop\""),
        "{err}"
    );

    // Unknown values are refused when the file is read.
    let bad = policy("summary", "").replace("partitions = \"drop\"", "partitions = \"truncate\"");
    let err = PolicyFile::parse(&bad).unwrap_err().to_string();
    assert!(
        err.contains("partitions = \"truncate\" is unknown"),
        "{err}"
    );
}

#[db_test(migrated)]
async fn the_role_must_be_able_to_drop_every_partition(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    let suffix = &db.name()[db.name().len() - 12..];
    let (app, other) = (
        format!("cohort_app_{suffix}"),
        format!("cohort_other_{suffix}"),
    );
    // The application role owns the table and every partition but March.
    exec(
        db.pool(),
        &format!(
            "CREATE ROLE {app} LOGIN PASSWORD 'app-secret' NOSUPERUSER;
             CREATE ROLE {other} NOLOGIN;
             GRANT USAGE ON SCHEMA public, app TO {app};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {app};
             ALTER TABLE app.events OWNER TO {app};
             ALTER TABLE app.events_2026_01 OWNER TO {app};
             ALTER TABLE app.events_2026_02 OWNER TO {app};
             ALTER TABLE app.events_2026_03 OWNER TO {other};
             ALTER TABLE app.events_2026_04 OWNER TO {app};
             ALTER TABLE app.events_2026_05 OWNER TO {app};
             ALTER TABLE app.events_2026_06 OWNER TO {app};
             ALTER TABLE app.events_default OWNER TO {app};"
        ),
    )
    .await;
    let pool = pool_as(&db, &app, "app-secret", 3).await;
    let Err(err) = Cohort::builder(pool.clone())
        .policy(PolicyFile::parse(&policy("summary", "")).unwrap())
        .build()
        .await
    else {
        panic!("a role that cannot drop March must be refused");
    };
    let text = err.to_string();
    assert!(
        text.contains(&format!("the current role is not a member of the owner of app.events_2026_03 (owner \"{other}\")")),
        "{text}"
    );
    assert!(!text.contains("events_2026_01"), "{text}");

    // Once the role may drop March too, it runs, and drops.
    exec(
        db.pool(),
        &format!("ALTER TABLE app.events_2026_03 OWNER TO {app};"),
    )
    .await;
    let cohort = Cohort::builder(pool.clone())
        .policy(PolicyFile::parse(&policy("summary", "")).unwrap())
        .build()
        .await
        .unwrap();
    let result = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");
    assert_eq!(summary(&pool, result.run_id).await, (41, 0, 0, 3));
    assert_eq!(partitions(&pool).await.len(), 3);
}

#[tokio::test]
async fn two_sweeps_at_once_drop_each_partition_once_and_count_each_row_once() {
    let (db, cohort) = setup("per_row", "").await;
    let runs = both(&cohort).await;
    let mut affected = 0;
    for result in &runs {
        assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");
        affected += summary(db.pool(), result.run_id).await.0;
    }
    assert_eq!(affected, 41, "every purged row counted by exactly one run");
    let details: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT record_id) FROM public.sweep_run_row_detail WHERE record_id IS NOT NULL",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let all: i64 = sqlx::query_scalar("SELECT count(*) FROM public.sweep_run_row_detail")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!((details, all), (41, 41), "one detail per purged row");
    assert_eq!(partitions(db.pool()).await.len(), 3);
}

/// A partition whose hold gate is not granted within
/// `partition_lock_timeout` (a subject hold being placed: here the test
/// holds the gate open) is left for the next run, as one whose own lock
/// is not granted: the run succeeds and drops nothing, and once the gate
/// is free the next run drops every expired partition. (Before, the wait
/// failed the entity; so could the re-check of the parent's partitions
/// while another run detached one, which is how two sweeps at once could
/// fail on a busy server.)
#[tokio::test]
async fn a_partition_waiting_too_long_for_the_hold_gate_is_left_for_the_next_run() {
    let (db, cohort) = setup("summary", "").await;
    let before = partitions(db.pool()).await;
    let mut gate = db.pool().begin().await.unwrap();
    sqlx::query(
        "SELECT pg_catalog.pg_advisory_xact_lock(1131375665, \
         'public.retention_hold'::pg_catalog.regclass::pg_catalog.oid::int4)",
    )
    .execute(&mut *gate)
    .await
    .unwrap();
    let sweep = || cohort.sweep(SweepRequest::tenantless(now()));
    let waited = tokio::time::timeout(std::time::Duration::from_secs(60), sweep())
        .await
        .expect("the sweep waits for the gate no longer than its time-out")
        .unwrap();
    assert_eq!(waited.status, cohort::RunStatus::Succeeded, "{waited:?}");
    assert_eq!(summary(db.pool(), waited.run_id).await.0, 0);
    assert_eq!(partitions(db.pool()).await, before, "no partition dropped");

    gate.rollback().await.unwrap();
    let freed = sweep().await.unwrap();
    assert_eq!(freed.status, cohort::RunStatus::Succeeded, "{freed:?}");
    assert_eq!(summary(db.pool(), freed.run_id).await, (41, 0, 0, 3));
    assert_eq!(partitions(db.pool()).await.len(), 3);
}

async fn both(cohort: &Cohort) -> Vec<cohort::SweepResult> {
    let a = tokio::spawn({
        let cohort = cohort.clone();
        async move { cohort.sweep(SweepRequest::tenantless(now())).await }
    });
    let b = tokio::spawn({
        let cohort = cohort.clone();
        async move { cohort.sweep(SweepRequest::tenantless(now())).await }
    });
    vec![a.await.unwrap().unwrap(), b.await.unwrap().unwrap()]
}

#[db_test(migrated)]
async fn an_erasure_never_drops_partitions(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.visits (id bigint NOT NULL, created_at timestamptz NOT NULL, user_id bigint NOT NULL)
             PARTITION BY RANGE (created_at);
         CREATE UNIQUE INDEX ON app.visits (id, created_at);
         CREATE TABLE app.visits_2026_01 PARTITION OF app.visits FOR VALUES FROM ('2026-01-01Z') TO ('2026-02-01Z');
         CREATE TABLE app.visits_2026_02 PARTITION OF app.visits FOR VALUES FROM ('2026-02-01Z') TO ('2026-03-01Z');
         INSERT INTO app.visits SELECT g, make_timestamptz(2026, 1 + g % 2, 1 + g % 20, 0, 0, 0, 'UTC'), g % 3
             FROM generate_series(1, 60) g;",
    )
    .await;
    let policy = format!(
        r#"
[[entity]]
name = "Visit"
id = "{EVENT_ID}"
table = "app.visits"
category = "visits"
anchor = "created_at"
tenantless = true
partitions = "drop"
subjects = ["user_id"]

[[category]]
name = "visits"
strategy = "purge"
period = "30d"
legal_min = "10d"
"#
    );
    let cohort = build(&db, &policy).await.unwrap();
    let result = cohort
        .erase(cohort::erasure::ErasureRequest::tenantless(
            cohort::erasure::ErasureScope::new("1"),
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");
    // Only the subject's 20 rows go; both partitions and every other
    // subject's rows stay.
    assert_eq!(result.entities[0].affected, 20);
    let left: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT user_id, count(*) FROM app.visits GROUP BY user_id ORDER BY user_id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(left, vec![(0, 20), (2, 20)]);
    let parts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'app.visits'::regclass",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(parts, 2);
}

#[tokio::test]
async fn a_hold_in_another_spelling_of_the_id_keeps_its_partition() {
    let (db, cohort) = setup("summary", "").await;
    let entity = uuid::Uuid::parse_str(EVENT_ID).unwrap();
    // `0205` and ` 205 ` name record 205 (a bigint key) like `205` does.
    cohort
        .create_hold(HoldRequest::new(entity, "0205", "litigation"))
        .await
        .unwrap();
    assert!(cohort.is_held(entity, " 205 ").await.unwrap());
    let result = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");
    assert!(partitions(db.pool()).await.contains("events_2026_02"));
    assert!(ids(db.pool()).await.contains(&205));
    assert_eq!(summary(db.pool(), result.run_id).await, (40, 1, 0, 3));
}

/// A subject hold keeps the partition holding one of the subject's rows,
/// as a record hold does, though it names no record: the partition check
/// reads every row when a subject hold is active.
#[db_test(migrated)]
async fn a_partition_with_a_row_of_a_held_subject_stays(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    exec(
        db.pool(),
        "ALTER TABLE app.events ADD COLUMN user_id text; \
         UPDATE app.events SET user_id = 'user-' || id; \
         UPDATE app.events SET user_id = 'held-user' WHERE id IN (305, 601)",
    )
    .await;
    let cohort = build(&db, &policy("summary", "subjects = [\"user_id\"]"))
        .await
        .unwrap();
    cohort
        .create_hold(HoldRequest::subject("held-user", "litigation"))
        .await
        .unwrap();
    let result = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");
    let left = partitions(db.pool()).await;
    assert!(
        left.contains("events_2026_03"),
        "held partition kept: {left:?}"
    );
    for dropped in ["events_2026_01", "events_2026_02", "events_2026_04"] {
        assert!(
            !left.contains(dropped),
            "{dropped} should be dropped: {left:?}"
        );
    }
    let remaining = ids(db.pool()).await;
    assert!(remaining.contains(&305), "the subject's row is kept");
    for gone in expired_ids(1..=4).into_iter().filter(|id| *id != 305) {
        assert!(!remaining.contains(&gone), "{gone} should be purged");
    }
    assert_eq!(summary(db.pool(), result.run_id).await, (40, 1, 0, 3));
    let by_subject: i64 = sqlx::query_scalar(
        "SELECT held_by_subject_count FROM public.sweep_run_entity_summary WHERE run_id = $1",
    )
    .bind(result.run_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(by_subject, 1);
}

/// Cohort on a table pg_partman manages (Debian's `postgresql-15-partman`,
/// installed by `.ci/run`): partman creates the monthly partitions, Cohort
/// drops the expired ones. Exact to the cutoff (pg_partman's own retention
/// drops whole months only), a held row keeps its month, partman's
/// maintenance goes on working after Cohort's drops, and the primary key
/// `(id, created_at)` is the only index, as partman tables often have.
#[db_test(migrated)]
async fn partman_creates_the_partitions_and_cohort_drops_the_expired_ones(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA partman; CREATE EXTENSION pg_partman SCHEMA partman;
         CREATE SCHEMA app;
         CREATE TABLE app.events (id bigint NOT NULL, created_at timestamptz NOT NULL, body text,
             PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
         SELECT partman.create_parent('app.events', 'created_at', 'native', 'monthly',
             p_start_partition := '2025-01-01');
         -- Ten rows a month from 2025-01 to 2026-05 (17 months), ids month * 100 + day.
         INSERT INTO app.events
           SELECT (extract(year FROM m) - 2025) * 1200 + extract(month FROM m) * 100 + d,
                  m + make_interval(days => d - 1, hours => 12), 'event'
           FROM generate_series(timestamptz '2025-01-01Z', '2026-05-01Z', interval '1 month') m,
                generate_series(1, 10) d;",
    )
    .await;
    let policy = policy("per_row", "").replace("period = \"30d\"", "period = \"90d\"");
    let cohort = build(&db, &policy).await.unwrap();
    // March 2025 (ids 301..=310) has a held row.
    let entity = uuid::Uuid::parse_str(EVENT_ID).unwrap();
    cohort
        .create_hold(HoldRequest::new(entity, "305", "litigation"))
        .await
        .unwrap();
    let before = ids(db.pool()).await;
    assert_eq!(before.len(), 170);
    let months_before = partitions(db.pool()).await;
    assert!(months_before.contains("events_p2025_01") && months_before.contains("events_default"));

    // now 2026-06-01, 90 days: the cutoff is 2026-03-03T00:00Z.
    let result = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");
    // What must be left, from the ids (month * 100 + day, years apart by 1200).
    let must_stay: BTreeSet<i64> = before
        .iter()
        .copied()
        .filter(|id| {
            let (year, month, day) = (2025 + id / 1200, (id % 1200) / 100, id % 100);
            (year, month, day) >= (2026, 3, 3) || *id == 305
        })
        .collect();
    assert_eq!(
        ids(db.pool()).await,
        must_stay,
        "exact to the cutoff, the held row kept"
    );

    // Every wholly expired month without a hold is gone as a table; March
    // 2025 (held) and the straddling March 2026 stay.
    let left = partitions(db.pool()).await;
    assert!(left.contains("events_p2025_03"), "{left:?}");
    assert!(left.contains("events_p2026_03"), "{left:?}");
    for gone in [
        "events_p2025_01",
        "events_p2025_02",
        "events_p2025_04",
        "events_p2026_02",
    ] {
        assert!(!left.contains(gone), "{gone}: {left:?}");
    }
    // Audited exactly: one detail per removed row, the held one counted.
    let removed = (before.len() - must_stay.len()) as i64;
    assert_eq!(summary(db.pool(), result.run_id).await, (removed, 1, 0, 0));
    let details: i64 =
        sqlx::query_scalar("SELECT count(*) FROM public.sweep_run_row_detail WHERE run_id = $1")
            .bind(result.run_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(details, removed);

    // pg_partman's maintenance still works on the table Cohort pruned, and
    // keeps creating the months ahead.
    exec(db.pool(), "SELECT partman.run_maintenance('app.events')").await;
    let after = partitions(db.pool()).await;
    assert!(
        after.is_superset(&left),
        "maintenance dropped nothing of Cohort's: {after:?}"
    );
    let ahead: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM partman.show_partitions('app.events') p
         WHERE (partman.show_partition_info(p.partition_schemaname || '.' || p.partition_tablename)).child_start_time > now()",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(ahead >= 1, "partman still premakes future months");
}
