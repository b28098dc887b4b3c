//! Cohort's own tables: migrations create exactly the contract, in exactly
//! the configured schema, once, whatever the search path. Any schema name
//! is quoted in one pass; a version-1 database upgrades keeping its
//! history; released migrations are pinned by their checksums.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::schema::{self, CohortTable, SCHEMA_VERSION};
use cohort::Cohort;
use sqlx::{AssertSqlSafe, Row};
use support::*;

async fn catalog_columns(
    pool: &sqlx::PgPool,
    schema: &str,
    table: &str,
) -> Vec<(String, String, bool)> {
    sqlx::query(
        "SELECT a.attname::text AS name, pg_catalog.format_type(a.atttypid, a.atttypmod) AS ty, NOT a.attnotnull AS nullable \
         FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .map(|r| (r.get("name"), r.get("ty"), r.get("nullable")))
    .collect()
}

#[db_test(empty)]
async fn migrations_create_exactly_the_table_contract(db: TestDatabase) {
    let mut conn = db.connect().await.unwrap();
    schema::migrate(&mut conn, "public").await.unwrap();
    for table in CohortTable::ALL {
        let expected: Vec<(String, String, bool)> = table
            .columns()
            .iter()
            .map(|c| (c.name.to_string(), c.sql_type.to_string(), c.nullable))
            .collect();
        assert_eq!(
            catalog_columns(db.pool(), "public", table.name()).await,
            expected,
            "{}",
            table.name()
        );
    }
    assert_eq!(
        schema::installed_version(&mut conn, "public")
            .await
            .unwrap(),
        Some(SCHEMA_VERSION)
    );
}

#[db_test(empty)]
async fn concurrent_migrations_apply_once_and_rerun_is_a_no_op(db: TestDatabase) {
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let options = db.connect_options();
        tasks.push(tokio::spawn(async move {
            let mut conn = sqlx::ConnectOptions::connect(&options).await.unwrap();
            schema::migrate(&mut conn, "retention").await.unwrap()
        }));
    }
    let mut applied = Vec::new();
    for t in tasks {
        applied.push(t.await.unwrap().applied);
    }
    applied.sort();
    let all: Vec<u32> = (1..=SCHEMA_VERSION).collect();
    assert_eq!(applied, vec![vec![], vec![], vec![], all]);
    let mut conn = db.connect().await.unwrap();
    let again = schema::migrate(&mut conn, "retention").await.unwrap();
    assert_eq!(
        (again.from_version, again.to_version, again.applied),
        (SCHEMA_VERSION, SCHEMA_VERSION, vec![])
    );
}

