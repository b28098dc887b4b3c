//! Cohort's end-to-end tests in one binary (one link of the library, one
//! process): a module per guarantee, each on databases of its own, cloned
//! from a migrated template by `support`. The binary's one tracing
//! subscriber is `support::logs`'s and captures per test thread, so the
//! tests that read logs run beside the others. One test keeps a binary of
//! its own: `tests/bounded_failures.rs` measures the process's peak heap
//! through its global allocator, which other tests beside it would move
//! (a per-thread counting allocator needs `unsafe`, which the workspace
//! forbids).

mod support;

mod anonymisers;
mod archive;
mod backlog;
mod calendar;
mod cdc;
mod chain;
mod chain_keys;
mod command_handlers;
mod compliance;
mod composite_keys;
mod concurrency;
mod contract;
mod derive;
mod docs;
mod erasure;
mod erasure_requests;
mod failures;
mod fused;
mod guarded;
mod handlers;
mod hold_gate;
mod hold_reach;
mod holds;
mod hostile;
mod journal_attacks;
mod layers;
mod pacing;
mod parallel;
mod parity;
mod partitions;
mod passes;
mod peers;
mod pooler;
mod privileges;
mod reach;
mod refused;
mod replica_lag;
mod restore;
mod schema;
mod services;
mod stages;
mod subject_holds;
mod sweep;
mod table_health;
mod telemetry;
mod tenant_tags;
mod validation;
