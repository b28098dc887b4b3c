//! `cohort erase-requests`: list erasure requests, show one with its
//! history, move a due date; and the request terms of `cohort erase`.

use clap::Subcommand;
use cohort::erasure::ErasureRequest;
use cohort::erasure_requests::{Due, RequestFilter, RequestRecord, RequestState};
use cohort::Cohort;

use crate::output::{print_json, table};
use crate::Failure;

use super::*;

/// `cohort erase-requests …`.
#[derive(Debug, Subcommand)]
pub(crate) enum RequestsCommand {
    /// List erasure requests, oldest received first.
    List {
        /// Only requests not completed and past their due date.
        #[arg(long)]
        overdue: bool,
        /// Only requests in this state (open, in_progress, waiting,
        /// completed, failed).
        #[arg(long)]
        state: Option<String>,
    },
    /// One request by its reference, with every change of its state.
    Show {
        /// The request's reference.
        reference: String,
    },
    /// Move a request's due date (set or extend it), recording why.
    Extend {
        /// The request's reference.
        reference: String,
        /// The new due date: a period after the request was received (60d,
        /// 2mo), a date (its end, UTC) or an RFC 3339 time.
        #[arg(long)]
        due: String,
        /// Why (recorded in the request's history).
        #[arg(long)]
        reason: String,
    },
}

/// `--reference`, `--due`, `--due-reason` and `--note` of `cohort erase`,
/// checked before the database is opened.
#[derive(Debug)]
pub(crate) struct RequestTerms {
    reference: String,
    due: Option<Due>,
    due_reason: Option<String>,
    note: Option<String>,
}

impl RequestTerms {
    /// `None` without `--reference` (clap requires it for the others).
    pub(crate) fn new(
        reference: &Option<String>,
        due: &Option<String>,
        due_reason: &Option<String>,
        note: &Option<String>,
    ) -> Result<Option<Self>, Failure> {
        let Some(reference) = reference else {
            return Ok(None);
        };
        let due = due
            .as_deref()
            .map(Due::parse)
            .transpose()
            .map_err(Failure::Input)?;
        Ok(Some(Self {
            reference: reference.clone(),
            due,
            due_reason: due_reason.clone(),
            note: note.clone(),
        }))
    }

    /// The erasure, opened as this request.
    pub(crate) fn apply(self, mut req: ErasureRequest) -> ErasureRequest {
        req = req.reference(self.reference);
        if let Some(d) = self.due {
            req = req.due(d);
        }
        if let Some(r) = self.due_reason {
            req = req.due_reason(r);
        }
        if let Some(n) = self.note {
            req = req.note(n);
        }
        req
    }
}

const HEADERS: [&str; 7] = [
    "REFERENCE",
    "STATE",
    "TENANT",
    "RECEIVED",
    "DUE",
    "OVERDUE",
    "WAITING",
];

fn row(r: &RequestRecord) -> Vec<String> {
    vec![
        r.reference.clone(),
        r.state.to_string(),
        r.tenant.clone().unwrap_or_else(|| "-".into()),
        r.received_at.format("%Y-%m-%d %H:%M").to_string(),
        r.due_at.format("%Y-%m-%d %H:%M").to_string(),
        if r.overdue { "yes" } else { "no" }.into(),
        waiting(r),
    ]
}

fn waiting(r: &RequestRecord) -> String {
    if r.waiting.is_empty() {
        return "-".into();
    }
    r.waiting
        .iter()
        .map(|p| {
            let until = p
                .until
                .map(|t| format!(" until {}", t.format("%Y-%m-%d")))
                .unwrap_or_default();
            format!("{} {} ({}{until})", p.entity, p.rows, p.reason)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The lines `cohort erase --reference` prints after the run.
pub(super) fn print_request(r: &RequestRecord) {
    outln!(
        "Erasure request {}: {} (due {}{})",
        r.reference,
        r.state,
        r.due_at.to_rfc3339(),
        if r.overdue { ", overdue" } else { "" }
    );
    for p in &r.waiting {
        let until = p
            .until
            .map(|t| format!(", can go from {}", t.to_rfc3339()))
            .unwrap_or_default();
        outln!(
            "  waiting: {} {} row(s): {}{until}",
            p.entity,
            p.rows,
            p.reason.describe()
        );
    }
    if let Some(e) = &r.error {
        outln!("  failed: {e}");
    }
}

pub(crate) async fn requests(
    cohort: &Cohort,
    json: bool,
    cmd: &RequestsCommand,
) -> Result<(), Failure> {
    match cmd {
        RequestsCommand::List { overdue, state } => {
            let mut filter = RequestFilter::new();
            if let Some(s) = state {
                let st = RequestState::parse(s).ok_or_else(|| {
                    bad(format!(
                        "--state {s:?}: one of {}",
                        RequestState::ALL.map(|s| s.as_str()).join(", ")
                    ))
                })?;
                filter = filter.state(st);
            }
            if *overdue {
                filter = filter.overdue_at(chrono::Utc::now());
            }
            let list = cohort.erasure_requests(filter).await?;
            if json {
                print_json(&serde_json::to_value(&list).expect("requests serialise"));
            } else {
                let rows: Vec<Vec<String>> = list.iter().map(row).collect();
                outln!("{}", table(&HEADERS, &rows));
            }
        }
        RequestsCommand::Show { reference } => {
            let shown = cohort.erasure_request(reference).await?;
            if json {
                print_json(&serde_json::to_value(&shown).expect("request serialises"));
            } else {
                let r = &shown.request;
                print_request(r);
                outln!(
                    "  subject: {}",
                    r.subject.as_deref().unwrap_or("(cleared on completion)")
                );
                outln!("  subject hash: {}", r.subject_hash);
                outln!("  received: {}", r.received_at.to_rfc3339());
                if let Some(why) = &r.due_reason {
                    outln!("  due because: {why}");
                }
                if let Some(n) = &r.note {
                    outln!("  note: {n}");
                }
                for e in &shown.events {
                    outln!(
                        "  {}  {:<11} {}{}",
                        e.at.to_rfc3339(),
                        e.state.as_str(),
                        e.detail,
                        e.run_id
                            .map(|id| format!(" (run {id})"))
                            .unwrap_or_default()
                    );
                }
            }
        }
        RequestsCommand::Extend {
            reference,
            due,
            reason,
        } => {
            let due = Due::parse(due).map_err(Failure::Input)?;
            let r = cohort
                .extend_erasure_request(reference, due, reason)
                .await?;
            if json {
                print_json(&serde_json::to_value(&r).expect("request serialises"));
            } else {
                print_request(&r);
            }
        }
    }
    Ok(())
}
