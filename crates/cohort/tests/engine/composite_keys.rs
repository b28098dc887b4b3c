//! Composite record keys (RS-038) on a real server: `record_id = ["a", "b"]`
//! in a policy file. Every mutating strategy sweeps a table keyed by
//! `(order_id, line_no)` in batches whose anchors tie, so only the key
//! orders them; a hold on one key (given in another spelling) keeps
//! exactly that row; the ledger's details carry the key as a JSON array;
//! the newcomer's month-partitioned, multi-tenant `audit_log` with the
//! primary key `(id, logged_at)` is retained on the row path with record
//! holds, subject holds and erasure; bad keys and keys that are not unique
//! are refused with nothing written.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL

use crate::support;
use cohort_test_macros::db_test;

use std::collections::BTreeSet;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::guarded::{Guarded, GuardedDeletion};
use cohort::holds::HoldRequest;
use cohort::policy::PolicyFile;
use cohort::{Cohort, Error, PreviewRequest, SweepRequest};
use cohort_pgtemp::TestDatabase;
use support::*;
use uuid::Uuid;

const LINE_ID: &str = "7a0c4a52-3b1e-4c55-8f0e-6d2b9a1c0e11";
const LOG_ID: &str = "8b1d5b63-4c2f-4d66-9a1f-7e3cab2d1f22";
const ACTOR_X: &str = "11111111-1111-4111-8111-111111111111";
const ACTOR_Y: &str = "22222222-2222-4222-8222-222222222222";

/// `app.order_lines`, keyed by `(order_id, line_no)`. Tenant A has orders
/// 1 to 3 with lines 1 to 5, every one created at the same instant long
/// past the cutoff (so batches break anchor ties by the key alone),
/// except order 3's lines 4 and 5, which are young; tenant B has order 4.
const LINES: &str = "CREATE SCHEMA app;
    CREATE TABLE app.order_lines (
        order_id bigint NOT NULL, line_no int NOT NULL, tenant_id uuid NOT NULL,
        note text, created_at timestamptz,
        is_deleted boolean NOT NULL DEFAULT false, deleted_at timestamptz, anonymised_at timestamptz,
        PRIMARY KEY (order_id, line_no));
    CREATE INDEX ON app.order_lines (created_at);
    CREATE TABLE app.order_lines_archive (
        order_id bigint NOT NULL, line_no int NOT NULL, tenant_id uuid NOT NULL,
        note text, created_at timestamptz,
        is_deleted boolean NOT NULL DEFAULT false, deleted_at timestamptz, anonymised_at timestamptz,
        archived_at timestamptz NOT NULL, run_id uuid NOT NULL,
        PRIMARY KEY (order_id, line_no));
    INSERT INTO app.order_lines (order_id, line_no, tenant_id, note, created_at)
      SELECT o, l, CASE WHEN o = 4 THEN 'bbbbbbbb-0000-0000-0000-00000000000b'::uuid
                        ELSE 'aaaaaaaa-0000-0000-0000-00000000000a'::uuid END,
             'line ' || o || '/' || l,
             CASE WHEN o = 3 AND l >= 4 THEN timestamptz '2026-05-30T00:00:00Z'
                  ELSE timestamptz '2026-01-01T00:00:00Z' END
      FROM generate_series(1, 4) o, generate_series(1, 5) l;";

fn lines_policy(strategy: &str, extra: &str) -> String {
    let archive = if strategy == "archive" {
        "archive_table = \"app.order_lines_archive\""
    } else {
        ""
    };
    format!(
        r#"
[cohort]
sweep_batch_size = 3
{extra}

[[entity]]
name = "OrderLine"
id = "{LINE_ID}"
table = "app.order_lines"
category = "lines"
anchor = "created_at"
record_id = ["order_id", "line_no"]
tenant = "tenant_id"
soft_delete = "is_deleted"
deleted_at = "deleted_at"
anonymised_at = "anonymised_at"
anonymise = {{ note = "null" }}
{archive}

[[category]]
name = "lines"
strategy = "{strategy}"
period = "30d"
audit = "per_row"
"#
    )
}

async fn build(db: &TestDatabase, policy: &str) -> Result<Cohort, Error> {
    Cohort::builder(db.pool().clone())
        .config(test_config())
        .policy(PolicyFile::parse(policy)?)
        .build()
        .await
}

fn line_entity() -> Uuid {
    Uuid::parse_str(LINE_ID).unwrap()
}

