//! Checks of the `archive` strategy's target, as pure functions over a
//! catalog snapshot: the archive table against its source (columns, types,
//! NOT NULL), and the pair of source and archive across the model (an
//! archive that keeps a person's data must itself be reachable by erasure
//! and retention). Privileges are checked with the other grants
//! (`services::grants`).

use std::collections::BTreeSet;

use super::catalog::{ColumnInfo, InsertHook, TableInfo};
use crate::domain::model::{
    AnonymiseMethod, ArchiveTarget, EntityDescriptor, ARCHIVED_AT, ARCHIVE_RUN_ID,
};
use crate::domain::rules::{CategoryCapabilities, Strategy};
use crate::error::Problem;

/// Whether every value of column `from` is stored unchanged in column
/// `to`: the same base type, and a type modifier at least as wide (see
/// [`typmod_holds`]).
fn fits(from: &ColumnInfo, to: &ColumnInfo) -> bool {
    from.type_name == to.type_name
        && from.type_schema == to.type_schema
        && typmod_holds(&from.type_name, from.typmod, to.typmod)
}

/// Whether a column of base type `type_name` (an array's element type
/// when it starts with `_`) with modifier `to` stores every value of one
/// with modifier `from` exactly. `-1` is unconstrained. A cast to a
/// narrower modifier rounds silently (`numeric(6,0)` makes 1234.56 into
/// 1235, `time(0)` makes 10:00:00.987654 into 10:00:01) or pads, so each
/// family is compared by what its modifier means; a type not known here
/// must have the same modifier.
pub(crate) fn typmod_holds(type_name: &str, from: i32, to: i32) -> bool {
    if to == -1 || from == to {
        return true;
    }
    let seconds = matches!(
        type_name.trim_start_matches('_'),
        "timestamp" | "timestamptz" | "time" | "timetz"
    );
    if from == -1 && !seconds {
        return false;
    }
    match type_name.trim_start_matches('_') {
        // n + 4 characters; char(n) pads with blanks, which char ignores.
        "varchar" | "bpchar" => to >= from,
        // Digits after the point and before it, each no fewer.
        "numeric" => {
            let (fp, fs) = numeric_precision_scale(from);
            let (tp, ts) = numeric_precision_scale(to);
            ts >= fs && tp - ts >= fp - fs
        }
        // Fractional digits of seconds; unconstrained is six.
        "timestamp" | "timestamptz" | "time" | "timetz" => to >= if from == -1 { 6 } else { from },
        // At most n bits.
        "varbit" => to >= from,
        // bit(n) is exactly n bits, interval's modifier names its fields
        // as well as its precision: only the same one.
        _ => false,
    }
}

/// A `numeric(p, s)` modifier's precision and scale (the scale is an
/// 11-bit signed field since PostgreSQL 15).
fn numeric_precision_scale(typmod: i32) -> (i32, i32) {
    let t = typmod - 4;
    let precision = (t >> 16) & 0xffff;
    let raw = t & 0x7ff;
    let scale = if raw & 0x400 != 0 { raw - 0x800 } else { raw };
    (precision, scale)
}

/// The problems of one entity's archive: `archive_table` is the live
/// archive table (`None`: it does not exist), `hooks` what can rewrite or
/// swallow an INSERT into it. Expects the archive's columns already
/// filled in (every source column when none were listed).
pub(crate) fn check(
    e: &EntityDescriptor,
    source: &TableInfo,
    archive_table: Option<&TableInfo>,
    hooks: &[InsertHook],
    capabilities: Option<&CategoryCapabilities>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(archive) = &e.archive else {
        if capabilities.is_some_and(|c| c.allows(Strategy::Archive)) {
            problems.push(format!(
                "category {:?} may archive, but the entity names no archive table (archive_table in the policy file, `archive = \"schema.table\"` in the derive)",
                e.category
            ));
        }
        return problems;
    };
    if capabilities.is_some_and(|c| !c.allows(Strategy::Archive)) {
        problems.push(format!(
            "an archive table ({}) is named, but category {:?} never archives: the setting would do nothing; remove it or give the category the archive strategy",
            archive.table.display_plain(),
            e.category
        ));
    }
    let Some(target) = archive_target(e, archive, archive_table, &mut problems) else {
        return problems;
    };
    let name = archive.table.display_plain();
    check_insert_hooks(&name, hooks, &mut problems);
    check_archived_keys(e, archive, &mut problems);
    check_archived_columns(e, archive, source, target, &name, &mut problems);
    check_archive_bookkeeping(target, &name, &mut problems);
    check_unfilled_columns(archive, target, &name, &mut problems);
    problems
}

