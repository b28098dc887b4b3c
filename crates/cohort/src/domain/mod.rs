//! The domain: what Cohort decides without a database (declarations, rules, schedules, tenants, outcomes, erasure and its requests, the journal's and the chain's formats, live settings, handlers, observers, telemetry, test signals).

pub mod chain;
pub mod erasure;
pub mod erasure_requests;
pub mod handlers;
pub mod journal;
pub mod model;
pub mod observer;
pub(crate) mod outcome;
pub(crate) mod request_rules;
pub mod rules;
pub(crate) mod schedule;
pub mod settings;
pub mod signals;
pub mod telemetry;
pub(crate) mod tenants;