#[db_test(empty)]
async fn tables_land_exactly_in_the_named_schema_whatever_the_search_path(db: TestDatabase) {
    exec(db.pool(), "CREATE SCHEMA decoy").await;
    let options = db.connect_options().options([("search_path", "decoy")]);
    let mut conn = sqlx::ConnectOptions::connect(&options).await.unwrap();
    schema::migrate(&mut conn, "Retention Ledger")
        .await
        .unwrap();
    let counts: Vec<(String, i64)> = sqlx::query(
        "SELECT n.nspname::text AS s, count(*) AS n FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind = 'r' AND n.nspname IN ('decoy', 'public', 'Retention Ledger') GROUP BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap()
    .into_iter()
    .map(|r| (r.get("s"), r.get("n")))
    .collect();
    assert_eq!(counts, vec![("Retention Ledger".to_string(), 13)]);
}

#[db_test(empty)]
async fn host_migration_tools_can_apply_the_rendered_sql(db: TestDatabase) {
    exec(db.pool(), "CREATE SCHEMA audit").await;
    for m in schema::migrations("audit").unwrap() {
        sqlx::raw_sql(AssertSqlSafe(m.sql))
            .execute(db.pool())
            .await
            .unwrap();
    }
    let mut conn = db.connect().await.unwrap();
    assert_eq!(
        schema::installed_version(&mut conn, "audit").await.unwrap(),
        Some(SCHEMA_VERSION)
    );
    // `cohort migrate` afterwards sees it as current.
    assert!(schema::migrate(&mut conn, "audit")
        .await
        .unwrap()
        .applied
        .is_empty());
}

/// `sqlx migrate` users: Cohort's migrator runs beside the application's
/// own, with a history table of its own, creates its schema (any name),
/// and agrees with `cohort migrate` afterwards; a schema `cohort migrate`
/// installed is adopted with `skip`.
#[db_test(empty)]
async fn the_sqlx_migrator_runs_beside_the_applications_own_migrations(db: TestDatabase) {
    let app = sqlx::migrate::Migrator::with_migrations(vec![sqlx::migrate::Migration::new(
        1,
        "app tables".into(),
        sqlx::migrate::MigrationType::Simple,
        sqlx::SqlSafeStr::into_sql_str(
            "CREATE SCHEMA app; CREATE TABLE app.notes (id bigint PRIMARY KEY)",
        ),
        false,
    )]);
    app.run(db.pool()).await.unwrap();
    for schema in ["retention", "Audit \"ledger\""] {
        let cohort = schema::sqlx_migrator(schema).unwrap();
        cohort.run(db.pool()).await.unwrap();
        // Twice: nothing to do; the application's migrator still sees only its own.
        cohort.run(db.pool()).await.unwrap();
        app.run(db.pool()).await.unwrap();
        let mut conn = db.connect().await.unwrap();
        assert_eq!(
            schema::installed_version(&mut conn, schema).await.unwrap(),
            Some(SCHEMA_VERSION)
        );
        assert!(schema::migrate(&mut conn, schema)
            .await
            .unwrap()
            .applied
            .is_empty());
        let history: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT version FROM \"{}\"._cohort_sqlx_migrations WHERE success ORDER BY 1",
            schema.replace('"', "\"\"")
        )))
        .fetch_all(db.pool())
        .await
        .unwrap();
        assert_eq!(history, (1..=i64::from(SCHEMA_VERSION)).collect::<Vec<_>>());
    }
    let own: Vec<i64> = sqlx::query_scalar("SELECT version FROM public._sqlx_migrations")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(
        own,
        vec![1],
        "Cohort's versions leaked into the application's history"
    );

    // Installed by `cohort migrate`: sqlx's migrator refuses to re-run the
    // DDL; `skip` adopts the installed versions, then runs are no-ops.
    let mut conn = db.connect().await.unwrap();
    schema::migrate(&mut conn, "adopted").await.unwrap();
    let migrator = schema::sqlx_migrator("adopted").unwrap();
    // (On a connection of its own: a failed sqlx run leaves its advisory
    // lock held by the session, which a pool would keep.)
    let mut once = db.connect().await.unwrap();
    assert!(migrator.run(&mut once).await.is_err());
    sqlx::Connection::close(once).await.unwrap();
    let installed = schema::installed_version(&mut conn, "adopted")
        .await
        .unwrap()
        .unwrap();
    migrator
        .skip(db.pool(), Some(i64::from(installed)))
        .await
        .unwrap();
    migrator.run(db.pool()).await.unwrap();
    assert_eq!(ledger_rows(db.pool(), "adopted").await, 0);
    assert!(schema::sqlx_migrator("").is_err());
}

#[db_test(empty)]
async fn unknown_or_newer_schemas_are_refused_and_left_alone(db: TestDatabase) {
    exec(db.pool(), "CREATE TABLE public.sweep_run (id int)").await;
    let mut conn = db.connect().await.unwrap();
    let err = schema::migrate(&mut conn, "public").await.unwrap_err();
    assert!(
        err.to_string().contains("carries no Cohort schema version"),
        "{err}"
    );
    exec(
        db.pool(),
        "COMMENT ON TABLE public.sweep_run IS 'cohort schema version 999'",
    )
    .await;
    let err = schema::migrate(&mut conn, "public").await.unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("newer than this build's {SCHEMA_VERSION}")),
        "{err}"
    );
    // Nothing was created next to the foreign table.
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'public'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(n, 1);
}

