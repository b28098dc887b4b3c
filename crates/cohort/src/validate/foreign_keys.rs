//! What foreign keys mean for the entities: the processing order
//! (dependents first, no cycle among entities that may purge), the
//! cascades a purge would set off, and the rows references keep for good.
//! Pure functions over a catalog snapshot; nothing here does I/O.

use std::collections::BTreeMap;

use super::catalog::{self, CascadeEdge};
use crate::base::ident::QualifiedName;
use crate::domain::model::EntityDescriptor;
use crate::error::Problem;

/// Dependents first: an entity whose table references another retained
/// table comes before it; ties keep declaration order. Foreign keys among
/// entities that may purge must not form a cycle: no order would delete
/// every row's dependents first, so one is refused, the cycle named
/// (`Err` lists its entities, each referencing the next, the last the
/// first). A cycle through entities that never purge is harmless (their
/// mutations delete nothing) and is ordered in declaration order.
fn dependency_order(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    purges: impl Fn(&EntityDescriptor) -> bool,
) -> std::result::Result<Vec<uuid::Uuid>, Vec<String>> {
    let n = entities.len();
    // referenced_by[p]: the entities whose tables reference p's (they come first).
    let mut waiting_on: Vec<usize> = vec![0; n];
    let mut referenced_by: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (child, table) in tables.iter().enumerate() {
        for fk in &table.foreign_keys {
            if let Some(parent) = tables.iter().position(|t| t.name == fk.references) {
                if parent != child && !referenced_by[parent].contains(&child) {
                    referenced_by[parent].push(child);
                    waiting_on[parent] += 1;
                }
            }
        }
    }
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    while order.len() < n {
        let next = match (0..n).find(|&i| !done[i] && waiting_on[i] == 0) {
            Some(i) => i,
            None => {
                if let Some(cycle) = purge_cycle(entities, &referenced_by, &done, &purges) {
                    return Err(cycle);
                }
                (0..n).find(|&i| !done[i]).expect("some entity is left")
            }
        };
        done[next] = true;
        order.push(entities[next].id);
        for parent in 0..n {
            if referenced_by[parent].contains(&next) && waiting_on[parent] > 0 {
                waiting_on[parent] -= 1;
            }
        }
    }
    Ok(order)
}

/// A cycle of references among the entities left (not `done`) that may
/// purge, by name, each referencing the next and the last the first.
fn purge_cycle(
    entities: &[EntityDescriptor],
    referenced_by: &[Vec<usize>],
    done: &[bool],
    purges: &impl Fn(&EntityDescriptor) -> bool,
) -> Option<Vec<String>> {
    let n = entities.len();
    let live = |i: usize| !done[i] && purges(&entities[i]);
    // Depth-first over "is referenced by" edges among live entities; a
    // back edge closes a cycle.
    let mut state = vec![0u8; n]; // 0 new, 1 on the path, 2 finished
    let mut path: Vec<usize> = Vec::new();
    fn visit(
        i: usize,
        referenced_by: &[Vec<usize>],
        live: &dyn Fn(usize) -> bool,
        state: &mut [u8],
        path: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        state[i] = 1;
        path.push(i);
        for &child in &referenced_by[i] {
            if !live(child) {
                continue;
            }
            if state[child] == 1 {
                let at = path.iter().position(|&p| p == child).expect("on the path");
                return Some(path[at..].to_vec());
            }
            if state[child] == 0 {
                if let Some(c) = visit(child, referenced_by, live, state, path) {
                    return Some(c);
                }
            }
        }
        path.pop();
        state[i] = 2;
        None
    }
    for start in (0..n).filter(|&i| live(i)) {
        if state[start] == 0 {
            if let Some(cycle) = visit(start, referenced_by, &live, &mut state, &mut path) {
                // The path runs parent → referencing child; name it the
                // other way round (each entity references the next),
                // starting from the one declared first.
                let mut ring: Vec<usize> = cycle.into_iter().rev().collect();
                let first = (0..ring.len()).min_by_key(|&k| ring[k]).expect("a cycle");
                ring.rotate_left(first);
                return Some(ring.iter().map(|&i| entities[i].name.clone()).collect());
            }
        }
    }
    None
}

/// The processing order of the entities ([`dependency_order`]); a cycle
/// among entities that may purge is added to `problems`, the order then
/// empty.
pub(super) fn processing_order(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    purges: impl Fn(&EntityDescriptor) -> bool,
    problems: &mut Vec<Problem>,
) -> Vec<uuid::Uuid> {
    match dependency_order(entities, tables, purges) {
        Ok(order) => order,
        Err(cycle) => {
            let mut ring = cycle.clone();
            ring.push(cycle[0].clone());
            problems.push(Problem::global(format!(
                "the foreign keys of entities that may purge form a cycle ({}): no order deletes every row's referencing rows first; break the cycle (drop or defer one foreign key), or give one of them a category that never purges",
                ring.join(" references ")
            )));
            Vec::new()
        }
    }
}

