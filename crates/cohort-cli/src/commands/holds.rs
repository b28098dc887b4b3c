//! `cohort holds`: create, list and release legal holds.

use clap::Subcommand;
use cohort::holds::{Hold, HoldFilter, HoldRequest};
use cohort::Cohort;
use uuid::Uuid;

use crate::output::{print_json, table, with_record_arrays};
use crate::Failure;

use super::*;

#[derive(Debug, Subcommand)]
pub(crate) enum HoldsCommand {
    /// Place a hold on one record (`--entity`, `--record`) or on a subject
    /// (`--subject`, with `--kind` when subject columns declare kinds).
    Create {
        /// Entity id or display name.
        #[arg(long, requires = "record", required_unless_present = "subject")]
        entity: Option<String>,
        /// Record id (canonicalised with the key column's type; a negative
        /// number is a value).
        #[arg(long, requires = "entity", allow_negative_numbers = true)]
        record: Option<String>,
        /// A subject: protects every row of every entity whose subject
        /// columns (of the kind, or of none) equal it, rows written later
        /// included. A negative number is a value (`--subject -42`); other
        /// text starting with `-` needs `--subject=-x`.
        #[arg(long, conflicts_with_all = ["entity", "record"], allow_negative_numbers = true)]
        subject: Option<String>,
        /// The subject's kind (`user`, `email`, ...).
        #[arg(long, requires = "subject")]
        kind: Option<String>,
        /// Record hold: the row's tenant (omit for tenantless entities).
        /// Subject hold: protect only this tenant's rows (omit: every
        /// tenant's and the tenantless entities').
        #[arg(long, allow_negative_numbers = true)]
        tenant: Option<String>,
        /// Why.
        #[arg(long)]
        reason: String,
        /// When the hold lapses (RFC 3339).
        #[arg(long)]
        expires_at: Option<String>,
        /// Hold id (default: a new UUID).
        #[arg(long)]
        hold_id: Option<Uuid>,
    },
    /// List holds.
    List {
        /// Entity id or display name.
        #[arg(long)]
        entity: Option<String>,
        /// Tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Only holds active now.
        #[arg(long)]
        active: bool,
    },
    /// Release a hold now.
    Release {
        /// The hold's id, or a unique prefix of it (the 8 characters the
        /// console and `holds list` print).
        hold_id: String,
    },
}

/// Hold rows with entity names (the id when the entity is no longer declared).
pub(super) async fn hold_rows(
    cohort: &Cohort,
    holds: &[Hold],
) -> Result<Vec<Vec<String>>, Failure> {
    let model = cohort.ready().await?;
    Ok(holds
        .iter()
        .map(|h| {
            let (entity, record) = match (h.retention_entity_id, &h.record_id) {
                (Some(id), Some(record)) => (
                    model
                        .entity(id)
                        .map(|e| e.name.clone())
                        .unwrap_or_else(|| id.to_string()),
                    record.clone(),
                ),
                _ => (
                    match &h.subject_kind {
                        Some(kind) => format!("(subject, {kind})"),
                        None => "(subject)".to_owned(),
                    },
                    h.subject.clone().unwrap_or_default(),
                ),
            };
            vec![
                h.hold_id.to_string(),
                entity,
                record,
                hold_tenant(h),
                if h.active { "yes" } else { "no" }.to_string(),
                h.expires_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
                h.reason.clone(),
            ]
        })
        .collect())
}

/// Whose rows a hold reaches: its tenant; for a subject hold placed
/// without one, every tenant's; for a record of a tenantless entity, none.
pub(crate) fn hold_tenant(h: &Hold) -> String {
    match (&h.tenant_id, h.target) {
        (Some(t), _) => t.clone(),
        (None, cohort::holds::HoldTarget::Subject) => "all tenants".to_owned(),
        (None, _) => "tenantless".to_owned(),
    }
}

pub(super) const HOLD_HEADERS: [&str; 7] = [
    "HOLD",
    "ENTITY",
    "RECORD/SUBJECT",
    "TENANT",
    "ACTIVE",
    "EXPIRES",
    "REASON",
];

/// `cohort holds`: places, lists or releases holds, printed as a table
/// or as JSON.
pub(crate) async fn holds(cohort: &Cohort, json: bool, cmd: &HoldsCommand) -> Result<(), Failure> {
    match cmd {
        HoldsCommand::Create {
            entity,
            record,
            subject,
            kind,
            tenant,
            reason,
            expires_at,
            hold_id,
        } => {
            let mut req = match (entity, record, subject) {
                (Some(entity), Some(record), None) => {
                    HoldRequest::new(entity_id(cohort, entity).await?, record, reason)
                }
                (None, None, Some(subject)) => HoldRequest::subject(subject, reason),
                _ => unreachable!("clap requires --entity with --record, or --subject"),
            };
            if let Some(k) = kind {
                req = req.kind(k);
            }
            if let Some(t) = tenant {
                req = req.tenant(t);
            }
            if let Some(e) = expires_at {
                req = req.expires_at(parse_time(Some(e), "--expires-at")?);
            }
            if let Some(id) = hold_id {
                req = req.hold_id(*id);
            }
            create(cohort, json, req).await
        }
        HoldsCommand::List {
            entity,
            tenant,
            active,
        } => {
            let mut filter = HoldFilter::all().active_only(*active);
            if let Some(e) = entity {
                filter = filter.entity(entity_id(cohort, e).await?);
            }
            if let Some(t) = tenant {
                filter = filter.tenant(t);
            }
            list(cohort, json, &filter).await
        }
        HoldsCommand::Release { hold_id } => release(cohort, json, hold_id).await,
    }
}

/// Prints holds as JSON, each record id as its entity's key reads it
/// ([`with_record_arrays`]).
async fn print_holds_json(cohort: &Cohort, holds: serde_json::Value) -> Result<(), Failure> {
    print_json(&with_record_arrays(&*cohort.ready().await?, holds));
    Ok(())
}

/// `cohort holds create`: places the hold and prints it.
async fn create(cohort: &Cohort, json: bool, req: HoldRequest) -> Result<(), Failure> {
    let hold = cohort.create_hold(req).await?;
    if json {
        print_holds_json(
            cohort,
            serde_json::to_value(&hold).expect("hold serialises"),
        )
        .await
    } else {
        outln!("Hold {} placed.\n", hold.hold_id);
        outln!(
            "{}",
            table(&HOLD_HEADERS, &hold_rows(cohort, &[hold]).await?)
        );
        Ok(())
    }
}

/// `cohort holds list`: the holds the filter keeps.
async fn list(cohort: &Cohort, json: bool, filter: &HoldFilter) -> Result<(), Failure> {
    let holds = cohort.list_holds(filter).await?;
    if json {
        print_holds_json(
            cohort,
            serde_json::to_value(&holds).expect("holds serialise"),
        )
        .await
    } else {
        outln!(
            "{}",
            table(&HOLD_HEADERS, &hold_rows(cohort, &holds).await?)
        );
        Ok(())
    }
}

/// `cohort holds release`: releases the hold (its id or a unique prefix)
/// now.
async fn release(cohort: &Cohort, json: bool, hold_id: &str) -> Result<(), Failure> {
    let hold_id = cohort.find_hold(hold_id).await?;
    let hold = cohort.release_hold(hold_id).await?;
    if json {
        print_holds_json(
            cohort,
            serde_json::to_value(&hold).expect("hold serialises"),
        )
        .await
    } else {
        outln!("Hold {} released.", hold.hold_id);
        Ok(())
    }
}
