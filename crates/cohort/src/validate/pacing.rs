//! `max_rows_per_second` and `max_replica_lag`, global and per entity:
//! their ranges, and whether the role can read what `max_replica_lag`
//! waits on.

use sqlx::PgConnection;

use crate::config::CohortConfig;
use crate::domain::model::EntityDescriptor;
use crate::error::{Problem, Result};

/// Each entity's own limits in range (the global ones are checked with
/// the configuration).
pub(super) fn entity_problems(entities: &[EntityDescriptor]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for e in entities {
        if e.max_rows_per_second == Some(0) {
            problems.push(Problem::entity(
                &e.name,
                "max_rows_per_second = 0: at least 1 (leave it out for the global pace)",
            ));
        }
        if e.max_replica_lag.is_some_and(|lag| lag.as_millis() < 1_000) {
            problems.push(Problem::entity(
                &e.name,
                "max_replica_lag is under a second: at least 1s (leave it out to not wait for standbys)",
            ));
        }
    }
    problems
}

/// With a `max_replica_lag` anywhere: the role must see every standby's
/// replay position (a problem naming the grant), and a server with no
/// standby streaming is worth a warning (nothing will be waited for).
pub(super) async fn replica_lag_checks(
    conn: &mut PgConnection,
    config: &CohortConfig,
    entities: &[EntityDescriptor],
) -> Result<(Vec<Problem>, Vec<String>)> {
    let wanted =
        config.max_replica_lag.is_some() || entities.iter().any(|e| e.max_replica_lag.is_some());
    if !wanted {
        return Ok((Vec::new(), Vec::new()));
    }
    let (role, can_read): (String, bool) = crate::sql::pacing::can_read_lag()
        .query_as()
        .fetch_one(&mut *conn)
        .await?;
    if !can_read {
        return Ok((
            vec![Problem::global(format!(
                "max_replica_lag needs to read every standby's replay position, and role {role:?} cannot (PostgreSQL hides other roles' replication rows): GRANT pg_monitor TO \"{role}\" (or pg_read_all_stats), or leave max_replica_lag out"
            ))],
            Vec::new(),
        ));
    }
    let standbys = crate::sql::pacing::standbys()
        .query()
        .fetch_all(&mut *conn)
        .await?;
    let warnings = if standbys.is_empty() {
        vec!["max_replica_lag is set, but no standby is streaming from this server now: sweeps wait for none, and each run records that nothing was waited for".to_owned()]
    } else {
        Vec::new()
    };
    Ok((Vec::new(), warnings))
}
