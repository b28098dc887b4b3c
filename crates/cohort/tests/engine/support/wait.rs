//! Waiting for state only the database or another process can tell (rows
//! settled, a lock released, a line printed): the tests' one polling
//! interval, in one place. Shared by every test crate of the workspace
//! (`#[path]`); it depends on nothing but tokio.

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

/// How often a condition is re-checked. A poll, not a wait for time to
/// pass: a test that needs time to pass backdates rows or waits for an
/// event instead.
const POLL: Duration = Duration::from_millis(20);

/// Re-checks `check` until it holds; fails the test after `limit`.
pub async fn wait_until(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// [`wait_until`] for a test without a runtime (a child process's output,
/// its exit).
pub fn wait_until_blocking(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(POLL);
    }
}
