//! Cohort's error type. One enum for the crate, every variant documented;
//! retryable PostgreSQL conditions are classified in one place.

use std::fmt;

/// A problem found by validation, attached to the entity it concerns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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

/// Every problem validation found, in a stable order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} problem(s):", self.0.len())?;
        for p in &self.0 {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

/// Errors returned by Cohort.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Startup validation found problems; nothing was changed. Lists all of them.
    #[error("Cohort validation failed with {0}")]
    Validation(Problems),
    /// Configuration is invalid or out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The policy file could not be read or is invalid.
    #[error("invalid policy file: {0}")]
    Policy(String),
    /// The database refused a migration, or the installed schema cannot be
    /// upgraded by this version.
    #[error("migration failed: {0}")]
    Migration(String),
    /// A request was invalid (unknown entity, malformed id, wrong tenant,
    /// missing record, …); nothing was changed.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A guarded-deletion callback failed; its transaction was rolled back.
    #[error("the guarded-deletion callback failed: {0}")]
    Callback(Box<dyn std::error::Error + Send + Sync>),
    /// A database error.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl Error {
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
            Error::Validation(p) => Some(&p.0),
            _ => None,
        }
    }
}

/// The one place retryable PostgreSQL conditions are listed.
pub(crate) fn is_retryable_sqlx(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("40001" | "40P01" | "55P03"))
                || db.code().is_some_and(|c| c.starts_with("08"))
        }
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        _ => false,
    }
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
        assert!(!Error::Config("x".into()).is_retryable());
    }
}
