#![doc = include_str!("../../../README.md")]

mod cohort;
pub mod config;
mod error;
mod ident;
pub mod model;
pub mod policy;
pub mod rules;
pub mod schema;
pub mod validate;

pub use cohort::{Cohort, CohortBuilder};
pub use config::CohortConfig;
pub use error::{Error, Problem, Problems, Result};
pub use ident::{quote_ident, QualifiedName};
pub use model::{EntityDeclaration, Retained};

#[cfg(feature = "derive")]
pub use cohort_macros::Retained;
