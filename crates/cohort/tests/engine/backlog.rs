//! Whether retention keeps up, read by the library: each entity's backlog
//! (the oldest row still eligible and its age past the cutoff) and the last
//! successful runs, against backdated rows on a real database.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use chrono::{DateTime, TimeDelta, Utc};
use cohort::holds::HoldRequest;
use cohort::{Cohort, SweepRequest};
use support::*;

const TABLES: &str = "
    CREATE SCHEMA app;
    CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz);
    CREATE INDEX ON app.notes (tenant_id, created_at);
    CREATE TABLE app.contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
                               anonymised_at timestamptz, email text);
    CREATE INDEX ON app.contacts (tenant_id, created_at);
    CREATE TABLE app.logs (id bigint PRIMARY KEY, created_at timestamptz);";

fn policy() -> String {
    format!(
        r#"
[[tenant]]
id = "{TENANT_A}"

[[tenant]]
id = "{TENANT_B}"

[[entity]]
name = "Note"
id = "{NOTE_ID}"
table = "app.notes"
category = "notes"
anchor = "created_at"

[[entity]]
name = "Contact"
id = "{CONTACT_ID}"
table = "app.contacts"
category = "contacts"
anchor = "created_at"
anonymise = {{ email = "null" }}

[[entity]]
name = "Log"
id = "{OTHER_ID}"
table = "app.logs"
category = "kept"
anchor = "created_at"
tenantless = true

[[category]]
name = "notes"
strategy = "purge"
period = "30d"

[[category.override]]
tenant = "{TENANT_B}"
period = "90d"

[[category]]
name = "contacts"
strategy = "anonymise"
period = "30d"

[[category]]
name = "kept"
strategy = "exempt"
period = "1d"
"#
    )
}

async fn anchor(pool: &sqlx::PgPool, table: &str, id: i64) -> DateTime<Utc> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT created_at FROM app.{table} WHERE id = $1"
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// RS-008: the backlog is the oldest row still eligible under its tenant's
/// rule (held rows, rows already anonymised and newer rows are not), for
/// the worst tenant, 0 for an exempt entity; after sweeps catch up it is
/// 0 everywhere, and the last success is the ledger's latest real sweep
/// (a dry run does not count).
#[db_test(migrated)]
async fn backlog_is_the_oldest_eligible_row_per_entity_and_last_success_the_latest_real_run(
    db: TestDatabase,
) {
    let pool = db.pool();
    exec(pool, TABLES).await;
    exec(
        pool,
        &format!(
            "INSERT INTO app.notes VALUES
               (1, '{TENANT_A}', now() - interval '50 days'),
               (2, '{TENANT_A}', now() - interval '70 days'),
               (3, '{TENANT_A}', now() - interval '10 days'),
               (11, '{TENANT_B}', now() - interval '100 days'),
               (12, '{TENANT_B}', now() - interval '80 days');
             INSERT INTO app.contacts VALUES
               (21, '{TENANT_A}', now() - interval '200 days', now() - interval '150 days', NULL),
               (22, '{TENANT_A}', now() - interval '45 days', NULL, 'a@example.com');
             INSERT INTO app.logs VALUES (31, now() - interval '1000 days');"
        ),
    )
    .await;
    let cohort = Cohort::builder(pool.clone())
        .policy(cohort::policy::PolicyFile::parse(&policy()).unwrap())
        .build()
        .await
        .unwrap();
    // Note 2 (70 days) is held: not eligible, so not the backlog.
    cohort
        .create_hold(HoldRequest::new(NOTE_ID.parse().unwrap(), "2", "litigation").tenant(TENANT_A))
        .await
        .unwrap();
    let last = cohort.last_success().await.unwrap();
    assert_eq!((last.sweep, last.erasure), (None, None), "nothing ran yet");

    let before: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap();
    let backlog = cohort.backlog().await.unwrap();
    let of = |name: &str| {
        backlog
            .iter()
            .find(|b| b.entity == name)
            .unwrap_or_else(|| panic!("{name} missing from {backlog:?}"))
            .clone()
    };
    // Tenant A's note 1 is 20 days past A's 30-day cutoff; tenant B's note
    // 11 only 10 past B's 90-day one: the worst tenant is A.
    let note = of("Note");
    assert_eq!(note.oldest, Some(anchor(pool, "notes", 1).await));
    assert_eq!(note.tenant.as_deref(), Some(TENANT_A));
    let twenty = TimeDelta::days(20).num_seconds() as f64;
    // Measured at the database's now when read: a little after the rows
    // were written, never before.
    let drift = (Utc::now() - before).num_milliseconds() as f64 / 1000.0 + 1.0;
    assert!(
        note.age_seconds >= twenty && note.age_seconds < twenty + drift,
        "{note:?}"
    );
    // Contact 21 is older but done (anonymised); contact 22 is behind.
    let contact = of("Contact");
    assert_eq!(contact.oldest, Some(anchor(pool, "contacts", 22).await));
    let fifteen = TimeDelta::days(15).num_seconds() as f64;
    assert!(
        contact.age_seconds >= fifteen && contact.age_seconds < fifteen + drift,
        "{contact:?}"
    );
    let log = of("Log");
    assert_eq!(
        (log.age_seconds, log.oldest),
        (0.0, None),
        "exempt: no backlog"
    );

    // A dry run changes nothing: the backlog stays, no success is recorded.
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap();
    cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now).dry_run(true))
        .await
        .unwrap();
    assert_eq!(cohort.last_success().await.unwrap().sweep, None);
    assert_eq!(
        of_now(&cohort, "Note").await.oldest,
        Some(anchor(pool, "notes", 1).await)
    );
    assert_eq!(
        of_now(&cohort, "Contact").await.oldest,
        Some(anchor(pool, "contacts", 22).await)
    );

    // Real sweeps of both tenants catch up.
    for tenant in [TENANT_A, TENANT_B] {
        let r = cohort
            .sweep(SweepRequest::tenanted(tenant, now))
            .await
            .unwrap();
        assert_eq!(r.status, cohort::RunStatus::Succeeded);
    }
    let caught_up = cohort.backlog().await.unwrap();
    assert!(!caught_up.is_empty(), "the backlog lists every entity");
    for b in caught_up {
        assert_eq!((b.age_seconds, b.oldest), (0.0, None), "{b:?}");
    }
    let latest: DateTime<Utc> = sqlx::query_scalar(
        "SELECT max(settled_at) FROM public.sweep_run WHERE NOT dry_run AND status = 'succeeded'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let last = cohort.last_success().await.unwrap();
    assert_eq!((last.sweep, last.erasure), (Some(latest), None));
    // What is left: the held note, the recent ones, B's note within 90 days.
    assert_eq!(
        labels(pool, "SELECT id::text FROM app.notes ORDER BY id").await,
        ["12", "2", "3"]
    );
}

