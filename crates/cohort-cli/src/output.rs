//! Human and JSON output. With `--json`, stdout carries exactly one JSON
//! document; everything else goes to stderr.

use cohort::model::{AnonymiseMethod, EntityDescriptor};
use cohort::schema::MigrationReport;
use cohort::validate::ValidatedModel;
use cohort::{CohortConfig, Error};
use serde_json::{json, Value};

/// Prints rows as an aligned text table.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    out.push_str(&line(widths.iter().map(|w| "-".repeat(*w)).collect()));
    for row in rows {
        out.push('\n');
        out.push_str(&line(row.clone()));
    }
    out
}

pub(crate) fn print_json(value: &Value) {
    outln!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values serialise")
    );
}

pub(crate) fn error(json: bool, error: &Error) {
    let kind = error.kind().as_str();
    if json {
        print_json(&json!({
            "error": {
                "kind": kind,
                "message": error.to_string(),
                "problems": error.problems().unwrap_or_default(),
            }
        }));
    } else {
        eprintln!("cohort: {error}");
    }
}

pub(crate) fn migration(json: bool, report: &MigrationReport) {
    if json {
        print_json(&serde_json::to_value(report).expect("report serialises"));
    } else if report.applied.is_empty() {
        outln!(
            "Cohort schema {:?} is up to date (version {}).",
            report.schema,
            report.to_version
        );
    } else {
        outln!(
            "Cohort schema {:?} migrated from version {} to {} (applied {:?}).",
            report.schema,
            report.from_version,
            report.to_version,
            report.applied
        );
    }
}

fn method(m: &AnonymiseMethod) -> String {
    match m {
        AnonymiseMethod::Literal(text) => format!("literal {text:?}"),
        other => other.kind().to_string(),
    }
}

