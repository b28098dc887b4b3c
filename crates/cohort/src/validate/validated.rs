//! What validation established: the validated model, and the facts of
//! each entity's table the plans and runs need.

use std::collections::BTreeMap;

use super::catalog;
use crate::domain::model::EntityDescriptor;
use crate::domain::model::ExemptEntity;
use crate::domain::rules::{CategoryCapabilities, TenantIdentity};
use crate::sql::{Casts, KeyType};

/// What validation established: the resolved entities Cohort may act on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ValidatedModel {
    /// Retained entities, in declaration order.
    pub entities: Vec<EntityDescriptor>,
    /// Explicitly exempt entities.
    pub exempt: Vec<ExemptEntity>,
    /// Each entity's category capabilities, by entity id.
    pub capabilities: BTreeMap<uuid::Uuid, CategoryCapabilities>,
    /// Advice (missing indexes); not errors.
    pub warnings: Vec<String>,
    /// `server_version_num` of the server validated against.
    pub server_version_num: i32,
    /// Entity ids in processing order: dependents (tables with foreign keys
    /// into other retained tables) before the tables they reference.
    pub order: Vec<uuid::Uuid>,
    /// Store types of the key-like columns, by entity id.
    pub(crate) facts: BTreeMap<uuid::Uuid, TableFacts>,
    /// The tenant columns' store type (every tenant-scoped entity agrees).
    pub(crate) tenant_key: Option<KeyType>,
}

/// What the engine needs to know about a validated entity's columns.
#[derive(Debug, Clone)]
pub(crate) struct TableFacts {
    pub(crate) record: KeyType,
    pub(crate) tenant: Option<KeyType>,
    /// Erasure-subject columns and their store types.
    pub(crate) subjects: BTreeMap<String, KeyType>,
    /// Foreign keys that forbid deleting a referenced row (NO ACTION,
    /// RESTRICT): purge leaves such rows alone and reports them as skipped.
    pub(crate) blocking_references: Vec<catalog::IncomingKey>,
    /// The tables whose blocking references keep rows of this entity for
    /// good (Cohort never deletes their rows), as a run's note names them;
    /// empty when none, or when the entity never purges or archives.
    pub(crate) kept_by_references: Vec<String>,
    /// The `{tenant}` literals written into a column of bounded length:
    /// each tenant's own id decides whether its sweeps can write them.
    pub(crate) tenant_literals: Vec<TenantLiteral>,
    /// Key-like columns compared in their own type (citext).
    pub(crate) casts: Casts,
    /// A plain table (not partitioned): a row's address (`ctid`) names
    /// it alone, so a sweep's mutation can find its locked rows by address.
    pub(crate) plain: bool,
}

/// A literal anonymise method with `{tenant}`, writing into a column of
/// bounded length (`varchar(n)`, `char(n)`, through domains too).
#[derive(Debug, Clone)]
pub(crate) struct TenantLiteral {
    pub(crate) column: String,
    pub(crate) display_type: String,
    pub(crate) max_chars: usize,
    pub(crate) template: String,
}

impl TenantLiteral {
    /// Why the literal cannot be written for `tenant` (its id as the run
    /// renders it), or `None` when it fits.
    pub(crate) fn misfit(&self, tenant: &str) -> Option<String> {
        let written = crate::domain::model::render_literal(
            &self.template,
            chrono::DateTime::UNIX_EPOCH,
            Some(tenant),
        )
        .ok()?
        .chars()
        .count();
        (written > self.max_chars).then(|| {
            format!(
                "the literal for column {:?} ({}) writes {written} characters for tenant {tenant:?}, more than the column holds: every anonymisation of this tenant's rows would fail (value too long, SQLSTATE 22001). Widen the column or shorten the literal",
                self.column, self.display_type
            )
        })
    }
}

impl TableFacts {
    /// Why anonymising this entity's rows of `tenant` cannot write its
    /// `{tenant}` literals (the first that does not fit), or `None`.
    pub(crate) fn literal_misfit(&self, tenant: &str) -> Option<String> {
        self.tenant_literals.iter().find_map(|l| l.misfit(tenant))
    }
    /// A row's stored tenant text in canonical form (so it compares with a
    /// canonical request tenant however the row spells it, e.g. citext).
    pub(crate) fn canonical_owner(&self, stored: Option<String>) -> Option<String> {
        stored.map(|o| {
            self.tenant
                .and_then(|ty| ty.canonical_text(&o))
                .unwrap_or(o)
        })
    }
}

impl ValidatedModel {
    /// Whether `strategy` writes `e`'s anonymise methods: an anonymisation,
    /// or an archive whose copy is anonymised.
    pub(crate) fn writes_literals(
        e: &EntityDescriptor,
        strategy: crate::domain::rules::Strategy,
    ) -> bool {
        use crate::domain::rules::Strategy;
        strategy == Strategy::Anonymise
            || (strategy == Strategy::Archive && e.archive.as_ref().is_some_and(|a| a.anonymise))
    }

