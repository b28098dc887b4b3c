//! The databases a test starts from: `#[db_test(fixture)]` (the
//! `cohort-test-macros` attribute, after `#[sqlx::test(fixtures(…))]`)
//! hands a test a fresh clone of the template its fixture names, built
//! once per cluster and keyed by the hash of what builds it, so a change
//! to the migrations or the seed builds a new one.

use cohort_pgtemp::{TemplateSpec, TestDatabase};

use super::ENGINE_TABLES;

/// What a fresh test database holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fixture {
    /// Nothing.
    Empty,
    /// Cohort's tables in `public`.
    Migrated,
    /// Cohort's tables and the engine fixture's tables and rows
    /// ([`ENGINE_TABLES`], seeded at fixed times, so a clone made at any
    /// moment holds the same rows).
    Engine,
}

/// A fresh database holding `fixture`.
pub async fn fixture(fixture: Fixture) -> TestDatabase {
    let db = match fixture {
        Fixture::Empty => cohort_pgtemp::fresh_empty_database().await,
        Fixture::Migrated => cohort_pgtemp::fresh_database(&migrated()).await,
        Fixture::Engine => cohort_pgtemp::fresh_database(&engine()).await,
    };
    db.expect("test database")
}

/// Cohort's migrations, as the template's key hashes them.
fn migrations_sql() -> String {
    cohort::schema::migrations("public")
        .unwrap()
        .into_iter()
        .map(|m| m.sql)
        .collect()
}

/// Cohort's tables in `public`.
fn migrated() -> TemplateSpec {
    let key = TemplateSpec::hashed_key("cohort", migrations_sql().as_bytes());
    TemplateSpec::new(key, |pool| {
        Box::pin(async move {
            let mut conn = pool.acquire().await?;
            cohort::schema::migrate(&mut conn, "public").await?;
            Ok(())
        })
    })
}

/// Cohort's tables, then the engine fixture's.
fn engine() -> TemplateSpec {
    let content = migrations_sql() + ENGINE_TABLES;
    let key = TemplateSpec::hashed_key("cohort_engine", content.as_bytes());
    TemplateSpec::new(key, |pool| {
        Box::pin(async move {
            let mut conn = pool.acquire().await?;
            cohort::schema::migrate(&mut conn, "public").await?;
            sqlx::raw_sql(ENGINE_TABLES).execute(&mut *conn).await?;
            Ok(())
        })
    })
}