/// From version 5: a ledger written then is kept row for row; afterwards a
/// row detail may record a `skipped` row (any other unknown action is
/// still refused), and runs have a subject kind (none for the old run).
#[db_test(empty)]
async fn upgrading_from_version_5_keeps_the_ledger_and_adds_skipped_rows_and_subject_kinds(
    db: TestDatabase,
) {
    for m in schema::migrations("public")
        .unwrap()
        .into_iter()
        .filter(|m| m.version <= 5)
    {
        sqlx::raw_sql(AssertSqlSafe(m.sql))
            .execute(db.pool())
            .await
            .unwrap();
    }
    let mut conn = db.connect().await.unwrap();
    assert_eq!(
        schema::installed_version(&mut conn, "public")
            .await
            .unwrap(),
        Some(5)
    );
    let detail = "INSERT INTO sweep_run_row_detail (run_id, retention_entity_id, entity_type, record_id, action) \
                  SELECT run_id, gen_random_uuid(), 'Doc', '1', $1 FROM sweep_run";
    exec(
        db.pool(),
        "INSERT INTO sweep_run (run_id, kind, trigger, dry_run, status, logical_now) \
         VALUES (gen_random_uuid(), 'sweep', 'manual', false, 'started', now())",
    )
    .await;
    sqlx::query(detail)
        .bind("purge")
        .execute(db.pool())
        .await
        .unwrap();
    let refused = sqlx::query(detail)
        .bind("skipped")
        .execute(db.pool())
        .await
        .unwrap_err();
    assert_eq!(
        refused
            .as_database_error()
            .and_then(|e| e.code())
            .as_deref(),
        Some("23514")
    );
    let before = table_digest(db.pool(), "public.sweep_run_row_detail").await;

    let report = schema::migrate(&mut conn, "public").await.unwrap();
    assert_eq!(
        (report.from_version, report.applied),
        (5, (6..=SCHEMA_VERSION).collect::<Vec<_>>())
    );
    // Version 7: the run of version 5 has no subject kind.
    let kind: Option<String> = sqlx::query_scalar("SELECT erasure_subject_kind FROM sweep_run")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(kind, None);
    assert_eq!(
        table_digest(db.pool(), "public.sweep_run_row_detail").await,
        before
    );
    sqlx::query(detail)
        .bind("skipped")
        .execute(db.pool())
        .await
        .unwrap();
    let refused = sqlx::query(detail)
        .bind("archived")
        .execute(db.pool())
        .await
        .unwrap_err();
    assert_eq!(
        refused
            .as_database_error()
            .and_then(|e| e.code())
            .as_deref(),
        Some("23514")
    );
}

#[db_test(migrated)]
async fn ledger_constraints_reject_incoherent_rows(db: TestDatabase) {
    // A settled status without settled_at, an unknown kind, and a hold with an empty reason are refused.
    for bad in [
        "INSERT INTO sweep_run (run_id, kind, trigger, dry_run, status, logical_now) VALUES (gen_random_uuid(), 'sweep', 'manual', false, 'succeeded', now())",
        "INSERT INTO sweep_run (run_id, kind, trigger, dry_run, status, logical_now) VALUES (gen_random_uuid(), 'purge', 'manual', false, 'started', now())",
        "INSERT INTO retention_hold (hold_id, retention_entity_id, record_id, reason) VALUES (gen_random_uuid(), gen_random_uuid(), '1', '  ')",
        "INSERT INTO retention_hold (hold_id, retention_entity_id, record_id, reason, created_at, expires_at) VALUES (gen_random_uuid(), gen_random_uuid(), '1', 'x', now(), now() - interval '1 day')",
    ] {
        let err = sqlx::raw_sql(AssertSqlSafe(bad)).execute(db.pool()).await.unwrap_err();
        assert_eq!(err.as_database_error().and_then(|e| e.code()).as_deref(), Some("23514"), "{bad}");
    }
    assert_eq!(ledger_rows(db.pool(), "public").await, 0);
}

