//! Cohort in a SeaORM application.
//!
//! - [`note`]: a SeaORM entity that also derives `cohort::Retained`.
//! - [`migration`]: the application's `sea-orm-migration` migrator, whose
//!   second migration installs Cohort's tables.
//! - [`delete_note`]: the application's own delete, in its own SeaORM
//!   transaction, guarded against legal holds.
//! - [`retention`]: a Cohort handle on SeaORM's connection pool.

pub mod migration;
pub mod note;

use cohort::guarded::{Guarded, GuardedDeletion};
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::Cohort;
use sea_orm::{DatabaseConnection, EntityTrait, TransactionTrait};
use uuid::Uuid;

/// The schema of Cohort's tables in this application.
pub const COHORT_SCHEMA: &str = "retention";

/// A validated Cohort handle sharing SeaORM's pool: notes are purged 30
/// days after creation.
pub async fn retention(db: &DatabaseConnection) -> Result<Cohort, cohort::Error> {
    let rules = StaticRuleProvider::builder()
        .category(
            "notes",
            RetentionRule::new("30d".parse().expect("a period"), Strategy::Purge),
        )
        .build()
        .expect("consistent rules");
    cohort::sea_orm::builder(db)?
        .config(cohort::CohortConfig {
            schema: COHORT_SCHEMA.into(),
            ..Default::default()
        })
        .entity::<note::Model>()
        .rules(rules)
        .build()
        .await
}

/// What [`delete_note`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Deleted {
    /// The note is gone (with the application's other work in the same
    /// transaction).
    Yes,
    /// A legal hold keeps it; nothing was deleted.
    Held,
}

/// Deletes one note in the application's own SeaORM transaction, after
/// Cohort has locked it and checked for legal holds.
pub async fn delete_note(
    db: &DatabaseConnection,
    cohort: &Cohort,
    tenant: Uuid,
    id: Uuid,
) -> Result<Deleted, Box<dyn std::error::Error + Send + Sync>> {
    let txn = db.begin().await?;
    let request = GuardedDeletion::new(note::Model::RETENTION_ENTITY_ID, [id.to_string()])
        .tenant(tenant.to_string());
    match cohort.guard_deletion_sea_orm(&txn, request).await {
        Ok(Guarded::Completed(())) => {
            note::Entity::delete_by_id(id).exec(&txn).await?;
            txn.commit().await?;
            Ok(Deleted::Yes)
        }
        Ok(Guarded::Protected { .. }) => {
            txn.rollback().await?;
            Ok(Deleted::Held)
        }
        Err(e) => {
            txn.rollback().await?;
            Err(e.into())
        }
    }
}
