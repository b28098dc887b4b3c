//! The entity model: declarations (from the derive, the policy file or
//! code), conventions, and the resolved descriptors everything downstream
//! works on. Pure: no I/O.

pub(crate) mod audit;
mod declaration;
mod descriptor;
mod key;

pub(crate) use declaration::render_literal;
pub use declaration::{
    AnonymiseContext, AnonymiseMethod, AnonymisedValue, AnonymiserFn, CustomAnonymiser,
    DeclaredColumn, EntityDeclaration, Marker, Origin, Partitions, Retained, SubjectDeclaration,
};
#[doc(hidden)]
pub use declaration::{ByContextAndValue, ByRun, ByValue};
pub(crate) use descriptor::{parse_entity_id, resolve, Resolved};
pub use descriptor::{
    AnonymisedColumn, Conventions, EntityDescriptor, ExemptEntity, Resolution, SubjectColumn,
};
pub(crate) use key::{KeyType, KeyValue};