/// Everything about Cohort's tables in `schema` that must survive a move,
/// with the schema name taken out of the definitions: rows (digest), indexes, constraints,
/// identity sequences' positions.
async fn shape(pool: &sqlx::PgPool, schema: &str) -> Vec<String> {
    let mut out = Vec::new();
    for t in CohortTable::ALL {
        let q = format!("{}.{}", cohort_pgtemp::quote_ident(schema), t.name());
        out.push(format!("{}: {}", t.name(), table_digest(pool, &q).await));
    }
    let defs: Vec<String> = sqlx::query_scalar(
        "SELECT replace(d, quote_ident($1) || '.', '') FROM (
            SELECT indexdef AS d FROM pg_indexes WHERE schemaname = $1
            UNION ALL
            SELECT t.relname || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid)
            FROM pg_constraint k JOIN pg_class t ON t.oid = k.conrelid
            WHERE k.connamespace = $1::regnamespace
            UNION ALL
            SELECT s.relname || ' ' || coalesce(pg_sequence_last_value(s.oid)::text, 'unused')
            FROM pg_class s WHERE s.relkind = 'S' AND s.relnamespace = $1::regnamespace
            UNION ALL
            SELECT c.relname || ' ' || coalesce(array_to_string(c.relacl, ','), '')
            FROM pg_class c WHERE c.relkind = 'r' AND c.relnamespace = $1::regnamespace
         ) x ORDER BY 1",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .unwrap();
    out.extend(defs.into_iter().map(|d| {
        d.replace(
            &format!("{}.", cohort_pgtemp::quote_ident(schema)),
            "<schema>.",
        )
    }));
    out
}

