//! Cohort's error type. One enum for the crate, every variant documented;
//! retryable PostgreSQL conditions are classified in one place.

use std::fmt;

/// A problem found by validation, attached to the entity it concerns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Problem {
    /// The entity's display name, or `None` for global problems (server,
    /// Cohort schema, configuration).
    pub entity: Option<String>,
    /// What is wrong and, where it helps, how to fix it.
    pub message: String,
}

impl Problem {
    /// A problem of one entity.
    pub fn entity(entity: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            entity: Some(entity.into()),
            message: message.into(),
        }
    }

    /// A global problem.
    pub fn global(message: impl Into<String>) -> Self {
        Self {
            entity: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.entity {
            Some(e) => write!(f, "{e}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Every problem found at once, in a stable order: what validation,
/// configuration and policy errors alike carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    /// One global problem.
    pub fn one(message: impl Into<String>) -> Self {
        Self(vec![Problem::global(message)])
    }

    /// Global problems, one per message.
    pub fn global(messages: impl IntoIterator<Item = String>) -> Self {
        Self(messages.into_iter().map(Problem::global).collect())
    }

    /// The same problems with `prefix: ` before each message.
    pub fn prefixed(self, prefix: &str) -> Self {
        Self(
            self.0
                .into_iter()
                .map(|p| Problem {
                    message: format!("{prefix}: {}", p.message),
                    ..p
                })
                .collect(),
        )
    }
}

impl From<String> for Problems {
    fn from(message: String) -> Self {
        Self::one(message)
    }
}

impl From<&str> for Problems {
    fn from(message: &str) -> Self {
        Self::one(message)
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let [only] = self.0.as_slice() {
            return write!(f, "{only}");
        }
        write!(f, "{} problem(s):", self.0.len())?;
        for p in &self.0 {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

/// Errors returned by Cohort. `Debug` prints the same readable text as
/// `Display` (prefixed by the kind), so `fn main() -> Result<(), cohort::Error>`
/// shows the problems, not a struct dump.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Startup validation found problems; nothing was changed. Lists all of them.
    #[error("Cohort validation failed with {0}")]
    Validation(Problems),
    /// Configuration is invalid or out of range; lists every problem.
    #[error("invalid configuration: {0}")]
    Config(Problems),
    /// The policy file could not be read or is invalid; lists every problem
    /// found (a TOML syntax or type error stops parsing at the first).
    #[error("invalid policy file: {0}")]
    Policy(Problems),
    /// The database refused a migration, or the installed schema cannot be
    /// upgraded by this version.
    #[error("migration failed: {0}")]
    Migration(String),
    /// A request was invalid (unknown entity, malformed id, wrong tenant,
    /// …); nothing was changed.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// What the request names does not exist (a record, a hold, a run);
    /// nothing was changed.
    #[error("not found: {0}")]
    NotFound(String),
    /// The request conflicts with what exists (a hold id already taken, a
    /// hold already released). Retrying the same create is safe to
    /// recognise by this kind. Nothing was changed.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The request is well-formed but refused by a safety rule (soft delete
    /// as erasure without opting in, a mutating run dated after the database
    /// clock); nothing was changed.
    #[error("refused: {0}")]
    Refused(String),
    /// A guarded-deletion callback failed; its transaction was rolled back.
    #[error("the guarded-deletion callback failed: {0}")]
    Callback(Box<dyn std::error::Error + Send + Sync>),
    /// A database error.
    #[error("database error: {}", describe_sqlx(.0))]
    Database(#[from] sqlx::Error),
    /// A database error reported through SeaORM (feature `sea-orm`).
    #[error("database error (through SeaORM): {0}")]
    Orm(String),
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {self}", self.kind().as_str())
    }
}

/// What kind of error an [`Error`] is: what callers branch on, and the
/// `error.kind` of the CLI's JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// Startup validation failed.
    Validation,
    /// Configuration is invalid.
    Config,
    /// The policy file is invalid.
    Policy,
    /// A migration failed or the schema cannot be upgraded.
    Migration,
    /// A malformed or inconsistent request.
    InvalidInput,
    /// Something the request names does not exist.
    NotFound,
    /// The request conflicts with existing state.
    Conflict,
    /// Refused by a safety rule.
    Refused,
    /// A guarded-deletion callback failed.
    Callback,
    /// The database could not be reached or the connection was lost.
    Connection,
    /// Any other database error.
    Database,
}

impl ErrorKind {
    /// The snake_case name (`invalid_input`, `not_found`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Validation => "validation",
            ErrorKind::Config => "config",
            ErrorKind::Policy => "policy",
            ErrorKind::Migration => "migration",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Refused => "refused",
            ErrorKind::Callback => "callback",
            ErrorKind::Connection => "connection",
            ErrorKind::Database => "database",
        }
    }

    /// Whether the caller's input (request, configuration, policy) is at
    /// fault and nothing was changed (the CLI's exit code 2).
    pub fn is_bad_input(self) -> bool {
        matches!(
            self,
            ErrorKind::Validation
                | ErrorKind::Config
                | ErrorKind::Policy
                | ErrorKind::InvalidInput
                | ErrorKind::NotFound
                | ErrorKind::Conflict
                | ErrorKind::Refused
        )
    }
}

impl Error {
    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Validation(_) => ErrorKind::Validation,
            Error::Config(_) => ErrorKind::Config,
            Error::Policy(_) => ErrorKind::Policy,
            Error::Migration(_) => ErrorKind::Migration,
            Error::InvalidInput(_) => ErrorKind::InvalidInput,
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::Conflict(_) => ErrorKind::Conflict,
            Error::Refused(_) => ErrorKind::Refused,
            Error::Callback(_) => ErrorKind::Callback,
            Error::Orm(_) => ErrorKind::Database,
            Error::Database(e) if is_connection_error(e) => ErrorKind::Connection,
            Error::Database(_) => ErrorKind::Database,
        }
    }

    /// Whether retrying the same operation may succeed: serialization
    /// failures (40001), deadlocks (40P01), lock timeouts (55P03) and lost
    /// connections.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Database(e) => is_retryable_sqlx(e),
            _ => false,
        }
    }

    /// The validation problems, if this is a validation error.
    pub fn problems(&self) -> Option<&[Problem]> {
        match self {
            Error::Validation(p) | Error::Config(p) | Error::Policy(p) => Some(&p.0),
            _ => None,
        }
    }
}

