//! Peers: the processes that sweep one database, as Oban and River track
//! theirs. Every process running [`crate::services::Services`] (so every
//! `cohort worker`) records itself in `retention_peer` with a heartbeat:
//! its host and pid, a fingerprint of its policy, and the row handlers it
//! has per entity. Two uses:
//!
//! - **Fail closed.** A run never mutates rows of an entity for which a
//!   live peer registered a handler this process lacks: during a rolling
//!   deploy the replica without the new handler would purge rows without
//!   queuing that handler's work, and those rows would never reach it. The
//!   entity fails with the reason instead (`cohort_peer_conflicts_total`).
//! - **Report disagreement.** Replicas whose policy fingerprints differ are
//!   reported by `cohort validate`, in the worker's log, on the console and
//!   as `cohort_peers{state}`; and an occurrence is done only for the
//!   policy that ran it, so another policy's entities are still swept.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::context::{Context, Prepared, Ready};
use crate::error::Result;
use crate::sql::peers as statements;

/// How often a process renews its peer record.
pub const PEER_HEARTBEAT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// A peer whose heartbeat is older than this is not live (six missed
/// heartbeats): its record no longer holds anyone back.
pub const PEER_TIMEOUT_SECONDS: f64 = 60.0;

/// The handlers of each entity, by identity.
pub type HandlerSets = BTreeMap<Uuid, BTreeSet<String>>;

/// Another live process sweeping the same database.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Peer {
    /// Its id (new at every start).
    pub peer_id: Uuid,
    /// Its host name.
    pub host: String,
    /// Its process id.
    pub pid: i32,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// Its policy's fingerprint.
    pub policy_fingerprint: String,
    /// Whether its policy is this process's.
    pub same_policy: bool,
    /// Its handlers per entity.
    pub handlers: HandlerSets,
}

/// This process's handlers per entity.
pub(crate) fn own_handlers(cx: &Context) -> HandlerSets {
    cx.handlers
        .iter()
        .map(|(entity, hs)| {
            (
                *entity,
                hs.iter().map(|h| h.registration.identity.clone()).collect(),
            )
        })
        .collect()
}

/// A fingerprint of what this process sweeps: every retained entity (id,
/// table, category, tenancy) and its handlers, hashed. Two processes with
/// the same fingerprint sweep the same way.
pub(crate) fn fingerprint(cx: &Context, prepared: &Prepared) -> String {
    let handlers = own_handlers(cx);
    let mut entities: Vec<String> = prepared
        .model
        .entities
        .iter()
        .map(|e| {
            format!(
                "{}|{}|{}|{}|{}",
                e.id,
                e.table.path(),
                e.category,
                e.tenant.is_some(),
                handlers
                    .get(&e.id)
                    .map(|h| h.iter().cloned().collect::<Vec<_>>().join(","))
                    .unwrap_or_default()
            )
        })
        .collect();
    entities.sort();
    crate::base::digest::sha256_hex(&[entities.join("\n").as_bytes()])[..16].to_owned()
}

/// A `retention_peer` row as read.
type PeerRow = (
    Uuid,
    String,
    i32,
    DateTime<Utc>,
    DateTime<Utc>,
    String,
    serde_json::Value,
);

/// This machine's host name (`HOSTNAME`, else `/etc/hostname`), or
/// `unknown`.
pub(crate) fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// This process as people reading the ledger know it: `host:pid` (read
/// once per process).
pub(crate) fn process_name() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| format!("{}:{}", host_name(), std::process::id()))
        .clone()
}

/// Renews (or creates) this process's record.
pub(crate) async fn heartbeat(cx: &Ready<'_>, peer_id: Uuid) -> Result<()> {
    let prepared = cx.plans();
    let handlers = serde_json::to_value(own_handlers(cx)).expect("handler sets serialise");
    let params = statements::Heartbeat {
        peer_id,
        host: host_name(),
        pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
        policy_fingerprint: fingerprint(cx, prepared),
        handlers,
    };
    statements::heartbeat(&cx.config.schema, params)
        .query()
        .execute(&cx.pool)
        .await?;
    Ok(())
}

/// Removes this process's record (at shutdown), and records of peers long
/// dead (ten timeouts), so the table stays small.
pub(crate) async fn leave(cx: &Context, peer_id: Uuid) -> Result<()> {
    let params = statements::Leave {
        peer_id,
        dead_after_secs: PEER_TIMEOUT_SECONDS * 10.0,
    };
    statements::leave(&cx.config.schema, params)
        .query()
        .execute(&cx.pool)
        .await?;
    Ok(())
}

/// The live peers other than `me`.
pub(crate) async fn live(cx: &Ready<'_>, me: Option<Uuid>) -> Result<Vec<Peer>> {
    let prepared = cx.plans();
    let ours = fingerprint(cx, prepared);
    let params = statements::Live {
        timeout_secs: PEER_TIMEOUT_SECONDS,
        me,
    };
    let rows: Vec<PeerRow> = statements::live(&cx.config.schema, params)
        .query_as()
        .fetch_all(&cx.pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(
            |(peer_id, host, pid, started_at, heartbeat_at, fp, handlers)| Peer {
                peer_id,
                host,
                pid,
                started_at,
                heartbeat_at,
                same_policy: fp == ours,
                policy_fingerprint: fp,
                // A record this version cannot read holds nothing back.
                handlers: serde_json::from_value(handlers).unwrap_or_default(),
            },
        )
        .collect())
}

/// Every peer record by heartbeat: (alive, stale). Alive ones (this
/// process's own included) were heard from within [`PEER_TIMEOUT_SECONDS`];
/// stale ones were not and are not removed yet. Also sets
/// `cohort_peers{state="alive"|"stale"}`.
pub(crate) async fn census(cx: &Context) -> Result<(u64, u64)> {
    let params = statements::Census {
        timeout_secs: PEER_TIMEOUT_SECONDS,
    };
    let (alive, stale): (i64, i64) = statements::census(&cx.config.schema, params)
        .query_as()
        .fetch_one(&cx.pool)
        .await?;
    let (alive, stale) = (alive.max(0) as u64, stale.max(0) as u64);
    crate::domain::telemetry::peer_census(alive, stale);
    Ok((alive, stale))
}

/// Why this process must not mutate `entity`'s rows: live peers that
/// register handlers for it that this process lacks. `None` when none do.
pub(crate) fn conflict(cx: &Context, peers: &[Peer], entity: Uuid) -> Option<String> {
    let ours = own_handlers(cx).remove(&entity).unwrap_or_default();
    let mut missing: Vec<String> = Vec::new();
    for peer in peers {
        if let Some(theirs) = peer.handlers.get(&entity) {
            for h in theirs.difference(&ours) {
                missing.push(format!(
                    "{h:?} (registered by {} pid {})",
                    peer.host, peer.pid
                ));
            }
        }
    }
    missing.sort();
    missing.dedup();
    (!missing.is_empty()).then(|| {
        format!(
            "a live peer has handler(s) this process lacks: {}; its rows are left alone so that no handler work is lost (deploy the same handlers here, or stop that peer)",
            missing.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_constants_leave_room_for_missed_heartbeats() {
        assert!(PEER_TIMEOUT_SECONDS >= 5.0 * PEER_HEARTBEAT_INTERVAL.as_secs_f64());
    }
}