/// MIGRATION-002: moving Cohort's tables to another schema keeps every
/// row, index, constraint, grant and sequence position, and behaviour
/// (holds still protect, history reads back, ids continue); refusals
/// change nothing.
#[db_test(engine)]
async fn moving_cohorts_tables_keeps_data_indexes_constraints_and_behaviour(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE ROLE cohort_reader_move; GRANT SELECT ON public.sweep_run TO cohort_reader_move",
    )
    .await;
    let cohort = engine_cohort(&db).await;
    let note = uuid::Uuid::parse_str(NOTE_ID).unwrap();
    let held: String = sqlx::query_scalar(
        "SELECT id::text FROM app.notes WHERE body = 'aaaaaaaa-0000-0000-0000-00000000000a:400d'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    cohort
        .create_hold(cohort::holds::HoldRequest::new(note, held.clone(), "case").tenant(TENANT_A))
        .await
        .unwrap();
    let first = cohort
        .sweep(cohort::SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(first.affected() > 0);
    let before = shape(db.pool(), "public").await;
    let mut conn = db.connect().await.unwrap();

    // Refusals first: each changes nothing.
    let same = schema::move_schema(&mut conn, "public", "public")
        .await
        .unwrap_err();
    assert!(matches!(same, cohort::Error::InvalidInput(_)), "{same}");
    let none = schema::move_schema(&mut conn, "nowhere", "ledger")
        .await
        .unwrap_err();
    assert!(matches!(none, cohort::Error::NotFound(_)), "{none}");
    exec(
        db.pool(),
        "CREATE SCHEMA taken; CREATE TABLE taken.retention_hold (x int)",
    )
    .await;
    let taken = schema::move_schema(&mut conn, "public", "taken")
        .await
        .unwrap_err();
    assert!(matches!(taken, cohort::Error::Conflict(_)), "{taken}");
    assert_eq!(shape(db.pool(), "public").await, before);
    // A started run whose process is alive (it holds its run lock) blocks
    // the move; once its process is gone (lock free), it does not: it is
    // recovered later, in the new schema.
    exec(db.pool(), "INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now) VALUES ('00000000-0000-0000-0000-0000000000aa', 'sweep', 'manual', false, 'started', now())").await;
    let before = shape(db.pool(), "public").await;
    let mut owner = db.connect().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtextextended('cohort.run:00000000-0000-0000-0000-0000000000aa', 0))")
        .execute(&mut owner)
        .await
        .unwrap();
    let busy = schema::move_schema(&mut conn, "public", "ledger")
        .await
        .unwrap_err();
    assert!(matches!(busy, cohort::Error::Refused(_)), "{busy}");
    assert!(busy.to_string().contains("still started"), "{busy}");
    sqlx::Connection::close(owner).await.unwrap();
    assert_eq!(shape(db.pool(), "public").await, before);
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'ledger'"
        )
        .await,
        0
    );

    // The move.
    let report = schema::move_schema(&mut conn, "public", "ledger")
        .await
        .unwrap();
    assert_eq!(report.tables.len(), CohortTable::ALL.len());
    assert_eq!(shape(db.pool(), "ledger").await, before);
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relname LIKE 'sweep%' AND relname <> 'sweep_run'"
        )
        .await,
        0
    );
    // The old schema keeps a marker: whatever still points there refuses
    // to start or to install a fresh, empty ledger (which knows no holds).
    let marker = schema::installed_version(&mut conn, "public")
        .await
        .unwrap_err();
    assert!(
        marker
            .to_string()
            .contains("moved out of schema \"public\" to \"ledger\""),
        "{marker}"
    );
    let reinstall = schema::migrate(&mut conn, "public").await.unwrap_err();
    assert!(reinstall.to_string().contains("moved"), "{reinstall}");
    assert!(schema::sqlx_migrator("public")
        .unwrap()
        .run(&mut conn)
        .await
        .is_err());
    sqlx::Connection::close(conn).await.unwrap();
    let mut conn = db.connect().await.unwrap();
    let mut stale = cohort::Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules());
    for d in engine_entities() {
        stale = stale.declaration(d);
    }
    let refused = stale.build().await.unwrap_err();
    assert!(
        refused.to_string().contains("moved out of schema"),
        "{refused}"
    );
    assert_eq!(
        schema::installed_version(&mut conn, "ledger")
            .await
            .unwrap(),
        Some(SCHEMA_VERSION)
    );

    // Behaviour in the new schema: validation passes (the contract), the
    // history reads back, the hold still protects, ids continue.
    let mut b = cohort::Cohort::builder(db.pool().clone())
        .config(cohort::CohortConfig {
            schema: "ledger".into(),
            ..test_config()
        })
        .rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let moved = b.build().await.unwrap();
    // The hold functions moved too, and the moved table's trigger calls
    // the new schema's own.
    let functions_in = |schema: &'static str| {
        format!(
            "SELECT count(*) FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = '{schema}' AND p.proname IN ('retention_hold_stamp', 'retention_hold_recent', 'retention_hold_reach')"
        )
    };
    assert_eq!(count(db.pool(), &functions_in("ledger")).await, 3);
    assert_eq!(count(db.pool(), &functions_in("public")).await, 0);
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM pg_catalog.pg_trigger tg JOIN pg_catalog.pg_proc p ON p.oid = tg.tgfoid \
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE tg.tgrelid = 'ledger.retention_hold'::regclass AND NOT tg.tgisinternal AND n.nspname = 'ledger'"
        )
        .await,
        3
    );
    let shown = moved.show_run(first.run_id).await.unwrap();
    assert_eq!(shown.affected(), first.affected());
    assert!(moved.is_held(note, &held).await.unwrap());
    exec(db.pool(), "UPDATE app.notes SET created_at = '2020-01-01' WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a' AND created_at IS NOT NULL").await;
    let max_before: i64 = count(
        db.pool(),
        "SELECT max(summary_id) FROM ledger.sweep_run_entity_summary",
    )
    .await;
    let second = moved
        .sweep(cohort::SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(second.status, cohort::RunStatus::Succeeded, "{second:?}");
    assert_eq!(second.entity("Note").unwrap().held, 1);
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM app.notes WHERE id = '{held}'")
        )
        .await,
        1
    );
    assert!(
        count(db.pool(), "SELECT min(summary_id) FROM ledger.sweep_run_entity_summary WHERE run_id <> (SELECT run_id FROM ledger.sweep_run ORDER BY started_at LIMIT 1)").await
            > max_before
    );
    // The old handle now fails loudly rather than writing somewhere else.
    assert!(cohort.list_runs(10).await.is_err());

    // And back: the marker is replaced, everything else as it was.
    let after_second = shape(db.pool(), "ledger").await;
    schema::move_schema(&mut conn, "ledger", "public")
        .await
        .unwrap();
    assert_eq!(shape(db.pool(), "public").await, after_second);
    assert_eq!(
        schema::installed_version(&mut conn, "public")
            .await
            .unwrap(),
        Some(SCHEMA_VERSION)
    );
}

