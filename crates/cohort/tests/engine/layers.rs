//! The library's layers, checked from its source.
//!
//! The folders of `crates/cohort/src` are the layers. Each module (a
//! top-level module, or `folder/module` in a folder of modules such as
//! `domain/`) belongs to one layer, and a module may import only from its
//! own layer or the layers below it; within a layer the imports must not
//! form a cycle. The list below is the picture
//! of the crate (STYLE.md, "Shape to grow into"): a new module must be
//! placed in it, and an import that points up fails with the edge named.
//!
//! What counts as an import: every `crate::module` path outside test code
//! (`#[cfg(test)]` modules and `*_test.rs` files), including the grouped
//! `use crate::{a::X, b::Y}` form. A bare `crate::Name` (a root re-export)
//! is refused outside the facade: import it from the module that defines it,
//! so the edge is visible.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom up. Each entry: the layer's name and its modules. A layer named
/// for a folder (`base/`, `domain/`, …) is that folder: its modules are
/// `folder/module`, and the folder holds no other layer's module
/// (`every_folder_is_one_layer`). The root keeps `lib.rs`, the facade's
/// `sea_orm.rs` and `error.rs` (a leaf); the facade's `cohort/`, and
/// `config/` and `policy/` (loading), are folders of one module each.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "base/ (leaves)",
        &[
            "error",
            "base/ident",
            "base/cancel",
            "base/diagnostic",
            "base/digest",
            "base/locks",
            "base/suggest",
        ],
    ),
    (
        "domain/ (no database)",
        &[
            "domain/model",
            "domain/rules",
            "domain/schedule",
            "domain/tenants",
            "domain/outcome",
            "domain/erasure",
            "domain/erasure_requests",
            "domain/request_rules",
            "domain/journal",
            "domain/chain",
            "domain/settings",
            "domain/handlers",
            "domain/observer",
            "domain/telemetry",
            "domain/signals",
        ],
    ),
    ("loading", &["config", "policy"]),
    ("sql/ (statement text and typed binds)", &["sql"]),
    ("schema/ (Cohort's own tables)", &["schema"]),
    ("validate/", &["validate"]),
    ("store/ (the journal's stores)", &["store/journal"]),
    ("context/", &["context"]),
    ("run/", &["run"]),
    ("services/", &["services"]),
    (
        "ops/ (operations that are not sweeps)",
        &[
            "ops/holds",
            "ops/guarded",
            "ops/history",
            "ops/report",
            "ops/verify",
            "ops/restore",
            "ops/dead_letters",
        ],
    ),
    ("facade", &["cohort", "sea_orm"]),
];

/// Folders whose files are modules of their own (`domain/model`), not one
/// module (`run`).
fn is_group(folder: &str) -> bool {
    LAYERS
        .iter()
        .flat_map(|(_, modules)| modules.iter())
        .any(|m| {
            m.strip_prefix(folder)
                .is_some_and(|rest| rest.starts_with('/'))
        })
}

fn src_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file belongs to: its top-level module, or `folder/module`
/// in a folder that groups modules (`None` for `lib.rs` and the groups'
/// own `mod.rs`).
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src_root()).expect("under src");
    let mut parts = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap_or(""));
    let first = parts.next()?;
    if first == "lib.rs" {
        return None;
    }
    if is_group(first) {
        let second = parts.next()?;
        if second == "mod.rs" {
            return None;
        }
        return Some(format!("{first}/{}", second.trim_end_matches(".rs")));
    }
    Some(first.trim_end_matches(".rs").to_owned())
}

/// Every source file, by its path under `src/` (`/`-separated, sorted),
/// with its production text.
fn production_files() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&src_root(), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let rel = file
                .strip_prefix(src_root())
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let text = production_text(&std::fs::read_to_string(&file).expect("read source"));
            (rel, text)
        })
        .collect()
}

