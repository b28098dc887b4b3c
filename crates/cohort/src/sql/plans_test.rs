//! The plans PostgreSQL picks for a sweep batch's statements, on a real
//! server: a batch's mutation reads its locked rows by address (a TID
//! scan), in the custom plans of a prepared statement's first executions
//! as in the generic plan after them. The SQL text is pinned by the
//! snapshots; this pins what the planner makes of it, which a harmless
//! looking rewrite can change (binding the addresses directly once made
//! custom plans count them and scan the tenant's whole eligible range).

use sqlx::{Connection, Executor, Row};

use super::snapshots_test::{descriptor, kinds, plain_plan};
use crate::domain::rules::{CategoryCapabilities, Strategy};

/// `app.contacts` as the snapshot descriptor reads it: 40,000 rows in two
/// tenants, a quarter of tenant `a`'s past the cutoff, analysed.
const TABLE: &str = "
CREATE SCHEMA app;
CREATE TABLE app.contacts (id bigint PRIMARY KEY, tenant_id text NOT NULL,
    created_at timestamptz, anonymised_at timestamptz, is_deleted boolean NOT NULL DEFAULT false,
    deleted_at timestamptz, email text, full_name text, phone text, reference text,
    nickname text, badge text, user_id uuid, delegate_id text);
CREATE INDEX ON app.contacts (tenant_id, created_at);
INSERT INTO app.contacts (id, tenant_id, created_at, email, full_name, phone, reference, user_id)
SELECT g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END,
       timestamptz '2026-01-01' + pg_catalog.make_interval(mins => g), 'x@example.com', 'X', '+1', 'R', pg_catalog.gen_random_uuid()
FROM pg_catalog.generate_series(1, 40000) g;
ANALYZE app.contacts;
";

/// The plan nodes of `EXPLAIN (FORMAT JSON)`, as (node type, relation).
fn nodes(plan: &serde_json::Value, out: &mut Vec<(String, String)>) {
    if let Some(ty) = plan.get("Node Type").and_then(|v| v.as_str()) {
        let relation = plan
            .get("Relation Name")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        out.push((ty.to_owned(), relation.to_owned()));
    }
    if let Some(children) = plan.get("Plans").and_then(|v| v.as_array()) {
        for child in children {
            nodes(child, out);
        }
    }
}

/// Whether a plan's ModifyTable on `app.contacts` reads its rows by a TID
/// scan, and no node scans the table otherwise but the candidates'.
fn modifies_by_address(plan: &[(String, String)]) -> bool {
    let tid = plan
        .iter()
        .any(|(ty, rel)| ty == "Tid Scan" && rel == "contacts");
    let bitmap = plan
        .iter()
        .any(|(ty, rel)| ty == "Bitmap Heap Scan" && rel == "contacts");
    tid && !bitmap
}

/// The plan `EXPLAIN EXECUTE` shows for `sql` prepared with `types` and
/// run with `args` (literals), under the transaction's `plan_cache_mode`.
async fn explain(
    tx: &mut sqlx::PgConnection,
    sql: &str,
    types: &str,
    args: &str,
) -> Vec<(String, String)> {
    tx.execute(sqlx::AssertSqlSafe(format!(
        "PREPARE batch ({types}) AS {sql}"
    )))
    .await
    .unwrap();
    let explained: serde_json::Value = sqlx::query(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (FORMAT JSON) EXECUTE batch ({args})"
    )))
    .fetch_one(&mut *tx)
    .await
    .unwrap()
    .try_get(0)
    .unwrap();
    tx.execute("DEALLOCATE batch").await.unwrap();
    let mut found = Vec::new();
    nodes(&explained[0]["Plan"], &mut found);
    found
}

