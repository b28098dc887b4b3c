//! Shared test support: a fresh database per test, cloned from a template
//! that already has Cohort's migrations in `public`.
#![allow(dead_code, unreachable_pub)]

pub mod factory;
mod fixture;
pub mod logs;
mod policy;
mod wait;
#[allow(unused_imports)]
pub use fixture::{fixture, Fixture};
#[allow(unused_imports)]
pub use policy::{expect_refused, from_policy, problems_text};
#[allow(unused_imports)]
pub use wait::{wait_until, wait_until_blocking};

use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort_pgtemp::TestDatabase;
use sqlx::{AssertSqlSafe, PgPool, Row};

/// A fresh database with Cohort's tables in `public`.
pub async fn migrated_db() -> TestDatabase {
    fixture(Fixture::Migrated).await
}

/// A fresh database with nothing in it.
pub async fn empty_db() -> TestDatabase {
    fixture(Fixture::Empty).await
}

/// Runs SQL written by the test (several statements allowed).
pub async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{e}\nin:\n{sql}"));
}

/// A digest of a table's whole content, to prove nothing changed.
pub async fn table_digest(pool: &PgPool, table: &str) -> String {
    let sql = format!(
        "SELECT count(*)::text || ':' || COALESCE(md5(string_agg(t::text, ',' ORDER BY t::text)), '') AS d FROM {table} t"
    );
    sqlx::query(AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap()
        .get("d")
}

/// Rows in Cohort's ledger tables (all must stay 0 during validation).
pub async fn ledger_rows(pool: &PgPool, schema: &str) -> i64 {
    let q = cohort_pgtemp::quote_ident(schema);
    let sql = format!(
        "SELECT (SELECT count(*) FROM {q}.sweep_run) + (SELECT count(*) FROM {q}.sweep_run_entity_summary) \
         + (SELECT count(*) FROM {q}.sweep_run_row_detail) + (SELECT count(*) FROM {q}.sweep_row_handler_status) \
         + (SELECT count(*) FROM {q}.retention_hold) AS n"
    );
    sqlx::query(AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap()
        .get("n")
}

pub fn days(n: i64) -> Period {
    Period::from_days(n).unwrap()
}

/// Categories used across tests: `notes` purge 30d, `contacts` anonymise
/// 90d, `soft` soft delete 10d, `kept` exempt, `mixed` purge with a
/// soft-delete override.
pub fn rules() -> StaticRuleProvider {
    StaticRuleProvider::builder()
        .category("notes", RetentionRule::new(days(30), Strategy::Purge))
        .category(
            "contacts",
            RetentionRule::new(days(90), Strategy::Anonymise),
        )
        .category("soft", RetentionRule::new(days(10), Strategy::SoftDelete))
        .category("kept", RetentionRule::new(days(1), Strategy::Exempt))
        .category_with(
            "mixed",
            RetentionRule::new(days(30), Strategy::Purge),
            vec![cohort::rules::RuleOverride {
                tenant: Some(TENANT_B.into()),
                jurisdiction: None,
                tag: None,
                rule: RetentionRule::new(days(30), Strategy::SoftDelete),
            }],
            None,
        )
        .build()
        .unwrap()
}

pub const NOTE_ID: &str = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8";
pub const CONTACT_ID: &str = "b7316df4-7db5-46ad-aea7-f65c4b430f73";
pub const OTHER_ID: &str = "5d1d2c55-2f0e-4e6c-9d59-5c0b6f3b8a11";

/// The logical time of engine tests.
pub fn now() -> chrono::DateTime<chrono::FixedOffset> {
    chrono::DateTime::parse_from_rfc3339("2026-06-01T00:00:00Z").unwrap()
}

pub const TENANT_A: &str = "aaaaaaaa-0000-0000-0000-00000000000a";
pub const TENANT_B: &str = "bbbbbbbb-0000-0000-0000-00000000000b";
pub const TICKET_ID: &str = "3c1f0d4e-8a7b-4c2d-9e6f-0a1b2c3d4e5f";
pub const INVOICE_ID: &str = "9e8d7c6b-5a49-4838-a726-1514f3e2d1c0";
pub const GLOBAL_ID: &str = "0f0e0d0c-0b0a-4908-8706-050403020100";

/// Tables for every strategy in schema `app`, plus a same-named decoy in
/// `other`. Rows for tenants A and B (and one unrelated tenant), aged
/// relative to [`now`]: 1 day, exactly on a 30-day cutoff, one second past
/// it, 45 days, 400 days, and a NULL anchor.
pub const ENGINE_TABLES: &str = r#"
CREATE SCHEMA app;
CREATE SCHEMA other;
CREATE TABLE app.notes (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), tenant_id uuid NOT NULL,
    created_at timestamptz, body text NOT NULL);
CREATE INDEX ON app.notes (tenant_id, created_at);
CREATE TABLE other.notes (LIKE app.notes INCLUDING ALL);
CREATE TABLE app.contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
    anonymised_at timestamptz, email text, full_name text NOT NULL, phone text NOT NULL,
    reference text NOT NULL, score integer, user_id uuid NOT NULL);
