//! Handles from policy text, and the problems validation lists for it.

use cohort::config::HashKey;
use cohort::policy::PolicyFile;
use cohort::{Cohort, Error};
use cohort_pgtemp::TestDatabase;

use super::{ledger_rows, TEST_HASH_KEY};

/// A Cohort from policy text (with the test hash key), validated.
pub async fn from_policy(db: &TestDatabase, policy: &str) -> Result<Cohort, Error> {
    let mut p = PolicyFile::parse(policy)?;
    if p.config.hash_key.is_none() {
        p.config.hash_key = Some(HashKey::new(TEST_HASH_KEY));
    }
    Cohort::builder(db.pool().clone()).policy(p).build().await
}

/// The problems of a validation error, as text; any other error fails.
pub fn problems_text(err: &Error) -> String {
    match err {
        Error::Validation(p) => p.to_string(),
        other => panic!("expected validation problems, got {other}"),
    }
}

/// Validation refuses `policy` naming every one of `fragments`, and no run
/// was recorded.
pub async fn expect_refused(db: &TestDatabase, policy: &str, fragments: &[&str]) {
    let err = from_policy(db, policy).await.unwrap_err();
    let text = problems_text(&err);
    for f in fragments {
        assert!(text.contains(f), "missing {f:?} in:\n{text}");
    }
    assert_eq!(ledger_rows(db.pool(), "public").await, 0);
}
