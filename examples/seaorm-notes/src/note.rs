//! A note: a SeaORM entity and a retained Cohort entity at once.

use sea_orm::entity::prelude::*;

/// `app.notes`. SeaORM names every entity's row type `Model`, so Cohort is
/// given a display name; the schema-qualified table is given explicitly.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, cohort::Retained)]
#[sea_orm(schema_name = "app", table_name = "notes")]
#[retain(
    name = "Note",
    category = "notes",
    anchor = "created_at",
    id = "6c0f3b9e-58a4-4c55-9d7e-3a2f1b0c9d11",
    table = "app.notes"
)]
pub struct Model {
    /// The note's id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The owning tenant.
    pub tenant_id: Uuid,
    /// When it was written (the retention anchor).
    pub created_at: DateTimeWithTimeZone,
    /// The text.
    pub body: String,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
