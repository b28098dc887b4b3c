//! What each part of Cohort needs the database role to be allowed, checked
//! at start-up against the live grants (`has_table_privilege`,
//! `has_function_privilege`), so that a role without them gets one clear
//! error listing every missing grant, not a failure in the middle of a run
//! or a delivery.

use crate::base::ident::QualifiedName;
use crate::context::{Prepared, Ready};
use crate::domain::rules::Strategy;
use crate::error::{Error, Problems, Result};
use crate::schema::CohortTable;
use crate::sql::grants as statements;

/// A part of Cohort that runs with the role's grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// Sweeps and erasure (the scheduled worker, `cohort sweep`): read
    /// and change the retained tables as their categories allow, write
    /// runs, summaries, details and queued work, read holds and settings.
    Runs,
    /// The row-handler dispatcher: claim and settle queued work, recover
    /// runs whose process died.
    Dispatcher,
    /// The history pruner: delete old runs with their rows, and old holds.
    Pruner,
    /// The maintenance service: settle runs whose process died,
    /// dead-letter work no handler can deliver, scrub old payloads.
    Maintenance,
    /// The operations console and the read-only commands: read Cohort's
    /// tables.
    Console,
}

impl Access {
    fn name(self) -> &'static str {
        match self {
            Access::Runs => "sweeps and erasure",
            Access::Dispatcher => "the dispatcher",
            Access::Pruner => "the pruner",
            Access::Maintenance => "the maintenance service",
            Access::Console => "the console",
        }
    }
}

/// What a privilege is on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Object {
    Table(QualifiedName),
    /// A function, with its argument types in parentheses.
    Function(QualifiedName, &'static str),
}

impl Object {
    fn name(&self) -> &QualifiedName {
        match self {
            Object::Table(n) | Object::Function(n, _) => n,
        }
    }

    fn arguments(&self) -> &'static str {
        match self {
            Object::Table(_) => "",
            Object::Function(_, args) => args,
        }
    }

    /// How a `GRANT` names it.
    fn granted_on(&self) -> String {
        match self {
            Object::Table(n) => n.display_plain(),
            Object::Function(n, args) => format!("FUNCTION {}{args}", n.display_plain()),
        }
    }
}

