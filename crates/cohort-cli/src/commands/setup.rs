//! `cohort init` (a new file), `migrate` and `validate`: setting a
//! database and a policy file up.

use std::path::PathBuf;

use cohort::{Cohort, CohortConfig, Error};

use crate::open::{connect, database_url, load_policy, pool};
use crate::{init, output, Cli, Failure};

/// `cohort init`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct InitArgs {
    /// The schema whose tables to list (default public; with --update,
    /// the schemas the file was made from).
    #[arg(long)]
    pub(crate) schema: Option<String>,
    /// Where to write the policy file.
    #[arg(long, default_value = "cohort.toml", value_name = "FILE")]
    pub(crate) output: PathBuf,
    /// Replace the file if it exists (by default it is kept).
    #[arg(long)]
    pub(crate) force: bool,
    /// Add to the existing file the tables that appeared since it was
    /// written (exempt until classified), changing nothing else in it.
    #[arg(long, conflicts_with = "force")]
    pub(crate) update: bool,
}

/// `cohort migrate`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct MigrateArgs {
    /// Schema for Cohort's tables (default: the policy file's, else public).
    #[arg(long)]
    pub(crate) schema: Option<String>,
    /// Move Cohort's tables from this schema to --schema instead (rows,
    /// indexes, constraints and grants kept; refused while a run is
    /// started or a delivery in flight).
    #[arg(long, value_name = "OLD_SCHEMA")]
    pub(crate) move_from: Option<String>,
}

/// `cohort init` without `--update`: a starter policy file from the
/// schema's tables (an existing file is kept unless `--force`).
pub(crate) async fn init(cli: &Cli, args: &InitArgs) -> Result<(), Failure> {
    let schema = &args.schema;
    let output = &args.output;
    let force = &args.force;
    let schema = schema.as_deref().unwrap_or(init::DEFAULT_SCHEMA);
    // Before connecting; `init::write` checks again as it creates.
    if !force && output.exists() {
        return Err(init::kept(output));
    }
    let policy = load_policy(cli, false).ok().flatten();
    let url = database_url(cli, policy.as_ref())?;
    let mut conn = connect(&url).await?;
    let tables = init::read_tables(&mut conn, schema)
        .await
        .map_err(|e| Failure::Run(e.into()))?;
    if tables.is_empty() {
        return Err(Failure::Input(Error::InvalidInput(format!(
            "schema {schema:?} has no tables (names are case-sensitive); nothing written"
        ))));
    }
    let (text, written) = init::render(schema, &tables, uuid::Uuid::new_v4);
    init::write(output, &text, *force)?;
    if cli.json {
        output::print_json(&serde_json::json!({
            "output": output.display().to_string(),
            "entities": written.entities,
            "without_timestamp": written.without_timestamp,
        }));
    } else {
        outln!(
            "wrote {}: {} table(s) of schema {schema:?}, every one exempt until you classify it{}",
            output.display(),
            written.entities,
            if written.without_timestamp.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} without a timestamptz column left out",
                    written.without_timestamp.len()
                )
            }
        );
    }
    Ok(())
}

