//! Snapshots of every statement the planner builds (insta): each strategy,
//! tenanted and tenantless, with and without foreign-key blockers, custom
//! anonymisers, a hashed column and citext keys; the ledger statements; and
//! the erasure statements with and without a legal minimum. A change to any
//! SQL text shows up as a reviewed snapshot diff.

use crate::base::ident::SqlText;
use std::collections::BTreeMap;

use super::{Casts, EntityPlan, ErasurePlan, HoldKeys, KeyType, LedgerPlan};
use crate::base::ident::QualifiedName;
use crate::domain::model::{
    resolve, AnonymiseMethod, Conventions, CustomAnonymiser, EntityDeclaration, EntityDescriptor,
    Resolved,
};
use crate::domain::rules::{CategoryCapabilities, Strategy};
use crate::sql::IncomingKey;

#[allow(clippy::ptr_arg)] // the anonymiser signature takes the column's Rust type by reference
fn mask(v: &String) -> String {
    format!("masked-{}", v.len())
}

/// The subject columns' and tenant's key types the snapshots assume: a
/// uuid `user_id`, a citext `delegate_id`, a text tenant.
pub(super) fn key_types(e: &EntityDescriptor) -> (BTreeMap<String, KeyType>, Option<KeyType>) {
    let subjects = e
        .subjects
        .iter()
        .map(|s| {
            let ty = if s.column == "delegate_id" {
                KeyType::CiText
            } else {
                KeyType::Uuid
            };
            (s.column.clone(), ty)
        })
        .collect();
    (subjects, e.tenant.as_ref().map(|_| KeyType::Text))
}

pub(super) fn hold_keys(types: &(BTreeMap<String, KeyType>, Option<KeyType>)) -> HoldKeys<'_> {
    HoldKeys {
        subjects: &types.0,
        tenant: types.1,
    }
}

pub(super) fn descriptor(tenanted: bool, custom: bool) -> EntityDescriptor {
    descriptor_with(tenanted, custom, false)
}

fn stamp(cx: &crate::domain::model::AnonymiseContext<'_>) -> String {
    format!("erased {}", cx.now)
}

fn descriptor_with(tenanted: bool, custom: bool, per_run: bool) -> EntityDescriptor {
    let mut d = EntityDeclaration::new("Contact", "b7316df4-7db5-46ad-aea7-f65c4b430f73")
        .category("contacts")
        .anchor("created_at")
        .table("app.contacts")
        .anonymise("email", AnonymiseMethod::Null)
        .anonymise("full_name", AnonymiseMethod::Empty)
        .anonymise("phone", AnonymiseMethod::Literal("[redacted]".into()))
        .anonymise("reference", AnonymiseMethod::Hash)
        .subject("user_id", Some("user"))
        .subject("delegate_id", None);
    if custom {
        d = d.anonymise(
            "nickname",
            AnonymiseMethod::Custom(CustomAnonymiser::new::<String, _, _>("mask", mask)),
        );
    }
    if per_run {
        // Between a literal and the per-row values: its parameter sits
        // among the literals, in declaration order.
        d = d.anonymise(
            "badge",
            AnonymiseMethod::Custom(CustomAnonymiser::per_run("stamp", stamp)),
        );
    }
    if !tenanted {
        d = d.tenantless();
    }
    let mut columns: Vec<String> = [
        "id",
        "created_at",
        "anonymised_at",
        "is_deleted",
        "deleted_at",
        "email",
        "full_name",
        "phone",
        "reference",
        "nickname",
        "badge",
        "user_id",
        "delegate_id",
    ]
    .iter()
    .map(|c| c.to_string())
    .collect();
    if tenanted {
        columns.push("tenant_id".into());
    }
    match resolve(&d, &Conventions::default(), "public", &columns) {
        Ok(Resolved::Retained(e)) => *e,
        other => panic!("fixture resolves: {other:?}"),
    }
}

/// The plan of `e` for `capabilities`, with no blockers, casts or stage,
/// on a plain table, in schema `cohort`.
pub(super) fn plain_plan(e: &EntityDescriptor, capabilities: &CategoryCapabilities) -> EntityPlan {
    let types = key_types(e);
    EntityPlan::build(
        e,
        capabilities,
        &[],
        &Casts::default(),
        hold_keys(&types),
        Some(&hasher()),
        "cohort",
        None,
        true,
    )
}

pub(super) fn hasher() -> CustomAnonymiser {
    crate::context::HmacPads::anonymiser(b"snapshot-test-key-0123456789")
}

fn blockers() -> Vec<IncomingKey> {
    vec![IncomingKey {
        name: "orders_contact_fkey".into(),
        on_delete: "a".into(),
        child: QualifiedName::new("app", "orders"),
        child_columns: vec!["contact_id".into()],
        parent_columns: vec!["id".into()],
        child_indexed: true,
    }]
}

fn all_strategies() -> CategoryCapabilities {
    CategoryCapabilities::new([
        Strategy::Purge,
        Strategy::SoftDelete,
        Strategy::Anonymise,
        Strategy::Exempt,
    ])
    .unwrap()
}

fn citext() -> Casts {
    Casts {
        columns: BTreeMap::from([
            ("id".to_string(), QualifiedName::new("ext", "citext")),
            ("tenant_id".to_string(), QualifiedName::new("ext", "citext")),
        ]),
        key: Vec::new(),
    }
}

/// The plan's statements by kind, then strategy: the layout the entity
/// snapshots were taken in (a map holds a strategy only where the
/// statement exists).
#[derive(Default)]
pub(super) struct Kinds {
    pub(super) counts: BTreeMap<Strategy, SqlText>,
    pub(super) counts_after: BTreeMap<Strategy, SqlText>,
    pub(super) backlog: BTreeMap<Strategy, SqlText>,
    pub(super) kept_by_legal_min: BTreeMap<Strategy, SqlText>,
    pub(super) lock: BTreeMap<Strategy, SqlText>,
    pub(super) lock_after: BTreeMap<Strategy, SqlText>,
    pub(super) lock_until: BTreeMap<Strategy, SqlText>,
    pub(super) lock_after_until: BTreeMap<Strategy, SqlText>,
    pub(super) ranges: BTreeMap<Strategy, SqlText>,
    pub(super) mutate: BTreeMap<Strategy, SqlText>,
    pub(super) mutate_count: BTreeMap<Strategy, SqlText>,
    pub(super) mutate_audited: BTreeMap<Strategy, SqlText>,
    pub(super) mutate_head: BTreeMap<Strategy, SqlText>,
    pub(super) fused: BTreeMap<Strategy, crate::sql::sweep::Fused>,
    pub(super) by_address: std::collections::BTreeSet<Strategy>,
}