CREATE TABLE app.tickets (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), tenant_id uuid NOT NULL,
    closed_at timestamptz, is_deleted boolean NOT NULL DEFAULT false, deleted_at timestamptz, subject text NOT NULL);
CREATE TABLE app.invoices (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), tenant_id uuid NOT NULL,
    issued_at timestamptz NOT NULL, amount bigint NOT NULL);
CREATE TABLE app.globals (id bigint PRIMARY KEY, created_at timestamptz, payload text);

CREATE FUNCTION pg_temp.seed_ages() RETURNS TABLE (label text, at timestamptz) LANGUAGE sql AS $$
  SELECT * FROM (VALUES
    ('1d', timestamptz '2026-06-01T00:00:00Z' - interval '1 day'),
    ('on-cutoff', timestamptz '2026-06-01T00:00:00Z' - interval '30 days'),
    ('past-cutoff', timestamptz '2026-06-01T00:00:00Z' - interval '30 days 1 second'),
    ('45d', timestamptz '2026-06-01T00:00:00Z' - interval '45 days'),
    ('400d', timestamptz '2026-06-01T00:00:00Z' - interval '400 days'),
    ('null', NULL::timestamptz)) v(label, at)
$$;
INSERT INTO app.notes (tenant_id, created_at, body)
SELECT t::uuid, a.at, t || ':' || a.label FROM pg_temp.seed_ages() a,
  unnest(ARRAY['aaaaaaaa-0000-0000-0000-00000000000a', 'bbbbbbbb-0000-0000-0000-00000000000b']) t;
INSERT INTO other.notes (tenant_id, created_at, body)
SELECT 'aaaaaaaa-0000-0000-0000-00000000000a', a.at, 'decoy:' || a.label FROM pg_temp.seed_ages() a;
INSERT INTO app.contacts (id, tenant_id, created_at, email, full_name, phone, reference, score, user_id)
SELECT row_number() OVER (), t::uuid, a.at - interval '60 days', 'person@example.com', 'Person ' || a.label,
       '+44 1', 'REF-' || a.label, 7, 'cccccccc-0000-0000-0000-00000000000c'
FROM pg_temp.seed_ages() a,
  unnest(ARRAY['aaaaaaaa-0000-0000-0000-00000000000a', 'bbbbbbbb-0000-0000-0000-00000000000b']) t;
INSERT INTO app.tickets (tenant_id, closed_at, subject)
SELECT t::uuid, a.at + interval '20 days', 'ticket ' || a.label FROM pg_temp.seed_ages() a,
  unnest(ARRAY['aaaaaaaa-0000-0000-0000-00000000000a', 'bbbbbbbb-0000-0000-0000-00000000000b']) t;
INSERT INTO app.invoices (tenant_id, issued_at, amount)
SELECT 'aaaaaaaa-0000-0000-0000-00000000000a', a.at, 100 FROM pg_temp.seed_ages() a WHERE a.at IS NOT NULL;
INSERT INTO app.globals (id, created_at, payload)
SELECT row_number() OVER (), a.at, a.label FROM pg_temp.seed_ages() a;
"#;

