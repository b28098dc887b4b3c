#![doc = include_str!("../../../README.md")]

pub mod audit;
mod cohort;
pub mod config;
mod diagnostic;
mod engine;
pub mod erasure;
mod error;
pub mod guarded;
pub mod holds;
mod ident;
pub mod model;
pub mod policy;
pub mod rules;
mod run;
pub mod runs;
pub mod schema;
mod sql;
pub mod validate;

pub use cohort::{Cohort, CohortBuilder};
pub use config::CohortConfig;
pub use diagnostic::Diagnostic;
pub use engine::PreviewResult;
pub use error::{Error, Problem, Problems, Result};
pub use ident::{quote_ident, QualifiedName};
pub use model::{EntityDeclaration, Retained};
pub use rules::{AuditDetail, Strategy};
pub use run::{
    EntityFailure, EntityOutcome, NotReached, PreviewRequest, RunKind, RunStatus, SweepRequest,
    SweepResult, Trigger,
};
pub use tokio_util::sync::CancellationToken;

#[cfg(feature = "derive")]
pub use cohort_macros::Retained;