pub(super) fn kinds(plan: &EntityPlan) -> Kinds {
    let mut k = Kinds::default();
    for (strategy, s) in &plan.strategies {
        let strategy = *strategy;
        k.counts.insert(strategy, s.counts.clone());
        let put = |map: &mut BTreeMap<Strategy, SqlText>, sql: &Option<SqlText>| {
            if let Some(sql) = sql {
                map.insert(strategy, sql.clone());
            }
        };
        put(&mut k.counts_after, &s.counts_after);
        put(&mut k.backlog, &s.backlog);
        put(&mut k.kept_by_legal_min, &s.kept_by_legal_min);
        put(&mut k.lock_after, &s.lock_after);
        put(&mut k.lock_until, &s.lock_until);
        put(&mut k.lock_after_until, &s.lock_after_until);
        put(&mut k.ranges, &s.ranges);
        put(&mut k.mutate_count, &s.mutate_count);
        put(&mut k.mutate_audited, &s.mutate_audited);
        put(&mut k.mutate_head, &s.mutate_head);
        if strategy.mutates() {
            k.lock.insert(strategy, s.lock.clone());
            k.mutate.insert(strategy, s.mutate.clone());
        }
        if let Some(f) = &s.fused {
            k.fused.insert(strategy, f.clone());
        }
        if s.by_address {
            k.by_address.insert(strategy);
        }
    }
    k
}

fn render(plan: &EntityPlan) -> String {
    let k = kinds(plan);
    let mut out = String::new();
    for (kind, statements) in [
        ("counts", &k.counts),
        ("counts_after", &k.counts_after),
        ("backlog", &k.backlog),
        ("kept_by_legal_min", &k.kept_by_legal_min),
        ("lock", &k.lock),
        ("lock_after", &k.lock_after),
        ("lock_until", &k.lock_until),
        ("lock_after_until", &k.lock_after_until),
        ("ranges", &k.ranges),
        ("mutate", &k.mutate),
        ("mutate_count", &k.mutate_count),
        ("mutate_audited", &k.mutate_audited),
    ] {
        for (strategy, sql) in statements {
            out.push_str(&format!("-- {kind} {strategy}\n{}\n\n", sql.as_str()));
        }
    }
    // The legal minimum's count binds as the counts, then one more: the
    // period's cutoff, with no gap.
    for (strategy, sql) in &k.kept_by_legal_min {
        let counts = placeholders(k.counts[strategy].as_str());
        let last = counts.iter().next_back().copied().unwrap_or(0);
        assert_eq!(
            placeholders(sql.as_str()),
            (1..=last + 1).collect(),
            "{}",
            sql.as_str()
        );
    }
    for (strategy, fused) in &k.fused {
        for (kind, sql) in [
            ("fused", &fused.count.plain),
            ("fused_after_until", &fused.count.after_until),
            ("fused_audited_after", &fused.audited.after),
        ] {
            out.push_str(&format!("-- {kind} {strategy}\n{}\n\n", sql.as_str()));
        }
        // Every form binds its parameters without a gap.
        for forms in [&fused.count, &fused.audited] {
            for sql in [&forms.plain, &forms.after, &forms.until, &forms.after_until] {
                let found = placeholders(sql.as_str());
                let last = found.iter().next_back().copied().unwrap_or(0);
                assert_eq!(found, (1..=last).collect(), "{}", sql.as_str());
            }
        }
    }
    for (name, sql) in [
        ("load_rows", &plan.targets.load_rows),
        ("lock_target", &plan.targets.lock_target),
        ("guard_lock", &plan.targets.guard_lock),
        ("guard_held", &plan.targets.guard_held),
        ("is_held", &plan.targets.is_held),
        ("is_held_at", &plan.targets.is_held_at),
    ] {
        out.push_str(&format!("-- {name}\n{}\n\n", sql.as_str()));
    }
    out
}

#[test]
fn entity_statements() {
    for (name, tenanted, custom, blocked, casts) in [
        ("tenanted", true, false, false, Casts::default()),
        ("tenantless", false, false, false, Casts::default()),
        ("tenanted_blocked", true, false, true, Casts::default()),
        ("tenanted_custom", true, true, false, Casts::default()),
        ("tenanted_citext_custom_blocked", true, true, true, citext()),
    ] {
        let e = descriptor(tenanted, custom);
        let b = if blocked { blockers() } else { Vec::new() };
        let types = key_types(&e);
        let plan = EntityPlan::build(
            &e,
            &all_strategies(),
            &b,
            &casts,
            hold_keys(&types),
            Some(&hasher()),
            "cohort",
            None,
            true,
        );
        // Fused: purge (and soft delete) where nothing references the
        // table; anonymise where no value is computed in Rust.
        assert_eq!(
            kinds(&plan).fused.contains_key(&Strategy::Purge),
            !blocked,
            "{name}"
        );
        assert!(
            kinds(&plan).fused.contains_key(&Strategy::SoftDelete),
            "{name}"
        );
        assert_eq!(
            kinds(&plan).fused.contains_key(&Strategy::Anonymise),
            !plan.values.computes_per_row(Strategy::Anonymise),
            "{name}"
        );
        if let Some(fused) = kinds(&plan).fused.get(&Strategy::Purge) {
            // The lock's values (tenant after the limit), then (audited)
            // the four audit values, then the cursor and the range's end.
            let t = usize::from(tenanted);
            for (sql, last) in [
                (&fused.count.plain, 3 + t),
                (&fused.count.after, 5 + t),
                (&fused.count.after_until, 7 + t),
                (&fused.audited.plain, 7 + t),
                (&fused.audited.until, 9 + t),
            ] {
                assert_eq!(placeholders(sql.as_str()), (1..=last).collect());
            }
        }
        insta::assert_snapshot!(format!("entity_{name}"), render(&plan));
    }
}

#[test]
fn entity_statements_with_a_per_run_anonymiser() {
    let e = descriptor_with(true, true, true);
    let plan = plain_plan(&e, &all_strategies());
    insta::assert_snapshot!("entity_tenanted_custom_per_run", render(&plan));
}

#[test]
fn ledger_statements() {
    let l = LedgerPlan::build("cohort");
    let out: String = [
        ("insert_run", &l.insert_run),
        ("settle_run", &l.settle_run),
        ("insert_not_started", &l.insert_not_started),
        ("insert_summary", &l.insert_summary),
        ("add_affected", &l.add_affected),
        ("add_affected_marked", &l.add_affected_marked),
        ("finish_summary", &l.finish_summary),
        ("insert_details", &l.insert_details),
        ("insert_hold", &l.insert_hold),
        ("list_holds", &l.list_holds),
        ("release_hold", &l.release_hold),
        ("get_hold", &l.get_hold),
        ("active_subject_holds", &l.active_subject_holds),
        ("active_holds", &l.active_holds),
    ]
    .iter()
    .map(|(n, s)| format!("-- {n}\n{}\n\n", s.as_str()))
    .collect();
    insta::assert_snapshot!("ledger", out);
}

