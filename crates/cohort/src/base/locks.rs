//! Every advisory lock Cohort takes, in one place: the key text of each
//! kind (the statements that take and release them, and the connection
//! that holds one, are in `sql::locks`). Keys are namespaced
//! (`cohort.<kind>:<id>`) and hashed by the server, so Cohort's locks cannot
//! collide with each other; the worker and dispatcher add their kinds here.

use uuid::Uuid;

/// An advisory lock of Cohort's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockKey<'a> {
    /// Held on the run's dedicated connection from before `Started` is
    /// written until the run settles: a run whose lock can be taken is not
    /// live (what recovery checks).
    Run(Uuid),
    /// Held by the migration transaction of one schema.
    Migrate(&'a str),
    /// Held (for its transaction) by the worker replica that writes an
    /// occurrence and its passes, keyed on the install's schema-qualified
    /// `sweep_run` table (installs in different schemas of one database
    /// sweep independently).
    Worker(&'a crate::base::ident::QualifiedName),
    /// Held on the claiming connection by the worker replica that runs one
    /// pass of an occurrence (its id, then the pass number), from its claim
    /// until it is settled: a claimed pass whose lock can be taken lost its
    /// replica.
    Pass(Uuid, i32),
    /// Held on a dedicated connection by whoever runs an attempt at an
    /// erasure request, for the attempt: a request left in progress whose
    /// lock can be taken lost its process.
    Request(Uuid),
    /// Held (for its transaction) by whoever appends a link to the ledger's
    /// hash chain, keyed on the install's `ledger_link` table: one appender
    /// at a time, so links follow each other without gaps or forks.
    Chain(&'a crate::base::ident::QualifiedName),
}

impl LockKey<'_> {
    /// The key text the server hashes.
    pub(crate) fn text(&self) -> String {
        match self {
            LockKey::Run(id) => format!("cohort.run:{id}"),
            LockKey::Migrate(schema) => format!("cohort.migrate:{schema}"),
            LockKey::Worker(table) => format!("cohort.worker:{table}"),
            LockKey::Pass(occurrence, pass) => format!("{}{pass}", pass_prefix(*occurrence)),
            LockKey::Request(id) => format!("cohort.erasure-request:{id}"),
            LockKey::Chain(table) => format!("cohort.chain:{table}"),
        }
    }
}

/// The first key of the hold gate, an advisory lock of the two-key form
/// whose second key is the install's hold table's oid: taken exclusive by
/// a subject hold's creation after it has locked the subject's rows and
/// before its insert, and shared by every batch (sweep, erasure, guarded
/// deletion, partition purge) after it has locked its rows and before it
/// re-checks holds. A subject hold therefore either commits before a
/// batch's re-check, which sees it, or waits for that batch to commit;
/// rows that became the subject's after the hold's own lock statement
/// cannot slip between the two. The two-key form keeps it apart from the
/// text-keyed locks above. `migrations/0013_hold_functions.sql` takes the
/// same key shared inside the fused batch's re-check.
/// As SQL text (an `int4`).
pub(crate) const HOLD_GATE_CLASS: &str = "1131375665";

/// The text every pass lock of one occurrence starts with; the pass
/// number follows (as PostgreSQL's `int4::text` writes it), so a statement
/// can take the lock of the pass it claims.
pub(crate) fn pass_prefix(occurrence: Uuid) -> String {
    format!("cohort.pass:{occurrence}:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fused_re_check_takes_the_same_hold_gate() {
        assert!(HOLD_GATE_CLASS.parse::<i32>().is_ok());
        let functions = include_str!("../../migrations/0013_hold_functions.sql");
        assert!(functions.contains(&format!(
            "pg_advisory_xact_lock_shared({HOLD_GATE_CLASS}, {{retention_hold:regclass}}::pg_catalog.oid::int4)"
        )));
    }

    #[test]
    fn keys_are_namespaced_by_kind() {
        let id = Uuid::nil();
        assert_eq!(
            LockKey::Run(id).text(),
            "cohort.run:00000000-0000-0000-0000-000000000000"
        );
        assert_eq!(LockKey::Migrate("public").text(), "cohort.migrate:public");
        let table = crate::base::ident::QualifiedName::new("a.b", "sweep_run");
        assert_eq!(
            LockKey::Worker(&table).text(),
            "cohort.worker:\"a.b\".\"sweep_run\""
        );
        assert_eq!(
            LockKey::Pass(id, 3).text(),
            "cohort.pass:00000000-0000-0000-0000-000000000000:3"
        );
    }
}
