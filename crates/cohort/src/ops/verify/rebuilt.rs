//! The records links stand for, rebuilt from the ledger's rows and
//! compared with what each link recorded: runs, holds, releases, erasure
//! requests and their events.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::chain::{self, BreakKind, LinkKind, ReleaseRecord};
use crate::domain::request_rules::{due_moved_in, step_refused};
use crate::error::Result;
use crate::run::chain as records;
use crate::sql::chain as statements;

use super::{label, Walk, FIELDS, KEEP};

pub(super) async fn check_runs(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    runs: Vec<(i64, Uuid, String)>,
    walk: &mut Walk,
) -> Result<()> {
    if runs.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = runs.iter().map(|r| r.1).collect();
    let current = records::read_runs(conn, schema, &ids).await?;
    for (link_id, run_id, linked) in runs {
        let name = label(LinkKind::Run, Some(run_id), link_id);
        match current.get(&run_id) {
            None => walk.gone(link_id, LinkKind::Run, run_id, linked),
            Some(now) => {
                walk.records_checked += 1;
                let mut now = now.clone();
                if serde_json::from_str::<chain::RunRecord>(&linked)
                    .is_ok_and(|l| l.details.is_none())
                {
                    // Linked before schema 20, which added the details' digest.
                    now.details = None;
                }
                let now = chain::canonical(&now);
                if now != linked {
                    let fields = name_summaries(&linked, chain::differences(&linked, &now, FIELDS))
                        .join("; ");
                    walk.broken(
                        Some(link_id),
                        name,
                        BreakKind::Changed,
                        format!("the ledger's rows differ from the linked record: {fields}"),
                    );
                }
            }
        }
    }
    Ok(())
}

/// Differences as a person reads them: `summaries[3].affected_count`
/// becomes `summaries[3] (Invoice, tenant aaaa…).affected_count`, the
/// entity (and tenant) the linked record gives that summary.
fn name_summaries(linked: &str, fields: Vec<String>) -> Vec<String> {
    let Ok(run) = serde_json::from_str::<chain::RunRecord>(linked) else {
        return fields;
    };
    fields
        .into_iter()
        .map(|f| {
            let Some(rest) = f.strip_prefix("summaries[") else {
                return f;
            };
            let Some((index, tail)) = rest.split_once(']') else {
                return f;
            };
            match index
                .parse::<usize>()
                .ok()
                .and_then(|i| run.summaries.get(i))
            {
                Some(s) => format!(
                    "summaries[{index}] ({}{}){tail}",
                    s.entity_type,
                    s.tenant_id
                        .as_deref()
                        .map(|t| format!(", tenant {t}"))
                        .unwrap_or_default()
                ),
                None => f,
            }
        })
        .collect()
}

pub(super) async fn check_holds(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    holds: Vec<(i64, LinkKind, Uuid, String)>,
    walk: &mut Walk,
) -> Result<()> {
    if holds.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = holds.iter().map(|h| h.2).collect();
    let current = records::read_holds(conn, schema, &ids).await?;
    for (link_id, kind, hold_id, linked) in holds {
        let name = label(kind, Some(hold_id), link_id);
        let Some(now) = current.get(&hold_id) else {
            walk.gone(link_id, kind, hold_id, linked);
            continue;
        };
        if kind == LinkKind::HoldReleased {
            match serde_json::from_str::<ReleaseRecord>(&linked) {
                Ok(r) => {
                    walk.releases.insert(hold_id, (link_id, r));
                }
                Err(_) => walk.broken(
                    Some(link_id),
                    name,
                    BreakKind::Changed,
                    "its record is not a release".into(),
                ),
            }
            continue;
        }
        walk.records_checked += 1;
        if now.released_at.is_some() {
            walk.released_holds.insert(hold_id, link_id);
        }
        let mut now = now.placed.clone();
        if serde_json::from_str::<chain::HoldRecord>(&linked).is_ok_and(|l| l.forms.is_none()) {
            // Linked before schema 20, which added the subject's forms.
            now.forms = None;
        }
        let now = chain::canonical(&now);
        if now != linked {
            let fields = chain::differences(&linked, &now, FIELDS).join("; ");
            walk.broken(
                Some(link_id),
                name,
                BreakKind::Changed,
                format!("the hold differs from the linked record: {fields} (reason and subject are compared as digests)"),
            );
        }
    }
    Ok(())
}

/// Each request history line's link against the line now; the request
/// part of each request's newest link is compared with the request after
/// the walk ([`check_requests`]).
pub(super) async fn check_request_events(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    events: Vec<(i64, Uuid, String)>,
    walk: &mut Walk,
) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let mut linked = Vec::new();
    for (link_id, request_id, record) in events {
        match serde_json::from_str::<chain::RequestRecord>(&record) {
            Ok(r) => linked.push((link_id, request_id, r)),
            Err(_) => walk.broken(
                Some(link_id),
                format!("erasure request {request_id}"),
                BreakKind::Changed,
                "its record is not a request's history line".into(),
            ),
        }
    }
    let ids: Vec<i64> = linked.iter().map(|l| l.2.event.event_id).collect();
    let now = records::read_request_events(conn, schema, &ids).await?;
    for (link_id, request_id, r) in linked {
        let name = format!(
            "erasure request {} (history line {})",
            r.request.reference, r.event.event_id
        );
        walk.records_checked += 1;
        match now.get(&r.event.event_id) {
            None => walk.broken(
                Some(link_id),
                name,
                BreakKind::Missing,
                "its history line was deleted".into(),
            ),
            Some(records::EventLine {
                request_id: owner,
                part: line,
                ..
            }) => {
                if *owner != request_id || *line != r.event {
                    let fields = chain::differences(
                        &chain::canonical(&r.event),
                        &chain::canonical(line),
                        FIELDS,
                    )
                    .join("; ");
                    walk.broken(
                        Some(link_id),
                        name,
                        BreakKind::Changed,
                        format!("the history line differs from the linked one: {fields}"),
                    );
                }
            }
        }
        if let Some((earlier_link, earlier)) = walk.requests.get(&request_id).cloned() {
            let moved = now
                .get(&r.event.event_id)
                .and_then(|l| due_moved_in(&l.detail));
            let step = Step {
                earlier_link,
                earlier: &earlier,
                link_id,
                now: &r.request,
                moved,
            };
            check_step(walk, step);
        }
        walk.requests.insert(request_id, (link_id, r.request));
    }
    Ok(())
}