/// One needed privilege: (object, privilege, why).
type Need = (Object, &'static str, String);

/// The functions a part calls: a sweep's batch statement calls
/// `retention_hold_recent` to re-check holds written after its snapshot
/// (schema 12), and an archive batch `retention_archive_check` to compare
/// the copies with the rows it deleted (schema 13). A database that
/// revokes `EXECUTE` on new functions from `PUBLIC` must grant them.
fn cohort_functions(schema: &str, access: Access) -> Vec<Need> {
    match access {
        Access::Runs => vec![
            (
                Object::Function(
                    QualifiedName::new(schema, "retention_hold_recent"),
                    "(uuid, pg_snapshot, bigint)",
                ),
                "EXECUTE",
                format!(
                    "{} (a batch re-checks holds written after its snapshot)",
                    access.name()
                ),
            ),
            (
                Object::Function(
                    QualifiedName::new(schema, "retention_archive_check"),
                    "(bigint, bigint, bigint)",
                ),
                "EXECUTE",
                format!(
                    "{} (an archive batch checks its copies against the rows it deletes)",
                    access.name()
                ),
            ),
        ],
        _ => Vec::new(),
    }
}

fn cohort_tables(schema: &str, access: Access) -> Vec<Need> {
    use CohortTable::*;
    let list: &[(CohortTable, &[&'static str])] = match access {
        Access::Runs => &[
            (Peer, &["SELECT"]),
            (SweepRun, &["SELECT", "INSERT", "UPDATE"]),
            (EntitySummary, &["SELECT", "INSERT", "UPDATE"]),
            (RowDetail, &["SELECT", "INSERT"]),
            (HandlerStatus, &["SELECT", "INSERT"]),
            (Hold, &["SELECT"]),
            (Setting, &["SELECT"]),
            (Pacing, &["SELECT"]),
            (Occurrence, &["SELECT", "INSERT", "UPDATE"]),
            (OccurrencePass, &["SELECT", "INSERT", "UPDATE", "DELETE"]),
            (LedgerLink, &["SELECT", "INSERT"]),
        ],
        Access::Dispatcher => &[
            (SweepRun, &["SELECT", "UPDATE"]),
            (RowDetail, &["SELECT"]),
            (HandlerStatus, &["SELECT", "UPDATE"]),
        ],
        Access::Maintenance => &[
            (Peer, &["SELECT", "INSERT", "UPDATE", "DELETE"]),
            (SweepRun, &["SELECT", "UPDATE"]),
            (RowDetail, &["SELECT"]),
            (HandlerStatus, &["SELECT", "UPDATE"]),
            (ErasureRequest, &["SELECT", "UPDATE"]),
            (ErasureRequestEvent, &["SELECT", "INSERT"]),
            (LedgerLink, &["SELECT", "INSERT"]),
        ],
        Access::Pruner => &[
            (SweepRun, &["SELECT", "DELETE"]),
            (EntitySummary, &["SELECT", "DELETE"]),
            (RowDetail, &["SELECT", "DELETE"]),
            (HandlerStatus, &["SELECT", "DELETE"]),
            (Hold, &["SELECT", "DELETE"]),
            (Setting, &["SELECT"]),
            (Occurrence, &["SELECT", "DELETE"]),
            (OccurrencePass, &["SELECT", "DELETE"]),
            (LedgerLink, &["SELECT", "INSERT"]),
        ],
        Access::Console => &[
            (Peer, &["SELECT"]),
            (SweepRun, &["SELECT"]),
            (EntitySummary, &["SELECT"]),
            (RowDetail, &["SELECT"]),
            (HandlerStatus, &["SELECT"]),
            (Hold, &["SELECT"]),
            (Setting, &["SELECT"]),
            (Pacing, &["SELECT"]),
            (Occurrence, &["SELECT"]),
            (OccurrencePass, &["SELECT"]),
            (ErasureRequest, &["SELECT"]),
            (ErasureRequestEvent, &["SELECT"]),
            (LedgerLink, &["SELECT"]),
        ],
    };
    list.iter()
        .flat_map(|(t, privileges)| {
            privileges.iter().map(move |p| {
                (
                    Object::Table(t.qualified(schema)),
                    *p,
                    access.name().to_string(),
                )
            })
        })
        .collect()
}

/// The retained tables: read always; delete when a category may purge or
/// archive, update when it may mutate at all (row locks need it), insert
/// into the archive table when it may archive.
fn retained_tables(ready: &Prepared) -> Vec<Need> {
    let mut out = Vec::new();
    for e in ready.model.ordered() {
        let table = &e.table;
        out.push((
            Object::Table(table.clone()),
            "SELECT",
            format!("sweeps of {}", e.name),
        ));
        let Some(plan) = ready.plans.get(&e.id) else {
            continue;
        };
        let caps = ready.model.capabilities.get(&e.id);
        for strategy in plan.strategies.keys().copied().filter(|s| s.mutates()) {
            if let (Strategy::Archive, Some(archive)) = (strategy, &e.archive) {
                out.push((
                    Object::Table(archive.table.clone()),
                    "INSERT",
                    format!("archive of {} (its category may archive)", e.name),
                ));
            }
            let privilege = match strategy {
                Strategy::Purge | Strategy::Archive => "DELETE",
                Strategy::SoftDelete | Strategy::Anonymise => "UPDATE",
                _ => continue,
            };
            // The statement exists for a strategy the category may return,
            // or for erasure, which deletes (or anonymises) a subject's
            // rows whatever the category's own strategy.
            let why = if caps.is_some_and(|c| c.allows(strategy)) {
                format!(
                    "{} of {} (its category may {})",
                    strategy.as_str(),
                    e.name,
                    strategy.as_str()
                )
            } else {
                format!(
                    "erasure of {} (an erasure {} the subject's rows)",
                    e.name,
                    if strategy.deletes() {
                        "deletes"
                    } else {
                        "anonymises"
                    }
                )
            };
            out.push((Object::Table(table.clone()), privilege, why));
        }
        if plan.strategies.keys().any(|s| s.mutates()) {
            // Every mutating batch locks its rows first (`FOR UPDATE`), and
            // PostgreSQL allows a row lock only with UPDATE on the table,
            // whatever the strategy.
            out.push((
                Object::Table(table.clone()),
                "UPDATE",
                format!(
                    "row locks of {} (a batch locks its rows FOR UPDATE)",
                    e.name
                ),
            ));
        }
    }
    out
}

/// Checks every grant `accesses` need; one error lists all that are missing.
pub(crate) async fn check(cx: &Ready<'_>, accesses: &[Access]) -> Result<()> {
    let ready = cx.plans();
    let mut needs: Vec<Need> = Vec::new();
    for access in accesses {
        needs.extend(cohort_tables(&cx.config.schema, *access));
        needs.extend(cohort_functions(&cx.config.schema, *access));
        if *access == Access::Runs {
            needs.extend(retained_tables(ready));
        }
    }
    needs.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    // One line per grant, naming every part that needs it.
    needs.dedup_by(|later, kept| {
        let same = later.0 == kept.0 && later.1 == kept.1;
        if same && !kept.2.split("; ").any(|w| w == later.2) {
            kept.2 = format!("{}; {}", kept.2, later.2);
        }
        same
    });
    let privileges = statements::Privileges {
        schemas: needs.iter().map(|n| n.0.name().schema.clone()).collect(),
        names: needs.iter().map(|n| n.0.name().name.clone()).collect(),
        privileges: needs.iter().map(|n| n.1).collect(),
        arguments: needs.iter().map(|n| n.0.arguments()).collect(),
    };
    let missing: Vec<bool> = statements::missing(privileges)
        .query_scalar()
        .fetch_all(&cx.pool)
        .await?;
    let problems: Vec<String> = needs
        .iter()
        .zip(missing)
        .filter(|(_, m)| *m)
        .map(|((object, privilege, why), _)| {
            format!(
                "GRANT {privilege} ON {} is missing (needed by {why})",
                object.granted_on()
            )
        })
        .collect();
    // Not a grant, but what runs need as much: the hash key, for entities
    // that anonymise with `hash` (read-only parts do without it).
    let unkeyed = accesses
        .contains(&Access::Runs)
        .then(|| crate::validate::hash_key_missing(&cx.config, ready.model.ordered()))
        .flatten();
    if problems.is_empty() {
        return match unkeyed {
            Some(refused) => Err(refused),
            None => Ok(()),
        };
    }
    let role: String = statements::current_role()
        .query_scalar()
        .fetch_one(&cx.pool)
        .await?;
    Err(Error::Config(Problems::global(
        std::iter::once(format!(
            "role {role:?} lacks {} grant(s); nothing was started",
            problems.len()
        ))
        .chain(problems),
    )))
}
