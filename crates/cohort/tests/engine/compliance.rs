//! The requirement manifest (`compliance/manifest.toml`) is checked both
//! ways: every supported id names tests that exist, every named test exists,
//! every test of the end-to-end suite is named by some id, and every id of
//! the shared requirement inventory appears (when that file is present).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(serde::Deserialize)]
struct Manifest {
    requirement: Vec<Requirement>,
}

#[derive(serde::Deserialize)]
struct Requirement {
    id: String,
    text: String,
    status: String,
    tests: Vec<String>,
    /// Benchmark commands whose printed figures are evidence too (speed
    /// is proved by benchmarks, never by timed assertions); each must be
    /// one of the commands the README lists.
    #[serde(default)]
    benchmarks: Vec<String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn manifest() -> Manifest {
    let text = std::fs::read_to_string(root().join("compliance/manifest.toml")).expect("manifest");
    toml::from_str(&text).expect("manifest parses")
}

/// Test functions of a Rust file: `fn name(` right after a test attribute.
fn test_fns(source: &str) -> Vec<String> {
    let lines: Vec<&str> = source.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !(line.starts_with("#[test]")
            || line.starts_with("#[tokio::test")
            || line.starts_with("#[db_test"))
        {
            continue;
        }
        for next in lines.iter().skip(i + 1).take(3) {
            let rest = next
                .strip_prefix("async fn ")
                .or_else(|| next.strip_prefix("fn "));
            if let Some(rest) = rest {
                out.push(rest.split('(').next().unwrap().to_string());
                break;
            }
        }
    }
    out
}

