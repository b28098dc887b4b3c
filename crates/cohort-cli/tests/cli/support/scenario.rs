//! A CLI test's scenario: a throw-away database holding the test's own
//! tables and a directory holding its policy file, and the readings every
//! test makes of a run (it succeeded; its stdout is one JSON document).

#![allow(dead_code, unreachable_pub)]

use std::process::Output;

use cohort_pgtemp::TestDatabase;
use serde_json::Value;
use tempfile::TempDir;

/// A fresh empty database with `tables` run in it (any SQL), and a
/// directory whose `cohort.toml` is `policy`.
pub(crate) async fn scenario(tables: &str, policy: impl AsRef<[u8]>) -> (TestDatabase, TempDir) {
    let db = cohort_pgtemp::fresh_empty_database()
        .await
        .expect("a test database");
    sqlx::raw_sql(sqlx::AssertSqlSafe(tables.to_owned()))
        .execute(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{e}\nin:\n{tables}"));
    let dir = tempfile::tempdir().expect("a directory");
    std::fs::write(dir.path().join("cohort.toml"), policy).expect("the policy file");
    (db, dir)
}

/// Asserts the command exited 0, showing its stderr if not.
pub(crate) fn succeeded(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The command's stdout as one JSON document (its stdout and stderr shown
/// if it is not).
pub(crate) fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