#[tokio::test]
async fn a_batch_changes_its_locked_rows_by_address_in_custom_and_generic_plans() {
    let db = cohort_pgtemp::fresh_empty_database()
        .await
        .expect("test database");
    let mut conn = db.connect().await.unwrap();
    crate::schema::migrate(&mut conn, "cohort").await.unwrap();
    conn.execute(TABLE).await.unwrap();

    let e = descriptor(true, false);
    let plan = plain_plan(
        &e,
        &CategoryCapabilities::new([Strategy::SoftDelete]).unwrap(),
    );
    let entity = "b7316df4-7db5-46ad-aea7-f65c4b430f73";
    let cutoff: chrono::DateTime<chrono::Utc> = "2026-01-08T00:00:00Z".parse().unwrap();
    // The addresses of 5,000 of tenant a's eligible rows, as a lock
    // statement returns them.
    let addresses: Vec<String> = sqlx::query_scalar(
        "SELECT ctid::text FROM app.contacts WHERE tenant_id = 'a' AND created_at < $1 \
         ORDER BY created_at LIMIT 5000",
    )
    .bind(cutoff)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(addresses.len(), 5000);

    let addresses = format!(
        "'{{{}}}'::text[]",
        addresses
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(",")
    );
    let entity = format!("'{entity}'::uuid");
    let cutoff = "'2026-01-08T00:00:00Z'::timestamptz";
    // The control: the addresses bound directly, which a custom plan
    // counts; here it scans the tenant's eligible range instead, which is
    // what this test would catch.
    {
        let mut tx = conn.begin().await.unwrap();
        tx.execute("SET LOCAL plan_cache_mode = force_custom_plan")
            .await
            .unwrap();
        let found = explain(
            &mut tx,
            "UPDATE app.contacts t SET is_deleted = TRUE WHERE t.ctid = ANY($1::pg_catalog.tid[]) \
             AND t.created_at < $2 AND t.tenant_id = $3",
            "text[], timestamptz, text",
            &format!("{addresses}, {cutoff}, 'a'"),
        )
        .await;
        assert!(!modifies_by_address(&found), "{found:?}");
        tx.rollback().await.unwrap();
    }
    for mode in ["force_custom_plan", "force_generic_plan"] {
        let mut tx = conn.begin().await.unwrap();
        tx.execute(sqlx::AssertSqlSafe(format!(
            "SET LOCAL plan_cache_mode = {mode}"
        )))
        .await
        .unwrap();
        // The two-statement path's mutation: `$1` entity, `$2` addresses,
        // `$3` the run's now (the marker), then the cutoff and the tenant.
        let found = explain(
            &mut tx,
            kinds(&plan).mutate_count[&Strategy::SoftDelete].as_str(),
            "uuid, text[], timestamptz, timestamptz, text",
            &format!("{entity}, {addresses}, {cutoff}, {cutoff}, 'a'"),
        )
        .await;
        assert!(modifies_by_address(&found), "{mode}: {found:?}");
        // The fused statement: `$1` entity, `$2` cutoff, `$3` limit, `$4`
        // tenant, `$5` the run's now; its mutation reads the addresses its
        // own lock took.
        let found = explain(
            &mut tx,
            kinds(&plan).fused[&Strategy::SoftDelete]
                .count
                .plain
                .as_str(),
            "uuid, timestamptz, int8, text, timestamptz",
            &format!("{entity}, {cutoff}, 5000, 'a', {cutoff}"),
        )
        .await;
        assert!(modifies_by_address(&found), "{mode}: {found:?}");
        tx.rollback().await.unwrap();
    }
}

/// The statement that claimed passes before schema 13's release: the
/// pass chosen by a subquery joined in `FROM`.
const JOINED_CLAIM: &str = "UPDATE cohort.sweep_occurrence_pass AS p SET status = 'claimed', \
     attempts = p.attempts + 1, claim_token = $2, claimed_by = $3, claimed_at = pg_catalog.clock_timestamp() \
     FROM (SELECT pass FROM cohort.sweep_occurrence_pass WHERE occurrence_id = $1 AND status = 'pending' \
           ORDER BY pass LIMIT 1 FOR UPDATE SKIP LOCKED) AS c \
     WHERE p.occurrence_id = $1 AND p.pass = c.pass \
     RETURNING p.pass, p.spec, p.attempts, \
       pg_catalog.pg_try_advisory_lock(pg_catalog.hashtextextended($4 || p.pass::text, 0)) AS locked";

