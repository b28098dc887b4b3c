//! Statements of `retention_pacing` (live pauses and limits) and of the
//! standbys' replay, which a paced sweep reads before each batch.

use chrono::{DateTime, Utc};

use super::statement::{Args, Params, Statement};
use crate::base::ident::SqlText;
use crate::sql::tables::CohortTable;

/// The scope of a live value: one entity type, or every entity.
pub(crate) const EVERY_ENTITY: &str = "*";

/// The columns every read returns ([`PacingRow`]), `lag_ms` as whole
/// milliseconds, and the server's clock at the read (a pause is counted
/// from its row's `updated_at` on that same clock).
const COLUMNS: &str = "SELECT entity_type, paused, max_rows_per_second, \
     (pg_catalog.date_part('epoch', max_replica_lag) * 1000)::bigint AS lag_ms, \
     updated_at, updated_by, pg_catalog.statement_timestamp() AS read_at FROM ";

/// One row of `retention_pacing`, as [`for_entity`] and [`all`] return it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct PacingRow {
    /// An entity type, or [`EVERY_ENTITY`].
    pub(crate) entity_type: String,
    pub(crate) paused: bool,
    pub(crate) max_rows_per_second: Option<i32>,
    /// `max_replica_lag` in whole milliseconds.
    pub(crate) lag_ms: Option<i64>,
    pub(crate) updated_at: DateTime<Utc>,
    pub(crate) updated_by: String,
    /// The server's clock when the row was read.
    pub(crate) read_at: DateTime<Utc>,
}

impl PacingRow {
    /// The rate limit, at least one row a second.
    pub(crate) fn rate(&self) -> Option<u32> {
        self.max_rows_per_second.map(|n| n.max(1) as u32)
    }

    /// The lag limit, never negative.
    pub(crate) fn lag(&self) -> Option<std::time::Duration> {
        self.lag_ms
            .map(|ms| std::time::Duration::from_millis(ms.max(0) as u64))
    }
}

/// One physical standby, as [`standbys`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct StandbyRow {
    pub(crate) name: String,
    /// This server's WAL position, in bytes.
    pub(crate) current_lsn: i64,
    /// The standby's replay position, in bytes.
    pub(crate) replay_lsn: Option<i64>,
    /// PostgreSQL's replay lag, in milliseconds.
    pub(crate) replay_lag_ms: Option<i64>,
}

/// The rows that apply to one entity: its own and `*`.
pub(crate) fn for_entity(schema: &str, entity: &str) -> Statement<Entity> {
    let mut sql = SqlText::new(COLUMNS);
    sql.table(&CohortTable::Pacing.qualified(schema))
        .push(" WHERE entity_type IN ('*', $1)");
    Statement::new(sql, Entity(entity.to_owned()))
}

/// Every row, `*` first.
pub(crate) fn all(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new(COLUMNS);
    sql.table(&CohortTable::Pacing.qualified(schema))
        .push(" ORDER BY entity_type <> '*', entity_type");
    Statement::new(sql, ())
}

/// One entity type (or `*`).
#[derive(Debug)]
pub(crate) struct Entity(pub(crate) String);

impl Params for Entity {
    fn bind(self, q: Args) -> Args {
        q.bind(self.0)
    }
}

/// One live value set (or cleared, with `None`), recording when and by
/// which role; the other values of the row stay as they are.
#[derive(Debug)]
pub(crate) struct Set {
    pub(crate) scope: String,
    pub(crate) value: SetValue,
}

/// Which value, and what to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SetValue {
    Paused(bool),
    Rate(Option<i32>),
    /// Milliseconds.
    Lag(Option<i64>),
}

impl Params for Set {
    fn bind(self, q: Args) -> Args {
        let q = q.bind(self.scope);
        match self.value {
            SetValue::Paused(p) => q.bind(p),
            SetValue::Rate(r) => q.bind(r),
            SetValue::Lag(ms) => q.bind(ms),
        }
    }
}

/// Sets one value of a scope's row, creating the row when it is missing.
pub(crate) fn set(schema: &str, params: Set) -> Statement<Set> {
    let (column, value) = match params.value {
        SetValue::Paused(_) => ("paused", "$2::boolean"),
        SetValue::Rate(_) => ("max_rows_per_second", "$2::integer"),
        SetValue::Lag(_) => ("max_replica_lag", "$2::bigint * interval '1 millisecond'"),
    };
    let mut sql = SqlText::new("INSERT INTO ");
    sql.table(&CohortTable::Pacing.qualified(schema))
        .push(" AS p (entity_type, ")
        .push(column)
        .push(") VALUES ($1, ")
        .push(value)
        .push(") ON CONFLICT (entity_type) DO UPDATE SET ")
        .push(column)
        .push(" = EXCLUDED.")
        .push(column)
        .push(
            ", updated_at = pg_catalog.clock_timestamp(), \
             updated_by = pg_catalog.\"session_user\"()",
        );
    Statement::new(sql, params)
}

/// The physical standbys streaming from this server now (logical
/// consumers, which connect to a database, are not standbys): each one's
/// name, how far its replay is behind this server's WAL position in bytes,
/// the two positions, and PostgreSQL's own replay lag in milliseconds
/// (NULL once an idle standby has caught up).
pub(crate) fn standbys() -> Statement<()> {
    Statement::new(
        SqlText::new(
            "SELECT coalesce(nullif(r.application_name, ''), r.client_addr::text, 'pid ' || r.pid) AS name, \
                    (pg_catalog.pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint AS current_lsn, \
                    (r.replay_lsn - '0/0'::pg_lsn)::bigint AS replay_lsn, \
                    (pg_catalog.date_part('epoch', r.replay_lag) * 1000)::bigint AS replay_lag_ms \
             FROM pg_catalog.pg_stat_replication r \
             JOIN pg_catalog.pg_stat_activity a ON a.pid = r.pid \
             WHERE a.datname IS NULL \
             ORDER BY 1",
        ),
        (),
    )
}

/// The current role, and whether it can read every standby's positions
/// (`pg_read_all_stats`, which `pg_monitor` includes, or superuser).
pub(crate) fn can_read_lag() -> Statement<()> {
    Statement::new(
        SqlText::new(
            "SELECT current_user::text, \
                    pg_catalog.pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') \
                 OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user)",
        ),
        (),
    )
}