/// Declarations matching [`ENGINE_TABLES`] and [`rules`].
pub fn engine_entities() -> Vec<cohort::EntityDeclaration> {
    use cohort::model::AnonymiseMethod;
    vec![
        cohort::EntityDeclaration::new("Note", NOTE_ID)
            .category("notes")
            .anchor("created_at")
            .table("app.notes"),
        cohort::EntityDeclaration::new("Contact", CONTACT_ID)
            .category("contacts")
            .anchor("created_at")
            .table("app.contacts")
            .anonymise("email", AnonymiseMethod::Null)
            .anonymise("full_name", AnonymiseMethod::Empty)
            .anonymise("phone", AnonymiseMethod::Literal("[redacted]".into()))
            .anonymise("reference", AnonymiseMethod::Hash)
            .subject("user_id", None),
        cohort::EntityDeclaration::new("Ticket", TICKET_ID)
            .category("soft")
            .anchor("closed_at")
            .table("app.tickets"),
        cohort::EntityDeclaration::new("Invoice", INVOICE_ID)
            .category("kept")
            .anchor("issued_at")
            .table("app.invoices"),
        cohort::EntityDeclaration::new("Global", GLOBAL_ID)
            .category("notes")
            .anchor("created_at")
            .table("app.globals")
            .tenantless(),
    ]
}

/// A database seeded with [`ENGINE_TABLES`] (a clone of its template).
pub async fn engine_db() -> TestDatabase {
    fixture(Fixture::Engine).await
}

/// A pool of `connections` on `db` as `role` (logging in with `password`):
/// another role than the fixture's owner, for privilege tests.
pub async fn pool_as(db: &TestDatabase, role: &str, password: &str, connections: u32) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(db.connect_options().username(role).password(password))
        .await
        .unwrap_or_else(|e| panic!("connecting as {role}: {e}"))
}

/// A validated Cohort over [`engine_db`] with [`engine_entities`].
pub async fn engine_cohort(db: &TestDatabase) -> cohort::Cohort {
    engine_cohort_on(db.pool().clone(), test_config()).await
}

/// A validated Cohort over the [`engine_db`] fixture with
/// [`engine_entities`] and `config`, on `pool` (a pool of its own stands
/// for another process).
pub async fn engine_cohort_on(pool: PgPool, config: cohort::CohortConfig) -> cohort::Cohort {
    let mut b = cohort::Cohort::builder(pool).config(config).rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    b.build().await.expect("engine fixture validates")
}

/// [`test_config`] with fixed batches of `rows`.
pub fn batches_of(rows: u32) -> cohort::CohortConfig {
    cohort::CohortConfig {
        sweep_batch_size: cohort::BatchSize::Fixed(rows),
        ..test_config()
    }
}

/// Labels (text after ':') of the rows left in a notes-like table for a tenant.
pub async fn labels(pool: &PgPool, sql: &str) -> Vec<String> {
    let mut v: Vec<String> = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql.to_owned()))
        .fetch_all(pool)
        .await
        .unwrap();
    v.sort();
    v
}

