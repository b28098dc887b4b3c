//! Snapshots of every statement the planner builds (insta): each strategy,
//! tenanted and tenantless, with and without foreign-key blockers, custom
//! anonymisers, a hashed column and citext keys; the ledger statements; and
//! the erasure statements with and without a legal minimum. A change to any
//! SQL text shows up as a reviewed snapshot diff.

use std::collections::BTreeMap;

use super::{Casts, EntityPlan, ErasurePlan, LedgerPlan};
use crate::ident::QualifiedName;
use crate::model::{
    resolve, AnonymiseMethod, Conventions, CustomAnonymiser, EntityDeclaration, EntityDescriptor,
    Resolved,
};
use crate::rules::{CategoryCapabilities, Strategy};
use crate::validate::IncomingKey;

#[allow(clippy::ptr_arg)] // the anonymiser signature takes the column's Rust type by reference
fn mask(v: &String) -> String {
    format!("masked-{}", v.len())
}

fn descriptor(tenanted: bool, custom: bool) -> EntityDescriptor {
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

fn hasher() -> CustomAnonymiser {
    crate::context::HmacPads::anonymiser(b"snapshot-test-key-0123456789")
}

fn blockers() -> Vec<IncomingKey> {
    vec![IncomingKey {
        name: "orders_contact_fkey".into(),
        on_delete: "a".into(),
        child: QualifiedName::new("app", "orders"),
        child_columns: vec!["contact_id".into()],
        parent_columns: vec!["id".into()],
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
    Casts(BTreeMap::from([
        ("id".to_string(), QualifiedName::new("ext", "citext")),
        ("tenant_id".to_string(), QualifiedName::new("ext", "citext")),
    ]))
}

fn render(plan: &EntityPlan) -> String {
    let mut out = String::new();
    for (kind, statements) in [
        ("counts", &plan.counts),
        ("counts_after", &plan.counts_after),
        ("lock", &plan.lock),
        ("lock_after", &plan.lock_after),
        ("mutate", &plan.mutate),
        ("mutate_count", &plan.mutate_count),
        ("mutate_audited", &plan.mutate_audited),
    ] {
        for (strategy, sql) in statements {
            out.push_str(&format!("-- {kind} {strategy}\n{}\n\n", sql.as_str()));
        }
    }
    for (name, sql) in [
        ("load_rows", &plan.load_rows),
        ("lock_target", &plan.lock_target),
        ("guard_lock", &plan.guard_lock),
        ("is_held", &plan.is_held),
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
        let plan = EntityPlan::build(&e, &all_strategies(), &b, &casts, Some(&hasher()), "cohort");
        insta::assert_snapshot!(format!("entity_{name}"), render(&plan));
    }
}

#[test]
fn ledger_statements() {
    let l = LedgerPlan::build("cohort");
    let out: String = [
        ("insert_run", &l.insert_run),
        ("settle_run", &l.settle_run),
        ("insert_summary", &l.insert_summary),
        ("add_affected", &l.add_affected),
        ("finish_summary", &l.finish_summary),
        ("insert_details", &l.insert_details),
        ("insert_hold", &l.insert_hold),
        ("list_holds", &l.list_holds),
        ("release_hold", &l.release_hold),
        ("get_hold", &l.get_hold),
        ("held_records", &l.held_records),
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
        let plan = EntityPlan::build(
            &e,
            &all_strategies(),
            &blockers(),
            &Casts::default(),
            Some(&hasher()),
            "cohort",
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
                "cohort",
            );
            out.push_str(&format!(
                "-- {strategy} lock\n{}\n\n-- {strategy} mutate\n{}\n\n-- {strategy} counts\n{}\n\n",
                p.lock.as_str(),
                p.mutate.as_str(),
                p.counts.as_str()
            ));
        }
        insta::assert_snapshot!(format!("erasure_{name}"), out);
    }
}

/// Placeholders `$n` in a statement.
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
/// the cutoff and, tenanted, the tenant).
#[test]
fn mutate_parameters_match_what_the_executor_binds() {
    for (tenanted, custom) in [(true, false), (false, false), (true, true), (false, true)] {
        let e = descriptor(tenanted, custom);
        let plan = EntityPlan::build(
            &e,
            &all_strategies(),
            &blockers(),
            &Casts::default(),
            Some(&hasher()),
            "cohort",
        );
        for (strategy, sql) in &plan.mutate {
            let expected = 2 + plan.params_after_keys(*strategy) + 1 + usize::from(tenanted);
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
            plan.anonymise_params(),
            1 + 1,
            "one literal, one JSON array"
        );
        for (strategy, sql) in &plan.lock {
            let expected = 3 + usize::from(tenanted);
            assert_eq!(
                placeholders(sql.as_str()),
                (1..=expected).collect(),
                "{strategy} lock"
            );
        }
        for (strategy, sql) in &plan.counts {
            let expected = 2 + usize::from(tenanted);
            assert_eq!(
                placeholders(sql.as_str()),
                (1..=expected).collect(),
                "{strategy} counts"
            );
        }
    }
}
