//! A backdating row factory for the engine fixture's tables (River's
//! `testfactory`): a test says how many rows, whose, how old and how they
//! are told apart, and one statement with bound values inserts them. The
//! tests that need a table of their own still write its SQL.

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::PgPool;

/// `count` notes (`app.notes`) of one tenant: the n-th (from 1) created
/// `spacing × (n - 1)` before `at`, its body `prefix` followed by n
/// (or `prefix` alone, [`Notes::body`]).
#[must_use = "a factory inserts nothing until `insert`"]
pub struct Notes {
    tenant: String,
    at: DateTime<Utc>,
    spacing: TimeDelta,
    prefix: String,
    numbered: bool,
    count: i64,
}

/// One note of `tenant`, created 400 days before the fixture's `now()`,
/// its body `note 1`.
pub fn notes(tenant: &str) -> Notes {
    Notes {
        tenant: tenant.to_owned(),
        at: super::now().to_utc() - TimeDelta::days(400),
        spacing: TimeDelta::zero(),
        prefix: "note ".to_owned(),
        numbered: true,
        count: 1,
    }
}

/// A UTC time written as RFC 3339 (`2026-01-01T00:00:00Z`).
pub fn at(rfc3339: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(rfc3339)
        .expect("an RFC 3339 time")
        .to_utc()
}

impl Notes {
    /// How many.
    pub fn count(mut self, count: i64) -> Self {
        self.count = count;
        self
    }

    /// The first one's creation time.
    pub fn created(mut self, at: DateTime<Utc>) -> Self {
        self.at = at;
        self
    }

    /// Each one created this much before the one before it.
    pub fn spaced(mut self, spacing: TimeDelta) -> Self {
        self.spacing = spacing;
        self
    }

    /// Bodies `prefix1`, `prefix2`, ….
    pub fn numbered(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self.numbered = true;
        self
    }

    /// Every body `body`.
    pub fn body(mut self, body: &str) -> Self {
        self.prefix = body.to_owned();
        self.numbered = false;
        self
    }

    /// Inserts them; returns how many.
    pub async fn insert(self, pool: &PgPool) -> u64 {
        sqlx::query(
            "INSERT INTO app.notes (tenant_id, created_at, body) \
             SELECT $1::uuid, $2::timestamptz - $3::interval * (g - 1), \
                    CASE WHEN $4 THEN $5 || g ELSE $5 END \
             FROM pg_catalog.generate_series(1::int8, $6) g",
        )
        .bind(&self.tenant)
        .bind(self.at)
        .bind(self.spacing)
        .bind(self.numbered)
        .bind(&self.prefix)
        .bind(self.count)
        .execute(pool)
        .await
        .expect("the notes")
        .rows_affected()
    }
}
