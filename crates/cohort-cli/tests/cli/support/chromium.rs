//! Headless Chromium for the browser tests (Debian's `chromium`, installed
//! by `.ci/run`; `COHORT_CHROMIUM` points elsewhere).

use std::path::Path;
use std::process::{Command, Output};

/// Runs Chromium headless with the flags this machine needs (no sandbox as
/// root, no background networking), a fresh profile, and the page's
/// console on stderr.
pub(crate) fn run(profile: &Path, args: &[&str]) -> Output {
    let bin = std::env::var("COHORT_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&bin).exists(),
        "{bin} not found: install Debian's chromium package (.ci/run does), or point COHORT_CHROMIUM at a Chromium"
    );
    Command::new(&bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1280,720",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("run chromium")
}

/// What the page's console reported: errors, CSP refusals, failed loads.
pub(crate) fn console_errors(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Refused to") || l.contains("Uncaught"))
        .map(str::to_string)
        .collect()
}