/// Source without line comments and without test modules.
fn production_text(src: &str) -> String {
    let mut text = String::with_capacity(src.len());
    let mut lines = src.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            // Skip the item that follows: to the end of its braces, or to
            // its `;` for `mod x;`.
            let mut depth = 0i32;
            let mut opened = false;
            for next in lines.by_ref() {
                let code = next.split("//").next().unwrap_or("");
                depth += code.matches('{').count() as i32;
                depth -= code.matches('}').count() as i32;
                opened |= code.contains('{');
                if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        let code = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        text.push_str(code);
        text.push('\n');
    }
    text
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Where each entry of a path's next segment starts: one place for
/// `a::…`, one per top-level entry for `{a::X, b::{Y, Z}, c}`.
fn entries(s: &str) -> Vec<&str> {
    let Some(group) = s.strip_prefix('{') else {
        return vec![s];
    };
    let mut found = Vec::new();
    let mut depth = 0;
    let mut start = true;
    for (j, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => start = true,
            c if start && !c.is_whitespace() => {
                start = false;
                found.push(&group[j..]);
            }
            _ => {}
        }
    }
    found
}

/// The modules `text` names through `crate::` (`folder/module` in a
/// folder of modules), and bare root names.
fn imports(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut modules = BTreeSet::new();
    let mut roots = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        for entry in entries(rest) {
            let name = ident_at(entry);
            match entry[name.len()..].strip_prefix("::") {
                Some(inner) if is_group(name) => {
                    for e in entries(inner) {
                        classify(&format!("{name}/{}", ident_at(e)), &mut modules, &mut roots);
                    }
                }
                _ => classify(name, &mut modules, &mut roots),
            }
        }
    }
    (modules, roots)
}