/// The live archive table, if usable: not the entity's own table, existing, a table.
fn archive_target<'t>(
    e: &EntityDescriptor,
    archive: &ArchiveTarget,
    archive_table: Option<&'t TableInfo>,
    problems: &mut Vec<String>,
) -> Option<&'t TableInfo> {
    if archive.table == e.table {
        problems.push("the archive table is the entity's own table".into());
        return None;
    }
    let Some(target) = archive_table else {
        problems.push(format!(
            "archive table {} does not exist",
            archive.table.display_plain()
        ));
        return None;
    };
    if !matches!(target.relkind.as_str(), "r" | "p") {
        problems.push(format!(
            "archive table {} is not a table",
            archive.table.display_plain()
        ));
        return None;
    }
    Some(target)
}

/// No INSERT rule or BEFORE row trigger on the archive table can change a copy.
fn check_insert_hooks(name: &str, hooks: &[InsertHook], problems: &mut Vec<String>) {
    // A row deleted from the source must arrive in the archive as it was
    // copied: a rule can rewrite the INSERT into something else (or
    // nothing), a BEFORE row trigger can change the row or return NULL
    // and drop it. The batch also checks that the copy took every row it
    // deleted, but a changed value it cannot see.
    for hook in hooks {
        problems.push(match hook.kind.as_str() {
            "rule" => format!(
                "archive table {name} has the INSERT rule {:?}: it can rewrite or swallow the copy of rows the archive deletes; drop it (`DROP RULE {} ON {}`) or archive to a table without one",
                hook.name,
                crate::base::ident::quote_ident(&hook.name),
                hook.relation
            ),
            _ => format!(
                "archive table {name} has the BEFORE INSERT row trigger {:?} on {}: it can change a copy, or drop it by returning NULL, while the source row is deleted; drop it, make it an AFTER trigger, or archive to a table without one",
                hook.name, hook.relation
            ),
        });
    }
}

/// The archived columns leave out the bookkeeping columns and include the record key.
fn check_archived_keys(e: &EntityDescriptor, archive: &ArchiveTarget, problems: &mut Vec<String>) {
    for reserved in [ARCHIVED_AT, ARCHIVE_RUN_ID] {
        if archive.columns.iter().any(|c| c == reserved) {
            problems.push(format!(
                "column {reserved:?} is archived, but the archive table's {reserved:?} records the archive itself; list archive_columns without it"
            ));
        }
    }
    for key in &e.record_key {
        if !archive.columns.contains(key) {
            problems.push(format!(
                "the archived columns leave out the record key {key:?}: the audit and erasure find archived copies by it"
            ));
        }
    }
}

/// Each archived column, knowing which are anonymised to NULL on the way.
fn check_archived_columns(
    e: &EntityDescriptor,
    archive: &ArchiveTarget,
    source: &TableInfo,
    target: &TableInfo,
    name: &str,
    problems: &mut Vec<String>,
) {
    let anonymised: BTreeSet<&str> = if archive.anonymise {
        e.anonymise.iter().map(|a| a.column.as_str()).collect()
    } else {
        BTreeSet::new()
    };
    for column in &archive.columns {
        let nulled = anonymised.contains(column.as_str())
            && e.anonymise
                .iter()
                .any(|a| a.column == *column && a.method == AnonymiseMethod::Null);
        check_archived_column(e, source, target, name, column, nulled, problems);
    }
}

/// One archived column: on both sides, writable, its type kept, NULL allowed if nulled.
fn check_archived_column(
    e: &EntityDescriptor,
    source: &TableInfo,
    target: &TableInfo,
    name: &str,
    column: &str,
    nulled: bool,
    problems: &mut Vec<String>,
) {
    let Some(from) = source.column(column) else {
        problems.push(format!(
            "archive column {column:?} is not a column of {}",
            e.table.display_plain()
        ));
        return;
    };
    let Some(to) = target.column(column) else {
        problems.push(format!("archive table {name} has no column {column:?}"));
        return;
    };
    if to.generated {
        problems.push(format!(
            "archive column {column:?} is a generated column of {name}: it cannot be written; leave it out of the archived columns"
        ));
        return;
    }
    if !fits(from, to) {
        problems.push(format!(
            "archive column {column:?} is {} in {name} but {} in {}: archived values must keep their type, with a modifier at least as wide (a narrower one rounds or cuts values silently)",
            to.display_type,
            from.display_type,
            e.table.display_plain()
        ));
    }
    if nulled && to.not_null {
        problems.push(format!(
            "column {column:?} is anonymised to NULL on archive, but it is NOT NULL in {name}"
        ));
    }
}

/// The archive table has `archived_at` and `run_id` columns of the right types.
fn check_archive_bookkeeping(target: &TableInfo, name: &str, problems: &mut Vec<String>) {
    for (column, type_name, display) in [
        (ARCHIVED_AT, "timestamptz", "timestamptz"),
        (ARCHIVE_RUN_ID, "uuid", "uuid"),
    ] {
        match target.column(column) {
            None => problems.push(format!(
                "archive table {name} has no {column:?} column ({display}): each copy records when and by which run it was archived"
            )),
            Some(c) if c.type_name != type_name => problems.push(format!(
                "archive column {column:?} of {name} is {}; it must be {display}",
                c.display_type
            )),
            Some(_) => {}
        }
    }
}