/// What a purge of each purgeable entity would set off through foreign
/// keys: refused when a CASCADE / SET NULL / SET DEFAULT action (directly or
/// through a chain of cascades over any tables) reaches a retained or exempt
/// entity's table, or when a SET NULL / SET DEFAULT would violate NOT NULL
/// (every purge would fail).
pub(crate) fn check_cascades(
    purgeable: &[(&EntityDescriptor, Vec<CascadeEdge>)],
    kept_tables: &[(&str, &QualifiedName)],
) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (parent, edges) in purgeable {
        for edge in edges {
            let from = edge.path[edge.path.len() - 2].display_plain();
            let origin = if edge.path.len() > 2 {
                format!(
                    "{from}, which a purge of entity {} reaches through {}",
                    parent.name,
                    edge.path
                        .iter()
                        .map(QualifiedName::display_plain)
                        .collect::<Vec<_>>()
                        .join(" -> ")
                )
            } else {
                format!("{from} (entity {}, which may be purged)", parent.name)
            };
            if let Some((kept, _)) = kept_tables.iter().find(|(_, t)| **t == edge.child) {
                let effect = if edge.action == "c" {
                    "delete"
                } else {
                    "change"
                };
                problems.push(Problem::entity(
                    *kept,
                    format!(
                        "foreign key {:?} on {} is ON DELETE {} from {origin}; purging would {effect} {kept} rows outside retention rules, holds and audit. Use ON DELETE RESTRICT/NO ACTION and let Cohort purge dependents first",
                        edge.name,
                        edge.child.display_plain(),
                        edge.action_sql(),
                    ),
                ));
            } else if !edge.failing_columns.is_empty() {
                problems.push(Problem::entity(
                    &parent.name,
                    format!(
                        "foreign key {:?} on {} is ON DELETE {} from {origin}, but its column(s) {} are NOT NULL{}; every purge of a referenced row would fail",
                        edge.name,
                        edge.child.display_plain(),
                        edge.action_sql(),
                        edge.failing_columns.join(", "),
                        if edge.action == "d" { " without a default" } else { "" },
                    ),
                ));
            }
        }
    }
    problems
}

/// What keeps a purging entity's rows for good: the NO ACTION / RESTRICT
/// foreign keys into its table from a table whose rows Cohort never
/// deletes (a table no entity retains, an exempt declaration, or an entity
/// whose category never purges or archives). A row such a key references
/// is skipped on every run: nothing will ever delete the referencing row
/// first.
#[derive(Debug, Default)]
pub(crate) struct KeptByReferences {
    /// Advice naming each such key, the referencing table and what to do.
    pub(crate) warnings: Vec<String>,
    /// The referencing tables, as a run's note names them
    /// (`app.order_notes (not retained by Cohort)`); empty when none.
    pub(crate) tables: Vec<String>,
}

/// Whether purging `entity` (whose category may purge or archive) leaves
/// rows for good because of `keys`, the blocking keys into its table
/// (`retained`: the entities by table, with whether each may delete rows;
/// `exempt`: exempt declarations by table). Also advises an index on the
/// referencing columns where none starts with them: every batch looks the
/// referencing rows up by them.
pub(crate) fn references_kept_for_good(
    entity: &EntityDescriptor,
    keys: &[crate::sql::IncomingKey],
    retained: &[(&str, &QualifiedName, bool)],
    exempt: &[(&str, &QualifiedName)],
) -> KeptByReferences {
    let mut out = KeptByReferences::default();
    for key in keys {
        let action = if key.on_delete == "r" {
            "RESTRICT"
        } else {
            "NO ACTION"
        };
        let child = key.child.display_plain();
        if !key.child_indexed {
            out.warnings.push(format!(
                "{}: no index of {child} starts with ({}), the columns of foreign key {:?} that references it; every purge batch looks the referencing rows up by them and scans {child}. Suggested: CREATE INDEX ON {} ({});",
                entity.name,
                key.child_columns.join(", "),
                key.name,
                key.child,
                key.child_columns
                    .iter()
                    .map(|c| crate::base::ident::quote_ident(c))
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        if key.child == entity.table {
            // Rows referencing rows of their own table go with them.
            continue;
        }
        let why = match retained.iter().find(|(_, t, _)| **t == key.child) {
            Some((_, _, true)) => continue,
            Some((name, _, false)) => {
                format!("entity {name}, whose category never purges or archives")
            }
            None => match exempt.iter().find(|(_, t)| **t == key.child) {
                Some((name, _)) => format!("{name}, declared exempt"),
                None => "not retained by Cohort".to_owned(),
            },
        };
        out.warnings.push(format!(
            "{}: foreign key {:?} on {child} ({why}) references {} with ON DELETE {action}, and Cohort never deletes {child}'s rows: every {} row it references is skipped on every run, for good (runs count them as skipped and say why). Classify {child} with a category that purges (Cohort then deletes its rows first), or accept that the rows it references are kept",
            entity.name,
            key.name,
            entity.table.display_plain(),
            entity.name,
        ));
        let named = format!("{child} ({why})");
        if !out.tables.contains(&named) {
            out.tables.push(named);
        }
    }
    out
}

/// Rows referenced from tables Cohort never empties are kept for good:
/// the advice naming each such key (added to `warnings`), and by entity
/// the referencing tables a run's note names.
pub(super) fn kept_by_references(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    exempt_tables: &[(String, QualifiedName)],
    may_purge: impl Fn(&EntityDescriptor) -> bool,
    warnings: &mut Vec<String>,
) -> BTreeMap<uuid::Uuid, Vec<String>> {
    let retained: Vec<(&str, &QualifiedName, bool)> = entities
        .iter()
        .map(|e| (e.name.as_str(), &e.table, may_purge(e)))
        .collect();
    let exempt_named: Vec<(&str, &QualifiedName)> =
        exempt_tables.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut kept_by: BTreeMap<uuid::Uuid, Vec<String>> = BTreeMap::new();
    for (e, t) in entities.iter().zip(tables) {
        if !may_purge(e) {
            continue;
        }
        let found = references_kept_for_good(e, &t.blocking_references(), &retained, &exempt_named);
        warnings.extend(found.warnings);
        kept_by.insert(e.id, found.tables);
    }
    kept_by
}
