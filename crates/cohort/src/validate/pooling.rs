//! Cohort's run, worker and occurrence locks are session advisory locks:
//! they belong to one server session from `lock` to `unlock`. Behind a
//! pooler that hands each transaction or statement to any server session
//! (PgBouncer's `transaction` or `statement` pool mode), a lock would be
//! taken on one session and "released" on another, and the lock left on
//! the first would make a dead run look alive forever. Startup checks that
//! session state survives between statements and refuses otherwise.

use crate::sql::catalog as statements;
use sqlx::{PgConnection, PgPool};

use crate::error::{Error, Problem, Problems, Result};

const PROBE: &str = "cohort.session_probe";

/// Checks that `first` keeps its session between statements while another
/// connection of `pool` holds a transaction open (which makes a
/// transaction pooler hand `first` a different server session).
pub(crate) async fn check(first: &mut PgConnection, pool: &PgPool) -> Result<()> {
    let token = uuid::Uuid::new_v4().to_string();
    statements::set_probe(PROBE, token.clone())
        .query()
        .execute(&mut *first)
        .await?;
    // A second client connection pins a server session in a transaction:
    // the one `first` just used, if the pooler reuses the most recently
    // released one (PgBouncer's default).
    let second = if pool.options().get_max_connections() >= 2 {
        tokio::time::timeout(std::time::Duration::from_secs(5), pool.acquire())
            .await
            .ok()
            .and_then(|c| c.ok())
    } else {
        None
    };
    let mut pinned = match second {
        Some(second) => {
            let mut second = second;
            match statements::begin().query().execute(&mut *second).await {
                Ok(_) => {
                    statements::round_trip()
                        .query()
                        .execute(&mut *second)
                        .await?;
                    Some(second)
                }
                Err(e) => {
                    return Err(refusal(&format!(
                        "a transaction could not be opened ({e}): statement pooling?"
                    )))
                }
            }
        }
        None => None,
    };
    let seen: Option<String> = statements::read_setting(PROBE)
        .query_scalar()
        .fetch_one(&mut *first)
        .await?;
    if let Some(second) = pinned.as_mut() {
        statements::rollback()
            .query()
            .execute(&mut **second)
            .await?;
    }
    if seen.as_deref() != Some(token.as_str()) {
        return Err(refusal(
            "a setting made by one statement was gone at the next: each statement or \
             transaction runs on whichever server session is free",
        ));
    }
    statements::clear_probe(PROBE)
        .query()
        .execute(&mut *first)
        .await?;
    Ok(())
}

fn refusal(what: &str) -> Error {
    Error::Validation(Problems(vec![Problem::global(format!(
        "the database connection does not keep its session between statements ({what}). \
         This is what a pooler in transaction or statement mode (PgBouncer pool_mode = \
         transaction/statement) does; Cohort's run and worker locks are session advisory \
         locks and would be taken on one session and lost or leaked on another. Connect \
         directly, or through a pooler in session mode"
    ))]))
}
