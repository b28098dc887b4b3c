//! SQL planning: typed keys and the statements the engine runs, built once
//! per entity from quoted identifiers and fixed text.

/// The one definition of an active hold: neither released nor expired by
/// the database clock, so a hold at its release or expiry instant no
/// longer protects. `active_hold!()` for the hold table's own columns,
/// `active_hold!("h.")` for an alias; a string literal, for `concat!`.
macro_rules! active_hold {
    () => {
        active_hold!("")
    };
    ($alias:literal) => {
        concat!(
            "(",
            $alias,
            "released_at IS NULL OR ",
            $alias,
            "released_at > pg_catalog.now()) AND (",
            $alias,
            "expires_at IS NULL OR ",
            $alias,
            "expires_at > pg_catalog.now())"
        )
    };
}

pub(crate) mod catalog;
pub(crate) mod chain;
pub(crate) mod dead_letters;
mod erasure;
mod fragments;
pub(crate) mod grants;
pub(crate) mod history;
pub(crate) mod holds;
pub(crate) mod journal;
mod key;
pub(crate) mod ledger;
pub(crate) mod locks;
pub(crate) mod occurrences;
pub(crate) mod pacing;
pub(crate) mod partitions;
pub(crate) mod peers;
pub(crate) mod prune;
pub(crate) mod queue;
mod record_key;
pub(crate) mod report;
pub(crate) mod requests;
pub(crate) mod schema;
pub(crate) mod settings;
pub(crate) mod statement;
mod sweep;
pub(crate) mod tables;
pub(crate) mod tenants;
pub(crate) mod values;
pub(crate) mod worker;

pub(crate) use erasure::ErasurePlan;
pub(crate) use fragments::{bound_rows, canonical_text, Casts, HoldKeys, KeyPart};
pub(crate) use key::{bind_array, BindKey, BoundHolds, DecodeKey, IncomingKey, KeyType, KeyValue};
pub(crate) use ledger::LedgerPlan;
#[cfg(feature = "sea-orm")]
pub(crate) use sweep::sea;
pub(crate) use sweep::{
    lock_subject_rows, Audit, Batch, Change, Changed, CountsRow, Cursor, EntityPlan, LockedRow,
    RecordRow, Rows, RunParam, RunValue, Scope, StageScope, SweepStatements, Targets,
};

/// Every Cohort transaction that relies on a later statement seeing rows
/// committed after an earlier one (hold checks after row locks) runs in
/// READ COMMITTED explicitly, whatever the role's or database's default
/// isolation level: under REPEATABLE READ the re-check would reuse the
/// first statement's snapshot and miss a hold committed in between.
pub(crate) const READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// One consistent snapshot that changes nothing: `cohort verify` reads the
/// chain and the records it covers as of one instant.
pub(crate) const SNAPSHOT: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

/// The transaction of one sweep or erasure batch, and of an entity's
/// counts: [`READ_COMMITTED`], with JIT compilation off for its statements
/// (sent in the same round trip). A batch's statements are bounded by the
/// batch size and the counts read a few index ranges, but the planner
/// prices a hold check's probe per row it might read, so with holds in the
/// table their estimates pass `jit_above_cost` and each statement would
/// spend tens of milliseconds (the counts, over a second) compiling code
/// that runs for a few.
pub(crate) const BATCH_BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL jit = off";

/// The transaction a policy's `tenants_query` runs in: it can list
/// tenants, never change anything.
pub(crate) const READ_ONLY: &str = "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY";

/// The isolation level of the caller's transaction (column `isolation`),
/// which guarded deletion checks before relying on READ COMMITTED.
pub(crate) const ISOLATION_LEVEL: &str =
    "SELECT pg_catalog.current_setting('transaction_isolation') AS isolation";

/// The database clock now: what cutoffs, occurrences and prune ages are
/// measured against, never the process's own clock.
pub(crate) async fn database_now(
    executor: impl sqlx::PgExecutor<'_>,
) -> Result<chrono::DateTime<chrono::Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_catalog.clock_timestamp()")
        .fetch_one(executor)
        .await
}

/// Characters the `hash` anonymise method writes (hex of HMAC-SHA256).
pub(crate) const HASH_HEX_CHARS: usize = 64;

#[cfg(test)]
mod plans_test;
#[cfg(test)]
mod qualified_test;
#[cfg(test)]
mod snapshots_test;