async fn of_now(cohort: &Cohort, name: &str) -> cohort::telemetry::EntityBacklog {
    cohort
        .backlog()
        .await
        .unwrap()
        .into_iter()
        .find(|b| b.entity == name)
        .unwrap()
}

/// A metrics recorder for one test's thread: every value a gauge is set
/// to, by name and labels.
#[derive(Clone, Default)]
struct Gauges(std::sync::Arc<std::sync::Mutex<Vec<(String, f64)>>>);

struct Set {
    key: String,
    seen: Gauges,
}

impl metrics::GaugeFn for Set {
    fn increment(&self, _: f64) {}
    fn decrement(&self, _: f64) {}
    fn set(&self, value: f64) {
        self.seen.0.lock().unwrap().push((self.key.clone(), value));
    }
}

impl metrics::Recorder for Gauges {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        metrics::Gauge::from_arc(std::sync::Arc::new(Set {
            key: format!("{}{{{}}}", key.name(), labels.join(",")),
            seen: self.clone(),
        }))
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

impl Gauges {
    fn backlog_of(&self, entity: &str) -> Vec<f64> {
        let key = format!("cohort_entity_backlog_age_seconds{{entity={entity}}}");
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .collect()
    }
}

/// The backlog gauge's read after a sweep runs by default, and finds what
/// the sweep left: here a row another session held locked, which the
/// batches passed over (`SKIP LOCKED`). `backlog_gauge(false)`, for a
/// process that exports no metrics (`cohort sweep`), skips the read: the
/// same sweep sets no gauge, and changes the same rows.
#[db_test(migrated)]
async fn the_backlog_gauge_is_read_after_a_sweep_unless_turned_off(db: TestDatabase) {
    let pool = db.pool();
    exec(pool, TABLES).await;
    let seed = format!(
        "DELETE FROM app.notes;
         INSERT INTO app.notes VALUES
           (1, '{TENANT_A}', now() - interval '50 days'),
           (2, '{TENANT_A}', now() - interval '70 days'),
           (3, '{TENANT_A}', now() - interval '10 days');"
    );
    let policy = || cohort::policy::PolicyFile::parse(&policy()).unwrap();
    let measured = Cohort::builder(pool.clone())
        .policy(policy())
        .build()
        .await
        .unwrap();
    let unmeasured = Cohort::builder(pool.clone())
        .policy(policy())
        .backlog_gauge(false)
        .build()
        .await
        .unwrap();

    for (cohort, read) in [(&measured, true), (&unmeasured, false)] {
        exec(pool, &seed).await;
        // Another session holds note 2 (70 days old) locked for the sweep.
        let mut locker = pool.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM app.notes WHERE id = 2 FOR UPDATE")
            .execute(&mut *locker)
            .await
            .unwrap();
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(pool)
            .await
            .unwrap();
        let gauges = Gauges::default();
        let swept = {
            let _local = metrics::set_default_local_recorder(&gauges);
            cohort
                .sweep(SweepRequest::tenanted(TENANT_A, now))
                .await
                .unwrap()
        };
        locker.rollback().await.unwrap();
        assert_eq!(swept.status, cohort::RunStatus::Succeeded);
        assert_eq!(swept.entity("Note").unwrap().affected, 1, "note 1 only");
        assert_eq!(
            labels(pool, "SELECT id::text FROM app.notes ORDER BY id").await,
            ["2", "3"],
            "the locked row was passed over"
        );
        let seen = gauges.backlog_of("Note");
        if read {
            // Note 2 is 40 days past the 30-day cutoff.
            let forty = TimeDelta::days(40).num_seconds() as f64;
            assert_eq!(seen.len(), 1, "{seen:?}");
            assert!(seen[0] >= forty && seen[0] < forty + 60.0, "{seen:?}");
        } else {
            assert!(seen.is_empty(), "no read, no gauge: {seen:?}");
        }
    }
}