/// A sqlx migration history moves with the tables, its checksums rewritten
/// for the new schema: the application's next start runs clean.
#[db_test(empty)]
async fn a_moved_sqlx_history_still_runs_clean(db: TestDatabase) {
    schema::sqlx_migrator("first")
        .unwrap()
        .run(db.pool())
        .await
        .unwrap();
    let mut conn = db.connect().await.unwrap();
    let report = schema::move_schema(&mut conn, "first", "second")
        .await
        .unwrap();
    assert!(
        report.tables.iter().any(|t| t == "_cohort_sqlx_migrations"),
        "{report:?}"
    );
    let migrator = schema::sqlx_migrator("second").unwrap();
    migrator.run(db.pool()).await.unwrap();
    migrator.run(db.pool()).await.unwrap();
    assert_eq!(
        schema::installed_version(&mut conn, "second")
            .await
            .unwrap(),
        Some(SCHEMA_VERSION)
    );
}

/// F.12: schema names holding braces, quotes and placeholders stay inside
/// their own quotes.
#[db_test(empty)]
async fn migrations_quote_any_schema_name_in_one_pass(db: TestDatabase) {
    let mut conn = db.connect().await.unwrap();
    for schema in [
        "x{retention_hold}",
        "{sweep_run_entity_summary}",
        "{sweep_run}",
        "we\"ird {",
        "}{",
    ] {
        let report = cohort::schema::migrate(&mut conn, schema).await.unwrap();
        assert_eq!(report.to_version, cohort::schema::SCHEMA_VERSION);
        let tables: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = $1")
                .bind(schema)
                .fetch_one(&mut conn)
                .await
                .unwrap();
        assert_eq!(
            tables as usize,
            cohort::schema::CohortTable::ALL.len(),
            "{schema:?}"
        );
        assert_eq!(
            cohort::schema::installed_version(&mut conn, schema)
                .await
                .unwrap(),
            Some(cohort::schema::SCHEMA_VERSION)
        );
        let config = cohort::CohortConfig {
            schema: schema.into(),
            ..test_config()
        };
        Cohort::builder(db.pool().clone())
            .config(config)
            .build()
            .await
            .unwrap_or_else(|e| panic!("{schema:?}: {e}"));
    }
}

/// Migration 0002 upgrades a version-1 database keeping its history, and a
/// handle refuses a database that is behind.
#[db_test(empty)]
async fn a_version_one_database_upgrades_keeping_history(db: TestDatabase) {
    let mut conn = db.connect().await.unwrap();
    let v1 = &cohort::schema::migrations("public").unwrap()[0];
    assert_eq!(v1.version, 1);
    sqlx::raw_sql(sqlx::AssertSqlSafe(v1.sql.clone()))
        .execute(&mut conn)
        .await
        .unwrap();
    exec(
        db.pool(),
        "INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, started_at, settled_at, error)
           VALUES ('11111111-1111-4111-8111-111111111111', 'sweep', 'manual', false, 'partially_failed', now(), now(), now(), 'entity x: kind=db code=22001 diagnostic_id=abc');
         INSERT INTO public.sweep_run_entity_summary (run_id, retention_entity_id, entity_type, category, strategy,
             affected_count, held_count, skipped_count, null_anchor_count, resolved_period)
           VALUES ('11111111-1111-4111-8111-111111111111', 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'Note', 'notes', 'purge', 5, 1, 0, 2, interval '30 days');",
    )
    .await;
    // The columns of version 1, value for value (later versions add columns).
    const V1_RUNS: &str =
        "(SELECT run_id, kind, trigger, dry_run, tenant_id, status, logical_now, \
        started_at, settled_at, error FROM public.sweep_run)";
    let before = table_digest(db.pool(), V1_RUNS).await;
    let err = Cohort::builder(db.pool().clone())
        .config(test_config())
        .build()
        .await
        .unwrap_err();
    assert!(
        problems_text(&err).contains(&format!(
            "is version 1, older than this build's {}; run `cohort migrate`",
            cohort::schema::SCHEMA_VERSION
        )),
        "{err}"
    );
    let report = cohort::schema::migrate(&mut conn, "public").await.unwrap();
    assert_eq!(
        (report.from_version, report.applied),
        (1, (2..=cohort::schema::SCHEMA_VERSION).collect::<Vec<_>>())
    );
    // The runs table is byte for byte as it was, error texts included.
    assert_eq!(table_digest(db.pool(), V1_RUNS).await, before);
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .build()
        .await
        .unwrap();
    let run = cohort
        .show_run(uuid::Uuid::parse_str("11111111-1111-4111-8111-111111111111").unwrap())
        .await
        .unwrap();
    let note = run.entity("Note").unwrap();
    assert_eq!(
        (
            note.affected,
            note.held,
            note.null_anchor,
            note.kept_by_legal_min
        ),
        (5, 1, 2, 0)
    );
}