/// A database error for people: the server's message, its SQLSTATE and
/// its hint; never the server's own source line (`at line 768`), which says
/// nothing about the user's problem, nor its detail, which can quote row
/// values (personal data) into logs.
fn describe_sqlx(e: &sqlx::Error) -> String {
    let Some(db) = e.as_database_error() else {
        return e.to_string();
    };
    let mut out = db.message().to_owned();
    if let Some(code) = db.code() {
        out.push_str(&format!(" (SQLSTATE {code})"));
    }
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        if let Some(hint) = pg.hint() {
            out.push_str(&format!("; hint: {hint}"));
        }
    }
    out
}

/// The one place connection-level failures are recognised: the connection
/// is gone (I/O, protocol, pool), SQLSTATE class 08, or the server
/// terminated the session (57P01 admin shutdown, 57P02 crash shutdown,
/// 57P03 cannot connect now).
pub(crate) fn is_connection_error(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolClosed
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::Protocol(_)
    ) || e
        .as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c.starts_with("08") || matches!(c.as_ref(), "57P01" | "57P02" | "57P03"))
}

/// The one place retryable PostgreSQL conditions are listed: lost
/// connections, serialization failures (40001), deadlocks (40P01) and lock
/// time-outs (55P03).
pub(crate) fn is_retryable_sqlx(e: &sqlx::Error) -> bool {
    is_connection_error(e)
        || e.as_database_error()
            .and_then(|d| d.code())
            .is_some_and(|c| matches!(c.as_ref(), "40001" | "40P01" | "55P03"))
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_display_lists_every_problem() {
        let p = Problems(vec![
            Problem::entity("Note", "anchor is naive"),
            Problem::global("schema missing"),
        ]);
        assert_eq!(
            p.to_string(),
            "2 problem(s):\n  - Note: anchor is naive\n  - schema missing"
        );
    }

    #[test]
    fn retryable_classification() {
        assert!(Error::Database(sqlx::Error::PoolTimedOut).is_retryable());
        assert!(!Error::Database(sqlx::Error::RowNotFound).is_retryable());
        assert!(!Error::Config(Problems::one("x")).is_retryable());
    }
}