    /// The entity with this id.
    pub fn entity(&self, id: uuid::Uuid) -> Option<&EntityDescriptor> {
        self.entities.iter().find(|e| e.id == id)
    }

    /// The entity with this display name or id (as text).
    pub fn find_entity(&self, id_or_name: &str) -> Option<&EntityDescriptor> {
        let id = uuid::Uuid::parse_str(id_or_name.trim()).ok();
        self.entities
            .iter()
            .find(|e| Some(e.id) == id || e.name == id_or_name)
    }

    /// Entities in processing order.
    pub fn ordered(&self) -> impl Iterator<Item = &EntityDescriptor> {
        self.order.iter().filter_map(|id| self.entity(*id))
    }

    /// How tenant ids compare, from the tenant columns' type.
    pub fn tenant_identity(&self) -> TenantIdentity {
        identity_of(self.tenant_key)
    }
}

fn identity_of(key: Option<KeyType>) -> TenantIdentity {
    match key {
        Some(KeyType::Uuid) => TenantIdentity::Uuid,
        Some(KeyType::Int2 | KeyType::Int4 | KeyType::Int8) => TenantIdentity::Integer,
        Some(KeyType::CiText) => TenantIdentity::CaseInsensitive,
        Some(KeyType::Text) | None => TenantIdentity::Exact,
    }
}

/// What the plans and runs need to know of each entity's table.
pub(super) fn table_facts(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    mut kept_by: BTreeMap<uuid::Uuid, Vec<String>>,
) -> BTreeMap<uuid::Uuid, TableFacts> {
    entities
        .iter()
        .zip(tables)
        .map(|(e, t)| {
            let kept_by_references = kept_by.remove(&e.id).unwrap_or_default();
            (e.id, TableFacts::of(e, t, kept_by_references))
        })
        .collect()
}

impl TableFacts {
    /// The facts of entity `e`'s table `t`, validated (its key-like
    /// columns have key types), with the tables whose references keep its
    /// rows for good.
    fn of(e: &EntityDescriptor, t: &catalog::TableInfo, kept_by_references: Vec<String>) -> Self {
        let key = |c: &str| {
            t.column(c)
                .and_then(|c| KeyType::from_type_name(&c.type_name))
        };
        // A composite key travels as its JSON text (see `sql::record_key`).
        let composite = e.has_composite_key();
        TableFacts {
            record: if composite {
                KeyType::Text
            } else {
                key(&e.record_id).expect("validated key type")
            },
            tenant: e
                .tenant
                .as_deref()
                .map(|c| key(c).expect("validated tenant type")),
            subjects: e
                .subjects
                .iter()
                .map(|s| {
                    (
                        s.column.clone(),
                        key(&s.column).expect("validated subject type"),
                    )
                })
                .collect(),
            blocking_references: t.blocking_references(),
            kept_by_references,
            tenant_literals: tenant_literals(e, t),
            casts: Casts {
                columns: t
                    .columns
                    .iter()
                    .filter(|c| KeyType::from_type_name(&c.type_name) == Some(KeyType::CiText))
                    .map(|c| (c.name.clone(), c.qualified_type()))
                    .collect(),
                key: if composite {
                    key_parts(e, t)
                } else {
                    Vec::new()
                },
            },
            plain: t.relkind == "r",
        }
    }
}

/// The entity's literal anonymise methods with `{tenant}` that write into
/// a column of bounded length.
fn tenant_literals(e: &EntityDescriptor, t: &catalog::TableInfo) -> Vec<TenantLiteral> {
    e.anonymise
        .iter()
        .filter_map(|a| {
            let crate::domain::model::AnonymiseMethod::Literal(template) = &a.method else {
                return None;
            };
            let col = t.column(&a.column)?;
            Some(TenantLiteral {
                column: col.name.clone(),
                display_type: col.display_type.clone(),
                max_chars: usize::try_from(col.max_chars?).ok()?,
                template: template.clone(),
            })
            .filter(|_| template.contains("{tenant}"))
        })
        .collect()
}

/// The parts of the entity's composite record key, with their types.
fn key_parts(e: &EntityDescriptor, t: &catalog::TableInfo) -> Vec<crate::sql::KeyPart> {
    e.record_key
        .iter()
        .map(|c| {
            let col = t.column(c).expect("validated key column");
            crate::sql::KeyPart {
                column: c.clone(),
                ty: crate::domain::model::PartType::from_type_name(&col.type_name)
                    .expect("validated key type"),
                sql_type: col.qualified_type(),
            }
        })
        .collect()
}
