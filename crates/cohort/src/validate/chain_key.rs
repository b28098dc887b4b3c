//! The ledger key a process brings against the key the chain is keyed
//! with (see [`crate::domain::chain::LedgerKey`]): checked when a process that
//! links runs and holds starts, before it writes anything.

use sqlx::PgConnection;

use crate::domain::chain::{self, LedgerKey};
use crate::error::{Error, Problems};
use crate::sql::chain as statements;

/// What a process that links runs and holds needs of its ledger key,
/// checked when it starts: the key the chain is keyed with, once it is;
/// and no key for a chain not yet keyed (`cohort migrate` keys it, with
/// the key in its environment), so that a key given is never ignored.
pub(crate) async fn check_key(
    conn: &mut PgConnection,
    schema: &str,
    key: Option<&LedgerKey>,
) -> Result<(), Error> {
    let env = chain::LEDGER_KEY_ENV;
    let problem = match (keyed_with(conn, schema).await?, key) {
        (None, None) => return Ok(()),
        (Some(id), Some(k)) if id == k.id() => return Ok(()),
        (Some(id), None) => format!(
            "the ledger's hash chain is keyed (key {id}): a process that settles runs or changes holds needs {env}, the key it was keyed with, or what it did could not be linked"
        ),
        (Some(id), Some(k)) => format!(
            "{env} is key {}, and the ledger's hash chain is keyed with key {id}: give this process the chain's key",
            k.id()
        ),
        (None, Some(_)) => format!(
            "{env} is set but the ledger's hash chain is not keyed yet: run `cohort migrate` with {env} in its environment (it keys the chain), then start this process again"
        ),
    };
    Err(Error::Config(Problems::one(problem)))
}

/// The id of the key the chain is keyed with (its newest `key` link's),
/// or `None` when it was never keyed.
pub(crate) async fn keyed_with(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<Option<String>, sqlx::Error> {
    let Some(statements::KeyLinkRow { link_id, record }) = statements::key_link(schema)
        .query_as()
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    serde_json::from_str::<chain::KeyRecord>(&record)
        .map(|k| Some(k.key_id))
        .map_err(|_| {
            sqlx::Error::Protocol(format!(
                "the chain's key link {link_id} does not name a key: run `cohort verify`"
            ))
        })
}
