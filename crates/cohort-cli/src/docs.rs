//! The guide's account of the command cannot drift from its definition:
//! the reference table of `docs/cli.md` lists exactly the commands, flags
//! and arguments clap knows, the synopsis names only flags that exist, and
//! every `cohort …` invocation in the README's and the guide's shell,
//! console, systemd and container blocks parses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};

use crate::Cli;

/// Commands documented on a page of their own rather than in the table.
const ELSEWHERE: &[(&str, &str)] = &[("report", "docs/report.md")];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn documents() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_owned()];
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.sort();
    names.extend(pages);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(root().join(&n)).unwrap();
            (n, text)
        })
        .collect()
}

/// Fenced blocks as (info string, first line, text).
fn blocks(markdown: &str) -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), i + 1, String::new())),
            (Some(_), Some(rest)) if rest.trim().is_empty() => out.push(open.take().unwrap()),
            (Some((_, _, text)), _) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// Shell words of one command line, up to the first pipe, redirection,
/// `&&`, `;` or comment; leading `NAME=value` assignments dropped.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == c {
                        break;
                    }
                    word.push(q);
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '|' | ';' | '&' | '>' | '<' if !in_word || word.chars().all(|d| d.is_ascii_digit()) => {
                word.clear();
                in_word = false;
                break;
            }
            '#' if !in_word => break,
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    let skip = words
        .iter()
        .take_while(|w| {
            w.split_once('=').is_some_and(|(k, _)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        })
        .count();
    words.split_off(skip)
}

/// Every `cohort` invocation in a block, as argv (program first).
fn invocations(info: &str, text: &str) -> Vec<Vec<String>> {
    let is_cohort = |w: &str| w == "cohort" || w.ends_with("/cohort");
    let mut out = Vec::new();
    for line in text.lines() {
        let argv: Vec<String> = match info {
            "console" | "console,runnable" => match line.strip_prefix("$ ") {
                Some(cmd) => shell_words(cmd),
                None => continue,
            },
            "sh" | "bash" => shell_words(line),
            "ini" => match line.strip_prefix("ExecStart=") {
                Some(cmd) => shell_words(cmd),
                None => continue,
            },
            "dockerfile" => match line
                .strip_prefix("ENTRYPOINT ")
                .or_else(|| line.strip_prefix("CMD "))
            {
                Some(array) if array.trim_start().starts_with('[') => {
                    serde_json::from_str(array.trim()).expect("an exec-form array")
                }
                _ => continue,
            },
            _ => continue,
        };
        if argv.first().is_some_and(|w| is_cohort(w)) {
            out.push(argv);
        }
    }
    out
}

#[test]
fn shell_word_splitting() {
    assert_eq!(
        shell_words("RUST_LOG=cohort=info cohort --log-format json sweep --tenant 1111… 2>&1 >/dev/null | head -1"),
        ["cohort", "--log-format", "json", "sweep", "--tenant", "1111…"]
    );
    assert_eq!(
        shell_words("cohort migrate --schema ledger --move-from public   # then"),
        [
            "cohort",
            "migrate",
            "--schema",
            "ledger",
            "--move-from",
            "public"
        ]
    );
    assert_eq!(
        shell_words(r#"cohort holds create --subject "a b" --reason 'x y'"#),
        [
            "cohort",
            "holds",
            "create",
            "--subject",
            "a b",
            "--reason",
            "x y"
        ]
    );
}

#[test]
fn every_cohort_invocation_in_the_guide_parses() {
    let mut problems = Vec::new();
    let mut parsed = 0;
    for (doc, text) in documents() {
        for (info, line, block) in blocks(&text) {
            for argv in invocations(&info, &block) {
                let elsewhere = ELSEWHERE.iter().any(|(c, _)| argv.iter().any(|a| a == c));
                parsed += 1;
                match Cli::try_parse_from(&argv) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            clap::error::ErrorKind::DisplayHelp
                                | clap::error::ErrorKind::DisplayVersion
                        ) => {}
                    Err(_) if elsewhere => {}
                    Err(e) => problems.push(format!("{doc}:{line}: {argv:?}: {}", e.render())),
                }
            }
        }
    }
    assert!(parsed >= 10, "only {parsed} invocations found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A command's own flags (`--name`) and positional arguments (`NAME`),
/// without help and version.
fn own_arguments(cmd: &clap::Command) -> BTreeSet<String> {
    cmd.get_arguments()
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .map(|a| match a.get_long() {
            Some(long) => format!("--{long}"),
            None => a
                .get_value_names()
                .and_then(|v| v.first())
                .map(|v| v.to_string())
                .unwrap_or_else(|| a.get_id().as_str().to_uppercase()),
        })
        .collect()
}

/// Every command that takes arguments itself (no subcommands), by path
/// (`holds create`), with its arguments; the root as `cohort`.
fn clap_commands() -> BTreeMap<String, BTreeSet<String>> {
    fn walk(cmd: &clap::Command, path: &str, out: &mut BTreeMap<String, BTreeSet<String>>) {
        for sub in cmd.get_subcommands() {
            let name = if path.is_empty() {
                sub.get_name().to_owned()
            } else {
                format!("{path} {}", sub.get_name())
            };
            if ELSEWHERE.iter().any(|(c, _)| *c == name) {
                continue;
            }
            if sub.has_subcommands() {
                walk(sub, &name, out);
            } else {
                out.insert(name, own_arguments(sub));
            }
        }
    }
    let cli = Cli::command();
    let mut out = BTreeMap::new();
    out.insert("cohort".to_owned(), own_arguments(&cli));
    walk(&cli, "", &mut out);
    out
}

/// `docs/cli.md`'s reference table: command → arguments.
fn documented_commands() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(root().join("docs/cli.md")).unwrap();
    let table = text
        .split_once("## Reference: every command and flag")
        .expect("the reference section")
        .1;
    let mut out = BTreeMap::new();
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        // Cells split on `|`, except the escaped `\|` inside a code span.
        let line = line.replace("\\|", "\u{0}");
        let cells: Vec<&str> = line.split('|').skip(1).map(str::trim).collect();
        let command = cells[0].trim_matches('`').to_owned();
        let arguments: BTreeSet<String> = cells[1]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|span| span.split_whitespace().next().unwrap_or("").to_owned())
            .collect();
        assert!(
            out.insert(command.clone(), arguments).is_none(),
            "{command} is listed twice"
        );
    }
    out
}

