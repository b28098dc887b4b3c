//! Sanitised failure diagnostics. What is stored in the ledger (`error`,
//! `last_error`) and returned in results is an error kind, a safe machine
//! code (a SQLSTATE) and a random diagnostic id; never messages, SQL
//! values, subject ids or stack traces. The full error is logged once, at
//! error level, with the same diagnostic id.

use std::fmt;

use uuid::Uuid;

/// The SQLSTATE `retention_archive_check` raises when an archive batch's
/// copies differ from the rows it deleted (schema 13): the batch rolled
/// back, and the failure reads `kind=engine code=archive_copy_mismatch`.
pub(crate) const ARCHIVE_COPY_MISMATCH: &str = "CH001";

/// A sanitised description of a failure.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Diagnostic {
    /// What failed, from a fixed vocabulary (`database`, `rule`, `anonymiser`, …).
    pub kind: String,
    /// A machine-safe code, e.g. the SQLSTATE.
    pub code: Option<String>,
    /// Correlates the stored text with the full error in the logs.
    pub diagnostic_id: Uuid,
}

impl Diagnostic {
    /// Logs `error` with a new diagnostic id and returns the sanitised form.
    pub(crate) fn capture(kind: &str, code: Option<String>, error: &dyn fmt::Display) -> Self {
        let d = Diagnostic {
            kind: kind.to_owned(),
            code,
            diagnostic_id: Uuid::new_v4(),
        };
        tracing::error!(diagnostic_id = %d.diagnostic_id, kind, code = d.code.as_deref(), error = %error, "cohort failure");
        d
    }

    /// For a sqlx error: its SQLSTATE when it has one. Cohort's own
    /// conditions raised in SQL (see [`ARCHIVE_COPY_MISMATCH`]) get their
    /// own kind and code.
    pub(crate) fn from_sqlx(error: &sqlx::Error) -> Self {
        let code = error
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned())
            .filter(|c| c.chars().all(|ch| ch.is_ascii_alphanumeric()));
        if code.as_deref() == Some(ARCHIVE_COPY_MISMATCH) {
            return Self::capture("engine", Some("archive_copy_mismatch".into()), error);
        }
        let kind = match error {
            sqlx::Error::Database(_) => "database",
            sqlx::Error::Io(_) | sqlx::Error::Tls(_) => "connection",
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => "pool",
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => "decode",
            _ => "driver",
        };
        Self::capture(kind, code, error)
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kind={}", self.kind)?;
        if let Some(code) = &self.code {
            write!(f, " code={code}")?;
        }
        write!(f, " diagnostic_id={}", self.diagnostic_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_holds_only_safe_fields() {
        let d = Diagnostic::capture(
            "database",
            Some("23503".into()),
            &"secret subject alice@example.com",
        );
        let text = d.to_string();
        assert!(
            text.starts_with("kind=database code=23503 diagnostic_id="),
            "{text}"
        );
        assert!(!text.contains("alice"));
    }
}
