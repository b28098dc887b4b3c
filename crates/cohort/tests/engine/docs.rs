//! The guide (`docs/*.md`) and the README cannot drift from the code:
//! every policy-file block loads through the policy-file loader, the
//! policy reference table lists exactly the keys the loader accepts, every
//! page is compiled as doctests, every block is marked with a language a
//! test checks, the cargo commands name packages and binaries that exist,
//! and the grants block runs. (The CLI's blocks and reference table are
//! checked by `cohort-cli`'s own `docs` tests, which see its clap model.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use cohort::policy::PolicyFile;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The README and every page of `docs/`, as (path relative to the root, text).
fn documents() -> Vec<(String, String)> {
    let mut out = vec![(
        "README.md".to_owned(),
        std::fs::read_to_string(root().join("README.md")).unwrap(),
    )];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    for p in pages {
        let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
        out.push((name, std::fs::read_to_string(&p).unwrap()));
    }
    out
}

/// One fenced code block: its info string, first line number and text.
struct Block {
    info: String,
    line: usize,
    text: String,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    info: info.trim().to_owned(),
                    line: i + 1,
                    text: String::new(),
                })
            }
            (Some(_), Some(rest)) if rest.trim().is_empty() => out.push(open.take().unwrap()),
            (Some(b), _) => {
                b.text.push_str(line);
                b.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    out
}

/// The info strings a test checks (see docs/README.md), and `text`.
const CHECKED: &[&str] = &[
    "rust",
    "rust,no_run",
    "toml",
    "toml,fragment",
    "toml,cargo",
    "sh",
    "bash",
    "console",
    "console,runnable",
    "ini",
    "dockerfile",
    "sql",
    "sql,sketch",
    "text",
    "text,synopsis",
];

