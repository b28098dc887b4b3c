//! Cohort's end-to-end tests in one binary (one link of the library, one
//! process): a module per guarantee, each on databases of its own, cloned
//! from a migrated template by `support`. Tests that install a process-wide
//! tracing subscriber or allocator, and the derive macro's, keep binaries
//! of their own beside this folder.

mod support;

mod anonymisers;
mod archive;
mod backlog;
mod before_failures;
mod calendar;
mod cdc;
mod chain;
mod chain_keys;
mod command_handlers;
mod compliance;
mod composite_keys;
mod concurrency;
mod contract;
mod data_loss;
mod docs;
mod erasure;
mod erasure_requests;
mod faults;
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
mod restore;
mod schema;
mod services;
mod stages;
mod subject_holds;
mod sweep;
mod table_health;
mod tenant_tags;
mod validation;