fn classify(name: &str, modules: &mut BTreeSet<String>, roots: &mut BTreeSet<String>) {
    if name.is_empty() || name == "self" {
        return;
    }
    if name.starts_with(|c: char| c.is_ascii_uppercase()) {
        roots.insert(name.to_owned());
    } else {
        modules.insert(name.to_owned());
    }
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// Every `module -> module` import of the crate's production code.
fn graph() -> (BTreeMap<String, BTreeSet<String>>, Vec<String>) {
    let mut files = Vec::new();
    rust_files(&src_root(), &mut files);
    files.sort();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for file in files {
        let Some(module) = module_of(&file) else {
            continue;
        };
        if file.to_string_lossy().ends_with("_test.rs") {
            continue;
        }
        let src = std::fs::read_to_string(&file).expect("read source");
        let (used, roots) = imports(&production_text(&src));
        let rel = file.strip_prefix(src_root()).unwrap().display().to_string();
        let facade = layer_of(&module) == Some(LAYERS.len() - 1);
        if !facade {
            for root in roots {
                problems.push(format!(
                    "{rel} names `crate::{root}` (a root re-export): import it from the module that defines it"
                ));
            }
        }
        let entry = edges.entry(module.clone()).or_default();
        for target in used {
            if target != module {
                entry.insert(target);
            }
        }
    }
    (edges, problems)
}

#[test]
fn every_module_is_placed_in_one_layer() {
    let (edges, _) = graph();
    let mut seen = BTreeSet::new();
    for (_, modules) in LAYERS {
        for m in *modules {
            assert!(seen.insert(*m), "module `{m}` is listed in two layers");
        }
    }
    let unplaced: Vec<_> = edges.keys().filter(|m| layer_of(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "modules not placed in LAYERS (tests/layers.rs): {unplaced:?}"
    );
    let gone: Vec<_> = seen.iter().filter(|m| !edges.contains_key(**m)).collect();
    assert!(
        gone.is_empty(),
        "LAYERS lists modules that do not exist: {gone:?}"
    );
}

/// The folders are the layers: a folder named by a layer holds that
/// layer's modules and no other's, and the crate's root keeps at most six
/// loose files.
#[test]
fn every_folder_is_one_layer() {
    let (edges, _) = graph();
    let mut problems = Vec::new();
    for (name, modules) in LAYERS {
        let Some(folder) = name
            .split_whitespace()
            .next()
            .and_then(|w| w.strip_suffix('/'))
        else {
            continue;
        };
        for m in edges.keys() {
            let inside = m == folder || m.starts_with(&format!("{folder}/"));
            if inside && !modules.contains(&m.as_str()) {
                problems.push(format!(
                    "`{m}` lives in {folder}/ but is not of layer `{name}`"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let loose: Vec<String> = std::fs::read_dir(src_root())
        .expect("read src")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        loose.len() <= 6,
        "loose files at crates/cohort/src/: {loose:?}"
    );
}

#[test]
fn no_module_imports_from_a_higher_layer() {
    let (edges, mut problems) = graph();
    for (from, targets) in &edges {
        let Some(lf) = layer_of(from) else { continue };
        for to in targets {
            match layer_of(to) {
                Some(lt) if lt > lf => problems.push(format!(
                    "`{from}` ({}) imports `{to}` ({}), a higher layer",
                    LAYERS[lf].0, LAYERS[lt].0
                )),
                Some(_) => {}
                None => problems.push(format!("`{from}` imports `{to}`, which no layer lists")),
            }
        }
    }
    assert!(
        problems.is_empty(),
        "layer violations:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn modules_of_one_layer_import_each_other_without_a_cycle() {
    let (edges, _) = graph();
    // Depth-first search for a back edge; the path names the cycle.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_owned());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_owned());
        for next in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        let mut path = Vec::new();
        if let Some(cycle) = visit(m, &edges, &mut path, &mut done) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_checker_sees_grouped_and_nested_imports() {
    let (m, r) = imports(
        "use crate::{a::X, b::{Y, Z}, c};\nfn f() { crate::d::g(); crate::Root; my_crate::e; }\n",
    );
    assert_eq!(m.into_iter().collect::<Vec<_>>(), ["a", "b", "c", "d"]);
    assert_eq!(r.into_iter().collect::<Vec<_>>(), ["Root"]);
    // A folder of modules: its modules are named with it, in any form.
    let (m, _) = imports(
        "use crate::domain::model::X;\nuse crate::{ops::{holds, verify::V}, domain::rules::{R, S}};\n",
    );
    assert_eq!(
        m.into_iter().collect::<Vec<_>>(),
        ["domain/model", "domain/rules", "ops/holds", "ops/verify"]
    );
    let text = production_text(
        "use crate::a;\n// crate::commented\n#[cfg(test)]\nmod tests {\n    use crate::hidden;\n}\nuse crate::b;\n",
    );
    let (m, _) = imports(&text);
    assert_eq!(m.into_iter().collect::<Vec<_>>(), ["a", "b"]);
}

/// A file's module path under `src` (`services/events.rs` is
/// `["services", "events"]`, `services/mod.rs` is `["services"]`), with
/// whether it is a folder's `mod.rs`; `None` for `lib.rs` and test files.
fn file_module(path: &Path) -> Option<Vec<String>> {
    let rel = path.strip_prefix(src_root()).ok()?;
    let text = rel.to_string_lossy().replace('\\', "/");
    if text == "lib.rs" || text.ends_with("_test.rs") {
        return None;
    }
    let mut parts: Vec<String> = text
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    Some(parts)
}

/// Every file's imports of other files, through `crate::a::b`,
/// `super::x` and `self::x` paths (each resolved to the longest path that
/// is a file of the crate).
fn file_graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut paths = Vec::new();
    rust_files(&src_root(), &mut paths);
    let files: BTreeMap<Vec<String>, PathBuf> = paths
        .into_iter()
        .filter_map(|p| Some((file_module(&p)?, p)))
        .collect();
    let mut edges = BTreeMap::new();
    for (module, path) in &files {
        let text = production_text(&std::fs::read_to_string(path).expect("read source"));
        let mut targets = BTreeSet::new();
        for (i, _) in text.match_indices("::") {
            // The path that ends here: walk back over `ident::` segments.
            let start = text[..i]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(0, |j| j + 1);
            if text[start..i].contains("::") {
                continue; // not the first separator of its path
            }
            let head = &text[start..i];
            let mut base: Vec<String> = match head {
                "crate" => Vec::new(),
                "super" => module[..module.len().saturating_sub(1)].to_vec(),
                "self" => module.clone(),
                _ => continue,
            };
            let mut rest = &text[i + 2..];
            loop {
                let seg = ident_at(rest);
                if seg.is_empty() {
                    break;
                }
                if seg == "super" {
                    base.pop();
                } else {
                    base.push(seg.to_owned());
                }
                rest = &rest[seg.len()..];
                match rest.strip_prefix("::") {
                    Some(r) => rest = r,
                    None => break,
                }
            }
            while !base.is_empty() {
                if files.contains_key(&base) {
                    if &base != module {
                        targets.insert(base.clone());
                    }
                    break;
                }
                base.pop();
            }
        }
        edges.insert(module.clone(), targets);
    }
    edges
}

/// Files of one folder do not import each other in a circle (a parent
/// module's `mod.rs` and its own files excepted: a child reads what its
/// parent declares). Two circles passed the module-level check before:
/// `services/events.rs` with `pruner.rs`, and `sql/entity.rs` with
/// `sql/fused.rs`.
#[test]
fn files_of_one_folder_import_each_other_without_a_cycle() {
    let edges = file_graph();
    assert!(edges.len() > 60, "{} files", edges.len());
    // Siblings: same parent folder, neither an ancestor of the other.
    let siblings = |a: &[String], b: &[String]| {
        a.len() == b.len() && a.len() > 1 && a[..a.len() - 1] == b[..b.len() - 1]
    };
    fn visit(
        m: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        siblings: &dyn Fn(&[String], &[String]) -> bool,
        path: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.clone());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.clone());
        for next in edges.get(m).into_iter().flatten() {
            if siblings(m, next) {
                if let Some(c) = visit(next, edges, siblings, path, done) {
                    return Some(c);
                }
            }
        }
        path.pop();
        done.insert(m.clone());
        None
    }
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        if let Some(cycle) = visit(m, &edges, &siblings, &mut Vec::new(), &mut done) {
            panic!(
                "files of one folder import each other in a circle: {}",
                cycle
                    .iter()
                    .map(|m| m.join("/"))
                    .collect::<Vec<_>>()
                    .join(" -> ")
            );
        }
    }
}

/// What does I/O: database access, processes, HTTP and spawned tasks.
const IO: &[&str] = &[
    "PgConnection",
    "PgPool",
    "sqlx::query",
    ".fetch_one(",
    ".fetch_all(",
    ".fetch_optional(",
    ".execute(",
    "tokio::process",
    "tokio::spawn",
    "ureq::",
];

/// Files of the pure layers that still do I/O, each to move up. Empty
/// since issue 38 moved the policy handlers' delivery to
/// `services/dispatcher/command.rs` and the observers' queues to
/// `context/observers.rs`; a listed file that no longer does I/O fails
/// the test until it is taken off.
const STILL_TO_MOVE: &[&str] = &[];

/// The layers below `sql` (leaves, domain, loading) do no I/O: they name
/// no connection, pool, query, process, HTTP client or spawned task.
#[test]
fn the_pure_layers_do_no_io() {
    let pure: Vec<&str> = LAYERS
        .iter()
        .take_while(|(name, _)| !name.starts_with("sql"))
        .flat_map(|(_, modules)| modules.iter().copied())
        .collect();
    assert!(
        pure.contains(&"domain/model") && pure.contains(&"policy"),
        "{pure:?}"
    );
    let mut files = Vec::new();
    rust_files(&src_root(), &mut files);
    files.sort();
    let mut doing = BTreeMap::new();
    for file in files {
        let Some(module) = module_of(&file) else {
            continue;
        };
        if !pure.contains(&module.as_str()) || file.to_string_lossy().ends_with("_test.rs") {
            continue;
        }
        let text = production_text(&std::fs::read_to_string(&file).expect("read source"));
        let found: Vec<&str> = IO.iter().copied().filter(|io| text.contains(io)).collect();
        if !found.is_empty() {
            let rel = file
                .strip_prefix(src_root())
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            doing.insert(rel, found);
        }
    }
    let new: Vec<String> = doing
        .iter()
        .filter(|(f, _)| !STILL_TO_MOVE.contains(&f.as_str()))
        .map(|(f, io)| format!("{f}: {io:?}"))
        .collect();
    assert!(
        new.is_empty(),
        "files of a pure layer doing I/O (move it to the layer that runs it):\n  {}",
        new.join("\n  ")
    );
    let moved: Vec<&&str> = STILL_TO_MOVE
        .iter()
        .filter(|f| !doing.contains_key(**f))
        .collect();
    assert!(
        moved.is_empty(),
        "no longer doing I/O, take them off STILL_TO_MOVE: {moved:?}"
    );
}

/// A handle is validated at the top (the facade, and each service's
/// iteration, which may start before the schema is migrated) and handed
/// down as a `Ready`: the runs and operations below take one, so none of
/// them validates, and holding one means validation passed.
/// (`Context::prepared` is private to the context: nothing else can call it.)
#[test]
fn only_the_facade_and_the_services_validate() {
    const TOP: &[&str] = &["cohort/", "sea_orm.rs", "services/", "context/mod.rs"];
    let mut below = Vec::new();
    let mut at_top = 0;
    for (rel, text) in production_files() {
        let compact: String = text.split_whitespace().collect();
        if !compact.contains(".ready().await") {
            continue;
        }
        if TOP.iter().any(|t| rel.starts_with(t)) {
            at_top += 1;
        } else {
            below.push(rel);
        }
    }
    // The checker sees the facade's calls.
    assert!(at_top >= 4, "{at_top}");
    assert!(
        below.is_empty(),
        "validated below the facade and the services (take a `Ready` from the caller): {below:?}"
    );
}

/// The statements that settle a run or change a hold run only in
/// `run/chain.rs`, whose `settle_run`, `place_hold` and `release_hold` link
/// each in the hash chain in the same call: a new path cannot settle a run
/// or change a hold and leave the chain without its link.
#[test]
fn only_the_chain_settles_a_run_or_changes_a_hold() {
    const LINKED: &[&str] = &[
        ".settle_run(",
        ".recover_run(",
        ".insert_not_started(",
        ".insert_hold(",
        ".release_hold(",
    ];
    let mut elsewhere = Vec::new();
    let mut in_chain = Vec::new();
    for (rel, text) in production_files() {
        if rel.starts_with("sql/") || rel.ends_with("_test.rs") {
            continue;
        }
        for statement in LINKED.iter().filter(|s| text.contains(**s)) {
            if rel == "run/chain.rs" {
                in_chain.push(*statement);
            } else {
                elsewhere.push(format!("{rel}: {statement}"));
            }
        }
    }
    // The checker sees them where they are.
    assert_eq!(in_chain, LINKED, "run/chain.rs runs each of them");
    assert!(
        elsewhere.is_empty(),
        "a run settled or a hold changed outside run/chain.rs (use settle_run, place_hold, release_hold, which link it):\n  {}",
        elsewhere.join("\n  ")
    );
}

/// SQL text lives in `sql/` (and `schema/`'s migrations): no string
/// literal elsewhere starts a statement. (`ident.rs` builds text; its
/// tests are left out with every test module.)
#[test]
fn no_sql_text_outside_sql_and_schema() {
    // Statements the library runs. (DDL shown in messages as the fix to
    // apply, `ALTER TABLE …` or `CREATE INDEX …`, is advice, not run.)
    const STARTS: &[&str] = &[
        "\"SELECT ",
        "\"INSERT ",
        "\"UPDATE ",
        "\"DELETE ",
        "\"WITH ",
        "\"SET TRANSACTION",
        "\"SET LOCAL",
        "\"SET SESSION",
        "\"LOCK ",
    ];
    let mut files = Vec::new();
    rust_files(&src_root(), &mut files);
    files.sort();
    let mut found = Vec::new();
    let mut read = 0;
    for file in files {
        let Some(module) = module_of(&file) else {
            continue;
        };
        if module == "sql" || module == "schema" || file.to_string_lossy().ends_with("_test.rs") {
            continue;
        }
        read += 1;
        let text = production_text(&std::fs::read_to_string(&file).expect("read source"));
        for start in STARTS {
            if text.contains(start) {
                let rel = file
                    .strip_prefix(src_root())
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                found.push(format!("{rel}: {}…", start.trim_matches('"')));
            }
        }
    }
    assert!(read > 50, "{read} files read");
    // The scan sees statements where they belong.
    let ledger = production_text(
        &std::fs::read_to_string(src_root().join("sql/ledger.rs")).expect("read sql/ledger.rs"),
    );
    assert!(
        STARTS.iter().filter(|s| ledger.contains(**s)).count() >= 2,
        "the scan finds no statement in sql/ledger.rs"
    );
    assert!(
        found.is_empty(),
        "SQL text outside sql/ and schema/:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn no_statement_of_an_entity_plan_is_bound_outside_sql() {
    // A plan's statements number their parameters in `sql/`; their
    // values are bound there, by typed structs (`sql/sweep/params.rs`),
    // and what they return is read there. Elsewhere, taking a plan
    // statement's text to bind it by hand would count placeholders again.
    // `ops/guarded.rs` hands text to its driver seam (`GuardSession`: sqlx or
    // SeaORM, each binding the same typed keys).
    const BY_HAND: &[&str] = &[".sql())", "bind_array(", "bind_all("];
    let mut files = Vec::new();
    rust_files(&src_root(), &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in &files {
        let Some(module) = module_of(file) else {
            continue;
        };
        let rel = file
            .strip_prefix(src_root())
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if module == "sql" || rel == "ops/guarded.rs" || rel.ends_with("_test.rs") {
            continue;
        }
        let text = production_text(&std::fs::read_to_string(file).expect("read source"));
        for pattern in BY_HAND {
            if text.contains(pattern) {
                found.push(format!("{rel}: {pattern}"));
            }
        }
    }
    // The scan sees them where they belong.
    let params = production_text(
        &std::fs::read_to_string(src_root().join("sql/sweep/params.rs"))
            .expect("read sql/sweep/params.rs"),
    );
    assert!(
        BY_HAND.iter().filter(|p| params.contains(**p)).count() >= 2,
        "the scan finds no plan statement bound in sql/sweep/params.rs"
    );
    assert!(
        found.is_empty(),
        "plan statements bound outside sql/:\n  {}",
        found.join("\n  ")
    );
}

/// docs/architecture.md draws the same picture: its `crates/cohort/src/`
/// block has one section per layer, in this order (a section starts with
/// the layer's first word, or its folder: `sql/`), and each section names
/// every module of its layer (`name.rs` or `name/`).
#[test]
fn the_architecture_page_draws_these_layers() {
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md"),
    )
    .expect("read docs/architecture.md");
    let block = page
        .split("```text\ncrates/cohort/src/\n")
        .nth(1)
        .and_then(|rest| rest.split("\ncrates/").next())
        .expect("the crates/cohort/src/ block");
    // Sections: a line indented two spaces starts one, named by its label.
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in block.lines() {
        if let Some(rest) = line.strip_prefix("  ").filter(|r| !r.starts_with(' ')) {
            let label = rest.split_whitespace().next().unwrap_or("").to_owned();
            sections.push((label.trim_end_matches('/').to_owned(), rest.to_owned()));
        } else if let Some((_, text)) = sections.last_mut() {
            text.push(' ');
            text.push_str(line.trim());
        }
    }
    let labels: Vec<&str> = sections.iter().map(|(l, _)| l.as_str()).collect();
    let wanted: Vec<&str> = LAYERS
        .iter()
        .map(|(name, _)| {
            name.split_whitespace()
                .next()
                .unwrap_or("")
                .trim_end_matches('/')
        })
        .collect();
    assert_eq!(labels, wanted, "the page's sections, bottom up");
    let mut missing = Vec::new();
    for ((_, modules), (label, text)) in LAYERS.iter().zip(&sections) {
        for m in *modules {
            let m = m.rsplit('/').next().unwrap_or(m);
            let named = text.contains(&format!("{m}.rs")) || text.contains(&format!("{m}/"));
            if !named {
                missing.push(format!("{label}: {m}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "modules docs/architecture.md does not name in their layer: {missing:?}"
    );
}

/// Rows are decoded where their statements are written: `sql/`. Elsewhere
/// a column read by name (`try_get("…")`, `.get("…")`) is a second place
/// that must agree with the statement's text, and nothing makes it. One
/// read stays outside, for a reason the layers impose: a per-row
/// anonymiser reads its own column in the Rust type of the user's closure,
/// which only the domain's typed wrapper knows, and the domain sits below
/// `sql/` (issue 56: typed rows; 340 reads in 26 files when it began).
const ROWS_DECODED_OUTSIDE_SQL: &[(&str, usize)] = &[("domain/model/anonymise.rs", 1)];

#[test]
fn rows_are_decoded_in_sql_and_what_remains_elsewhere_only_shrinks() {
    let mut files = Vec::new();
    rust_files(&src_root(), &mut files);
    files.sort();
    let mut found: Vec<(String, usize)> = Vec::new();
    for file in &files {
        let rel = file
            .strip_prefix(src_root())
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if rel.starts_with("sql/") {
            continue;
        }
        let text = production_text(&std::fs::read_to_string(file).expect("read source"));
        let n = text.matches("try_get").count()
            + text.matches(".get(\"").count()
            + text.matches(".get::<").count();
        if n > 0 {
            found.push((rel, n));
        }
    }
    // The scan sees decoding where it is: sql/ reads rows by name.
    let in_sql = production_text(
        &std::fs::read_to_string(src_root().join("sql/statement.rs"))
            .expect("read sql/statement.rs"),
    );
    assert!(
        in_sql.contains("try_get"),
        "the scan does not see the decoding in sql/statement.rs"
    );
    let allowed: std::collections::BTreeMap<&str, usize> =
        ROWS_DECODED_OUTSIDE_SQL.iter().copied().collect();
    let mut wrong = Vec::new();
    for (file, n) in &found {
        match allowed.get(file.as_str()) {
            Some(max) if n == max => {}
            Some(max) if n < max => wrong.push(format!("{file}: {n}, lower its count from {max}")),
            Some(max) => wrong.push(format!("{file}: {n} columns read by name, more than {max}")),
            None => wrong.push(format!("{file}: {n} columns read by name, none allowed")),
        }
    }
    for (file, max) in ROWS_DECODED_OUTSIDE_SQL {
        if !found.iter().any(|(f, _)| f == file) {
            wrong.push(format!(
                "{file}: decodes no row now, remove it from the list (was {max})"
            ));
        }
    }
    let current: Vec<String> = found
        .iter()
        .map(|(f, n)| format!("    (\"{f}\", {n}),"))
        .collect();
    assert!(
        wrong.is_empty(),
        "rows decoded outside sql/:\n  {}\nthe list as it stands:\n{}",
        wrong.join("\n  "),
        current.join("\n")
    );
}