/// Every NOT NULL column of the archive table without a default is one the archive fills.
fn check_unfilled_columns(
    archive: &ArchiveTarget,
    target: &TableInfo,
    name: &str,
    problems: &mut Vec<String>,
) {
    for c in &target.columns {
        let filled =
            archive.columns.contains(&c.name) || c.name == ARCHIVED_AT || c.name == ARCHIVE_RUN_ID;
        if c.not_null && !c.has_default && !c.identity && !filled {
            problems.push(format!(
                "archive table {name} has a NOT NULL column {:?} without a default that the archive does not fill",
                c.name
            ));
        }
    }
}

/// Problems of source and archive together: an archive that keeps a
/// subject column (not anonymised on the way) must be a retained entity
/// declaring that column a subject, so erasure reaches the copies and a
/// retention rule ends them; archives must not lead back to their source.
pub(crate) fn check_pairs(entities: &[EntityDescriptor]) -> Vec<Problem> {
    let mut problems = Vec::new();
    let by_table = |t: &crate::base::ident::QualifiedName| entities.iter().find(|e| e.table == *t);
    for e in entities {
        let Some(archive) = &e.archive else {
            continue;
        };
        let target = by_table(&archive.table);
        let anonymised = |c: &str| archive.anonymise && e.anonymise.iter().any(|a| a.column == c);
        for s in &e.subjects {
            if !archive.columns.contains(&s.column) || anonymised(&s.column) {
                continue;
            }
            let declared = target.and_then(|t| t.subjects.iter().find(|ts| ts.column == s.column));
            // An erasure of the source's kind must reach the copy: the
            // archive's column carries that kind, or none (every kind).
            if let Some(ts) = declared.filter(|ts| ts.kind.is_some() && ts.kind != s.kind) {
                problems.push(Problem::entity(
                    &e.name,
                    format!(
                        "archive table {} declares the subject column {:?} as kind {:?}, but {} declares it {}: an erasure of the source's kind would not reach the archived copies; give the archive's column the same kind, or none",
                        archive.table.display_plain(),
                        s.column,
                        ts.kind.as_deref().unwrap_or_default(),
                        e.table.display_plain(),
                        s.kind.as_deref().map_or_else(|| "without a kind".to_owned(), |k| format!("as kind {k:?}")),
                    ),
                ));
                continue;
            }
            if declared.is_none() {
                problems.push(Problem::entity(
                    &e.name,
                    format!(
                        "archive table {} keeps the subject column {:?}: declare the archive table as a retained entity with {:?} as an erasure subject (so erasure and its own retention reach the copies), or anonymise {:?} on archive",
                        archive.table.display_plain(),
                        s.column,
                        s.column,
                        s.column
                    ),
                ));
            }
        }
        // Follow the chain of archives: it must not come back here.
        let mut seen = vec![&e.table];
        let mut next = Some(&archive.table);
        while let Some(t) = next {
            if seen.contains(&t) {
                problems.push(Problem::entity(
                    &e.name,
                    format!(
                        "archiving leads back to {}: archives must not form a cycle",
                        t.display_plain()
                    ),
                ));
                break;
            }
            seen.push(t);
            next = by_table(t)
                .and_then(|a| a.archive.as_ref())
                .map(|a| &a.table);
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::typmod_holds;

    /// `numeric(p, s)` as PostgreSQL encodes it.
    fn numeric(p: i32, s: i32) -> i32 {
        ((p << 16) | (s & 0x7ff)) + 4
    }

    #[test]
    fn a_modifier_holds_the_values_of_one_no_wider() {
        let cases = [
            ("numeric", numeric(8, 2), numeric(8, 2), true),
            ("numeric", numeric(8, 2), numeric(10, 3), true),
            ("numeric", numeric(8, 2), -1, true),
            ("numeric", numeric(8, 2), numeric(6, 0), false),
            ("numeric", numeric(8, 2), numeric(12, 1), false),
            ("numeric", numeric(8, 2), numeric(9, 3), true),
            ("numeric", numeric(8, 2), numeric(8, 3), false),
            ("numeric", -1, numeric(30, 10), false),
            ("numeric", numeric(4, -2), numeric(6, 0), true),
            ("_numeric", numeric(8, 2), numeric(6, 0), false),
            ("varchar", 24, 44, true),
            ("varchar", 44, 24, false),
            ("varchar", -1, 44, false),
            ("timestamptz", 3, 6, true),
            ("timestamptz", -1, 6, true),
            ("timestamptz", -1, 3, false),
            ("time", 6, 0, false),
            ("varbit", 8, 4, false),
            ("varbit", 4, 8, true),
            ("bit", 4, 8, false),
            ("interval", -1, 3, false),
            ("geometry", 7, 7, true),
            ("geometry", 7, 8, false),
        ];
        for (ty, from, to, holds) in cases {
            assert_eq!(typmod_holds(ty, from, to), holds, "{ty} {from} -> {to}");
        }
    }
}
