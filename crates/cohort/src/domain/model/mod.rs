//! The entity model: declarations (from the derive, the policy file or
//! code), conventions, and the resolved descriptors everything downstream
//! works on. Pure: no I/O.

mod anonymise;
pub(crate) mod audit;
mod composite;
mod declaration;
mod descriptor;
mod key;

pub(crate) use anonymise::render_literal;
pub use anonymise::{
    AnonymiseContext, AnonymiseMethod, AnonymisedValue, AnonymiserFn, CustomAnonymiser,
};
#[doc(hidden)]
pub use anonymise::{ByContextAndValue, ByRun, ByValue};
pub(crate) use composite::{parse_composite, PartType};
pub use declaration::{
    folded_column_name, looks_like_tenant, ArchiveDeclaration, DeclaredColumn, EntityDeclaration,
    Marker, Origin, Partitions, Retained, SubjectDeclaration,
};
pub(crate) use descriptor::{parse_entity_id, resolve, Resolved};
pub use descriptor::{
    AnonymisedColumn, ArchiveTarget, Conventions, EntityDescriptor, ExemptEntity, Resolution,
    SubjectColumn, ARCHIVED_AT, ARCHIVE_RUN_ID,
};
pub(crate) use key::{KeyType, KeyValue, SubjectForm};
