//! Tenant tags (.NET Cohort's tenant context): from `[[tenant]]`, from a
//! `tenants_query`'s third column (`text[]` or comma-separated text) and
//! from the library's tenant list; rule providers see them and a
//! `[[category.override]]` can match on one. A tenant listed twice with
//! other tags: the first listing wins, with one warning (the directory the
//! operator wrote refuses it instead).

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::sync::{Arc, Mutex};

use cohort::policy::{PolicyFile, TenantEntry};
use cohort::rules::{
    CategoryCapabilities, ResolutionContext, ResolveError, RetentionRule, RuleProvider,
};
use cohort::{Cohort, ErrorKind, PreviewAllRequest, SweepAllRequest, SweepRequest, TenantSource};
use support::*;

/// Notes purge after 30 days; a tenant tagged `vip` keeps them 60 days.
fn policy(tenants: &str) -> String {
    format!(
        r#"
{tenants}

[[entity]]
name = "Note"
id = "{NOTE_ID}"
table = "app.notes"
category = "notes"
anchor = "created_at"

[[category]]
name = "notes"
strategy = "purge"
period = "30d"

[[category.override]]
tag = " vip "
period = "60d"
"#
    )
}

async fn handle(db: &cohort_pgtemp::TestDatabase, tenants: &str) -> Cohort {
    let p = PolicyFile::parse(&policy(tenants)).unwrap();
    Cohort::builder(db.pool().clone())
        .policy(p)
        .build()
        .await
        .unwrap()
}

/// The engine fixture's notes left for a tenant, by age label.
async fn notes_left(db: &cohort_pgtemp::TestDatabase, tenant: &str) -> Vec<String> {
    labels(
        db.pool(),
        &format!("SELECT split_part(body, ':', 2) FROM app.notes WHERE tenant_id = '{tenant}' ORDER BY 1"),
    )
    .await
}

/// What a 30-day purge leaves of a tenant's notes, and what a 60-day one
/// leaves (the vip override).
const AFTER_30_DAYS: [&str; 3] = ["1d", "null", "on-cutoff"];
const AFTER_60_DAYS: [&str; 5] = ["1d", "45d", "null", "on-cutoff", "past-cutoff"];

#[db_test(engine)]
async fn a_tag_from_the_tenant_directory_selects_its_override(db: TestDatabase) {
    let cohort = handle(
        &db,
        &format!(
            "[[tenant]]\nid = \"{TENANT_A}\"\ntags = [\"vip\", \"eu-health\"]\n\n[[tenant]]\nid = \"{TENANT_B}\"\n"
        ),
    )
    .await;
    // The preview counts what the sweep then does.
    let preview = cohort
        .preview_all(PreviewAllRequest::new(TenantSource::Directory, now()))
        .await
        .unwrap();
    let eligible: Vec<u64> = preview
        .passes
        .iter()
        .map(|p| p.as_ref().unwrap().entities[0].affected)
        .collect();
    assert_eq!(eligible, [1, 3], "vip: only the 400-day note; B: three");
    let result = cohort
        .sweep_all(SweepAllRequest::new(TenantSource::Directory, now()))
        .await
        .unwrap();
    let affected: Vec<u64> = result.runs().map(|r| r.affected()).collect();
    assert_eq!(affected, [1, 3]);
    assert_eq!(notes_left(&db, TENANT_A).await, AFTER_60_DAYS);
    assert_eq!(notes_left(&db, TENANT_B).await, AFTER_30_DAYS);
    // The runs record the override's period.
    let periods: Vec<String> = result
        .runs()
        .map(|r| r.entities[0].period.to_string())
        .collect();
    assert_eq!(periods, ["60d", "30d"]);
    // The audit trail says the same: each run's summary counts and the
    // period it applied.
    for (run, (affected, days)) in result.runs().zip([(1, 60), (3, 30)]) {
        let (status, dry_run, settled, summaries) = ledger(db.pool(), run.run_id).await;
        assert_eq!(
            (status.as_str(), dry_run, settled),
            ("succeeded", false, true)
        );
        assert_eq!(
            summaries,
            [("Note".into(), "purge".into(), affected, 0, 0, 1)]
        );
        let stored: bool = sqlx::query_scalar(
            "SELECT resolved_period = make_interval(days => $2) FROM public.sweep_run_entity_summary WHERE run_id = $1",
        )
        .bind(run.run_id)
        .bind(days)
        .fetch_one(db.pool())
        .await
        .unwrap();
        assert!(stored, "run {} stores the {days}-day period", run.run_id);
    }
}

