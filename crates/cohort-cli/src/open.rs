//! Opening what a command needs: the policy file, the database URL (flag,
//! environment, file), a connection that fails fast with its cause, a
//! pool, and the handle (validated, for the ledger alone, or as an auditor
//! has it).

use std::path::PathBuf;

use cohort::policy::PolicyFile;
use cohort::{Cohort, CohortConfig, Error};

use crate::{commands, console, Cli, Failure};

/// Loads the policy, connects, and builds a validated handle.
pub(crate) async fn open(cli: &Cli) -> Result<(Cohort, PolicyFile), Failure> {
    open_with(cli, false, false).await
}

/// A handle for a command that reads only the ledger (`report`): the
/// policy names the database and Cohort's schema, and is not validated
/// against the catalog, so evidence stays readable after the retained
/// tables have changed.
pub(crate) async fn open_ledger(cli: &Cli) -> Result<(Cohort, PolicyFile), Failure> {
    let policy = load_policy(cli, true)?.expect("required");
    let url = database_url(cli, Some(&policy))?;
    let pool = pool(&url, 2).await?;
    let cohort = Cohort::builder(pool)
        .policy(policy.clone())
        .build_unvalidated()?;
    Ok((cohort, policy))
}

/// A handle on the ledger as an auditor has it: a database URL (flag or
/// `DATABASE_URL`) and Cohort's schema (`--schema`, else `COHORT_SCHEMA`,
/// else public), with the keys and journal the environment gives; no
/// policy file, and nothing validated against the retained tables.
pub(crate) async fn open_auditor(cli: &Cli, schema: Option<&str>) -> Result<Cohort, Failure> {
    let mut config = CohortConfig::default();
    config.apply_env(cohort_env())?;
    if let Some(s) = schema {
        config.schema = s.to_owned();
    }
    let url = database_url(cli, None).map_err(|_| {
        Failure::Input(Error::Config(
            "no database URL: pass --database-url or set DATABASE_URL (verifying without a policy file, with --schema naming Cohort's schema)".into(),
        ))
    })?;
    Ok(Cohort::builder(pool(&url, 2).await?)
        .config(config)
        .build_unvalidated()?)
}

/// [`open`] for a command that runs services: its pool also has room for
/// the worker's pass lock, a run's lock and batch, the pruner, and one
/// connection per parallel handler delivery. Either pool has room for the
/// extra connections of a parallel sweep (`sweep_parallelism`). Sweeps
/// read the backlog for its gauge only in a process that `exports` metrics
/// (`cohort worker --metrics-addr`): elsewhere nothing would show it.
pub(crate) async fn open_with(
    cli: &Cli,
    services: bool,
    exports: bool,
) -> Result<(Cohort, PolicyFile), Failure> {
    let policy = load_policy(cli, true)?.expect("required");
    let url = database_url(cli, Some(&policy))?;
    let lanes = policy.max_sweep_parallelism().min(64) - 1;
    let connections = lanes
        + if services {
            6 + policy.config.dispatch.max_parallelism.min(100)
        } else {
            4
        };
    let pool = pool(&url, connections).await?;
    let mut builder = Cohort::builder(pool)
        .policy(policy.clone())
        .backlog_gauge(exports);
    let progress = commands::progress_wanted(cli.json).then(commands::Progress::install);
    if let Some(p) = &progress {
        builder = builder.observer(p.clone());
    }
    let cohort = builder.build().await?;
    if let Some(p) = &progress {
        p.names(&*cohort.ready().await?);
    }
    Ok((cohort, policy))
}

/// Loads `--config` (default `./cohort.toml`). When not `required`, a
/// missing default file is fine; an explicitly named one must exist.
pub(crate) fn load_policy(cli: &Cli, required: bool) -> Result<Option<PolicyFile>, Failure> {
    let path = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from("cohort.toml"));
    if cli.config.is_none() && !required && !path.exists() {
        return Ok(None);
    }
    let mut policy = PolicyFile::load(&path)?;
    // The console's token is the command's own, not library configuration
    // (it is refused where it does nothing: see `console::token`).
    policy.config.apply_env(cohort_env())?;
    Ok(Some(policy))
}

/// `--database-url`, then `DATABASE_URL`, then the policy file.
pub(crate) fn database_url(cli: &Cli, policy: Option<&PolicyFile>) -> Result<String, Failure> {
    cli.database_url
        .clone()
        .or_else(|| std::env::var("DATABASE_URL").ok().filter(|s| !s.is_empty()))
        .or_else(|| policy.and_then(|p| p.database_url.clone()))
        .ok_or_else(|| {
            Failure::Input(Error::Config(
                "no database URL: pass --database-url, set DATABASE_URL, or set [database] url in the policy file".into(),
            ))
        })
}

/// How long the first connection may take before the command gives up.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Connects once, failing fast (within [`CONNECT_TIMEOUT`]) with the
/// underlying cause and where it tried to connect (never the password).
pub(crate) async fn connect(url: &str) -> Result<sqlx::PgConnection, Failure> {
    use sqlx::ConnectOptions;
    let options: sqlx::postgres::PgConnectOptions = url.parse().map_err(|e| {
        Failure::Input(Error::Config(
            format!("the database URL is not valid: {e}").into(),
        ))
    })?;
    let place = format!(
        "{}:{} (database {:?}, user {:?})",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("(default)"),
        options.get_username()
    );
    let unreachable = |cause: String| {
        Failure::Run(Error::Database(sqlx::Error::Io(std::io::Error::other(
            format!("cannot reach PostgreSQL at {place}: {cause}"),
        ))))
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, options.connect()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(unreachable(e.to_string())),
        Err(_) => Err(unreachable(format!(
            "no answer within {} s",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

/// A pool whose first connection is made (and checked) by [`connect`], so
/// an unreachable server fails fast with its cause.
pub(crate) async fn pool(url: &str, max: u32) -> Result<sqlx::PgPool, Failure> {
    use sqlx::Connection;
    // Closing the probe connection politely; a failure to close changes nothing.
    let _ = connect(url).await?.close().await;
    let options: sqlx::postgres::PgConnectOptions = url.parse().map_err(|e| {
        Failure::Input(Error::Config(
            format!("the database URL is not valid: {e}").into(),
        ))
    })?;
    Ok(sqlx::postgres::PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_lazy_with(options))
}

/// The environment's `COHORT_*` settings for the library's configuration:
/// all but the console's token (the command's own, refused where it does
/// nothing: see `console::token`) and the journal's key (read by the
/// journal itself).
fn cohort_env() -> impl Iterator<Item = (String, String)> {
    std::env::vars()
        .filter(|(k, _)| k.as_str() != console::TOKEN_VAR && k.as_str() != cohort::journal::KEY_ENV)
}