/// A request between two consecutive links of its history.
struct Step<'a> {
    earlier_link: i64,
    earlier: &'a chain::RequestPart,
    link_id: i64,
    now: &'a chain::RequestPart,
    /// The due date this link's line moved (from, to), if it moves one.
    moved: Option<(i64, i64)>,
}

/// What no line of Cohort's changes between two links of a request: its
/// terms once open, its due date but by a line that moves it (between the
/// two dates), its state but as an attempt steps it (a state set by hand,
/// work called failed or done, and then linked by the next line is named).
fn check_step(walk: &mut Walk, s: Step<'_>) {
    let name = format!("erasure request {}", s.now.reference);
    let mut changed = s.earlier.changed_since_opened(s.now);
    if s.earlier.due_at != s.now.due_at && s.moved != Some((s.earlier.due_at, s.now.due_at)) {
        changed.push("due_at");
    }
    if let Some(why) = step_refused(&s.earlier.state, &s.now.state, s.moved.is_some()) {
        walk.broken(
            Some(s.link_id),
            name.clone(),
            BreakKind::Changed,
            format!(
                "{why} (since its earlier linked line, link {})",
                s.earlier_link
            ),
        );
    }
    if !changed.is_empty() {
        walk.broken(
            Some(s.link_id),
            name,
            BreakKind::Changed,
            format!(
                "{} changed since its earlier linked line (link {}) by a line that does not change them",
                changed.join(", "),
                s.earlier_link
            ),
        );
    }
}

/// Each linked request as it stands now against its newest link (its
/// state, due date, completion: what the report's deadline figures count),
/// and every history line since the first linked one has a link.
pub(super) async fn check_requests(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    walk: &mut Walk,
) -> Result<()> {
    let requests = std::mem::take(&mut walk.requests);
    if requests.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = requests.keys().copied().collect();
    let now = records::read_requests(conn, schema, &ids).await?;
    let mut found = Vec::new();
    for (request_id, (link_id, linked)) in &requests {
        let name = format!("erasure request {}", linked.reference);
        // A link written before the scope was covered carries none: the
        // request is compared without it.
        let now_part = now.get(request_id).map(|current| chain::RequestPart {
            scope: linked.scope.as_ref().and(current.scope.clone()),
            ..current.clone()
        });
        match now_part.as_ref() {
            None => found.push((
                *link_id,
                name,
                BreakKind::Missing,
                "it was deleted".to_owned(),
            )),
            Some(current) if current != linked => {
                let fields = chain::differences(
                    &chain::canonical(linked),
                    &chain::canonical(current),
                    FIELDS,
                )
                .join("; ");
                found.push((
                    *link_id,
                    name,
                    BreakKind::Changed,
                    format!("the request differs from its newest linked history line: {fields}"),
                ));
            }
            Some(_) => {}
        }
    }
    for (link_id, name, kind, detail) in found {
        walk.broken(Some(link_id), name, kind, detail);
    }
    let unlinked: Vec<(i64, Uuid)> = statements::unlinked_events(schema, KEEP as i64)
        .query_as()
        .fetch_all(&mut *conn)
        .await?;
    for (event_id, request_id) in unlinked {
        walk.broken(
            None,
            format!("erasure request {request_id} (history line {event_id})"),
            BreakKind::Inserted,
            "written after the chain linked request histories, and has no link".into(),
        );
    }
    Ok(())
}

/// Each hold's release time against its latest release link; a hold in
/// the chain released without one was released outside the library.
pub(super) async fn check_releases(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    walk: &mut Walk,
) -> Result<()> {
    let mut ids: HashSet<Uuid> = walk.releases.keys().copied().collect();
    ids.extend(walk.released_holds.keys().copied());
    if ids.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = ids.into_iter().collect();
    let current = records::read_holds(conn, schema, &ids).await?;
    let mut found = Vec::new();
    for (hold_id, placed_link) in &walk.released_holds {
        if !walk.releases.contains_key(hold_id) {
            found.push((
                *placed_link,
                format!("hold {hold_id}"),
                "it carries a release time but its release has no link: released outside the library".to_string(),
            ));
        }
    }
    for (hold_id, (link_id, r)) in &walk.releases {
        let Some(now) = current.get(hold_id) else {
            continue;
        };
        let now_at = now.released_at.map(chain::micros);
        if now_at != Some(r.released_at) {
            let shown = |m: Option<i64>| {
                m.and_then(DateTime::<Utc>::from_timestamp_micros)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_else(|| "none".into())
            };
            found.push((
                *link_id,
                format!("hold {hold_id}"),
                format!(
                    "its release time differs from the linked release: released_at: linked {}, now {}",
                    shown(Some(r.released_at)),
                    shown(now_at)
                ),
            ));
        }
    }
    for (link_id, name, detail) in found {
        walk.broken(Some(link_id), name, BreakKind::Changed, detail);
    }
    Ok(())
}
