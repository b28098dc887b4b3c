//! Statements of `retention_peer`: each sweeping process's record.

use uuid::Uuid;

use super::statement::{Args, Params, Statement};
use crate::base::ident::SqlText;
use crate::sql::tables::CohortTable;

/// This process's record, created or renewed.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    pub(crate) peer_id: Uuid,
    pub(crate) host: String,
    pub(crate) pid: i32,
    pub(crate) policy_fingerprint: String,
    pub(crate) handlers: serde_json::Value,
}

impl Params for Heartbeat {
    fn bind(self, q: Args) -> Args {
        q.bind(self.peer_id)
            .bind(self.host)
            .bind(self.pid)
            .bind(self.policy_fingerprint)
            .bind(self.handlers)
    }
}

pub(crate) fn heartbeat(schema: &str, params: Heartbeat) -> Statement<Heartbeat> {
    let mut sql = SqlText::new("INSERT INTO ");
    sql.table(&CohortTable::Peer.qualified(schema)).push(
        " (peer_id, host, pid, policy_fingerprint, handlers) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (peer_id) DO UPDATE SET heartbeat_at = pg_catalog.clock_timestamp(), \
           policy_fingerprint = EXCLUDED.policy_fingerprint, handlers = EXCLUDED.handlers",
    );
    Statement::new(sql, params)
}

/// Removes this process's record and records silent for `dead_after_secs`.
#[derive(Debug)]
pub(crate) struct Leave {
    pub(crate) peer_id: Uuid,
    pub(crate) dead_after_secs: f64,
}

impl Params for Leave {
    fn bind(self, q: Args) -> Args {
        q.bind(self.peer_id).bind(self.dead_after_secs)
    }
}

pub(crate) fn leave(schema: &str, params: Leave) -> Statement<Leave> {
    let mut sql = SqlText::new("DELETE FROM ");
    sql.table(&CohortTable::Peer.qualified(schema)).push(
        " WHERE peer_id = $1 OR heartbeat_at < pg_catalog.clock_timestamp() \
           - pg_catalog.make_interval(secs => $2)",
    );
    Statement::new(sql, params)
}

/// Records heard from within `timeout_secs`, other than `me`.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) timeout_secs: f64,
    pub(crate) me: Option<Uuid>,
}

impl Params for Live {
    fn bind(self, q: Args) -> Args {
        q.bind(self.timeout_secs).bind(self.me)
    }
}

/// Columns: `peer_id, host, pid, started_at, heartbeat_at,
/// policy_fingerprint, handlers`.
pub(crate) fn live(schema: &str, params: Live) -> Statement<Live> {
    let mut sql = SqlText::new(
        "SELECT peer_id, host, pid, started_at, heartbeat_at, policy_fingerprint, handlers FROM ",
    );
    sql.table(&CohortTable::Peer.qualified(schema)).push(
        " WHERE heartbeat_at > pg_catalog.clock_timestamp() - pg_catalog.make_interval(secs => $1) \
           AND ($2::uuid IS NULL OR peer_id <> $2) ORDER BY started_at, peer_id",
    );
    Statement::new(sql, params)
}

/// Every record by whether it was heard from within `timeout_secs`
/// (columns `alive`, `stale`; this process's own record included).
#[derive(Debug)]
pub(crate) struct Census {
    pub(crate) timeout_secs: f64,
}

impl Params for Census {
    fn bind(self, q: Args) -> Args {
        q.bind(self.timeout_secs)
    }
}

pub(crate) fn census(schema: &str, params: Census) -> Statement<Census> {
    let mut sql = SqlText::new(
        "SELECT pg_catalog.count(*) FILTER (WHERE heartbeat_at > pg_catalog.clock_timestamp() \
           - pg_catalog.make_interval(secs => $1)) AS alive, \
         pg_catalog.count(*) FILTER (WHERE heartbeat_at <= pg_catalog.clock_timestamp() \
           - pg_catalog.make_interval(secs => $1)) AS stale FROM ",
    );
    sql.table(&CohortTable::Peer.qualified(schema));
    Statement::new(sql, params)
}