/// Released migrations are never edited: their checksums are pinned.
#[test]
fn released_migrations_are_pinned() {
    use sha2::Digest;
    let pinned = [
        (
            1,
            "608e187d69252026253c8487bf78d7024f388d117640699d1f28ff6f314622c1",
        ),
        (
            2,
            "3983322a06f8235d7f6e2b5210f2a523572e856d33297deb0669c1a2eb9a224e",
        ),
        (
            3,
            "b8d9fc32d3501bd6f79c129c54855d04493726568eefa30269dbaae07a9a3962",
        ),
        (
            4,
            "45dffbf9579bdc6115b338ed578e004f432442d925d590ff8c9a834331463886",
        ),
        (
            5,
            "01e42d47e1412e09959ba1925c2d8a1cdfff6cf49e2cfd0b8ae5404af3d39d2a",
        ),
        (
            6,
            "78e92c0354c4b7f4892f7498575515605add9e139bd25af81f9d195308742d68",
        ),
        (
            7,
            "947d0fd514d6a1e88128faa9be1fa88b241d589cf433adc32657f6338efc9e18",
        ),
        (
            8,
            "934b14d7bde011bd94d43d676c19e9520a026edb578391f28a3feff3029eff96",
        ),
        (
            9,
            "299e9c4ab01bcbe9fa816b646776f330a9c07b048e96cb4434398b4938dea694",
        ),
        (
            10,
            "3c2fc499810bcf26a4f130a068837d63170f2bf582e4044ac3247c53b3044c5b",
        ),
        (
            11,
            "bae5a3019c4873d968a41f53d143f03d80ef01549e081cd19cd8de98a6832033",
        ),
        (
            12,
            "d4dfe5a116ee3541fcc86656d2255b1ff63c5dbc2d71fe29fb7c35af2dff8e47",
        ),
        (
            13,
            "96a37b109645c155c33e578c171115b0f9ceb1741c1f4fcf176ebca7037c0c77",
        ),
        (
            14,
            "439702dae9baaf9f036fd03b6dc30a9a1b4d0016f75c698023cfcf69215e6130",
        ),
        (
            15,
            "6675ea972d634df6f4936ba01060fbb538f22c2bc15d44232932fcedd162605d",
        ),
        (
            16,
            "41c72e36cb1e109778f293314d66e3de11cb0b6de95b0d887cebc75a9ad64e1f",
        ),
        (
            17,
            "346ea9aefa8375d62bd71855d7a6646bc48206f6a7da4f5ba838491af5fe2991",
        ),
        (
            18,
            "49c58b0a5990045a70fd54a8d73099706540de5a6349532281ab71a567a2eae4",
        ),
        (
            19,
            "8747c88981cb2dff681e795a4db0f779f494ed23c66c4797456063ead5620518",
        ),
        (
            20,
            "ddc2bcff47a5c41746414a6ec672e6942a0d59ff605c2db9594d5277f58b909e",
        ),
    ];
    assert_eq!(
        pinned.len(),
        cohort::schema::migrations("public").unwrap().len(),
        "pin every released migration"
    );
    for (version, digest) in pinned {
        let m = &cohort::schema::migrations("public").unwrap()[version - 1];
        let hex: String = sha2::Sha256::digest(m.sql.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, digest, "migration {version} was edited after release");
    }
}
