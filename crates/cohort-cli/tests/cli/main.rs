//! The `cohort` binary's end-to-end tests in one test binary (one link of
//! the library and the CLI instead of one per file), a module per part of
//! the command line: `cargo test -p cohort-cli --test cli MODULE::`.

mod commands;
mod console;
mod monitoring;
mod names;
mod report;
mod restore_drill;
mod support;
mod worker;