/// `value` (an object, or an array of them) with each `record_id` of an
/// entity whose key is composite (`entity_id` names it) as the JSON array
/// it is, not a string holding one: what scripts read (SPEC §17).
pub(crate) fn with_record_arrays(model: &ValidatedModel, mut value: Value) -> Value {
    fn fix(model: &ValidatedModel, v: &mut Value) {
        match v {
            Value::Array(items) => items.iter_mut().for_each(|i| fix(model, i)),
            Value::Object(o) => {
                let composite = o
                    .get("entity_id")
                    .and_then(Value::as_str)
                    .and_then(|id| id.parse().ok())
                    .and_then(|id| model.entity(id))
                    .is_some_and(EntityDescriptor::has_composite_key);
                if composite {
                    if let Some(Value::String(text)) = o.get("record_id") {
                        if let Ok(parsed) = serde_json::from_str::<Value>(text) {
                            o.insert("record_id".into(), parsed);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    fix(model, &mut value);
    value
}

pub(crate) fn entity_json(e: &EntityDescriptor, model: &ValidatedModel) -> Value {
    json!({
        "entity_id": e.id,
        "entity": e.name,
        "table": e.table.display_plain(),
        "category": e.category,
        "strategies": model.capabilities.get(&e.id).map(|c| c.iter().map(|s| s.as_str()).collect::<Vec<_>>()),
        "anchor": e.anchor,
        "record_id": if e.has_composite_key() { json!(e.record_key) } else { json!(e.record_id) },
        "tenant": e.tenant,
        "soft_delete": e.soft_delete,
        "deleted_at": e.deleted_at,
        "anonymised_at": e.anonymised_at,
        "anonymise": e.anonymise.iter().map(|a| json!({"column": a.column, "method": method(&a.method)})).collect::<Vec<_>>(),
        "subjects": e.subjects.iter().map(|s| json!({"column": s.column, "kind": s.kind})).collect::<Vec<_>>(),
        "archive": e.archive.as_ref().map(|a| json!({
            "table": a.table.display_plain(),
            "columns": a.columns,
            "anonymise": a.anonymise,
        })),
    })
}

pub(crate) fn entity_rows(model: &ValidatedModel) -> Vec<Vec<String>> {
    model
        .entities
        .iter()
        .map(|e| {
            vec![
                e.name.clone(),
                e.table.display_plain(),
                e.category.clone(),
                model
                    .capabilities
                    .get(&e.id)
                    .map(|c| c.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default(),
                e.tenant.clone().unwrap_or_else(|| "(tenantless)".into()),
                e.anchor.clone(),
            ]
        })
        .collect()
}

pub(crate) fn validated(
    json: bool,
    config: &CohortConfig,
    model: &ValidatedModel,
    unusable_tenants: &[cohort::UnusableTenant],
    peers_with_other_policy: &[cohort::peers::Peer],
) {
    if json {
        print_json(&json!({
            "valid": true,
            "schema": config.schema,
            "entities": model.entities.iter().map(|e| entity_json(e, model)).collect::<Vec<_>>(),
            "exempt": model.exempt.iter().map(|e| json!({"entity_id": e.id, "entity": e.name, "reason": e.reason})).collect::<Vec<_>>(),
            "warnings": model.warnings,
            "unusable_tenants": unusable_tenants,
            "peers_with_other_policy": peers_with_other_policy,
        }));
        return;
    }
    outln!(
        "Valid: {} retained entit{}, Cohort tables in schema {:?}.\n",
        model.entities.len(),
        if model.entities.len() == 1 {
            "y"
        } else {
            "ies"
        },
        config.schema
    );
    outln!(
        "{}",
        table(
            &[
                "ENTITY",
                "TABLE",
                "CATEGORY",
                "STRATEGIES",
                "TENANT",
                "ANCHOR"
            ],
            &entity_rows(model)
        )
    );
    for e in &model.exempt {
        outln!("\nExempt: {} ({})", e.name, e.reason);
    }
    for w in &model.warnings {
        outln!("\nadvice: {w}");
    }
}

/// One row per entity outcome, under [`OUTCOME_HEADERS`]; exempt entities
/// show "never" as their cutoff. KEPT counts rows kept by the legal minimum
/// (erasure) or by an exempt strategy.
pub(crate) fn outcome_rows(result_entities: &[cohort::EntityOutcome]) -> Vec<Vec<String>> {
    result_entities
        .iter()
        .map(|e| {
            vec![
                e.entity.clone(),
                e.category.clone(),
                // A category in stages shows each stage's position; a
                // paused entity says so (its rows left are not skipped).
                match (e.stage, e.paused) {
                    (Some(n), false) => format!("{} (stage {n})", e.strategy),
                    (Some(n), true) => format!("{} (stage {n}, paused)", e.strategy),
                    (None, false) => e.strategy.to_string(),
                    (None, true) => format!("{} (paused)", e.strategy),
                },
                e.affected.to_string(),
                e.held.to_string(),
                e.skipped.to_string(),
                e.null_anchor.to_string(),
                (e.kept_by_legal_min + e.kept_by_policy).to_string(),
                e.period.to_string(),
                e.legal_min
                    .map(|l| l.to_string())
                    .unwrap_or_else(|| "-".into()),
                if e.strategy.mutates() {
                    e.cutoff
                        .map(|c| c.format("%Y-%m-%d %H:%M:%S").to_string())
                        .unwrap_or_else(|| "-".into())
                } else {
                    "never".into()
                },
            ]
        })
        .collect()
}

/// Headers of the per-entity outcome table.
pub(crate) const OUTCOME_HEADERS: [&str; 11] = [
    "ENTITY",
    "CATEGORY",
    "STRATEGY",
    "AFFECTED",
    "HELD",
    "SKIPPED",
    "NULL ANCHOR",
    "KEPT",
    "PERIOD",
    "LEGAL MIN",
    "CUTOFF (UTC)",
];

/// Writes to stdout; a closed pipe ends the process quietly with the
/// shell's code for it (141), never a panic.
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("cohort: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// A command-line usage error as the `--json` error document.
pub(crate) fn usage_error(rendered: &str) {
    print_json(&json!({
        "error": {
            "kind": "usage",
            "message": rendered.trim(),
            "problems": [],
        }
    }));
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_aligns_columns() {
        let t = super::table(&["A", "LONG"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    LONG\n---  ----\nxyz  1");
    }
}
