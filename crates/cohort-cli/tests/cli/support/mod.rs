//! What the CLI's tests share: running the binary, Chromium, relinking a
//! ledger moved in time, and the library tests' wait helpers.

pub(crate) mod chromium;
pub(crate) mod cli;
pub(crate) mod relink;
pub(crate) mod scenario;
#[path = "../../../../cohort/tests/engine/support/wait.rs"]
pub(crate) mod wait;
