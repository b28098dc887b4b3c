//! Cohort: annotation-driven data retention for Rust applications on PostgreSQL.

mod ident;
pub mod model;
pub mod rules;

pub use ident::{quote_ident, QualifiedName};
pub use model::{EntityDeclaration, Retained};

#[cfg(feature = "derive")]
pub use cohort_macros::Retained;
