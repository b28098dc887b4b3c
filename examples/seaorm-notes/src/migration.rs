//! The application's migrations (`sea-orm-migration`): its own table, then
//! Cohort's tables through `cohort::sea_orm::migrate`, in one migrator.

use sea_orm_migration::prelude::*;

/// The application's migrator.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(CreateNotes), Box::new(InstallCohort)]
    }
}

/// `app.notes`.
pub struct CreateNotes;

impl MigrationName for CreateNotes {
    fn name(&self) -> &str {
        "m20260101_000001_create_notes"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CreateNotes {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE SCHEMA IF NOT EXISTS app;
                 CREATE TABLE app.notes (id uuid PRIMARY KEY, tenant_id uuid NOT NULL,
                     created_at timestamptz NOT NULL, body text NOT NULL);
                 CREATE INDEX notes_tenant_created_idx ON app.notes (tenant_id, created_at);",
            )
            .await?;
        Ok(())
    }
}

/// Cohort's ledger in schema `retention` (a later Cohort version adds a
/// migration of the same kind: each call brings the tables to the version
/// of the Cohort it is built with).
pub struct InstallCohort;

impl MigrationName for InstallCohort {
    fn name(&self) -> &str {
        "m20260101_000002_install_cohort"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for InstallCohort {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        cohort::sea_orm::migrate(manager.get_connection(), crate::COHORT_SCHEMA)
            .await
            .map_err(|e| DbErr::Migration(e.to_string()))?;
        Ok(())
    }
}