/// `(order_id, line_no)` of tenant A's lines that `strategy` has not changed.
async fn untouched_lines(pool: &sqlx::PgPool, strategy: &str) -> BTreeSet<(i64, i32)> {
    let changed = match strategy {
        "purge" | "archive" => "FALSE",
        "soft_delete" => "is_deleted",
        _ => "anonymised_at IS NOT NULL OR note IS NULL",
    };
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT order_id, line_no FROM app.order_lines \
         WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a' AND NOT ({changed})"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// The record ids of a run's row details.
async fn detail_ids(pool: &sqlx::PgPool, run: Uuid) -> BTreeSet<String> {
    sqlx::query_scalar("SELECT record_id FROM public.sweep_run_row_detail WHERE run_id = $1")
        .bind(run)
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

#[tokio::test]
async fn every_strategy_sweeps_a_composite_key_in_tied_batches_and_a_hold_keeps_exactly_its_row() {
    for (strategy, lanes) in [
        ("purge", 1),
        ("soft_delete", 1),
        ("anonymise", 1),
        ("archive", 1),
        ("purge", 2),
        ("anonymise", 2),
        ("archive", 2),
    ] {
        let db = migrated_db().await;
        exec(db.pool(), LINES).await;
        let extra = format!("sweep_parallelism = {lanes}");
        let cohort = build(&db, &lines_policy(strategy, &extra)).await.unwrap();
        // Held in another spelling of the same key: the order as a string.
        let hold = cohort
            .create_hold(HoldRequest::new(line_entity(), r#"["1", 2]"#, "dispute").tenant(TENANT_A))
            .await
            .unwrap();
        assert_eq!(hold.record_id.as_deref(), Some("[1, 2]"), "{strategy}");
        assert!(cohort.is_held(line_entity(), "[1, 2]").await.unwrap());
        assert!(!cohort.is_held(line_entity(), "[2, 1]").await.unwrap());

        let result = cohort
            .sweep(SweepRequest::tenanted(TENANT_A, now()))
            .await
            .unwrap();
        let e = result.entity("OrderLine").unwrap();
        // 13 old lines of tenant A, one held.
        assert_eq!((e.affected, e.held), (12, 1), "{strategy} × {lanes}");
        let expected_left: BTreeSet<(i64, i32)> = [(1, 2), (3, 4), (3, 5)].into();
        assert_eq!(
            untouched_lines(db.pool(), strategy).await,
            expected_left,
            "{strategy} × {lanes}"
        );
        // Tenant B's order is another tenant's: untouched.
        assert_eq!(
            count(
                db.pool(),
                "SELECT count(*) FROM app.order_lines WHERE order_id = 4 \
                 AND NOT is_deleted AND anonymised_at IS NULL AND note IS NOT NULL"
            )
            .await,
            5
        );
        // One detail per changed row, the key as its JSON array.
        let expected: BTreeSet<String> = (1..=3)
            .flat_map(|o| (1..=5).map(move |l| (o, l)))
            .filter(|k| !expected_left.contains(k))
            .map(|(o, l)| format!("[{o}, {l}]"))
            .collect();
        assert_eq!(detail_ids(db.pool(), result.run_id).await, expected);
        // The archive holds an exact copy of each row it took, and no other.
        let archived: BTreeSet<String> = sqlx::query_scalar(
            "SELECT '[' || order_id || ', ' || line_no || ']' FROM app.order_lines_archive \
             WHERE note = 'line ' || order_id || '/' || line_no AND run_id = $1",
        )
        .bind(result.run_id)
        .fetch_all(db.pool())
        .await
        .unwrap()
        .into_iter()
        .collect();
        let want = if strategy == "archive" {
            expected.clone()
        } else {
            BTreeSet::new()
        };
        assert_eq!(archived, want, "{strategy} × {lanes}");
        // A second sweep finds nothing left to do.
        let again = cohort
            .sweep(SweepRequest::tenanted(TENANT_A, now()))
            .await
            .unwrap();
        assert_eq!(again.entity("OrderLine").unwrap().affected, 0);
    }
}

#[db_test(migrated)]
async fn a_composite_key_given_badly_is_refused_and_nothing_is_written(db: TestDatabase) {
    exec(db.pool(), LINES).await;
    let cohort = build(&db, &lines_policy("purge", "")).await.unwrap();
    for (raw, says) in [
        ("1", "not a JSON array"),
        ("[1]", "has 1 part(s); the record key has 2"),
        ("[1, 2, 3]", "has 3 part(s)"),
        (r#"[1, "two"]"#, "part 2"),
        ("[1.5, 2]", "part 1"),
        ("[null, 2]", "part 1"),
        ("[1, 99999999999]", "out of range"),
    ] {
        let err = cohort
            .create_hold(HoldRequest::new(line_entity(), raw, "x").tenant(TENANT_A))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidInput(m) if m.contains(says)),
            "{raw}: {err}"
        );
    }
    // A well-formed key of no row is refused too.
    let err = cohort
        .create_hold(HoldRequest::new(line_entity(), "[9, 9]", "x").tenant(TENANT_A))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM public.retention_hold").await,
        0
    );
}

#[db_test(migrated)]
async fn guarded_deletion_names_held_composite_keys_and_runs_otherwise(db: TestDatabase) {
    exec(db.pool(), LINES).await;
    let cohort = build(&db, &lines_policy("purge", "")).await.unwrap();
    cohort
        .create_hold(HoldRequest::new(line_entity(), "[2, 3]", "dispute").tenant(TENANT_A))
        .await
        .unwrap();
    let outcome = cohort
        .guarded_delete(
            GuardedDeletion::new(line_entity(), ["[2, 2]", r#"["2", "3"]"#]).tenant(TENANT_A),
            |_tx| Box::pin(async { Ok(()) }),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Guarded::Protected {
            held: vec!["[2, 3]".to_owned()]
        }
    );
    let outcome = cohort
        .guarded_delete(
            GuardedDeletion::new(line_entity(), ["[2, 2]"]).tenant(TENANT_A),
            |tx| {
                Box::pin(async move {
                    let done = sqlx::query(
                        "DELETE FROM app.order_lines WHERE order_id = 2 AND line_no = 2",
                    )
                    .execute(&mut *tx)
                    .await?;
                    Ok(done.rows_affected())
                })
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome, Guarded::Completed(1));
}

/// The newcomer's table: month partitions, a tenant column, the primary
/// key `(id, logged_at)`. Ids repeat across months (the key is the pair).
const AUDIT_LOG: &str = "CREATE SCHEMA app;
    CREATE TABLE app.audit_log (
        id bigint NOT NULL, logged_at timestamptz NOT NULL, tenant_id uuid NOT NULL,
        actor_id uuid, action text, PRIMARY KEY (id, logged_at))
      PARTITION BY RANGE (logged_at);
    CREATE TABLE app.audit_log_2026_01 PARTITION OF app.audit_log FOR VALUES FROM ('2026-01-01Z') TO ('2026-02-01Z');
    CREATE TABLE app.audit_log_2026_02 PARTITION OF app.audit_log FOR VALUES FROM ('2026-02-01Z') TO ('2026-03-01Z');
    CREATE TABLE app.audit_log_2026_03 PARTITION OF app.audit_log FOR VALUES FROM ('2026-03-01Z') TO ('2026-04-01Z');
    CREATE TABLE app.audit_log_2026_04 PARTITION OF app.audit_log FOR VALUES FROM ('2026-04-01Z') TO ('2026-05-01Z');
    CREATE TABLE app.audit_log_2026_05 PARTITION OF app.audit_log FOR VALUES FROM ('2026-05-01Z') TO ('2026-06-01Z');
    CREATE TABLE app.audit_log_2026_06 PARTITION OF app.audit_log FOR VALUES FROM ('2026-06-01Z') TO ('2026-07-01Z');
    CREATE INDEX ON app.audit_log (logged_at);
    CREATE INDEX ON app.audit_log (actor_id);
    INSERT INTO app.audit_log
      SELECT d, make_timestamptz(2026, m, d, 0, 0, 0, 'UTC'),
             CASE WHEN d % 2 = 0 THEN 'aaaaaaaa-0000-0000-0000-00000000000a'::uuid
                  ELSE 'bbbbbbbb-0000-0000-0000-00000000000b'::uuid END,
             CASE WHEN d <= 2 THEN '11111111-1111-4111-8111-111111111111'::uuid
                  WHEN d <= 4 THEN '22222222-2222-4222-8222-222222222222'::uuid END,
             'viewed'
      FROM generate_series(1, 5) m, generate_series(1, 10) d;";

fn audit_log_policy() -> String {
    format!(
        r#"
[cohort]
sweep_batch_size = 4

[[entity]]
name = "AuditLog"
id = "{LOG_ID}"
table = "app.audit_log"
category = "audit"
anchor = "logged_at"
record_id = ["id", "logged_at"]
tenant = "tenant_id"
subjects = [{{ column = "actor_id", kind = "user" }}]

[[category]]
name = "audit"
strategy = "purge"
period = "30d"
audit = "per_row"
"#
    )
}

fn log_entity() -> Uuid {
    Uuid::parse_str(LOG_ID).unwrap()
}

/// `(id, month)` of tenant A's rows left.
async fn tenant_a_log(pool: &sqlx::PgPool) -> BTreeSet<(i64, i32)> {
    sqlx::query_as(
        "SELECT id, extract(month FROM logged_at AT TIME ZONE 'UTC')::int FROM app.audit_log \
         WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a'",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

#[tokio::test]
async fn the_partitioned_multi_tenant_audit_log_is_retained_on_the_row_path_with_holds_and_erasure()
{
    let db = migrated_db().await;
    exec(db.pool(), AUDIT_LOG).await;
    let cohort = build(&db, &audit_log_policy()).await.unwrap();

    // Erasure first: actor Y's rows of tenant A (id 4, every month) go,
    // whatever their age; the details name each by its pair.
    let erased = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new(ACTOR_Y).kind("user"),
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(erased.run.entity("AuditLog").unwrap().affected, 5);
    let expected: BTreeSet<String> = (1..=5)
        .map(|m| format!("[4, \"2026-0{m}-04T00:00:00.000000Z\"]"))
        .collect();
    assert_eq!(detail_ids(db.pool(), erased.run.run_id).await, expected);

    // A record hold on (6, January), given with another offset, keeps that
    // row and not (6, February), which shares its id; a subject hold on
    // actor X keeps X's rows of tenant A (id 2).
    let hold = cohort
        .create_hold(
            HoldRequest::new(log_entity(), r#"[6, "2026-01-06T01:00:00+01:00"]"#, "audit")
                .tenant(TENANT_A),
        )
        .await
        .unwrap();
    assert_eq!(
        hold.record_id.as_deref(),
        Some(r#"[6, "2026-01-06T00:00:00.000000Z"]"#)
    );
    cohort
        .create_hold(HoldRequest::subject(ACTOR_X, "litigation").kind("user"))
        .await
        .unwrap();

    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let e = result.entity("AuditLog").unwrap();
    // Tenant A: ids 2, 6, 8, 10 left in months 1..=4 (past the cutoff of
    // 2026-05-02) and May's 2, 4 (erased), ... : 4 ids × 4 months = 16
    // past the cutoff, minus (6, Jan) and X's 4 rows of id 2: 11 purged.
    assert_eq!((e.affected, e.held, e.held_by_subject), (11, 5, 4));
    let left = tenant_a_log(db.pool()).await;
    let mut expected: BTreeSet<(i64, i32)> = [(6, 1), (2, 1), (2, 2), (2, 3), (2, 4)].into();
    expected.extend([2, 6, 8, 10].map(|d| (d, 5)));
    assert_eq!(left, expected);
    // Tenant B is another tenant: its 25 rows are all there.
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.audit_log WHERE tenant_id = 'bbbbbbbb-0000-0000-0000-00000000000b'"
        )
        .await,
        25
    );
    let details = detail_ids(db.pool(), result.run_id).await;
    assert_eq!(details.len(), 11);
    assert!(details.contains(r#"[6, "2026-02-06T00:00:00.000000Z"]"#));
    assert!(!details.contains(r#"[6, "2026-01-06T00:00:00.000000Z"]"#));
}

#[db_test(migrated)]
async fn validation_requires_a_unique_not_null_key_of_supported_types(db: TestDatabase) {
    exec(
        db.pool(),
        &format!(
            "{LINES};
             CREATE TABLE app.loose (a bigint NOT NULL, b int, c numeric NOT NULL, created_at timestamptz,
                                     tenant_id uuid NOT NULL);
             CREATE UNIQUE INDEX ON app.loose (a, b);
             CREATE UNIQUE INDEX ON app.loose (a, c);"
        ),
    )
    .await;
    let with_key = |table: &str, key: &str| {
        lines_policy("purge", "")
            .replace("app.order_lines", table)
            .replace(
                r#"record_id = ["order_id", "line_no"]"#,
                &format!("record_id = {key}"),
            )
            .replace("soft_delete = \"is_deleted\"\n", "")
            .replace("deleted_at = \"deleted_at\"\n", "")
            .replace("anonymised_at = \"anonymised_at\"\n", "")
            .replace("anonymise = { note = \"null\" }\n", "")
    };
    for (table, key, says) in [
        (
            "app.order_lines",
            r#"["order_id", "tenant_id"]"#,
            "is not its primary key or a unique index of exactly these columns",
        ),
        (
            "app.order_lines",
            r#"["order_id"]"#,
            "and the record key is \"order_id\" alone",
        ),
        ("app.loose", r#"["a", "b"]"#, "\"b\" allows NULL"),
        (
            "app.loose",
            r#"["a", "c"]"#,
            "a composite key's parts may be",
        ),
        ("app.order_lines", "[]", "record_id = [] names no column"),
        (
            "app.order_lines",
            r#"["order_id", "order_id"]"#,
            "lists the column \"order_id\" twice",
        ),
    ] {
        let err = build(&db, &with_key(table, key)).await.unwrap_err();
        assert!(err.to_string().contains(says), "{key}: {err}");
    }
    // An archive must copy every key column.
    let archive = lines_policy("archive", "").replace(
        "archive_table = \"app.order_lines_archive\"",
        "archive_table = \"app.order_lines_archive\"\narchive_columns = [\"order_id\", \"tenant_id\", \"note\", \"created_at\"]",
    );
    let err = build(&db, &archive).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("the archived columns leave out the record key \"line_no\""),
        "{err}"
    );
    // Nothing was written: every row is still there.
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.order_lines").await,
        20
    );
}

#[tokio::test]
async fn an_archive_copy_whose_key_part_is_rewritten_fails_the_batch_and_deletes_nothing() {
    // First without the verdict (the check made to pass): the rewrite
    // does lose the row's exact copy, so the verdict is what stops it.
    for verdict in [false, true] {
        for lanes in [1, 2] {
            let case = format!("verdict {verdict}, {lanes} lane(s)");
            let db = migrated_db().await;
            exec(db.pool(), LINES).await;
            let extra = format!("sweep_parallelism = {lanes}");
            let cohort = build(&db, &lines_policy("archive", &extra)).await.unwrap();
            // Installed after startup, which refuses such a table.
            exec(
                db.pool(),
                "CREATE FUNCTION app.hook() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
                     IF NEW.order_id = 2 AND NEW.line_no = 3 THEN NEW.line_no := 33; END IF;
                     RETURN NEW; END $$;
                 CREATE TRIGGER hook BEFORE INSERT ON app.order_lines_archive
                     FOR EACH ROW EXECUTE FUNCTION app.hook();",
            )
            .await;
            if !verdict {
                exec(
                    db.pool(),
                    "CREATE OR REPLACE FUNCTION public.retention_archive_check(moved bigint, copied bigint, unmatched bigint)
                     RETURNS boolean LANGUAGE sql VOLATILE AS 'SELECT true'",
                )
                .await;
            }
            let result = cohort
                .sweep(SweepRequest::tenanted(TENANT_A, now()))
                .await
                .unwrap();
            let left = count(
                db.pool(),
                "SELECT count(*) FROM app.order_lines WHERE order_id = 2 AND line_no = 3",
            )
            .await;
            let exact = count(
                db.pool(),
                "SELECT count(*) FROM app.order_lines_archive WHERE order_id = 2 AND line_no = 3",
            )
            .await;
            if verdict {
                let failure = result
                    .failures
                    .iter()
                    .find(|f| f.entity == "OrderLine")
                    .unwrap_or_else(|| panic!("{case}: the batch fails: {result:?}"));
                assert!(
                    failure.error.contains("code=archive_copy_mismatch"),
                    "{case}: {}",
                    failure.error
                );
                assert_eq!((left, exact), (1, 0), "{case}: row kept, nothing copied");
            } else {
                assert_eq!((left, exact), (0, 0), "{case}: deleted without its copy");
            }
        }
    }
}

#[db_test(migrated)]
async fn a_command_handler_receives_each_composite_key_as_a_json_array_with_its_snapshot(
    db: TestDatabase,
) {
    exec(db.pool(), LINES).await;
    let dir = tempfile::tempdir().unwrap();
    // One file per delivery: deliveries run at once.
    let script = format!("cat > \"$(mktemp -p {})\"", dir.path().display());
    let handler = format!(
        "[[entity.handler]]\nname = \"crm\"\ncapture = [\"note\"]\ncommand = [\"sh\", \"-c\", {script:?}]\n"
    );
    // The handler belongs to the entity: after its anonymise line.
    let policy = lines_policy("purge", "").replace(
        "anonymise = { note = \"null\" }\n",
        &format!("anonymise = {{ note = \"null\" }}\n\n{handler}"),
    );
    let cohort = build(&db, &policy).await.unwrap();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.entity("OrderLine").unwrap().affected, 13);
    let report = cohort.dispatcher().flush().await.unwrap();
    assert_eq!((report.delivered, report.dead_lettered), (13, 0));
    let mut seen = BTreeSet::new();
    for file in std::fs::read_dir(dir.path()).unwrap() {
        let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let key = doc["record_id"].as_array().expect("a JSON array").clone();
        let (o, l) = (key[0].as_i64().unwrap(), key[1].as_i64().unwrap());
        assert_eq!(doc["snapshot"]["note"], format!("line {o}/{l}"), "{doc}");
        seen.insert((o, l));
    }
    let expected: BTreeSet<(i64, i64)> = (1..=3)
        .flat_map(|o| (1..=5).map(move |l| (o, l)))
        .filter(|&(o, l)| !(o == 3 && l >= 4))
        .collect();
    assert_eq!(seen, expected);
}

#[db_test(migrated)]
async fn stages_carry_a_composite_key_from_soft_delete_to_purge_past_a_hold(db: TestDatabase) {
    exec(db.pool(), LINES).await;
    let policy = lines_policy("soft_delete", "").replace(
        "audit = \"per_row\"\n",
        "audit = \"per_row\"\n\n[[category.stage]]\nstrategy = \"purge\"\nperiod = \"60d\"\nafter = \"previous\"\n",
    );
    let cohort = build(&db, &policy).await.unwrap();
    cohort
        .create_hold(HoldRequest::new(line_entity(), "[2, 5]", "dispute").tenant(TENANT_A))
        .await
        .unwrap();
    let first = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.order_lines WHERE is_deleted"
        )
        .await,
        12
    );
    // 61 days later the second stage purges what the first soft-deleted.
    let later = now() + chrono::Duration::days(61);
    let second = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, later))
        .await
        .unwrap();
    let left: BTreeSet<(i64, i32)> =
        sqlx::query_as("SELECT order_id, line_no FROM app.order_lines WHERE order_id < 4")
            .fetch_all(db.pool())
            .await
            .unwrap()
            .into_iter()
            .collect();
    // The held line stays; the young lines were soft-deleted by the
    // second sweep (now past the first stage) but not yet purged.
    assert_eq!(left, [(2, 5), (3, 4), (3, 5)].into());
    let purged = detail_ids(db.pool(), second.run_id).await;
    assert!(
        purged.contains("[1, 1]") && !purged.contains("[2, 5]"),
        "{purged:?}"
    );
    assert!(detail_ids(db.pool(), first.run_id).await.contains("[3, 3]"));
}

/// The derive's composite key: `record_id` on two fields, in field order.
#[derive(cohort::Retained)]
#[retain(
    category = "lines",
    anchor = "created_at",
    id = "7a0c4a52-3b1e-4c55-8f0e-6d2b9a1c0e11",
    table = "app.order_lines",
    name = "OrderLine"
)]
#[allow(dead_code)]
struct OrderLineRow {
    #[retain(record_id)]
    order_id: i64,
    #[retain(record_id)]
    line_no: i32,
    tenant_id: Uuid,
    note: Option<String>,
    created_at: chrono::DateTime<chrono::Utc>,
}

#[tokio::test]
async fn the_derive_declares_a_composite_key_in_field_order() {
    use cohort::model::Retained;
    let decl = OrderLineRow::declaration();
    assert_eq!(
        decl.clone().record_key(Vec::<String>::new()),
        decl,
        "adding no key column changes nothing"
    );
    let db = migrated_db().await;
    exec(db.pool(), LINES).await;
    let categories = "[[category]]\nname = \"lines\"\nstrategy = \"purge\"\nperiod = \"30d\"\naudit = \"per_row\"\n";
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .policy(PolicyFile::parse(categories).unwrap())
        .declaration(decl)
        .build()
        .await
        .unwrap();
    let model = cohort.ready().await.unwrap();
    let e = model.entity(line_entity()).unwrap();
    assert_eq!(e.record_key, ["order_id", "line_no"]);
    assert!(e.has_composite_key());
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.entity("OrderLine").unwrap().affected, 13);
    assert!(detail_ids(db.pool(), result.run_id)
        .await
        .contains("[3, 3]"));
}

#[tokio::test]
async fn a_hold_written_by_sql_with_a_key_that_is_no_json_array_stops_the_sweep_and_deletes_nothing(
) {
    let db = migrated_db().await;
    exec(db.pool(), LINES).await;
    let cohort = build(&db, &lines_policy("purge", "")).await.unwrap();
    // A well-formed hold written by SQL protects its row like any other.
    exec(
        db.pool(),
        &format!(
            "INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, tenant_id, reason)
             VALUES (gen_random_uuid(), '{LINE_ID}', '[1, 1]', '{TENANT_A}', 'by sql')"
        ),
    )
    .await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.entity("OrderLine").unwrap().held, 1);
    assert!(untouched_lines(db.pool(), "purge").await.contains(&(1, 1)));
    // One that names no key in Cohort's form fails the entity's sweep
    // loudly instead of protecting nothing.
    exec(
        db.pool(),
        LINES
            .replace(
                "CREATE SCHEMA app;",
                "DROP SCHEMA app CASCADE; CREATE SCHEMA app;",
            )
            .as_str(),
    )
    .await;
    exec(
        db.pool(),
        &format!(
            "INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, tenant_id, reason)
             VALUES (gen_random_uuid(), '{LINE_ID}', '1,1', '{TENANT_A}', 'by hand')"
        ),
    )
    .await;
    let before = table_digest(db.pool(), "app.order_lines").await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(
        result.failures.iter().any(|f| f.entity == "OrderLine"),
        "{result:?}"
    );
    assert_eq!(table_digest(db.pool(), "app.order_lines").await, before);
}

/// Every part type, with values that need escaping: the key text Cohort
/// writes is exactly the `jsonb` array PostgreSQL prints for the parts,
/// and what Rust canonicalises from a user's spelling is the same text.
#[db_test(migrated)]
async fn the_key_text_is_the_jsonb_array_of_its_parts_for_every_part_type(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE EXTENSION IF NOT EXISTS citext;
         CREATE SCHEMA app;
         CREATE TABLE app.tricky (name text NOT NULL, code citext NOT NULL, u uuid NOT NULL,
             n smallint NOT NULL, at timestamptz NOT NULL, day date NOT NULL, local timestamp NOT NULL,
             tenant_id uuid NOT NULL, created_at timestamptz,
             PRIMARY KEY (name, code, u, n, at, day, local));
         INSERT INTO app.tricky VALUES
           ('quote \" back \\ tab \t nl \n bell ' || chr(7) || ' é 雪', 'MiXeD', 'A3F467FE-C5D0-4F17-9897-83C373CC1DC8',
            -7, '2026-01-05T01:02:03.000450+01', '2026-01-05', '2026-01-05 10:00:00.5',
            'aaaaaaaa-0000-0000-0000-00000000000a', '2026-01-01Z'),
           ('plain', 'x', '00000000-0000-4000-8000-000000000000', 0, 'infinity', '-infinity', 'infinity',
            'aaaaaaaa-0000-0000-0000-00000000000a', '2026-01-01Z'),
           ('young', 'y', '00000000-0000-4000-8000-000000000001', 1, '2026-01-01Z', '2026-01-01', '2026-01-01',
            'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-31Z');",
    )
    .await;
    let policy = format!(
        r#"
[[entity]]
name = "Tricky"
id = "{LOG_ID}"
table = "app.tricky"
category = "t"
anchor = "created_at"
record_id = ["name", "code", "u", "n", "at", "day", "local"]

[[category]]
name = "t"
strategy = "purge"
period = "30d"
audit = "per_row"
"#
    );
    let cohort = build(&db, &policy).await.unwrap();
    // PostgreSQL's own jsonb text of each row's parts, as the contract
    // has them (timestamps in UTC with six digits, citext lower case).
    let jsonb: BTreeSet<String> = sqlx::query_scalar(
        r#"SELECT jsonb_build_array(name, lower(code::text), u, n,
               CASE WHEN isfinite(at) THEN to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') ELSE at::text END,
               CASE WHEN isfinite(day) THEN to_char(day, 'YYYY-MM-DD') ELSE day::text END,
               CASE WHEN isfinite(local) THEN to_char(local, 'YYYY-MM-DD"T"HH24:MI:SS.US') ELSE local::text END)::text
           FROM app.tricky WHERE name <> 'young'"#,
    )
    .fetch_all(db.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    // The user's spelling of the tricky row, read by Rust into that text:
    // a hold on it names the row.
    let spelled = serde_json::json!([
        "quote \" back \\ tab \t nl \n bell \u{7} é 雪",
        "mixed",
        "a3f467fec5d04f17989783c373cc1dc8",
        "-7",
        "2026-01-05T00:02:03.00045Z",
        "2026-01-05",
        "2026-01-05T10:00:00.500"
    ])
    .to_string();
    let hold = cohort
        .create_hold(HoldRequest::new(log_entity(), spelled.as_str(), "check").tenant(TENANT_A))
        .await
        .unwrap();
    let held = hold.record_id.clone().unwrap();
    assert!(jsonb.contains(&held), "{held} not in {jsonb:?}");
    assert!(cohort.is_held(log_entity(), &spelled).await.unwrap());
    cohort.release_hold(hold.hold_id).await.unwrap();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.entity("Tricky").unwrap().affected, 2);
    assert_eq!(detail_ids(db.pool(), result.run_id).await, jsonb);
}