#[test]
fn erasure_statements() {
    for (name, tenanted, custom, with_cutoff) in [
        ("tenanted", true, false, false),
        ("tenanted_legal_min", true, false, true),
        ("tenantless_custom_legal_min", false, true, true),
    ] {
        let e = descriptor(tenanted, custom);
        let types = key_types(&e);
        let plan = EntityPlan::build(
            &e,
            &all_strategies(),
            &blockers(),
            &Casts::default(),
            hold_keys(&types),
            Some(&hasher()),
            "cohort",
            None,
            true,
        );
        let mut out = String::new();
        for strategy in [
            Strategy::Purge,
            Strategy::SoftDelete,
            Strategy::Anonymise,
            Strategy::Exempt,
        ] {
            let subjects = vec!["user_id".to_string(), "delegate_id".to_string()];
            let p = ErasurePlan::build(
                &e,
                &plan,
                strategy,
                &Casts::default(),
                &subjects,
                with_cutoff,
            );
            out.push_str(&format!(
                "-- {strategy} lock\n{}\n\n-- {strategy} lock_after\n{}\n\n-- {strategy} mutate\n{}\n\n-- {strategy} counts\n{}\n\n",
                p.lock.as_str(),
                p.lock_after.as_str(),
                p.mutate.as_str(),
                p.counts.as_str()
            ));
        }
        insta::assert_snapshot!(format!("erasure_{name}"), out);
    }
}

/// Placeholders `$n` in a statement.
/// The plan of `e` with a blocking foreign key, no casts and the hash key.
fn blocked_plan(
    e: &EntityDescriptor,
    caps: &CategoryCapabilities,
    stage: Option<&crate::sql::StageScope>,
) -> EntityPlan {
    let types = key_types(e);
    EntityPlan::build(
        e,
        caps,
        &blockers(),
        &Casts::default(),
        hold_keys(&types),
        Some(&hasher()),
        "cohort",
        stage,
        true,
    )
}

/// An entity that archives into `vault.contacts_archive`: every column,
/// or (anonymised) the copy scrubbed like an anonymisation.
fn archiving(tenanted: bool, custom: bool, anonymise: bool) -> EntityDescriptor {
    let mut e = descriptor_with(tenanted, custom, custom);
    let mut columns = vec!["id", "created_at", "email", "phone", "reference", "user_id"];
    if custom {
        columns.extend(["nickname", "badge"]);
    }
    e.archive = Some(crate::domain::model::ArchiveTarget {
        table: QualifiedName::new("vault", "contacts_archive"),
        columns: columns.into_iter().map(str::to_owned).collect(),
        anonymise,
    });
    e
}

fn archive_only() -> CategoryCapabilities {
    CategoryCapabilities::new([Strategy::Archive]).unwrap()
}

#[test]
fn entity_archive_statements() {
    for (name, tenanted, custom, anonymise) in [
        ("archive_tenanted", true, false, false),
        ("archive_tenantless_anonymised_custom", false, true, true),
    ] {
        let plan = blocked_plan(
            &archiving(tenanted, custom, anonymise),
            &archive_only(),
            None,
        );
        // Archive brings purge's statements, for erasure.
        assert!(kinds(&plan).mutate_head.contains_key(&Strategy::Purge));
        let mut out = String::new();
        for (kind, statements) in [
            ("mutate", &kinds(&plan).mutate),
            ("mutate_count", &kinds(&plan).mutate_count),
            ("mutate_audited", &kinds(&plan).mutate_audited),
        ] {
            let sql = &statements[&Strategy::Archive];
            out.push_str(&format!("-- {kind} archive\n{}\n\n", sql.as_str()));
        }
        insta::assert_snapshot!(format!("entity_{name}"), out);
    }
}

/// Archive binds the run id (`$3`) after the keys, then, anonymised, the
/// anonymise parameters, then the run's `now` (`archived_at`); then the
/// cutoff and the tenant; the audited form then its four ledger values.
#[test]
fn archive_parameters_match_what_the_executor_binds() {
    for (tenanted, custom, anonymise) in [
        (true, false, false),
        (false, false, false),
        (true, true, true),
        (false, true, true),
        (true, false, true),
    ] {
        let plan = blocked_plan(
            &archiving(tenanted, custom, anonymise),
            &archive_only(),
            None,
        );
        let after = plan.values.params_after_keys(Strategy::Archive);
        assert_eq!(
            after,
            1 + if anonymise {
                plan.values.anonymise_params()
            } else {
                0
            } + 1
        );
        let expected = 2 + after + 1 + usize::from(tenanted);
        for sql in [&kinds(&plan).mutate, &kinds(&plan).mutate_count] {
            let sql = sql[&Strategy::Archive].as_str();
            assert_eq!(placeholders(sql), (1..=expected).collect(), "{sql}");
        }
        let kinds = kinds(&plan);
        let audited = kinds.mutate_audited[&Strategy::Archive].as_str();
        assert_eq!(
            placeholders(audited),
            (1..=expected + 4).collect(),
            "{audited}"
        );
        // The hashed column is computed in Rust: an anonymised copy needs it.
        assert_eq!(plan.values.computes_per_row(Strategy::Archive), anonymise);
    }
}

