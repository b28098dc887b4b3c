//! The crate's error type.

use std::time::Duration;

/// A boxed error as returned by template setup closures.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong while starting a throw-away cluster or
/// handing out test databases.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No PostgreSQL server binaries (`initdb`, `postgres`) could be found.
    #[error(
        "PostgreSQL server binaries (initdb, postgres) not found; searched: {searched}. \
         Install them (Debian/Ubuntu: `apt-get install postgresql`; macOS: `brew install postgresql`), \
         or set PG_BIN to the directory containing initdb and postgres, \
         or set DATABASE_URL to an existing server"
    )]
    BinariesNotFound {
        /// Human readable list of the places that were searched.
        searched: String,
    },

    /// `PG_BIN` is set but does not point at a directory with `initdb` and `postgres`.
    #[error("PG_BIN={dir} does not contain both `initdb` and `postgres`")]
    InvalidPgBin {
        /// The value of `PG_BIN`.
        dir: String,
    },

    /// The process runs as root and neither a `postgres` nor a `nobody`
    /// user exists to run the server as (PostgreSQL refuses to run as root).
    #[error(
        "running as root, but no `postgres` or `nobody` user was found in /etc/passwd \
         to run the PostgreSQL server as (PostgreSQL refuses to run as root)"
    )]
    NoUnprivilegedUser,

    /// A filesystem or process-spawning operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// An environment variable of the harness holds something unusable.
    #[error("{variable}: {problem}")]
    Settings {
        /// The variable.
        variable: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// An external command (e.g. `initdb`) exited unsuccessfully.
    #[error("`{command}` failed ({status}):\n{output}")]
    CommandFailed {
        /// The command line that was run.
        command: String,
        /// Its exit status.
        status: String,
        /// Its captured stdout and stderr.
        output: String,
    },

    /// The PostgreSQL server exited before it accepted connections.
    #[error("PostgreSQL server exited during startup ({status}); server log tail:\n{log_tail}")]
    ServerExited {
        /// Exit status of the server supervisor.
        status: String,
        /// The last lines of the server log.
        log_tail: String,
    },

    /// The PostgreSQL server did not accept connections in time.
    #[error("PostgreSQL server did not accept connections within {waited:?}; last error: {last_error}; server log tail:\n{log_tail}")]
    StartTimeout {
        /// How long we waited.
        waited: Duration,
        /// The last connection error seen.
        last_error: String,
        /// The last lines of the server log.
        log_tail: String,
    },

    /// `DATABASE_URL` (or another given URL) could not be parsed.
    #[error("invalid database URL {url:?}: {source}")]
    InvalidUrl {
        /// The offending URL.
        url: String,
        /// The parse error.
        #[source]
        source: sqlx::Error,
    },

    /// A template key contains characters other than `[a-z0-9_]` or is too long.
    #[error("invalid template key {key:?}: use 1 to 40 characters from [a-z0-9_]")]
    InvalidTemplateKey {
        /// The offending key.
        key: String,
    },

    /// The caller's template setup closure failed.
    #[error("setting up template database {template} failed: {source}")]
    TemplateSetup {
        /// Name of the template database being built.
        template: String,
        /// The error returned by the setup closure.
        #[source]
        source: BoxError,
    },

    /// A database operation failed.
    #[error("{context}: {source}")]
    Sql {
        /// What was being done.
        context: String,
        /// The underlying sqlx error.
        #[source]
        source: sqlx::Error,
    },
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn sql(context: impl Into<String>, source: sqlx::Error) -> Self {
        Error::Sql {
            context: context.into(),
            source,
        }
    }
}

/// Shorthand for `Result<T, cohort_pgtemp::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