/// Partition purge of a tenantless table keyed by `(id, created_at)`: the
/// expired partitions go whole, the one holding a held key stays with
/// that row alone, and every row gone has its detail under its JSON key.
#[db_test(migrated)]
async fn partition_purge_drops_whole_partitions_of_a_composite_key_and_keeps_a_held_one(
    db: TestDatabase,
) {
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.events (id bigint NOT NULL, created_at timestamptz NOT NULL, body text,
             PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
         CREATE TABLE app.events_2026_01 PARTITION OF app.events FOR VALUES FROM ('2026-01-01Z') TO ('2026-02-01Z');
         CREATE TABLE app.events_2026_02 PARTITION OF app.events FOR VALUES FROM ('2026-02-01Z') TO ('2026-03-01Z');
         CREATE TABLE app.events_2026_03 PARTITION OF app.events FOR VALUES FROM ('2026-03-01Z') TO ('2026-04-01Z');
         CREATE TABLE app.events_2026_06 PARTITION OF app.events FOR VALUES FROM ('2026-06-01Z') TO ('2026-07-01Z');
         INSERT INTO app.events
           SELECT d, make_timestamptz(2026, m, d, 0, 0, 0, 'UTC'), 'event'
           FROM unnest(ARRAY[1, 2, 3, 6]) m, generate_series(1, 5) d;",
    )
    .await;
    let policy = format!(
        r#"
[cohort]
partition_lock_timeout = "1s"

[[entity]]
name = "Event"
id = "{LOG_ID}"
table = "app.events"
category = "events"
anchor = "created_at"
tenantless = true
partitions = "drop"
record_id = ["id", "created_at"]

[[category]]
name = "events"
strategy = "purge"
period = "30d"
audit = "per_row"
"#
    );
    let cohort = build(&db, &policy).await.unwrap();
    cohort
        .create_hold(HoldRequest::new(
            log_entity(),
            r#"[3, "2026-02-03T00:00:00Z"]"#,
            "audit",
        ))
        .await
        .unwrap();
    let result = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    let e = result.entity("Event").unwrap();
    assert_eq!((e.affected, e.held), (14, 1), "{result:?}");
    let partitions: BTreeSet<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'app.events'::regclass",
    )
    .fetch_all(db.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(
        partitions,
        ["events_2026_02", "events_2026_06"]
            .map(String::from)
            .into()
    );
    let left: BTreeSet<(i64, i32)> = sqlx::query_as(
        "SELECT id, extract(month FROM created_at AT TIME ZONE 'UTC')::int FROM app.events",
    )
    .fetch_all(db.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    let mut expected: BTreeSet<(i64, i32)> = (1..=5).map(|d| (d, 6)).collect();
    expected.insert((3, 2));
    assert_eq!(left, expected);
    let details = detail_ids(db.pool(), result.run_id).await;
    let want: BTreeSet<String> = [1, 2, 3]
        .into_iter()
        .flat_map(|m| (1..=5).map(move |d| (m, d)))
        .filter(|&(m, d)| (m, d) != (2, 3))
        .map(|(m, d)| format!("[{d}, \"2026-0{m}-0{d}T00:00:00.000000Z\"]"))
        .collect();
    assert_eq!(details, want);
}

const TENANT_C: &str = "cccccccc-0000-0000-0000-00000000000c";

/// The newcomer's audit_log with `partitions = "drop"`: months January to
/// May (and June), tenants A and B (4 rows each a month, ids `m*100+d` and
/// `m*100+50+d`, day `d` of the month).
fn multi_tenant_log(extra_rows: &str) -> String {
    format!(
        "CREATE SCHEMA app;
         CREATE TABLE app.audit_log (
             id bigint NOT NULL, logged_at timestamptz NOT NULL, tenant_id uuid NOT NULL,
             action text, PRIMARY KEY (id, logged_at))
           PARTITION BY RANGE (logged_at);
         CREATE TABLE app.audit_log_2026_01 PARTITION OF app.audit_log FOR VALUES FROM ('2026-01-01Z') TO ('2026-02-01Z');
         CREATE TABLE app.audit_log_2026_02 PARTITION OF app.audit_log FOR VALUES FROM ('2026-02-01Z') TO ('2026-03-01Z');
         CREATE TABLE app.audit_log_2026_03 PARTITION OF app.audit_log FOR VALUES FROM ('2026-03-01Z') TO ('2026-04-01Z');
         CREATE TABLE app.audit_log_2026_04 PARTITION OF app.audit_log FOR VALUES FROM ('2026-04-01Z') TO ('2026-05-01Z');
         CREATE TABLE app.audit_log_2026_05 PARTITION OF app.audit_log FOR VALUES FROM ('2026-05-01Z') TO ('2026-06-01Z');
         CREATE TABLE app.audit_log_2026_06 PARTITION OF app.audit_log FOR VALUES FROM ('2026-06-01Z') TO ('2026-07-01Z');
         CREATE INDEX ON app.audit_log (tenant_id, logged_at);
         INSERT INTO app.audit_log
           SELECT m * 100 + d + CASE WHEN t = 'b' THEN 50 ELSE 0 END,
                  make_timestamptz(2026, m, d, 0, 0, 0, 'UTC'),
                  CASE WHEN t = 'a' THEN '{TENANT_A}'::uuid ELSE '{TENANT_B}'::uuid END, 'viewed'
           FROM generate_series(1, 5) m, generate_series(1, 4) d, unnest(ARRAY['a', 'b']) t;
         {extra_rows}"
    )
}

fn multi_tenant_policy(b_override: bool) -> String {
    let over = if b_override {
        // Spelled in capitals: the same tenant as the rows' uuid.
        format!(
            "\n[[category.override]]\ntenant = \"{}\"\nperiod = \"120d\"\nstrategy = \"purge\"\n",
            TENANT_B.to_uppercase()
        )
    } else {
        String::new()
    };
    format!(
        r#"
[cohort]
partition_lock_timeout = "1s"

[[tenant]]
id = "{TENANT_A}"

[[tenant]]
id = "{tenant_b}"

[[entity]]
name = "AuditLog"
id = "{LOG_ID}"
table = "app.audit_log"
category = "audit"
anchor = "logged_at"
record_id = ["id", "logged_at"]
tenant = "tenant_id"
partitions = "drop"

[[category]]
name = "audit"
strategy = "purge"
period = "30d"
audit = "per_row"
{over}"#,
        // The directory in another spelling of B's uuid: still B.
        tenant_b = TENANT_B.to_uppercase()
    )
}

async fn log_partitions(pool: &sqlx::PgPool) -> BTreeSet<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'app.audit_log'::regclass",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

async fn log_ids(pool: &sqlx::PgPool) -> BTreeSet<i64> {
    sqlx::query_scalar("SELECT id FROM app.audit_log")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// RS-039: a partition of several tenants goes whole only when every row
/// in it is due for its own tenant. First with every tenant on 30 days
/// (and a hold): January to April go (April's held row stays with its
/// partition, alone); then B's 120-day override keeps February to April,
/// and a row of a tenant Cohort does not sweep keeps March, while A's rows
/// in them go by the row path.
#[tokio::test]
async fn a_partition_of_several_tenants_goes_only_when_every_tenants_rows_in_it_are_due() {
    // Every tenant on 30 days: A's pass drops January to April whole,
    // B's rows with them; a held B row keeps April with it alone.
    // An empty partition before them all (issue 55, D3: noted once as
    // empty, never as rows of every tenant).
    let db = migrated_db().await;
    exec(
        db.pool(),
        &multi_tenant_log(
            "CREATE TABLE app.audit_log_2025_12 PARTITION OF app.audit_log FOR VALUES FROM ('2025-12-01Z') TO ('2026-01-01Z');",
        ),
    )
    .await;
    let cohort = build(&db, &multi_tenant_policy(false)).await.unwrap();
    // The preview names the partitions a sweep would drop.
    let preview = cohort
        .preview(PreviewRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let note = preview.entities[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("5 partition(s) wholly before the cutoff would be dropped whole: app.audit_log_2025_12, app.audit_log_2026_01, app.audit_log_2026_02, app.audit_log_2026_03, app.audit_log_2026_04"),
        "{note}"
    );
    cohort
        .create_hold(
            HoldRequest::new(log_entity(), r#"[452, "2026-04-02T00:00:00Z"]"#, "audit")
                .tenant(TENANT_B),
        )
        .await
        .unwrap();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.status, cohort::RunStatus::Succeeded, "{result:?}");
    let e = result.entity("AuditLog").unwrap();
    // Jan-Mar: 8 rows each; April: 7 unheld; May 1st of A by the row path.
    assert_eq!(e.affected, 8 * 3 + 7 + 1, "{result:?}");
    assert_eq!(
        log_partitions(db.pool()).await,
        [
            "audit_log_2026_04",
            "audit_log_2026_05",
            "audit_log_2026_06"
        ]
        .map(String::from)
        .into()
    );
    let mut left: BTreeSet<i64> = [452].into();
    left.extend((1..=4).map(|d| 550 + d));
    left.extend([502, 503, 504]);
    assert_eq!(log_ids(db.pool()).await, left);
    let note = e.note.clone().unwrap_or_default();
    assert!(
        note.contains("partition app.audit_log_2026_01 dropped whole with 8 rows, each due under its own tenant's rule")
            && note.contains(&format!("{TENANT_B} (4 rows)")),
        "{note}"
    );
    assert!(
        note.contains("1 empty partition(s) dropped (no row in them): app.audit_log_2025_12")
            && !note.contains(": ;"),
        "{note}"
    );
    // Each row gone has its detail, with its own tenant.
    let b_details: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM public.sweep_run_row_detail WHERE run_id = $1 AND tenant_id = $2",
    )
    .bind(result.run_id)
    .bind(TENANT_B)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(b_details, 4 * 3 + 3);

    // B keeps 120 days, and C (a tenant Cohort does not sweep) has a row
    // in March: only January goes whole; A's rows of February to April
    // go one by one; B's and C's stay.
    let db = migrated_db().await;
    exec(
        db.pool(),
        &multi_tenant_log(&format!(
            "INSERT INTO app.audit_log VALUES (399, '2026-03-09Z', '{TENANT_C}', 'viewed');"
        )),
    )
    .await;
    let cohort = build(&db, &multi_tenant_policy(true)).await.unwrap();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let e = result.entity("AuditLog").unwrap();
    assert_eq!(e.affected, 8 + 4 * 3 + 1, "{result:?}");
    assert_eq!(
        log_partitions(db.pool()).await,
        [
            "audit_log_2026_02",
            "audit_log_2026_03",
            "audit_log_2026_04",
            "audit_log_2026_05",
            "audit_log_2026_06"
        ]
        .map(String::from)
        .into()
    );
    let mut left: BTreeSet<i64> = (2..=5)
        .flat_map(|m| (1..=4).map(move |d| m * 100 + 50 + d))
        .collect();
    left.insert(399);
    left.extend([502, 503, 504]);
    assert_eq!(log_ids(db.pool()).await, left);
    // B's own pass, on B's 120 days, has nothing left that is due.
    let b = cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(b.entity("AuditLog").unwrap().affected, 0);
}