/// A purge stage measured from the soft-delete marker: anchored on
/// `deleted_at`, only rows still soft-deleted, and the legal minimum's
/// floor on the entity's own anchor bound right after the tenant.
#[test]
fn entity_stage_statements() {
    for (name, tenanted) in [("stage_tenanted", true), ("stage_tenantless", false)] {
        let mut e = descriptor(tenanted, false);
        e.soft_delete = Some("is_deleted".into());
        e.deleted_at = Some("deleted_at".into());
        let (staged, scope) = crate::sql::StageScope::after(&e, Strategy::SoftDelete).unwrap();
        assert_eq!(staged.anchor, "deleted_at");
        let plan = blocked_plan(
            &staged,
            &CategoryCapabilities::only(Strategy::Purge),
            Some(&scope),
        );
        let t = usize::from(tenanted);
        // Lock: cutoff, limit, tenant, floor, then the cursor.
        assert_eq!(
            placeholders(kinds(&plan).lock[&Strategy::Purge].as_str()),
            (1..=4 + t).collect()
        );
        assert_eq!(
            placeholders(kinds(&plan).lock_after[&Strategy::Purge].as_str()),
            (1..=6 + t).collect()
        );
        // A parallel sweep's key range: its last row where the cursor
        // goes, or after it; the ranges bind as `lock`.
        assert_eq!(
            placeholders(kinds(&plan).lock_until[&Strategy::Purge].as_str()),
            (1..=6 + t).collect()
        );
        assert_eq!(
            placeholders(kinds(&plan).lock_after_until[&Strategy::Purge].as_str()),
            (1..=8 + t).collect()
        );
        assert_eq!(
            placeholders(kinds(&plan).ranges[&Strategy::Purge].as_str()),
            (1..=4 + t).collect()
        );
        // Counts: cutoff, tenant, floor; after a run the hold arrays follow.
        assert_eq!(
            placeholders(kinds(&plan).counts[&Strategy::Purge].as_str()),
            (1..=3 + t).collect()
        );
        let after = placeholders(kinds(&plan).counts_after[&Strategy::Purge].as_str());
        assert_eq!(
            after.iter().next_back(),
            Some(&(3 + t + 1 + 2)),
            "record keys, then two subject arrays"
        );
        // Kept by the legal minimum: as the counts, then the period's cutoff.
        assert_eq!(
            placeholders(kinds(&plan).kept_by_legal_min[&Strategy::Purge].as_str()),
            (1..=4 + t).collect()
        );
        // Rows other rows reference through a restricting foreign key are
        // deleted with two statements: a reference committed after the
        // snapshot must be seen before the delete.
        assert!(!kinds(&plan).fused.contains_key(&Strategy::Purge));
        // Mutate: the addresses (keys elsewhere), cutoff, tenant, floor;
        // audited then its four values.
        assert!(kinds(&plan).by_address.contains(&Strategy::Purge));
        assert_eq!(
            placeholders(kinds(&plan).mutate[&Strategy::Purge].as_str()),
            (1..=4 + t).collect()
        );
        assert_eq!(
            placeholders(kinds(&plan).mutate_audited[&Strategy::Purge].as_str()),
            (1..=8 + t).collect()
        );
        insta::assert_snapshot!(format!("entity_{name}"), render(&plan));
    }
}