#[test]
fn every_code_block_is_marked_with_a_language_a_test_checks() {
    let mut problems = Vec::new();
    let mut count = 0;
    for (doc, text) in documents() {
        for b in blocks(&text) {
            count += 1;
            if !CHECKED.contains(&b.info.as_str()) {
                problems.push(format!("{doc}:{}: ```{}", b.line, b.info));
            }
        }
    }
    assert!(count >= 40, "only {count} blocks found");
    assert!(
        problems.is_empty(),
        "code blocks whose info string no test checks (use one of {CHECKED:?}):\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_guide_page_is_compiled_as_doctests() {
    let lib = std::fs::read_to_string(root().join("crates/cohort/src/lib.rs")).unwrap();
    assert!(lib.contains("#![doc = include_str!(\"../../../README.md\")]"));
    let missing: Vec<String> = documents()
        .into_iter()
        .map(|(doc, _)| doc)
        .filter(|doc| doc.starts_with("docs/"))
        .filter(|doc| !lib.contains(&format!("include_str!(\"../../../{doc}\")")))
        .collect();
    assert!(
        missing.is_empty(),
        "pages not in `mod guide` of crates/cohort/src/lib.rs: {missing:?}"
    );
}

/// What a fragment is wrapped in: an entity (for `[[entity.handler]]`)
/// and a category (for `[[category.override]]` / `[[category.stage]]`),
/// whichever the fragment's first table needs last.
const GUIDE_ENTITY: &str = "[[entity]]\nname = \"GuideEntity\"\n\
    id = \"0d0c0000-0000-4000-8000-000000000001\"\ntable = \"app.guide_entity\"\n\
    category = \"guide-category\"\nanchor = \"created_at\"\n\n";
const GUIDE_CATEGORY: &str =
    "[[category]]\nname = \"guide-category\"\nstrategy = \"purge\"\nperiod = \"30d\"\n\n";

/// A fragment in a minimal policy file: its top-level keys first, then the
/// prelude, then its tables.
fn wrap(fragment: &str) -> String {
    let at = fragment
        .lines()
        .position(|l| l.trim_start().starts_with('['))
        .unwrap_or(fragment.lines().count());
    let lines: Vec<&str> = fragment.lines().collect();
    let (top, tables) = (lines[..at].join("\n"), lines[at..].join("\n"));
    let prelude = if tables.starts_with("[[entity.") {
        format!("{GUIDE_CATEGORY}{GUIDE_ENTITY}")
    } else {
        format!("{GUIDE_ENTITY}{GUIDE_CATEGORY}")
    };
    format!("{top}\n\n{prelude}{tables}\n")
}

/// Problems that depend on the machine, not on the block: a handler's
/// example program that is not installed here, a webhook secret variable
/// that is not set.
fn machine_dependent(problem: &str) -> bool {
    (problem.contains("/usr/local/bin/") && problem.contains("cannot be used"))
        || (problem.contains("secret_env names") && problem.contains("which is not set"))
}

#[test]
fn every_policy_block_in_the_guide_loads() {
    let mut problems = Vec::new();
    let mut loaded = 0;
    for (doc, text) in documents() {
        for b in blocks(&text) {
            let file = match b.info.as_str() {
                "toml" => b.text.clone(),
                "toml,fragment" => wrap(&b.text),
                "toml,cargo" => {
                    let value: toml::Value = match toml::from_str(&b.text) {
                        Ok(v) => v,
                        Err(e) => {
                            problems.push(format!("{doc}:{}: not TOML: {e}", b.line));
                            continue;
                        }
                    };
                    if value
                        .get("dependencies")
                        .and_then(|d| d.get("cohort"))
                        .is_none()
                    {
                        problems.push(format!(
                            "{doc}:{}: a Cargo excerpt without the cohort dependency",
                            b.line
                        ));
                    }
                    continue;
                }
                _ => continue,
            };
            loaded += 1;
            if let Err(e) = PolicyFile::parse(&file) {
                let real: Vec<String> = match &e {
                    cohort::Error::Policy(ps) => {
                        ps.0.iter()
                            .map(|p| p.message.clone())
                            .filter(|m| !machine_dependent(m))
                            .collect()
                    }
                    other => vec![other.to_string()],
                };
                if !real.is_empty() {
                    problems.push(format!(
                        "{doc}:{} (```{}): {}\n--- as loaded:\n{file}",
                        b.line,
                        b.info,
                        real.join("; ")
                    ));
                }
            }
        }
    }
    assert!(loaded >= 10, "only {loaded} policy blocks found");
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[test]
fn a_broken_policy_block_would_be_caught() {
    // The check above is not vacuous: a misspelt key or a bad period fails.
    assert!(PolicyFile::parse(&wrap("[[category.override]]\nperiodd = \"1d\"\n")).is_err());
    assert!(PolicyFile::parse(
        "[[category]]\nname = \"x\"\nstrategy = \"purge\"\nperiod = \"30 days\"\n"
    )
    .is_err());
    assert!(PolicyFile::parse(&wrap("tenants_query = \"SELECT 1\"\n")).is_ok());
    assert!(machine_dependent(
        "entity #1 (X): handler \"h\": /usr/local/bin/crm-forget cannot be used: entity not found"
    ));
}

/// The keys the loader accepts in one table of the file, read from its
/// own refusal of an unknown key (`expected one of ...`).
fn loader_keys(section: &str) -> BTreeSet<String> {
    let text = match section {
        "(top level)" => "zz_not_a_key = 1\n".to_owned(),
        "[[entity.handler]]" => {
            "[[entity]]\nname = \"A\"\nid = \"x\"\n[[entity.handler]]\nzz_not_a_key = 1\n"
                .to_owned()
        }
        "[[category.override]]" | "[[category.stage]]" => {
            format!("[[category]]\nname = \"a\"\n{section}\nzz_not_a_key = 1\n")
        }
        other => format!("{other}\nzz_not_a_key = 1\n"),
    };
    let err = PolicyFile::parse(&text).expect_err("an unknown key is refused");
    let message = err.to_string();
    let expected = message
        .split_once("expected")
        .unwrap_or_else(|| panic!("{section}: no list of keys in {message:?}"))
        .1;
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// `docs/policy-file.md`'s reference table, as table → keys.
fn documented_keys() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(root().join("docs/policy-file.md")).unwrap();
    let table = text
        .split_once("## Reference: every key")
        .expect("the reference section")
        .1;
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in table.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = line.split(" | ").map(str::trim).collect();
        let section = cells[0].trim_start_matches("| ").trim_matches('`');
        let key = cells[1].trim_matches('`');
        if section == "table" || section.starts_with("---") {
            continue;
        }
        out.entry(section.to_owned())
            .or_default()
            .insert(key.to_owned());
    }
    out
}

#[test]
fn the_policy_key_table_matches_the_loader() {
    let documented = documented_keys();
    let sections = [
        "(top level)",
        "[database]",
        "[cohort]",
        "[cohort.conventions]",
        "[cohort.dispatch]",
        "[cohort.prune]",
        "[[entity]]",
        "[[entity.handler]]",
        "[[category]]",
        "[[category.override]]",
        "[[category.stage]]",
        "[[tenant]]",
        "[evidence]",
        "[journal]",
    ];
    let mut problems = Vec::new();
    for section in sections {
        let mut accepted = loader_keys(section);
        // Tables of their own, each with its own rows.
        for sub in [
            "entity", "category", "tenant", "database", "cohort", "evidence", "journal",
        ] {
            if section == "(top level)" {
                accepted.remove(sub);
            }
        }
        match section {
            "[cohort]" => {
                for sub in ["conventions", "dispatch", "prune"] {
                    assert!(accepted.remove(sub), "[cohort] has no {sub}");
                }
            }
            "[[entity]]" => assert!(accepted.remove("handler")),
            "[[category]]" => {
                assert!(accepted.remove("override"));
                assert!(accepted.remove("stage"));
            }
            _ => {}
        }
        let listed = documented.get(section).cloned().unwrap_or_default();
        for k in accepted.difference(&listed) {
            problems.push(format!(
                "{section} `{k}`: accepted by the loader, missing from the table"
            ));
        }
        for k in listed.difference(&accepted) {
            problems.push(format!(
                "{section} `{k}`: in the table, refused by the loader"
            ));
        }
    }
    for section in documented.keys() {
        if !sections.contains(&section.as_str()) {
            problems.push(format!("the table lists an unknown table {section}"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/policy-file.md's reference table:\n{}",
        problems.join("\n")
    );
}

/// `[package] name` and binary names of every workspace crate.
fn workspace_binaries() -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for dir in ["crates", "examples"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let crate_dir = entry.unwrap().path();
            let Ok(manifest) = std::fs::read_to_string(crate_dir.join("Cargo.toml")) else {
                continue;
            };
            let value: toml::Value = toml::from_str(&manifest).unwrap();
            let name = value["package"]["name"].as_str().unwrap().to_owned();
            let mut bins: BTreeSet<String> = value
                .get("bin")
                .and_then(|b| b.as_array())
                .into_iter()
                .flatten()
                .filter_map(|b| b.get("name").and_then(|n| n.as_str()).map(str::to_owned))
                .collect();
            if crate_dir.join("src/main.rs").exists() {
                bins.insert(name.clone());
            }
            if let Ok(dir) = std::fs::read_dir(crate_dir.join("src/bin")) {
                for f in dir {
                    let p = f.unwrap().path();
                    bins.insert(p.file_stem().unwrap().to_string_lossy().into_owned());
                }
            }
            out.insert(name, bins);
        }
    }
    out
}

#[test]
fn every_cargo_command_names_a_package_and_binary_that_exist() {
    let crates = workspace_binaries();
    let mut problems = Vec::new();
    let mut seen = 0;
    for (doc, text) in documents() {
        for b in blocks(&text) {
            if !matches!(
                b.info.as_str(),
                "sh" | "bash" | "console" | "console,runnable"
            ) {
                continue;
            }
            for line in b.text.lines() {
                let line = line.trim_start_matches("$ ").trim();
                let words: Vec<&str> = line.split_whitespace().collect();
                if words.first() != Some(&"cargo") {
                    continue;
                }
                // Only the words before `--` belong to cargo.
                let cargo: Vec<&str> = words.iter().take_while(|w| **w != "--").copied().collect();
                let after = |flag: &str| -> Vec<&str> {
                    cargo
                        .windows(2)
                        .filter(|w| w[0] == flag)
                        .map(|w| w[1])
                        .collect()
                };
                let packages = after("-p");
                for p in &packages {
                    seen += 1;
                    if !crates.contains_key(*p) {
                        problems.push(format!("{doc}:{}: no package {p}: {line}", b.line));
                    }
                }
                for bin in after("--bin") {
                    let ok = packages
                        .iter()
                        .any(|p| crates.get(*p).is_some_and(|bins| bins.contains(bin)));
                    if !ok {
                        problems.push(format!("{doc}:{}: no binary {bin}: {line}", b.line));
                    }
                }
                if cargo.contains(&"install") {
                    for path in after("--path") {
                        seen += 1;
                        if !root().join(path).join("Cargo.toml").exists() {
                            problems.push(format!("{doc}:{}: no crate at {path}", b.line));
                        }
                    }
                }
            }
        }
    }
    assert!(seen >= 10, "only {seen} cargo commands found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The README keeps what CI and the compliance manifest rely on.
#[test]
fn the_readme_keeps_the_commands_ci_runs_and_stays_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for line in [
        "cargo install --locked --path crates/cohort-cli",
        "cargo run -p cohort-cli -- demo",
        "cargo run -q -p cohort-pgtemp -- exec -- cargo test --workspace --locked --no-fail-fast",
        "cohort init",
        "cohort migrate",
        "cohort validate",
    ] {
        assert!(
            readme.lines().any(|l| l.trim() == line),
            "the README lost {line:?}"
        );
    }
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(ci.contains(
        "cargo run -q --locked -p cohort-pgtemp -- exec -- cargo test --workspace --locked --no-fail-fast"
    ));
    let lines = readme.lines().count();
    assert!(lines <= 300, "the README has {lines} lines (at most 300)");
    // Every relative link of the README and the guide leads to a file.
    let mut broken = Vec::new();
    for (doc, text) in documents() {
        let base = root().join(&doc);
        let dir = base.parent().unwrap();
        for link in text.split("](").skip(1) {
            let target = link.split(')').next().unwrap_or("");
            let path = target.split('#').next().unwrap_or("");
            if path.is_empty() || path.contains("://") || path.contains(' ') {
                continue;
            }
            if !dir.join(path).exists()
                && !["metrics.md", "report.md"]
                    .iter()
                    .any(|p| path.ends_with(p))
            {
                broken.push(format!("{doc}: {target}"));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing: {broken:?}");
}

/// A database laid out as the guide describes: Cohort's tables in schema
/// `cohort`, the example tables, and the roles the grants name (roles are
/// the cluster's, so each is created only when missing).
async fn guide_database() -> cohort_pgtemp::TestDatabase {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    cohort::schema::migrate(&mut conn, "cohort").await.unwrap();
    sqlx::raw_sql(
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app_role') THEN CREATE ROLE app_role; END IF;
             IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'events_owner') THEN CREATE ROLE events_owner; END IF;
         END $$;
         CREATE SCHEMA app; CREATE SCHEMA vault;
         CREATE TABLE app.session_notes (id uuid PRIMARY KEY);
         CREATE TABLE app.case_contacts (id uuid PRIMARY KEY);
         CREATE TABLE app.activity (what text);
         CREATE TABLE vault.session_notes_archive (id uuid PRIMARY KEY);",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    db
}

/// The minimal grants of docs/migrations.md run as written on a database
/// laid out as the page describes.
#[tokio::test]
async fn the_grants_block_runs_on_a_fresh_database() {
    let text = std::fs::read_to_string(root().join("docs/migrations.md")).unwrap();
    let grants: Vec<Block> = blocks(&text)
        .into_iter()
        .filter(|b| b.info == "sql")
        .collect();
    assert_eq!(grants.len(), 1, "one sql block: the grants");
    let db = guide_database().await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(grants[0].text.clone()))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("the grants block fails: {e}\n{}", grants[0].text));
    let can: bool = sqlx::query_scalar(
        "SELECT has_table_privilege('app_role', 'cohort.sweep_run', 'INSERT') \
           AND has_table_privilege('app_role', 'app.session_notes', 'UPDATE') \
           AND has_table_privilege('app_role', 'vault.session_notes_archive', 'INSERT') \
           AND has_function_privilege('app_role', \
                   'cohort.retention_hold_recent(uuid, pg_snapshot, bigint)', 'EXECUTE') \
           AND has_function_privilege('app_role', \
                   'cohort.retention_archive_check(bigint, bigint, bigint)', 'EXECUTE')",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert!(can);
}

/// `docs/policy-file.md`'s settings table: every `[cohort]`,
/// `[cohort.dispatch]` and `[cohort.prune]` key the loader accepts, each
/// with the environment variable `apply_env` reads for it (or none).
#[test]
fn the_settings_table_matches_the_configuration() {
    let text = std::fs::read_to_string(root().join("docs/policy-file.md")).unwrap();
    let section = text
        .split_once("## Settings: `[cohort]`")
        .expect("the settings section")
        .1
        .split("\n## ")
        .next()
        .unwrap();
    let mut documented: BTreeMap<String, Option<String>> = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').skip(1).map(str::trim).collect();
        let key = cells[0].trim_matches('`').to_owned();
        let env = cells[3].trim_matches('`');
        documented.insert(key, (!env.is_empty()).then(|| env.to_owned()));
    }
    let mut accepted = BTreeSet::new();
    for (section, prefix) in [
        ("[cohort]", ""),
        ("[cohort.dispatch]", "dispatch."),
        ("[cohort.prune]", "prune."),
    ] {
        for k in loader_keys(section) {
            if !matches!(k.as_str(), "conventions" | "dispatch" | "prune") || !prefix.is_empty() {
                accepted.insert(format!("{prefix}{k}"));
            }
        }
    }
    let listed: BTreeSet<String> = documented.keys().cloned().collect();
    let mut problems = Vec::new();
    for k in accepted.difference(&listed) {
        problems.push(format!("`{k}` is accepted but not in the settings table"));
    }
    for k in listed.difference(&accepted) {
        problems.push(format!("`{k}` is in the settings table but refused"));
    }
    for (key, env) in &documented {
        let expected = format!("COHORT_{}", key.to_uppercase().replace('.', "__"));
        let unknown = |var: &str| {
            let mut config = cohort::CohortConfig::default();
            config
                .apply_env([(var.to_owned(), "x".to_owned())])
                .err()
                .is_some_and(|e| e.to_string().contains("unknown setting"))
        };
        match env {
            Some(var) if *var != expected => {
                problems.push(format!("`{key}`: {var}, expected {expected}"))
            }
            Some(var) if unknown(var) => problems.push(format!("`{key}`: {var} is not read")),
            None if !unknown(&expected) => {
                problems.push(format!("`{key}`: {expected} is read but not in the table"))
            }
            _ => {}
        }
    }
    assert!(documented.len() > 20, "{documented:?}");
    assert!(
        problems.is_empty(),
        "docs/policy-file.md's settings table:\n{}",
        problems.join("\n")
    );
}

/// The guide's index links every page (and the pages written beside this
/// one, metrics and report).
#[test]
fn every_page_is_in_the_guide_index() {
    let index = std::fs::read_to_string(root().join("docs/README.md")).unwrap();
    let mut missing: Vec<String> = documents()
        .into_iter()
        .filter_map(|(doc, _)| doc.strip_prefix("docs/").map(str::to_owned))
        .filter(|page| page != "README.md" && !index.contains(&format!("]({page})")))
        .collect();
    for page in ["metrics.md", "report.md"] {
        if !index.contains(&format!("]({page})")) {
            missing.push(page.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/README.md does not link {missing:?}"
    );
}

/// A tool of a Debian package `.ci/run` installs: a missing one fails
/// the test, never skips it.
fn tool(name: &str, package: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!("{name} is not installed: apt-get install --no-install-recommends {package} (.ci/run does)")
        })
}

/// Runs `systemd-analyze verify` on a unit (written under `name` in a
/// scratch directory) and returns what it printed; empty means systemd
/// reads every line as written. (Its exit code stays 0 for a value it
/// ignores, such as `TimeoutStopSec=45 # note`: what it prints is the
/// verdict.) The unit's `/usr/local/bin/cohort` is pointed at an
/// executable that exists here, since `verify` checks `ExecStart=`'s
/// path; nothing else is changed.
fn systemd_verify(name: &str, unit: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let path = dir.path().join(name);
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/cohort", &exe.display().to_string()),
    )
    .unwrap();
    let out = std::process::Command::new(tool("systemd-analyze", "systemd"))
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    format!(
        "{}{}{}",
        if out.status.success() {
            ""
        } else {
            "(failed) "
        },
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `ini` blocks of the guide (systemd units) and the example units
/// pass `systemd-analyze verify` without a word: systemd takes no comment
/// at the end of a line (`TimeoutStopSec=45 # note` is the value `45 #
/// note`: "Failed to parse time value"), which the first check shows it
/// reports. A unit block names its file in a first comment line
/// (`# /etc/systemd/system/cohort-worker.service`).
#[test]
fn every_systemd_unit_in_the_docs_passes_systemd_analyze_verify() {
    let broken = systemd_verify(
        "broken.service",
        "[Service]\nExecStart=/usr/local/bin/cohort worker\nTimeoutStopSec=45 # note\n",
    );
    assert!(broken.contains("Failed to parse"), "{broken}");

    let mut units: Vec<(String, String, String)> = Vec::new();
    for (doc, text) in documents() {
        for b in blocks(&text).into_iter().filter(|b| b.info == "ini") {
            let name = b
                .text
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("# /etc/systemd/system/"))
                .unwrap_or_else(|| panic!("{doc}:{}: a unit block names its file first", b.line))
                .trim()
                .to_owned();
            units.push((format!("{doc}:{}", b.line), name, b.text));
        }
    }
    for entry in std::fs::read_dir(root().join("examples/policy-only")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "service") {
            units.push((
                path.display().to_string(),
                path.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
    assert!(units.len() >= 3, "{} units", units.len());
    let problems: Vec<String> = units
        .iter()
        .filter_map(|(at, name, text)| {
            let said = systemd_verify(name, text);
            (!said.trim().is_empty()).then(|| format!("{at}: {said}"))
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Whether a `sql,sketch` block says why psql cannot run it: a statement
/// shape with bound parameters (`$1`) or Cohort's placeholders
/// (`<hold>`), or a query of Citus's own catalog.
fn sketch_reason(sql: &str) -> bool {
    sql.contains("$1") || sql.contains('<') || sql.contains("citus") || sql.contains("pg_dist")
}

/// Every `sql` block of the guide runs under `psql -v ON_ERROR_STOP=1`,
/// as written, on a database laid out as the guide describes (Cohort's
/// tables in schema `cohort`, the example tables, the roles the grants
/// name); blocks marked `sql,sketch` are statement shapes psql cannot run
/// as they stand, and each must show why. The first check shows psql
/// stops at a broken statement.
#[tokio::test]
async fn every_sql_block_in_the_docs_runs_under_psql() {
    let db = guide_database().await;
    let psql = |sql: &str| {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("block.sql");
        std::fs::write(&file, sql).unwrap();
        // Roles are the cluster's, shared with tests running at the same
        // time: a NOTICE such as "role is already a member" is not a
        // finding; warnings and errors are.
        let out = std::process::Command::new(tool("psql", "postgresql-client"))
            .env("PGOPTIONS", "-c client_min_messages=warning")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db.url(), "-f"])
            .arg(&file)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, said) = psql("SELECT 1;\nSELEC 2;\n");
    assert!(!ok && said.contains("syntax error"), "{said}");

    let mut ran = 0;
    let mut problems = Vec::new();
    for (doc, text) in documents() {
        for b in blocks(&text) {
            match b.info.as_str() {
                "sql" => {
                    ran += 1;
                    let (ok, said) = psql(&b.text);
                    if !ok || !said.trim().is_empty() {
                        problems.push(format!("{doc}:{}: {said}", b.line));
                    }
                }
                "sql,sketch" if !sketch_reason(&b.text) => problems.push(format!(
                    "{doc}:{}: a sketch psql could run: mark it `sql`",
                    b.line
                )),
                _ => {}
            }
        }
    }
    assert!(ran >= 2, "only {ran} sql blocks ran");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The files whose messages `docs/validation.md` lists under `## Messages`:
/// every file of the validation module, and declaration resolution.
fn validation_sources() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("crates/cohort/src/validate"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    files.push(root().join("crates/cohort/src/domain/model/descriptor.rs"));
    files
}

/// `source` without its top-level `#[cfg(test)]` items: a block item runs
/// to the next line that is a lone `}` (where rustfmt closes a top-level
/// block), any other item is the one line after the attribute. Code after
/// a test module (`checks.rs` has some) is kept.
fn without_tests(source: &str) -> String {
    let mut out = String::new();
    let mut lines = source.lines();
    while let Some(line) = lines.next() {
        if line.trim_end() == "#[cfg(test)]" {
            if lines
                .next()
                .is_some_and(|item| item.trim_end().ends_with('{'))
            {
                for inner in lines.by_ref() {
                    if inner == "}" {
                        break;
                    }
                }
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// A string literal of Rust source: its value, and the code just before
/// it (to tell a panic's or `expect`'s text from a message).
struct Literal {
    value: String,
    before: String,
}

/// The string literals of Rust `source`, comments skipped: escapes decoded
/// (`\"`, `\\`, `\n`, `\u{…}`), a `\` at the end of a line dropped with
/// the next line's leading whitespace (as Rust does), raw strings
/// (`r#"…"#`) as written, and the pieces of a `concat!` joined into one.
fn string_literals(source: &str) -> Vec<Literal> {
    let c: Vec<char> = source.chars().collect();
    let n = c.len();
    let ident_before = |k: usize| k > 0 && (c[k - 1].is_alphanumeric() || c[k - 1] == '_');
    let before = |k: usize| {
        let mut end = k;
        while end > 0 && c[end - 1].is_whitespace() {
            end -= 1;
        }
        c[end.saturating_sub(24)..end].iter().collect::<String>()
    };
    let mut out: Vec<Literal> = Vec::new();
    // An open `concat!(`: where it starts, its parenthesis depth, its text.
    let mut concat: Option<(usize, usize, String)> = None;
    let at = |i: usize, s: &str| {
        s.chars()
            .enumerate()
            .all(|(k, ch)| c.get(i + k) == Some(&ch))
    };
    let mut i = 0;
    while i < n {
        let (start, value) = if at(i, "//") {
            while i < n && c[i] != '\n' {
                i += 1;
            }
            continue;
        } else if at(i, "/*") {
            i += 2;
            while i < n && !at(i, "*/") {
                i += 1;
            }
            i += 2;
            continue;
        } else if c[i] == '\'' {
            // A char literal ('"', '\'', '\u{7f}') or a lifetime.
            if c.get(i + 1) == Some(&'\\') {
                i += 3;
                while i < n && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
            continue;
        } else if at(i, "concat!") && !ident_before(i) {
            let mut k = i + "concat!".len();
            while k < n && c[k].is_whitespace() {
                k += 1;
            }
            if c.get(k) == Some(&'(') {
                concat = Some((i, 1, String::new()));
                i = k + 1;
            } else {
                i = k;
            }
            continue;
        } else if c[i] == 'r'
            && (!ident_before(i) || (c[i - 1] == 'b' && !ident_before(i - 1)))
            && matches!(c.get(i + 1), Some('"' | '#'))
        {
            let hashes = c[i + 1..].iter().take_while(|&&ch| ch == '#').count();
            if c.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let start = i;
            let body = i + 2 + hashes;
            let mut j = body;
            while j < n && !(c[j] == '"' && (1..=hashes).all(|h| c.get(j + h) == Some(&'#'))) {
                j += 1;
            }
            i = j + 1 + hashes;
            (start, c[body..j.min(n)].iter().collect::<String>())
        } else if c[i] == '"' {
            let start = i;
            let mut text = String::new();
            let mut j = i + 1;
            while j < n && c[j] != '"' {
                if c[j] != '\\' {
                    text.push(c[j]);
                    j += 1;
                    continue;
                }
                let escaped = c.get(j + 1).copied().unwrap_or('\\');
                j += 2;
                match escaped {
                    '\n' | '\r' => {
                        while j < n && c[j].is_whitespace() {
                            j += 1;
                        }
                    }
                    'n' => text.push('\n'),
                    't' => text.push('\t'),
                    'r' => text.push('\r'),
                    '0' => text.push('\0'),
                    'x' => {
                        let hex: String = c[j..(j + 2).min(n)].iter().collect();
                        text.extend(u8::from_str_radix(&hex, 16).ok().map(char::from));
                        j += 2;
                    }
                    'u' => {
                        let close = (j..n).find(|&k| c[k] == '}').unwrap_or(n);
                        let hex: String = c[(j + 1).min(close)..close].iter().collect();
                        text.extend(u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32));
                        j = close + 1;
                    }
                    other => text.push(other),
                }
            }
            i = j + 1;
            (start, text)
        } else {
            if let Some((start, depth, text)) = &mut concat {
                match c[i] {
                    '(' => *depth += 1,
                    ')' => *depth -= 1,
                    _ => {}
                }
                if *depth == 0 {
                    out.push(Literal {
                        value: std::mem::take(text),
                        before: before(*start),
                    });
                    concat = None;
                }
            }
            i += 1;
            continue;
        };
        match &mut concat {
            Some((_, _, text)) => text.push_str(&value),
            None => out.push(Literal {
                value,
                before: before(start),
            }),
        }
    }
    out
}

/// Runs of whitespace as one space, trimmed.
fn normalise_space(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A format string as the docs write it: every placeholder (`{}`, `{:?}`,
/// `{name}`, `{name:?}`) as `…`, and `{{` / `}}` as the brace they print.
fn with_ellipses(format: &str) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                for inner in chars.by_ref() {
                    if inner == '}' {
                        break;
                    }
                }
                out.push('…');
            }
            other => out.push(other),
        }
    }
    out
}

/// Literals of the validation sources that are text, not messages.
const NOT_MESSAGES: &[&str] = &[
    // What the hold stamp check looks for in the trigger function's
    // source (the restore statement in its message spells it out too).
    "NEW.written_xid := pg_catalog.pg_current_xact_id();",
];

/// Every message validation can give, with `…` for its placeholders and
/// whitespace normalised: the string literals of [`validation_sources`]
/// (tests left out) that read as text shown to a user. SQL text, a
/// panic's or `expect`'s text and short words (type names, keys) are not.
fn validation_messages() -> BTreeSet<String> {
    const SQL: &[&str] = &[
        "SELECT", "WITH", "INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "GRANT", "COMMENT",
        "DROP", "DO ",
    ];
    const PANICS: &[&str] = &[
        "expect(",
        "unreachable!(",
        "panic!(",
        "todo!(",
        "unimplemented!(",
        "assert!(",
    ];
    let mut messages = BTreeSet::new();
    for file in validation_sources() {
        let source = std::fs::read_to_string(&file).unwrap();
        for literal in string_literals(&without_tests(&source)) {
            let text = literal.value.trim();
            if text.chars().count() < 25
                || !text.contains(' ')
                || SQL.iter().any(|k| text.starts_with(k))
                || PANICS.iter().any(|p| literal.before.ends_with(p))
                || NOT_MESSAGES.contains(&text)
            {
                continue;
            }
            messages.insert(normalise_space(&with_ellipses(text)));
        }
    }
    messages
}

/// The `## Messages` section of `docs/validation.md`, to the next `## `.
fn messages_section(page: &str) -> &str {
    let start = page
        .find("\n## Messages\n")
        .expect("docs/validation.md has a `## Messages` section");
    let rest = &page[start + 1..];
    match rest[1..].find("\n## ") {
        Some(end) => &rest[..end + 1],
        None => rest,
    }
}

/// The section's top-level bullets (`- ` at the start of a line, with
/// their indented continuation lines), whitespace normalised.
fn bullets(section: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut open: Option<String> = None;
    for line in section.lines() {
        if let Some(first) = line.strip_prefix("- ") {
            out.extend(open.replace(first.to_owned()));
        } else if line.starts_with(' ') && !line.trim().is_empty() {
            if let Some(b) = &mut open {
                b.push(' ');
                b.push_str(line);
            }
        } else {
            out.extend(open.take());
        }
    }
    out.extend(open);
    out.iter().map(|b| normalise_space(b)).collect()
}

/// The code span a bullet starts with (`` `text` `` or ``` `` text `` ```,
/// for text with a backtick), trimmed; `None` when it starts otherwise.
fn leading_code_span(bullet: &str) -> Option<String> {
    let ticks = bullet.chars().take_while(|&ch| ch == '`').count();
    if ticks == 0 {
        return None;
    }
    let fence = "`".repeat(ticks);
    let body = &bullet[ticks..];
    let mut from = 0;
    while let Some(at) = body[from..].find(&fence) {
        let at = from + at;
        let run = body[at..].chars().take_while(|&ch| ch == '`').count();
        if run == ticks {
            return Some(body[..at].trim().to_owned());
        }
        from = at + run;
    }
    None
}

#[test]
fn every_validation_message_is_listed_in_docs_validation_md() {
    let messages = validation_messages();
    assert!(
        messages.len() >= 100,
        "only {} validation messages found: the extractor is broken",
        messages.len()
    );
    let page = std::fs::read_to_string(root().join("docs/validation.md")).unwrap();
    let section = messages_section(&page);
    let listed = normalise_space(section);
    let missing: Vec<&str> = messages
        .iter()
        .map(String::as_str)
        .filter(|m| !listed.contains(m))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/validation.md `## Messages` does not list {} message(s) validation gives \
         (each placeholder written `…`; add each to its group, or to NOT_MESSAGES if it is \
         no message):\n{}",
        missing.len(),
        missing.join("\n")
    );
    // The other way: each bullet starts with a message the code still gives.
    let stale: Vec<String> = bullets(section)
        .into_iter()
        .filter(|b| leading_code_span(b).is_none_or(|m| !messages.contains(&m)))
        .collect();
    assert!(
        stale.is_empty(),
        "bullets of docs/validation.md `## Messages` that do not start with a message \
         validation gives (in backticks, placeholders as `…`):\n{}",
        stale.join("\n")
    );
}
