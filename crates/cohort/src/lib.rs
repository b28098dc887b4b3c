#![doc = include_str!("../../../README.md")]

// The folders are the layers, bottom up (docs/architecture.md; the layer
// test in tests/engine/layers.rs checks the imports): base, domain, the
// loading of configuration (config, policy), sql, schema, validate,
// store, context, run, services, ops, and the facade (cohort, sea_orm).
mod base;
mod cohort;
pub mod config;
mod context;
mod domain;
mod error;
mod ops;
pub mod policy;
mod run;
pub mod schema;
#[cfg(feature = "sea-orm")]
pub mod sea_orm;
pub mod services;
mod sql;
mod store;
pub mod validate;

// Public paths as they were before the folders: `cohort::model`,
// `cohort::holds`, ….
pub use domain::{
    chain, erasure, erasure_requests, handlers, journal, model, observer, rules, settings, signals,
    telemetry,
};
pub use ops::{guarded, history, holds, report, restore, verify};
pub use run::peers;

pub use base::cancel::Cancel;
pub use base::ident::QualifiedName;
pub use cohort::{Cohort, CohortBuilder};
pub use config::{BatchSize, CohortConfig};
pub use error::{Error, ErrorKind, Problem, Problems, Result};
pub use model::{EntityDeclaration, Retained};
pub use rules::{AuditDetail, Strategy};
pub use run::passes::{
    PassFailure, PassOutcome, PreviewAllRequest, PreviewAllResult, SweepAllRequest, SweepAllResult,
    TenantDiscovery, TenantSource, UnusableTenant,
};
pub use run::PreviewResult;
pub use run::{
    EntityFailure, EntityOutcome, ErasureResult, NotReached, PreviewRequest, RunKind, RunStatus,
    SweepRequest, SweepResult, TableHealth, Trigger,
};

/// The attribute for implementing Cohort's async traits
/// ([`rules::RuleProvider`], [`observer::AuditObserver`]) without adding
/// `async-trait` to your own dependencies: `#[cohort::async_trait]`.
pub use async_trait::async_trait;

/// The sqlx version Cohort is built on (`cohort::sqlx::PgPool`): build the
/// pool you hand to [`Cohort::builder`] with it to avoid mixing two sqlx
/// versions.
pub use sqlx;

#[cfg(feature = "derive")]
pub use cohort_macros::Retained;

/// What the derive's expansion names; not part of the public API.
#[doc(hidden)]
pub mod __private {
    pub use uuid::Uuid;
}

/// The guide's pages in `docs/`, their Rust examples compiled as doctests
/// (every page: `crates/cohort/tests/engine/docs.rs` checks that none is missing).
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../../../docs/README.md")]
    struct Index;
    #[doc = include_str!("../../../docs/concepts.md")]
    struct Concepts;
    #[doc = include_str!("../../../docs/policy-file.md")]
    struct PolicyFile;
    #[doc = include_str!("../../../docs/derive.md")]
    struct Derive;
    #[doc = include_str!("../../../docs/cli.md")]
    struct Cli;
    #[doc = include_str!("../../../docs/worker.md")]
    struct Worker;
    #[doc = include_str!("../../../docs/handlers.md")]
    struct Handlers;
    #[doc = include_str!("../../../docs/erasure.md")]
    struct Erasure;
    #[doc = include_str!("../../../docs/holds.md")]
    struct Holds;
    #[doc = include_str!("../../../docs/operations.md")]
    struct Operations;
    #[doc = include_str!("../../../docs/migrations.md")]
    struct Migrations;
    #[doc = include_str!("../../../docs/validation.md")]
    struct Validation;
    #[doc = include_str!("../../../docs/partitions.md")]
    struct Partitions;
    #[doc = include_str!("../../../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../../../docs/archive.md")]
    struct Archive;
    #[doc = include_str!("../../../docs/stages.md")]
    struct Stages;
    #[doc = include_str!("../../../docs/guarantees.md")]
    struct Guarantees;
    #[doc = include_str!("../../../docs/architecture.md")]
    struct Architecture;
    #[doc = include_str!("../../../docs/report.md")]
    struct Report;
    #[doc = include_str!("../../../docs/metrics.md")]
    struct Metrics;
    #[doc = include_str!("../../../docs/scale.md")]
    struct Scale;
}