/// `cohort migrate`: install or upgrade Cohort's tables (or move them),
/// then key the chain or say how.
pub(crate) async fn migrate(cli: &Cli, args: &MigrateArgs) -> Result<(), Failure> {
    let schema = &args.schema;
    let move_from = &args.move_from;
    let policy = load_policy(cli, false)?;
    let schema = schema
        .clone()
        .or_else(|| policy.as_ref().map(|p| p.config.schema.clone()))
        .unwrap_or_else(|| CohortConfig::default().schema);
    let url = database_url(cli, policy.as_ref())?;
    let mut conn = connect(&url).await?;
    if let Some(from) = move_from {
        let report = cohort::schema::move_schema(&mut conn, from, &schema).await?;
        if cli.json {
            output::print_json(&serde_json::to_value(&report).expect("serialises"));
        } else {
            outln!(
                "Moved Cohort's tables from schema {:?} to {:?} ({}). Set schema = {:?} for every process now.",
                report.from,
                report.to,
                report.tables.join(", "),
                report.to
            );
        }
        return Ok(());
    }
    let report = cohort::schema::migrate(&mut conn, &schema).await?;
    output::migration(cli.json, &report);
    // The chain's key: keyed now when this process has it, else
    // the way to key it is said (on stderr with --json).
    let key = match policy.as_ref() {
        Some(p) => p.config.ledger_key.clone(),
        None => std::env::var(cohort::chain::LEDGER_KEY_ENV)
            .ok()
            .map(|k| cohort::chain::LedgerKey::from_hex(&k))
            .transpose()
            .map_err(|e| Failure::Input(cohort::Error::Config(cohort::Problems::one(e))))?,
    };
    let say = |line: String| {
        if cli.json {
            eprintln!("cohort: {line}");
        } else {
            outln!("{line}");
        }
    };
    let ledger = Cohort::builder(pool(&url, 1).await?)
        .config(CohortConfig {
            schema: schema.clone(),
            ledger_key: key.clone(),
            ..CohortConfig::default()
        })
        .build_unvalidated()?;
    match key {
        Some(key) => match ledger.key_chain().await? {
            Some(link) => say(format!(
                "Keyed the ledger's hash chain with key {} (link {link}): every process that settles runs or changes holds now needs {}.",
                key.id(),
                cohort::chain::LEDGER_KEY_ENV
            )),
            None => say(format!("The ledger's hash chain is keyed with key {}.", key.id())),
        },
        None => match ledger.chain_key_id().await? {
            Some(id) => say(format!("The ledger's hash chain is keyed with key {id}.")),
            None => say(format!(
                "The ledger's hash chain is not keyed: anyone who can write the database can extend it. \
                 Key it: put a key the database never sees in {} (openssl rand -hex 32) and run `cohort migrate` again; \
                 then give the same key to every process that sweeps, erases or changes holds.",
                cohort::chain::LEDGER_KEY_ENV
            )),
        },
    }
    Ok(())
}

/// `cohort validate`: the policy against the live catalog, the role's
/// grants, the tenants query and the live peers.
pub(crate) async fn validate(cli: &Cli) -> Result<(), Failure> {
    let policy = load_policy(cli, true)?.expect("required");
    let url = database_url(cli, Some(&policy))?;
    let pool = pool(&url, 2).await?;
    let query = policy.tenants_query.clone();
    let cohort = Cohort::builder(pool).policy(policy).build().await?;
    let model = cohort.ready().await?;
    // The grants a sweep, an erasure and the worker need, for the
    // role connected: a set-up that validates but cannot run is
    // refused here, not by every run (exit 2, each grant named).
    cohort
        .check_grants(&[cohort::services::Access::Runs])
        .await?;
    // A tenants query is run (read-only) and its shape checked too;
    // rows that cannot be tenants are warned about, not refused
    // (each fails only its own pass when sweeping).
    let unusable = match query {
        Some(q) => {
            cohort
                .tenants(&cohort::TenantSource::Query(q))
                .await?
                .unusable
        }
        None => Vec::new(),
    };
    for u in &unusable {
        eprintln!("cohort: warning: tenants_query {u}; its pass will fail, the others run");
    }
    // Replicas sweeping this database with another policy.
    let others: Vec<cohort::peers::Peer> = match cohort.peers().await {
        Ok(peers) => peers.into_iter().filter(|p| !p.same_policy).collect(),
        Err(e) => {
            eprintln!("cohort: warning: the peer records could not be read: {e}");
            Vec::new()
        }
    };
    for p in &others {
        eprintln!(
            "cohort: warning: a live peer ({} pid {}) sweeps this database with another policy (fingerprint {}); each policy runs its own occurrences, and an entity whose handlers differ is left alone by the process that lacks them",
            p.host, p.pid, p.policy_fingerprint
        );
    }
    output::validated(cli.json, cohort.config(), &model, &unusable, &others);
    Ok(())
}