/// Requirement ids in free text: `WORD(-WORD)*-NNN`.
fn ids_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '-'))
        .filter(|t| {
            let mut parts = t.rsplitn(2, '-');
            let digits = parts.next().unwrap_or("");
            let head = parts.next().unwrap_or("");
            digits.len() == 3
                && digits.chars().all(|c| c.is_ascii_digit())
                && head.starts_with(|c: char| c.is_ascii_uppercase())
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_supported_requirement_names_existing_tests() {
    let m = manifest();
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for r in &m.requirement {
        if !seen.insert(r.id.clone()) {
            problems.push(format!("{} appears twice", r.id));
        }
        if r.text.trim().is_empty() {
            problems.push(format!("{} has no text", r.id));
        }
        match r.status.as_str() {
            "supported" if r.tests.is_empty() => {
                problems.push(format!("{} is supported but names no test", r.id))
            }
            "non-goal" if !r.tests.is_empty() => {
                problems.push(format!("{} is a non-goal but names tests", r.id))
            }
            "supported" | "planned" | "non-goal" => {}
            other => problems.push(format!("{} has unknown status {other:?}", r.id)),
        }
        let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
        for command in &r.benchmarks {
            if !readme.lines().any(|l| l.trim() == command) {
                problems.push(format!(
                    "{}: benchmark {command:?} is not a command the README lists",
                    r.id
                ));
            }
        }
        for t in &r.tests {
            let Some((path, name)) = t.split_once("::") else {
                problems.push(format!("{}: {t:?} is not path::name", r.id));
                continue;
            };
            let Ok(source) = std::fs::read_to_string(root().join(path)) else {
                problems.push(format!("{}: {path} does not exist", r.id));
                continue;
            };
            let found = if name.ends_with(".md") {
                source.contains(&format!("include_str!(\"../../../{name}\")"))
            } else {
                test_fns(&source).iter().any(|f| f == name)
            };
            if !found {
                problems.push(format!("{}: no test {name} in {path}", r.id));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_end_to_end_test_is_named_by_a_requirement() {
    let m = manifest();
    let named: BTreeSet<&str> = m
        .requirement
        .iter()
        .flat_map(|r| r.tests.iter().map(String::as_str))
        .collect();
    let mut unnamed = Vec::new();
    for dir in [
        "crates/cohort/tests",
        "crates/cohort/tests/engine",
        "crates/cohort-cli/tests/cli",
        "examples/seaorm-notes/tests",
        "examples/axum-notes/tests",
    ] {
        let mut files: Vec<_> = std::fs::read_dir(root().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for file in files
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        {
            let rel = format!("{dir}/{}", file.file_name().unwrap().to_string_lossy());
            if rel.ends_with("/compliance.rs") {
                continue; // this file checks the manifest itself
            }
            for f in test_fns(&std::fs::read_to_string(&file).unwrap()) {
                let key = format!("{rel}::{f}");
                if !named.contains(key.as_str()) {
                    unnamed.push(key);
                }
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "tests named by no requirement:\n{}",
        unnamed.join("\n")
    );
}

/// docs/guarantees.md names its proofs as `file.rs::test` (cohort's
/// tests) or `cli/file.rs::test` (the CLI's): each must exist.
#[test]
fn every_test_the_guarantees_name_exists() {
    let text =
        std::fs::read_to_string(root().join("docs/guarantees.md")).expect("docs/guarantees.md");
    let mut named = 0;
    let mut missing = Vec::new();
    for token in text.split('`').skip(1).step_by(2) {
        let Some((file, test)) = token.split_once(".rs::") else {
            continue;
        };
        if test.contains('*') || test.contains('<') {
            continue;
        }
        // Cohort's own tests live in its one test binary (`engine/`), but
        // for the few with binaries of their own.
        let path = match file.strip_prefix("cli/") {
            Some(f) => format!("crates/cohort-cli/tests/cli/{f}.rs"),
            None if root()
                .join(format!("crates/cohort/tests/engine/{file}.rs"))
                .exists() =>
            {
                format!("crates/cohort/tests/engine/{file}.rs")
            }
            None => format!("crates/cohort/tests/{file}.rs"),
        };
        let source = std::fs::read_to_string(root().join(&path)).unwrap_or_default();
        named += 1;
        if !test_fns(&source).iter().any(|t| t == test) {
            missing.push(format!("{path}::{test}"));
        }
    }
    assert!(named > 20, "only {named} tests named");
    assert!(
        missing.is_empty(),
        "docs/guarantees.md names missing tests: {missing:?}"
    );
}

#[test]
fn every_inventory_id_is_in_the_manifest() {
    // The project's own list: this check never passes vacuously.
    let text = std::fs::read_to_string(root().join("compliance/requirements.txt"))
        .expect("compliance/requirements.txt");
    let inventory: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split('\t').next().unwrap_or("").to_owned())
        .collect();
    assert!(
        inventory.len() > 90,
        "the inventory lists only {} ids",
        inventory.len()
    );
    let m = manifest();
    let listed: BTreeMap<&str, &str> = m
        .requirement
        .iter()
        .map(|r| (r.id.as_str(), r.status.as_str()))
        .collect();
    let missing: Vec<&String> = inventory
        .iter()
        .filter(|id| !listed.contains_key(id.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "ids of compliance/requirements.txt missing from the manifest: {missing:?}"
    );
}

/// The shared inventory's ids as of its last reading, kept in the
/// project (`compliance/shared-requirement-ids.txt`): without `../shared`
/// (a clone on its own) the project's inventory is still checked against
/// them, never passed unchecked.
fn shared_ids_snapshot() -> BTreeSet<String> {
    ids_in(&std::fs::read_to_string(root().join("compliance/shared-requirement-ids.txt")).unwrap())
}

#[test]
fn the_inventory_follows_the_shared_requirements() {
    let own = ids_in(&std::fs::read_to_string(root().join("compliance/requirements.txt")).unwrap());
    let snapshot = shared_ids_snapshot();
    assert!(
        snapshot.len() >= 100,
        "{} ids in the snapshot",
        snapshot.len()
    );
    let shared = root().join("../shared/REQUIREMENTS.md");
    let expected = match std::fs::read_to_string(&shared) {
        Ok(text) => {
            let ids = ids_in(&text);
            let stale: Vec<&String> = ids.symmetric_difference(&snapshot).collect();
            assert!(
                stale.is_empty(),
                "compliance/shared-requirement-ids.txt differs from {} in {stale:?}: write its ids there, one per line",
                shared.display()
            );
            ids
        }
        Err(_) => snapshot,
    };
    let missing: Vec<&String> = expected.iter().filter(|id| !own.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "ids of the shared requirements missing from compliance/requirements.txt: {missing:?}"
    );
}

#[test]
fn id_extraction() {
    assert_eq!(
        ids_in(
            "- SCOPE-001 x\n- SCHEMA-SEARCHPATH-001 y; HOLD-004, NONGOAL-001: z RS-007 ABC-12 -001"
        ),
        [
            "HOLD-004",
            "NONGOAL-001",
            "RS-007",
            "SCHEMA-SEARCHPATH-001",
            "SCOPE-001"
        ]
        .into_iter()
        .map(String::from)
        .collect()
    );
}