/// A claim takes one pass and one lock, whatever plan the statistics or
/// the planner settings lead to. The ledger is analysed the way
/// autovacuum leaves it in production: after twenty finished occurrences
/// and before the new one's 300 passes exist, so the planner expects one
/// row of it. There, the joined claim of earlier releases takes every
/// pending pass at once (the control: this test reaches the hazard); the
/// claim now takes one under every combination of join and scan methods.
#[tokio::test]
async fn a_claim_takes_one_pass_whatever_the_plan() {
    use super::occurrences::{claim_pending, insert, insert_passes, Claim, Insert, InsertPasses};
    let db = cohort_pgtemp::fresh_empty_database()
        .await
        .expect("test database");
    let mut conn = db.connect().await.unwrap();
    crate::schema::migrate(&mut conn, "cohort").await.unwrap();
    let at: chrono::DateTime<chrono::Utc> = "2026-06-01T00:00:00Z".parse().unwrap();
    let specs = serde_json::Value::Array(
        (1..=300)
            .map(|t| serde_json::json!({ "kind": "tenant", "id": format!("t{t}") }))
            .collect(),
    );
    let occurrence = |n: u32| uuid::Uuid::from_u128(u128::from(n) + 1);
    for n in 0..=20u32 {
        insert(
            "cohort",
            Insert {
                occurrence_id: occurrence(n),
                at: at - chrono::Duration::hours(i64::from(21 - n)),
                dry_run: false,
                fingerprint: "fp".into(),
                passes: 300,
                created_by: "test".into(),
            },
        )
        .query()
        .execute(&mut conn)
        .await
        .unwrap();
        if n == 20 {
            // Analysed with only finished occurrences in the table.
            conn.execute("ANALYZE cohort.sweep_occurrence_pass")
                .await
                .unwrap();
        }
        insert_passes(
            "cohort",
            InsertPasses {
                occurrence_id: occurrence(n),
                specs: specs.clone(),
            },
        )
        .query()
        .execute(&mut conn)
        .await
        .unwrap();
        if n < 20 {
            sqlx::query(
                "UPDATE cohort.sweep_occurrence_pass SET status = 'done' WHERE occurrence_id = $1",
            )
            .bind(occurrence(n))
            .execute(&mut conn)
            .await
            .unwrap();
        }
    }
    let new = occurrence(20);
    let claim = |sql: &str| -> (String, Claim) {
        (
            sql.to_owned(),
            Claim {
                occurrence_id: new,
                token: uuid::Uuid::new_v4(),
                by: "test".into(),
                lock_prefix: crate::base::locks::pass_prefix(new),
            },
        )
    };
    // How many passes one claim took, and how many pass locks it holds.
    async fn claimed(tx: &mut sqlx::PgConnection, sql: &str, c: Claim) -> (usize, i64) {
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .bind(c.occurrence_id)
            .bind(c.token)
            .bind(c.by)
            .bind(c.lock_prefix)
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        let locks: i64 = sqlx::query_scalar(
            "SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' \
             AND pid = pg_catalog.pg_backend_pid()",
        )
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        sqlx::query("SELECT pg_catalog.pg_advisory_unlock_all()")
            .execute(&mut *tx)
            .await
            .unwrap();
        (rows.len(), locks)
    }

    let (old, c) = claim(JOINED_CLAIM);
    let mut tx = conn.begin().await.unwrap();
    let (passes, locks) = claimed(&mut tx, &old, c).await;
    tx.rollback().await.unwrap();
    assert!(
        passes > 1 && locks > 1,
        "the control: the joined claim takes {passes} passes and {locks} locks on these statistics"
    );

    let settings = [
        "enable_hashjoin",
        "enable_mergejoin",
        "enable_nestloop",
        "enable_indexscan",
        "enable_bitmapscan",
        "enable_seqscan",
        "enable_sort",
        "enable_indexonlyscan",
    ];
    // Every subset of the settings turned off (the planner needs one join
    // and one scan left; it falls back to disabled ones otherwise).
    for mask in 0u32..(1 << settings.len()) {
        let (sql, c) = claim(claim_pending("cohort", claim("").1).text());
        let mut tx = conn.begin().await.unwrap();
        for (i, s) in settings.iter().enumerate() {
            if mask & (1 << i) != 0 {
                tx.execute(sqlx::AssertSqlSafe(format!("SET LOCAL {s} = off")))
                    .await
                    .unwrap();
            }
        }
        let (passes, locks) = claimed(&mut tx, &sql, c).await;
        tx.rollback().await.unwrap();
        assert_eq!((passes, locks), (1, 1), "settings off: {mask:#b}");
    }
}