#[test]
fn the_cli_table_matches_the_commands() {
    let known = clap_commands();
    let documented = documented_commands();
    let mut problems = Vec::new();
    for (command, arguments) in &known {
        match documented.get(command) {
            None => problems.push(format!("`{command}` is missing from the table")),
            Some(listed) => {
                for a in arguments.difference(listed) {
                    problems.push(format!("`{command}`: {a} is missing from the table"));
                }
                for a in listed.difference(arguments) {
                    problems.push(format!("`{command}`: {a} is listed but does not exist"));
                }
            }
        }
    }
    for command in documented.keys().filter(|c| !known.contains_key(*c)) {
        problems.push(format!("`{command}` is listed but is no command"));
    }
    assert!(known.len() > 20, "only {} commands", known.len());
    assert!(
        problems.is_empty(),
        "docs/cli.md's reference table:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_synopsis_names_only_flags_that_exist() {
    let text = std::fs::read_to_string(root().join("docs/cli.md")).unwrap();
    let synopsis = blocks(&text)
        .into_iter()
        .find(|(info, _, _)| info == "text,synopsis")
        .expect("a synopsis block")
        .2;
    let cli = Cli::command();
    let global = own_arguments(&cli);
    let mut current: Option<clap::Command> = None;
    let mut problems = Vec::new();
    let mut named = BTreeSet::new();
    for line in synopsis.lines().skip(1) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let starts_command = line.starts_with("  ")
            && !line.starts_with("   ")
            && words
                .first()
                .is_some_and(|w| w.starts_with(|c: char| c.is_ascii_lowercase()));
        if starts_command {
            let mut cmd = cli.clone();
            let mut path = Vec::new();
            for w in &words {
                match cmd.find_subcommand(w) {
                    Some(sub) => {
                        path.push(*w);
                        cmd = sub.clone();
                    }
                    None => break,
                }
            }
            if path.is_empty() {
                problems.push(format!("no command in {line:?}"));
            }
            named.insert(path.join(" "));
            current = Some(cmd);
        }
        let Some(cmd) = &current else { continue };
        let own = own_arguments(cmd);
        for flag in line
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2)
        {
            if !own.contains(flag) && !global.contains(flag) {
                problems.push(format!("{flag} does not exist for {line:?}"));
            }
        }
    }
    for top in cli.get_subcommands() {
        let name = top.get_name();
        if !ELSEWHERE.iter().any(|(c, _)| *c == name)
            && !named.iter().any(|n| n.split(' ').next() == Some(name))
        {
            problems.push(format!("the synopsis leaves out `{name}`"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn commands_documented_elsewhere_have_their_page_once_they_exist() {
    let cli = Cli::command();
    for (command, page) in ELSEWHERE {
        if cli.find_subcommand(command).is_some() {
            assert!(
                root().join(page).exists(),
                "`cohort {command}` exists but {page} does not"
            );
        }
    }
}