/// The `int8` values `sql` returns (row ids, say), in its order.
pub async fn ids(pool: &PgPool, sql: &str) -> Vec<i64> {
    sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Counts rows of a query.
pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The ledger rows of a run: (status, dry_run, settled) and its summaries
/// as (entity_type, strategy, affected, held, skipped, null_anchor).
pub async fn ledger(
    pool: &PgPool,
    run_id: uuid::Uuid,
) -> (
    String,
    bool,
    bool,
    Vec<(String, String, i64, i64, i64, i64)>,
) {
    let run = sqlx::query("SELECT status, dry_run, settled_at IS NOT NULL AS settled FROM public.sweep_run WHERE run_id = $1")
        .bind(run_id)
        .fetch_one(pool)
        .await
        .unwrap();
    let summaries = sqlx::query(
        "SELECT entity_type, strategy, affected_count, held_count, skipped_count, null_anchor_count \
         FROM public.sweep_run_entity_summary WHERE run_id = $1 ORDER BY summary_id",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
    .collect();
    (
        run.get("status"),
        run.get("dry_run"),
        run.get("settled"),
        summaries,
    )
}

/// Waits until some session of this database is waiting for a lock (the
/// step a concurrency test needs before releasing the blocker).
pub async fn wait_for_lock_wait(pool: &PgPool) {
    wait_until("a session waiting for a lock", std::time::Duration::from_secs(10), async || {
        count(
            pool,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .await
            > 0
    })
    .await;
}

/// Events an observer received, shared with the test.
pub type Events = std::sync::Arc<std::sync::Mutex<Vec<cohort::observer::AuditEvent>>>;

/// An observer that records every event it receives.
pub struct Recorder(pub Events);

#[cohort::async_trait]
impl cohort::observer::AuditObserver for Recorder {
    async fn on_event(
        &self,
        event: &cohort::observer::AuditEvent,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.0.lock().unwrap().push(event.clone());
        Ok(())
    }
}

/// Waits until the recorder has seen a run settle, and returns what it saw.
pub async fn settled_events(events: &Events) -> Vec<cohort::observer::AuditEvent> {
    let settled = || {
        events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, cohort::observer::AuditEvent::Settled { .. }))
    };
    wait_until(
        "the observer to see the run settle",
        std::time::Duration::from_secs(5),
        async || settled(),
    )
    .await;
    events.lock().unwrap().clone()
}

/// The secret key tests hash with (the `hash` anonymise method needs one).
pub const TEST_HASH_KEY: &str = "test-hash-key-0123456789abcdef";

/// Default settings plus the test hash key.
pub fn test_config() -> cohort::CohortConfig {
    cohort::CohortConfig {
        hash_key: Some(cohort::config::HashKey::new(TEST_HASH_KEY)),
        ..cohort::CohortConfig::default()
    }
}

/// HMAC-SHA256 of `message` under the test key, hex: what the `hash`
/// anonymise method must write, computed by the RustCrypto crates.
pub fn test_hmac_hex(message: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(TEST_HASH_KEY.as_bytes()).unwrap();
    mac.update(message.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Collects log output.
#[derive(Clone, Default)]
pub struct LogBuffer(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogBuffer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// The next test signal that `wanted` accepts (others are skipped),
/// failing the test after `limit`: a test waits for a moment of a sweep's
/// pacing instead of sleeping or reading log lines.
pub async fn next_signal(
    signals: &mut tokio::sync::broadcast::Receiver<cohort::signals::Signal>,
    limit: std::time::Duration,
    mut wanted: impl FnMut(&cohort::signals::Signal) -> bool,
) -> cohort::signals::Signal {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let signal = tokio::time::timeout_at(deadline, signals.recv())
            .await
            .expect("timed out waiting for a test signal");
        match signal {
            Ok(s) if wanted(&s) => return s,
            Ok(_) => {}
            Err(e) => panic!("test signals lost or ended: {e}"),
        }
    }
}

/// The next event of the services that `wanted` accepts (others are
/// skipped), failing the test after `limit`: a test waits for what a
/// service did instead of sleeping.
pub async fn next_event(
    events: &mut tokio::sync::broadcast::Receiver<cohort::services::ServiceEvent>,
    limit: std::time::Duration,
    mut wanted: impl FnMut(&cohort::services::ServiceEvent) -> bool,
) -> cohort::services::ServiceEvent {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("timed out waiting for a service event");
        match event {
            Ok(e) if wanted(&e) => return e,
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(e) => panic!("the services' events ended: {e}"),
        }
    }
}

/// Whether no session holds the run lock of `run_id` (probed by taking and
/// releasing it on one connection). The server frees a lock when its
/// session ends, a moment after the client lets the connection go.
pub async fn run_lock_free(pool: &PgPool, run_id: uuid::Uuid) -> bool {
    let mut conn = pool.acquire().await.unwrap();
    let key = format!("cohort.run:{run_id}");
    let took: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
        .bind(&key)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    if took {
        sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
            .bind(&key)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    took
}

/// Runs still `started` (in the `public` ledger).
pub async fn started_runs(pool: &PgPool) -> Vec<uuid::Uuid> {
    sqlx::query_scalar("SELECT run_id FROM public.sweep_run WHERE status = 'started'")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Makes the runs left `started` look abandoned long ago to maintenance:
/// their lock is waited for (their session is gone) and their start is
/// backdated an hour, past any `settle_timeout` the tests use, instead of
/// sleeping until it passes.
pub async fn backdate_abandoned_runs(pool: &PgPool) {
    for run_id in started_runs(pool).await {
        wait_until(
            "the lost run's lock to be released",
            std::time::Duration::from_secs(30),
            || run_lock_free(pool, run_id),
        )
        .await;
    }
    sqlx::query(
        "UPDATE public.sweep_run SET started_at = started_at - interval '1 hour' WHERE status = 'started'",
    )
    .execute(pool)
    .await
    .unwrap();
}