#[tokio::test]
async fn tags_from_a_tenants_query_array_or_comma_text_select_the_override() {
    for tags in [
        "ARRAY['eu-health', 'vip']::text[]",
        "'eu-health, vip'::text",
    ] {
        let db = engine_db().await;
        let query = format!(
            "SELECT t, NULL::text, CASE WHEN t = '{TENANT_A}' THEN {tags} END FROM (VALUES ('{TENANT_A}'), ('{TENANT_B}')) v(t) ORDER BY t"
        );
        let cohort = handle(&db, &format!("tenants_query = \"{query}\"")).await;
        let found = cohort
            .tenants(&TenantSource::Query(query.clone()))
            .await
            .unwrap();
        assert_eq!(found.tenants[0].tags, ["eu-health", "vip"], "{tags}");
        assert!(found.tenants[1].tags.is_empty(), "NULL tags are none");
        cohort
            .sweep_all(SweepAllRequest::new(cohort.tenant_source().clone(), now()))
            .await
            .unwrap();
        assert_eq!(notes_left(&db, TENANT_A).await, AFTER_60_DAYS, "{tags}");
        assert_eq!(notes_left(&db, TENANT_B).await, AFTER_30_DAYS, "{tags}");
    }
}

#[db_test(engine)]
async fn tags_of_the_wrong_type_fail_only_their_row(db: TestDatabase) {
    let query = format!(
        "SELECT t, NULL::text, CASE WHEN t = '{TENANT_A}' THEN 42 ELSE NULL END FROM (VALUES ('{TENANT_A}'), ('{TENANT_B}')) v(t) ORDER BY t"
    );
    let cohort = handle(&db, &format!("tenants_query = \"{query}\"")).await;
    let result = cohort
        .sweep_all(SweepAllRequest::new(TenantSource::Query(query), now()))
        .await
        .unwrap();
    let failure = result.not_started().next().expect("tenant A's pass fails");
    assert_eq!(
        (failure.position, failure.kind),
        (Some(1), ErrorKind::InvalidInput)
    );
    assert!(failure.error.contains("third column"), "{}", failure.error);
    assert_eq!(notes_left(&db, TENANT_A).await.len(), 6, "A untouched");
    assert_eq!(notes_left(&db, TENANT_B).await, AFTER_30_DAYS, "B swept");
}

/// A tenant id and the tags a resolution saw for it.
type Seen = (Option<String>, Vec<String>);

/// Records the tags every resolution saw.
struct Recording {
    inner: cohort::rules::StaticRuleProvider,
    seen: Arc<Mutex<Vec<Seen>>>,
}

#[cohort::async_trait]
impl RuleProvider for Recording {
    fn capabilities(&self, category: &str) -> Option<CategoryCapabilities> {
        self.inner.capabilities(category)
    }

    async fn resolve(&self, ctx: &ResolutionContext) -> Result<RetentionRule, ResolveError> {
        self.seen
            .lock()
            .unwrap()
            .push((ctx.tenant.tenant_id.clone(), ctx.tenant.tags.clone()));
        self.inner.resolve(ctx).await
    }
}

#[db_test(engine)]
async fn providers_see_the_tags_of_a_list_and_the_first_listing_wins(db: TestDatabase) {
    let seen = Arc::default();
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(Recording {
            inner: rules(),
            seen: Arc::clone(&seen),
        })
        .declaration(
            cohort::EntityDeclaration::new("Note", NOTE_ID)
                .category("notes")
                .anchor("created_at")
                .table("app.notes"),
        )
        .build()
        .await
        .unwrap();
    let upper = TENANT_A.to_uppercase();
    let list = TenantSource::List(vec![
        TenantEntry::new(TENANT_A).tags(["gold", " gold", ""]),
        TenantEntry::new(&upper).tags(["silver"]),
        TenantEntry::new(TENANT_A).tags(["bronze"]),
        TenantEntry::new(TENANT_B),
    ]);
    let found = cohort.tenants(&list).await.unwrap();
    assert_eq!(found.tenants.len(), 2);
    assert_eq!(
        found.tenants[0].tags,
        ["gold"],
        "trimmed, empty and repeats dropped"
    );
    // An entry built field by field is read the same way.
    let literal = TenantEntry {
        id: TENANT_A.into(),
        jurisdiction: None,
        tags: vec![" gold ".into(), String::new(), "gold".into()],
    };
    let read = cohort
        .tenants(&TenantSource::List(vec![literal]))
        .await
        .unwrap();
    assert_eq!(read.tenants[0].tags, ["gold"]);
    assert_eq!(
        found.conflicting_duplicates,
        std::slice::from_ref(&upper),
        "one warning for the tenant however often it disagrees"
    );
    cohort
        .sweep_all(SweepAllRequest::new(list, now()))
        .await
        .unwrap();
    assert_eq!(
        seen.lock().unwrap().clone(),
        [
            (Some(TENANT_A.to_owned()), vec!["gold".to_owned()]),
            (Some(TENANT_B.to_owned()), vec![]),
        ]
    );
}

