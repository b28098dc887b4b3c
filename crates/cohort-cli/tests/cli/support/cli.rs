//! Running the `cohort` binary the one way every CLI test does: in a
//! directory, with none of the caller's `COHORT*` variables, `RUST_LOG` or
//! `DATABASE_URL` leaking in; the database URL and any other variables
//! only as the test gives them.

#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::process::{Command, Output};

/// The command, ready to run or spawn (`url`: the `DATABASE_URL` it
/// sees, `None`: none).
pub(crate) fn command<'a>(
    dir: &Path,
    args: &[&str],
    url: impl Into<Option<&'a str>>,
    env: &[(&str, &str)],
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cohort"));
    cmd.current_dir(dir)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG");
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("COHORT")) {
        cmd.env_remove(k);
    }
    if let Some(url) = url.into() {
        cmd.env("DATABASE_URL", url);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs `cohort ARGS` in `dir` to its end.
pub(crate) fn cohort<'a>(dir: &Path, args: &[&str], url: impl Into<Option<&'a str>>) -> Output {
    command(dir, args, url, &[]).output().expect("run cohort")
}

/// Runs `cohort ARGS` in `dir` to its end, with these variables set too.
pub(crate) fn cohort_with_env(
    dir: &Path,
    args: &[&str],
    url: &str,
    env: &[(&str, &str)],
) -> Output {
    command(dir, args, url, env).output().expect("run cohort")
}