fn placeholders(sql: &str) -> std::collections::BTreeSet<usize> {
    let mut out = std::collections::BTreeSet::new();
    let b = sql.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' {
            let start = i + 1;
            let mut j = start;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j > start {
                out.insert(sql[start..j].parse().unwrap());
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The bind order the executor uses matches each statement's documented
/// parameters: the placeholders are exactly `$1..=$n`, and `n` is what the
/// executor binds ($1 entity id, $2 keys, the anonymise parameters, then
/// the cutoff and, tenanted, the tenant; on a plain table the addresses).
#[test]
fn mutate_parameters_match_what_the_executor_binds() {
    for ((tenanted, custom), plain) in [(true, false), (false, false), (true, true), (false, true)]
        .into_iter()
        .flat_map(|c| [(c, true), (c, false)])
    {
        let e = descriptor(tenanted, custom);
        let types = key_types(&e);
        let plan = EntityPlan::build(
            &e,
            &all_strategies(),
            &blockers(),
            &Casts::default(),
            hold_keys(&types),
            Some(&hasher()),
            "cohort",
            None,
            plain,
        );
        for (strategy, sql) in &kinds(&plan).mutate {
            // Values computed in Rust are joined by key, never by address.
            let addressed = plain && !plan.values.computes_per_row(*strategy);
            assert_eq!(kinds(&plan).by_address.contains(strategy), addressed);
            let expected = 2 + plan.values.params_after_keys(*strategy) + 1 + usize::from(tenanted);
            let found = placeholders(sql.as_str());
            assert_eq!(
                found,
                (1..=expected).collect(),
                "{strategy} tenanted={tenanted} custom={custom}: {}",
                sql.as_str()
            );
        }
        // Anonymise: literals, then one JSON array for the values computed
        // in Rust (the hashed column, and custom anonymisers).
        assert_eq!(
            plan.values.anonymise_params(),
            1 + 1,
            "one literal, one JSON array"
        );
        for (strategy, sql) in &kinds(&plan).mutate_audited {
            let plain_form = &kinds(&plan).mutate[strategy];
            assert_eq!(
                placeholders(sql.as_str()).len(),
                placeholders(plain_form.as_str()).len() + 4,
                "{strategy} audited binds its four ledger values last"
            );
            assert_eq!(
                sql.as_str().contains("t.ctid = ANY("),
                kinds(&plan).by_address.contains(strategy)
            );
        }
        for (strategy, sql) in &kinds(&plan).lock {
            let expected = 3 + usize::from(tenanted);
            assert_eq!(
                placeholders(sql.as_str()),
                (1..=expected).collect(),
                "{strategy} lock"
            );
            // On a plain table each locked row's address comes third.
            assert_eq!(sql.as_str().contains(", t.ctid::text FROM "), plain);
        }
        // Erasure finds its rows by key.
        for sql in kinds(&plan).mutate_head.values() {
            assert!(!sql.as_str().contains("ctid"));
        }
        for (strategy, sql) in &kinds(&plan).counts {
            let expected = 2 + usize::from(tenanted);
            assert_eq!(
                placeholders(sql.as_str()),
                (1..=expected).collect(),
                "{strategy} counts"
            );
        }
    }
}

/// One snapshot per statement family: each statement's name and text.
fn family(statements: &[(&str, &str)]) -> String {
    statements
        .iter()
        .map(|(name, text)| format!("-- {name}\n{text}\n"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn settings_statements() {
    use crate::sql::settings::{read, upsert, Upsert};
    let upsert = upsert(
        "cohort",
        Upsert {
            name: "kill_switch",
            enabled: true,
        },
    );
    insta::assert_snapshot!(
        "settings",
        family(&[
            ("read", read("cohort").checked().as_str()),
            ("upsert", upsert.checked().as_str())
        ])
    );
}

#[test]
fn pacing_statements() {
    use crate::sql::pacing::{all, can_read_lag, for_entity, set, standbys, Set, SetValue};
    let set_one = |value| {
        set(
            "cohort",
            Set {
                scope: "Note".into(),
                value,
            },
        )
        .checked()
    };
    insta::assert_snapshot!(
        "pacing",
        family(&[
            (
                "for_entity",
                for_entity("cohort", "Note").checked().as_str()
            ),
            ("all", all("cohort").checked().as_str()),
            ("set_paused", set_one(SetValue::Paused(true)).as_str()),
            ("set_rate", set_one(SetValue::Rate(Some(500))).as_str()),
            ("set_lag", set_one(SetValue::Lag(Some(30_000))).as_str()),
            ("standbys", standbys().checked().as_str()),
            ("can_read_lag", can_read_lag().checked().as_str()),
        ])
    );
}

#[test]
fn chain_statements() {
    use crate::sql::chain as c;
    let id = uuid::Uuid::nil();
    let t = chrono::Utc::now();
    let append = c::append(
        "cohort",
        c::Append {
            kind: "run",
            subject: Some(id),
            record: "{}".into(),
            digest: "d".into(),
            covers: Vec::new(),
        },
    )
    .checked();
    let keyed = c::append_keyed(
        "cohort",
        c::AppendKeyed {
            link_id: 2,
            kind: "key",
            subject: None,
            record: "{}".into(),
            digest: "d".into(),
            prev: "p".into(),
            link: "l".into(),
            covers: Vec::new(),
            linked_at: t,
            mac: "m".into(),
        },
    )
    .checked();
    insta::assert_snapshot!(
        "chain",
        family(&[
            ("keyed_head", c::keyed_head("cohort").checked().as_str()),
            ("append_keyed", keyed.as_str()),
            ("key_link", c::key_link("cohort").checked().as_str()),
            (
                "link_hash_of",
                c::link_hash_of("cohort", 2).checked().as_str()
            ),
            (
                "journal_links",
                c::journal_links("cohort").checked().as_str()
            ),
            ("lock", c::lock("cohort").checked().as_str()),
            ("runs", c::runs("cohort", vec![id]).checked().as_str()),
            (
                "summaries",
                c::summaries("cohort", vec![id]).checked().as_str()
            ),
            ("holds", c::holds("cohort", vec![id]).checked().as_str()),
            ("append", append.as_str()),
            (
                "links_of",
                c::links_of("cohort", vec![id]).checked().as_str()
            ),
            (
                "links_after",
                c::links_after("cohort", 0, 1000).checked().as_str()
            ),
            ("head", c::head("cohort", Some(t)).checked().as_str()),
            (
                "unlinked_runs",
                c::unlinked_runs("cohort", t, 10).checked().as_str()
            ),
            (
                "runs_before",
                c::runs_before("cohort", t).checked().as_str()
            ),
            (
                "holds_outside",
                c::holds_outside("cohort").checked().as_str()
            ),
        ])
    );
}

#[test]
fn request_statements() {
    use crate::sql::requests as r;
    let t = chrono::Utc::now();
    let id = uuid::Uuid::nil();
    insta::assert_snapshot!(
        "requests",
        family(&[
            (
                "insert",
                r::insert(
                    "cohort",
                    r::Insert {
                        request_id: id,
                        reference: "SAR-1".into(),
                        tenant: None,
                        kind: None,
                        subject: "s".into(),
                        subject_hash: "h".into(),
                        allow_soft_delete: false,
                        stage: None,
                        note: None,
                        received_at: t,
                        due_at: t,
                        due_reason: None,
                        journal: Some((1, "h".into())),
                    },
                )
                .checked()
                .as_str()
            ),
            (
                "by_reference",
                r::by_reference("cohort", "SAR-1".into()).checked().as_str()
            ),
            ("by_id", r::by_id("cohort", id).checked().as_str()),
            ("lock", r::lock("cohort", id).checked().as_str()),
            (
                "set_state",
                r::set_state(
                    "cohort",
                    r::SetState {
                        request_id: id,
                        state: "waiting",
                        now: t,
                        resume_at: None,
                        waiting: serde_json::json!([]),
                        run_id: None,
                        error: None,
                        starting: false,
                    },
                )
                .checked()
                .as_str()
            ),
            (
                "event",
                r::event(
                    "cohort",
                    r::Event {
                        request_id: id,
                        state: "open",
                        run_id: None,
                        detail: "opened".into(),
                    },
                )
                .checked()
                .as_str()
            ),
            ("events", r::events("cohort", id).checked().as_str()),
            (
                "set_due",
                r::set_due(
                    "cohort",
                    r::SetDue {
                        request_id: id,
                        due_at: t,
                        reason: "why".into(),
                    },
                )
                .checked()
                .as_str()
            ),
            (
                "list",
                r::list(
                    "cohort",
                    r::List {
                        state: Some("waiting"),
                        overdue_at: None,
                        limit: 10,
                    },
                )
                .checked()
                .as_str()
            ),
            (
                "to_resume",
                r::to_resume("cohort", t, 100).checked().as_str()
            ),
            ("by_state", r::by_state("cohort", t).checked().as_str()),
            (
                "journal_records",
                r::journal_records("cohort").checked().as_str()
            ),
            (
                "system_identifier",
                crate::sql::journal::system_identifier().checked().as_str()
            ),
            ("clock", crate::sql::journal::clock().checked().as_str()),
        ])
    );
}

#[test]
fn worker_statements() {
    use crate::sql::worker::{keepalive, latest_scheduled, started_scheduled, LatestScheduled};
    let latest = latest_scheduled(
        "cohort",
        LatestScheduled {
            dry_run: false,
            at: chrono::Utc::now(),
            fingerprint: "fp".into(),
        },
    );
    insta::assert_snapshot!(
        "worker",
        family(&[
            ("latest_scheduled", latest.checked().as_str()),
            (
                "started_scheduled",
                started_scheduled("cohort").checked().as_str()
            ),
            ("keepalive", keepalive().checked().as_str()),
        ])
    );
}

#[test]
fn occurrence_statements() {
    use crate::sql::occurrences::*;
    let id = uuid::Uuid::nil();
    let at = chrono::Utc::now();
    let key = || Key {
        at,
        dry_run: false,
        fingerprint: "fp".into(),
    };
    let runs = || PassRuns {
        at,
        pass: 1,
        dry_run: false,
        fingerprint: "fp".into(),
    };
    let of = || Of { occurrence_id: id };
    insta::assert_snapshot!(
        "occurrences",
        family(&[
            ("find", find("cohort", key()).checked().as_str()),
            (
                "later_started",
                later_started("cohort", key()).checked().as_str()
            ),
            (
                "insert",
                insert(
                    "cohort",
                    Insert {
                        occurrence_id: id,
                        at,
                        dry_run: false,
                        fingerprint: "fp".into(),
                        passes: 2,
                        created_by: "host:1".into(),
                    }
                )
                .checked()
                .as_str()
            ),
            (
                "insert_passes",
                insert_passes(
                    "cohort",
                    InsertPasses {
                        occurrence_id: id,
                        specs: serde_json::json!([]),
                    }
                )
                .checked()
                .as_str()
            ),
            (
                "claim_pending",
                claim_pending(
                    "cohort",
                    Claim {
                        occurrence_id: id,
                        token: id,
                        by: "host:1".into(),
                        lock_prefix: crate::base::locks::pass_prefix(id),
                    }
                )
                .checked()
                .as_str()
            ),
            ("claimed", claimed("cohort", of()).checked().as_str()),
            ("remaining", remaining("cohort", of()).checked().as_str()),
            (
                "take_over",
                take_over(
                    "cohort",
                    TakeOver {
                        occurrence_id: id,
                        pass: 1,
                        token: id,
                        by: "host:1".into(),
                    }
                )
                .checked()
                .as_str()
            ),
            (
                "settle",
                settle(
                    "cohort",
                    Settle {
                        occurrence_id: id,
                        pass: 1,
                        token: id,
                        run_id: None,
                        done: true,
                        lock: Some(crate::base::locks::LockKey::Pass(id, 1).text()),
                    }
                )
                .checked()
                .as_str()
            ),
            (
                "unclaim",
                unclaim(
                    "cohort",
                    Unclaim {
                        occurrence_id: id,
                        pass: 1,
                        token: id,
                    }
                )
                .checked()
                .as_str()
            ),
            ("complete", complete("cohort", of()).checked().as_str()),
            (
                "started_of_pass",
                started_of_pass("cohort", runs()).checked().as_str()
            ),
            (
                "finished_run",
                finished_run(
                    "cohort",
                    FinishedRun {
                        runs: runs(),
                        since: at,
                    }
                )
                .checked()
                .as_str()
            ),
        ])
    );
}

#[test]
fn peer_statements() {
    use crate::sql::peers::{census, heartbeat, leave, live, Census, Heartbeat, Leave, Live};
    let id = uuid::Uuid::nil();
    let beat = heartbeat(
        "cohort",
        Heartbeat {
            peer_id: id,
            host: "h".into(),
            pid: 1,
            policy_fingerprint: "fp".into(),
            handlers: serde_json::json!({}),
        },
    );
    let gone = leave(
        "cohort",
        Leave {
            peer_id: id,
            dead_after_secs: 1.0,
        },
    );
    let others = live(
        "cohort",
        Live {
            timeout_secs: 1.0,
            me: None,
        },
    );
    insta::assert_snapshot!(
        "peers",
        family(&[
            ("heartbeat", beat.checked().as_str()),
            ("leave", gone.checked().as_str()),
            ("live", others.checked().as_str()),
            (
                "census",
                census("cohort", Census { timeout_secs: 1.0 })
                    .checked()
                    .as_str()
            ),
        ])
    );
}

#[test]
fn queue_statements() {
    use crate::sql::queue::{self, QueuePlan};
    let plan = QueuePlan::build("cohort");
    let id = uuid::Uuid::nil();
    let fenced = queue::Fenced { id: 1, token: id };
    let statements = [
        (
            "enqueue",
            plan.enqueue(queue::Enqueue {
                row_detail_ids: vec![],
                run_id: id,
                handlers: vec![],
                priorities: vec![],
                phases: vec![],
                payloads: vec![],
                requires_earlier: vec![],
            })
            .checked()
            .as_str()
            .to_owned(),
        ),
        (
            "dead_letter_skipped",
            plan.dead_letter_skipped(queue::DeadLetterSkipped {
                run_id: id,
                entity_id: id,
                entity: String::new(),
                tenant: None,
                record_ids: vec![],
                handlers: vec![],
                priorities: vec![],
                phases: vec![],
                reasons: vec![],
                requires_earlier: vec![],
            })
            .checked()
            .as_str()
            .to_owned(),
        ),
        (
            "claim",
            plan.claim(queue::Claim {
                limit: 1,
                claim_timeout_secs: 1.0,
                entities: vec![],
                foreign: vec![],
            })
            .checked()
            .as_str()
            .to_owned(),
        ),
        ("succeed", plan.succeed(fenced).checked()),
        (
            "fail",
            plan.fail(queue::Fail {
                work: fenced,
                error: String::new(),
                retry_in_secs: 1.0,
                dead: false,
            })
            .checked()
            .as_str()
            .to_owned(),
        ),
        ("release", plan.release(fenced).checked()),
        ("clear_payloads", plan.clear_payloads(1).checked()),
        ("scrub", plan.scrub(1.0).checked()),
        ("stale_runs", plan.stale_runs(1.0).checked()),
        (
            "recover_run",
            plan.recover_run(queue::Recover {
                run_id: id,
                reason: String::new(),
            })
            .checked()
            .as_str()
            .to_owned(),
        ),
        ("outstanding", plan.outstanding().checked()),
        (
            "orphans",
            queue::orphans(
                "cohort",
                queue::Orphans {
                    entities: vec![],
                    handlers: vec![],
                    reason: "r",
                    older_than_secs: 1.0,
                },
            )
            .checked()
            .as_str()
            .to_owned(),
        ),
    ];
    let refs: Vec<(&str, &str)> = statements.iter().map(|(n, t)| (*n, t.as_str())).collect();
    insta::assert_snapshot!("queue", family(&refs));
}

#[test]
fn dead_letter_statements() {
    use crate::sql::dead_letters::{
        depth, list, lock_ids, lock_retryable, owners, requeue, Ids, List,
    };
    let listed = list(
        "cohort",
        List {
            entity_id: None,
            handler: None,
            limit: 1,
        },
    );
    insta::assert_snapshot!(
        "dead_letters",
        family(&[
            ("list", listed.checked().as_str()),
            ("owners", owners("cohort", Ids(vec![])).checked().as_str()),
            (
                "lock_retryable",
                lock_retryable("cohort").checked().as_str()
            ),
            (
                "lock_ids",
                lock_ids("cohort", Ids(vec![])).checked().as_str()
            ),
            ("requeue", requeue("cohort", Ids(vec![])).checked().as_str()),
            ("depth", depth("cohort").checked().as_str()),
        ])
    );
}

#[test]
fn prune_statements() {
    use crate::sql::prune::{Batch, Before, OfRuns, PrunePlan, RunBatch, RunCutoffs, Runs};
    let plan = PrunePlan::build("cohort");
    let now = chrono::Utc::now();
    let batch = Batch {
        before: now,
        limit: 1,
    };
    let of = || OfRuns {
        runs: vec![],
        limit: 1,
    };
    let cutoffs = RunCutoffs {
        succeeded: Some(now),
        failed: None,
    };
    let statements = [
        (
            "select_runs",
            plan.select_runs(RunBatch { cutoffs, limit: 1 }).checked(),
        ),
        ("delete_work", plan.delete_work(of()).checked()),
        ("delete_details", plan.delete_details(of()).checked()),
        ("lock_runs", plan.lock_runs(Runs(vec![])).checked()),
        (
            "delete_summaries",
            plan.delete_summaries(Runs(vec![])).checked(),
        ),
        ("delete_runs", plan.delete_runs(Runs(vec![])).checked()),
        ("count_runs", plan.count_runs(cutoffs).checked()),
        ("kept_runs", plan.kept_runs(cutoffs).checked()),
        ("delete_holds", plan.delete_holds(batch).checked()),
        ("count_holds", plan.count_holds(Before(now)).checked()),
        (
            "delete_occurrences",
            plan.delete_occurrences(Batch {
                before: now,
                limit: 1,
            })
            .checked(),
        ),
        (
            "count_occurrences",
            plan.count_occurrences(Before(now)).checked(),
        ),
    ];
    let refs: Vec<(&str, &str)> = statements.iter().map(|(n, t)| (*n, t.as_str())).collect();
    insta::assert_snapshot!("prune", family(&refs));
}

#[test]
fn report_statements() {
    use crate::sql::report::{
        entity_kept, entity_months, entity_rules, entity_runs, erasures, failures, generated_at,
        holds, snapshot, Window,
    };
    let w = || Window {
        from: chrono::DateTime::UNIX_EPOCH,
        until: chrono::DateTime::UNIX_EPOCH,
        tenant: None,
    };
    insta::assert_snapshot!(
        "report",
        family(&[
            ("entity_runs", entity_runs("cohort", w()).checked().as_str()),
            (
                "entity_rules",
                entity_rules("cohort", w()).checked().as_str()
            ),
            (
                "entity_months",
                entity_months("cohort", w()).checked().as_str()
            ),
            ("entity_kept", entity_kept("cohort", w()).checked().as_str()),
            ("erasures", erasures("cohort", w()).checked().as_str()),
            ("holds", holds("cohort", w()).checked().as_str()),
            ("failures", failures("cohort", w()).checked().as_str()),
            ("snapshot", snapshot().checked().as_str()),
            ("generated_at", generated_at().checked().as_str()),
        ])
    );
}

#[test]
fn history_statements() {
    use crate::sql::history::{
        last_success, recent_runs, rows_per_day, run, runs_by_prefix, summaries, Limit, Prefix,
        Run, Since,
    };
    let id = Run(uuid::Uuid::nil());
    insta::assert_snapshot!(
        "history",
        family(&[
            (
                "recent_runs",
                recent_runs("cohort", Limit(1)).checked().as_str()
            ),
            ("run", run("cohort", id).checked().as_str()),
            ("summaries", summaries("cohort", id).checked().as_str()),
            (
                "runs_by_prefix",
                runs_by_prefix("cohort", Prefix("ab".into()))
                    .checked()
                    .as_str()
            ),
            ("last_success", last_success("cohort").checked().as_str()),
            (
                "rows_per_day",
                rows_per_day("cohort", Since(chrono::Utc::now()))
                    .checked()
                    .as_str()
            ),
        ])
    );
}

#[test]
fn grant_statements() {
    use crate::sql::grants::{current_role, missing, Privileges};
    let check = missing(Privileges {
        schemas: vec![],
        names: vec![],
        privileges: vec![],
        arguments: vec![],
    });
    insta::assert_snapshot!(
        "grants",
        family(&[
            ("missing", check.checked().as_str()),
            ("current_role", current_role().checked().as_str())
        ])
    );
}

/// Placeholders `$1..=$n` without a gap, and exactly `n` values bound.
fn check<P: crate::sql::statement::Params>(name: &str, s: crate::sql::statement::Statement<P>) {
    let text = s.text().to_owned();
    let wanted = placeholders(&text);
    let highest = wanted.iter().copied().max().unwrap_or(0);
    assert_eq!(
        wanted,
        (1..=highest).collect(),
        "{name}: placeholders have a gap"
    );
    use sqlx::Execute;
    let mut q = s.query();
    let bound = q
        .take_arguments()
        .expect("arguments encode")
        .map_or(0, |a| sqlx::Arguments::len(&a));
    assert_eq!(
        bound, highest,
        "{name}: binds {bound} values for {highest} placeholders"
    );
}

/// A statement's text, once its binds are checked against its
/// placeholders: each family's snapshot test builds a statement once and
/// both checks and snapshots it.
trait Checked {
    fn checked(self) -> String;
}

impl<P: crate::sql::statement::Params> Checked for crate::sql::statement::Statement<P> {
    fn checked(self) -> String {
        let text = self.text().to_owned();
        check(&text, self);
        text
    }
}

#[test]
fn catalog_partition_and_ledger_statements_bind_exactly_their_placeholders() {
    use crate::sql::{catalog as c, ledger as l, partitions as p};
    use sqlx::postgres::types::Oid;
    let oid = Oid(1);
    let id = uuid::Uuid::nil();
    let now = chrono::Utc::now();
    let catalog = [
        ("server_info", c::server_info().checked()),
        ("table", c::table("s".into(), "t".into()).checked()),
        ("columns", c::columns(oid).checked()),
        ("indexes", c::indexes(oid).checked()),
        ("foreign_keys", c::foreign_keys(oid).checked()),
        ("referenced_by", c::referenced_by(oid).checked()),
        ("cascade_edges", c::cascade_edges(oid).checked()),
        ("ledger_comment", c::ledger_comment("s".into()).checked()),
        ("partitioning", c::partitioning(oid).checked()),
        (
            "partitions_not_owned",
            c::partitions_not_owned(oid).checked(),
        ),
        (
            "partition_tree_referenced_by",
            c::partition_tree_referenced_by(oid).checked(),
        ),
        ("set_probe", c::set_probe("p", "v".into()).checked()),
        ("read_setting", c::read_setting("p").checked()),
        ("clear_probe", c::clear_probe("p").checked()),
    ];
    let refs: Vec<(&str, &str)> = catalog.iter().map(|(n, t)| (*n, t.as_str())).collect();
    insta::assert_snapshot!("catalog", family(&refs));

    let e = descriptor(false, false);
    let part = QualifiedName::new("app", "notes_2020");
    let casts = Casts::default();
    let types = key_types(&e);
    let hold = super::fragments::hold_exists(&e, &Casts::default(), hold_keys(&types), "cohort");
    let held_keys = p::held(
        &part,
        &e,
        &casts,
        &hold,
        p::Held {
            entity: id,
            keys: Some((
                crate::domain::model::KeyType::Uuid,
                crate::sql::BoundHolds {
                    records: Vec::new(),
                    subjects: vec![(KeyType::Uuid, Vec::new()), (KeyType::CiText, Vec::new())],
                },
            )),
        },
    );
    let held_all = p::held(
        &part,
        &e,
        &casts,
        &hold,
        p::Held {
            entity: id,
            keys: None,
        },
    );
    let details = p::Details {
        run_id: id,
        entity: id,
        entity_name: "Note".into(),
        action: "purge",
    };
    let page = p::DetailPage {
        from_id: 1,
        run_id: id,
        entity: id,
        limit: 1,
    };
    let partitions = [
        ("expired", p::expired("s".into(), "t".into(), now).checked()),
        ("held_by_keys", held_keys.checked()),
        ("held_any_row", held_all.checked()),
        (
            "set_lock_timeout",
            p::set_lock_timeout("1ms".into()).checked(),
        ),
        ("lock_exclusive", p::lock_exclusive(&part).checked()),
        (
            "insert_details",
            p::insert_details(
                "cohort",
                &part,
                &Casts::default().key_text(&e),
                None,
                details,
            )
            .checked()
            .as_str()
            .to_owned(),
        ),
        (
            "purge_unheld",
            p::purge_unheld(
                "cohort",
                &part,
                &Casts::default().key_text(&e),
                None,
                &hold,
                p::PurgeUnheld {
                    entity: id,
                    details: None,
                },
            )
            .checked(),
        ),
        (
            "purge_unheld_with_details",
            p::purge_unheld(
                "cohort",
                &part,
                &Casts::default().key_text(&e),
                None,
                &hold,
                p::PurgeUnheld {
                    entity: id,
                    details: Some(p::Details {
                        run_id: id,
                        entity: id,
                        entity_name: "Note".into(),
                        action: "purge",
                    }),
                },
            )
            .checked(),
        ),
        ("count", p::count(&part).checked()),
        ("detach", p::detach(&e.table, &part).checked()),
        ("drop", p::drop(&part).checked()),
        ("detail_page", p::detail_page("cohort", page).checked()),
    ];
    let refs: Vec<(&str, &str)> = partitions.iter().map(|(n, t)| (*n, t.as_str())).collect();
    insta::assert_snapshot!("partitions", family(&refs));

    let plan = crate::sql::LedgerPlan::build("cohort");
    let parts = l::IntervalParts {
        months: 1,
        days: 2,
        secs: 3.0,
    };
    check(
        "ledger.insert_run",
        plan.insert_run(l::InsertRun {
            run_id: id,
            kind: "sweep",
            trigger: "manual",
            dry_run: false,
            tenant: None,
            logical_now: now,
            occurrence: None,
            pass: None,
            passes: None,
            policy_fingerprint: None,
            erasure_subject_kind: None,
        }),
    );
    check(
        "ledger.insert_not_started",
        plan.insert_not_started(l::InsertNotStarted {
            run_id: id,
            dry_run: false,
            tenant: None,
            occurrence: now,
            error: String::new(),
            pass: 1,
            passes: 1,
            policy_fingerprint: String::new(),
        }),
    );
    check(
        "ledger.settle_run",
        plan.settle_run(l::SettleRun {
            run_id: id,
            status: "failed",
            error: None,
            failures: serde_json::json!([]),
        }),
    );
    check(
        "ledger.insert_summary",
        plan.insert_summary(l::InsertSummary {
            run_id: id,
            entity_id: id,
            entity: "N".into(),
            category: "c".into(),
            tenant: None,
            strategy: "purge",
            cutoff: None,
            period: parts,
            legal_min: Some(parts),
            rule_source: None,
            rule_reason: None,
            stage: None,
        }),
    );
    check(
        "ledger.add_affected",
        plan.add_affected(l::AddAffected {
            summary_id: 1,
            rows: 1,
            marker: None,
        }),
    );
    check(
        "ledger.add_affected_marked",
        plan.add_affected(l::AddAffected {
            summary_id: 1,
            rows: 1,
            marker: Some("{}".into()),
        }),
    );
    check(
        "ledger.finish_summary",
        plan.finish_summary(l::FinishSummary {
            summary_id: 1,
            affected: 0,
            held: 0,
            held_by_subject: 0,
            skipped: 0,
            null_anchor: 0,
            error: None,
            kept_by_legal_min: 0,
            kept_by_policy: 0,
            batch_size: Some(5000),
            note: None,
            paused: false,
            lag_waited_ms: None,
        }),
    );
    check(
        "ledger.insert_details",
        plan.insert_details(l::InsertDetails {
            run_id: id,
            entity_id: id,
            entity: "N".into(),
            tenant: None,
            action: "purge",
            record_ids: vec![],
        }),
    );
    check(
        "ledger.insert_hold",
        plan.insert_hold(l::InsertHold {
            hold_id: id,
            entity_id: Some(id),
            record_id: Some("1".into()),
            subject_kind: None,
            subject_forms: Default::default(),
            tenant: None,
            reason: "r".into(),
            created_at: now,
            expires_at: None,
            journal: None,
        }),
    );
    check(
        "ledger.list_holds",
        plan.list_holds(l::ListHolds {
            entity_id: None,
            tenant: None,
            active_only: true,
            limit: None,
        }),
    );
    check("ledger.release_hold", plan.release_hold(id));
    check("ledger.get_hold", plan.get_hold(id));
    check(
        "ledger.active_holds",
        plan.active_holds(l::ActiveHolds {
            entity_id: id,
            limit: 1,
        }),
    );
}

#[test]
fn schema_statements() {
    use crate::sql::schema as s;
    let t = QualifiedName::new("cohort", "sweep_run");
    let checksum = || s::Checksum {
        new: vec![],
        version: 1,
        old: vec![],
    };
    let statements = [
        (
            "installed_comment",
            s::installed_comment("cohort".into()).checked(),
        ),
        ("moved_to", s::moved_to("cohort").checked()),
        ("create_schema", s::create_schema("cohort").checked()),
        ("taken", s::taken("cohort".into(), vec![]).checked()),
        ("present", s::present("cohort".into(), vec![]).checked()),
        ("drop_table", s::drop_table(&t).checked()),
        ("lock_ledger", s::lock_ledger("cohort").checked()),
        ("started_runs", s::started_runs("cohort").checked()),
        ("try_run_lock", s::try_run_lock(uuid::Uuid::nil()).checked()),
        ("open_deliveries", s::open_deliveries("cohort").checked()),
        ("set_schema", s::set_schema(&t, "elsewhere").checked()),
        ("create_marker", s::create_marker(&t).checked()),
        (
            "insert_marker",
            s::insert_marker(&t, "elsewhere".into()).checked(),
        ),
        ("comment_marker", s::comment_marker(&t).checked()),
        ("count_rows", s::count_rows(&t).checked()),
        (
            "rewrite_checksum",
            s::rewrite_checksum(&t, checksum()).checked(),
        ),
        (
            "xact_lock",
            crate::sql::locks::xact_lock(crate::base::locks::LockKey::Migrate("cohort"))
                .checked()
                .as_str()
                .to_owned(),
        ),
    ];
    let refs: Vec<(&str, &str)> = statements.iter().map(|(n, t)| (*n, t.as_str())).collect();
    insta::assert_snapshot!("schema", family(&refs));
}