#[tokio::test]
async fn a_request_that_contradicts_the_directorys_tags_is_refused_and_bad_tags_are_refused_at_load(
) {
    let db = engine_db().await;
    let cohort = handle(
        &db,
        &format!("[[tenant]]\nid = \"{TENANT_A}\"\ntags = [\"vip\"]\n"),
    )
    .await;
    let before = table_digest(db.pool(), "app.notes").await;
    let e = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()).tags(["standard"]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("listed with tags"), "{e}");
    assert_eq!(table_digest(db.pool(), "app.notes").await, before);
    // The same tags in another order and spelling are the listing's.
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A.to_uppercase(), now()).tags([" vip"]))
        .await
        .unwrap();
    assert_eq!(r.affected(), 1, "the vip override applied");

    for (tenants, message) in [
        (
            format!("[[tenant]]\nid = \"{TENANT_A}\"\ntags = [\" \"]\n"),
            "a tag must not be empty",
        ),
        (
            format!(
                "[[tenant]]\nid = \"{TENANT_A}\"\ntags = [\"vip\"]\n\n[[tenant]]\nid = \"{TENANT_A}\"\ntags = [\"gold\"]\n"
            ),
            "listed twice with different tags",
        ),
    ] {
        let refused = match PolicyFile::parse(&policy(&tenants)) {
            Err(e) => e,
            Ok(p) => Cohort::builder(db.pool().clone())
                .policy(p)
                .build()
                .await
                .unwrap_err(),
        };
        assert!(refused.to_string().contains(message), "{refused}");
    }
    let empty_override = policy("").replace("tag = \" vip \"", "tag = \"\"");
    let refused = PolicyFile::parse(&empty_override).unwrap_err();
    assert!(
        refused.to_string().contains("tag must not be empty"),
        "{refused}"
    );
}

/// A library caller sweeping one tenant of a handle whose tenants come
/// from `tenants_query` gets the tenant's listing, as the CLI did on its
/// own (issue 38: the lookup moved into the library): the tenant's tag
/// selects its override (without it the sweep ran with no tag and purged
/// the notes the override keeps, as the control below shows); a tenant the
/// query does not list is refused with nothing written, and so is a
/// request naming other tags.
#[db_test(engine)]
async fn a_single_tenant_sweep_takes_its_listing_from_the_tenants_query(db: TestDatabase) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE app.orgs (id uuid, region text, tags text[]);
         INSERT INTO app.orgs VALUES ('{TENANT_A}', NULL, ARRAY['vip']);"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let cohort = handle(
        &db,
        "tenants_query = \"SELECT id, region, tags FROM app.orgs\"",
    )
    .await;
    let b_before = notes_left(&db, TENANT_B).await;
    let refused = cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{refused}");
    assert!(
        refused
            .to_string()
            .contains("is not among the tenants tenants_query returns"),
        "{refused}"
    );
    assert_eq!(notes_left(&db, TENANT_B).await, b_before, "nothing written");
    let other = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()).tags(["gold"]))
        .await
        .unwrap_err();
    assert!(other.to_string().contains("is listed with tags"), "{other}");

    // The control: the same sweep with the directory as the source (no
    // listing, so no tag) purges on the 30-day rule: a dry run counts it.
    let directory = handle(&db, "").await;
    let control = directory
        .sweep(SweepRequest::tenanted(TENANT_A, now()).dry_run(true))
        .await
        .unwrap();
    assert_eq!(control.entities[0].period.to_string(), "30d");

    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(run.entities[0].period.to_string(), "60d");
    assert_eq!(notes_left(&db, TENANT_A).await, AFTER_60_DAYS);
}
