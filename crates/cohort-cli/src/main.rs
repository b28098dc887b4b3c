//! The `cohort` command: retention driven by a policy file, on any
//! PostgreSQL database. See `cohort --help`.
//!
//! Exit codes are a public contract: 0 success; 1 the run failed (or the
//! database could not be reached); 2 bad input, bad config or failed
//! validation (nothing changed); 3 the run settled partially failed.

/// `println!` for everything the command prints on stdout: a closed pipe
/// (`cohort --json … | head`) ends the command quietly instead of panicking.
macro_rules! outln {
    () => {
        $crate::output::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod commands;
mod console;
mod demo;
#[cfg(test)]
mod docs;
mod evidence;
mod exit;
mod exporter;
mod init;
mod output;
mod pacing;
mod report;
mod restore;
mod services;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cohort::policy::PolicyFile;
use cohort::{Cohort, CohortConfig, Error};

pub(crate) use exit::Failure;

/// Annotation-driven data retention for PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "cohort", version, about)]
struct Cli {
    /// Policy file (TOML).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Database URL; overrides DATABASE_URL and the policy file's [database] url.
    #[arg(long, global = true, value_name = "URL")]
    database_url: Option<String>,
    /// Print one JSON document on stdout (logs go to stderr).
    #[arg(long, global = true)]
    json: bool,
    /// How logs are written on stderr: `text` (default) or `json` (one
    /// object per line, for log shippers). The level comes from RUST_LOG.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a throw-away PostgreSQL, create sample tables and walk through Cohort.
    Demo {
        /// Only write the demo's policy file to FILE (to start your own
        /// from), without running the demo; an existing file is kept.
        #[arg(long, value_name = "FILE")]
        write_policy: Option<PathBuf>,
    },
    /// Print a new random id (UUID v4) for a retained entity's `id`.
    NewId,
    /// Write a starter policy file from the live catalog: every table with
    /// a timestamptz column, exempt until you classify it.
    Init {
        /// The schema whose tables to list (default public; with --update,
        /// the schemas the file was made from).
        #[arg(long)]
        schema: Option<String>,
        /// Where to write the policy file.
        #[arg(long, default_value = "cohort.toml", value_name = "FILE")]
        output: PathBuf,
        /// Replace the file if it exists (by default it is kept).
        #[arg(long)]
        force: bool,
        /// Add to the existing file the tables that appeared since it was
        /// written (exempt until classified), changing nothing else in it.
        #[arg(long, conflicts_with = "force")]
        update: bool,
    },
    /// Install or upgrade Cohort's tables (or, with --move-from, move them
    /// to --schema with their data).
    Migrate {
        /// Schema for Cohort's tables (default: the policy file's, else public).
        #[arg(long)]
        schema: Option<String>,
        /// Move Cohort's tables from this schema to --schema instead (rows,
        /// indexes, constraints and grants kept; refused while a run is
        /// started or a delivery in flight).
        #[arg(long, value_name = "OLD_SCHEMA")]
        move_from: Option<String>,
    },
    /// Validate the policy against the live database; exit 2 listing every problem.
    Validate,
    /// Count what a sweep would change now; writes nothing.
    Preview {
        #[command(flatten)]
        scope: commands::SweepScope,
        /// Logical time (RFC 3339; default now).
        #[arg(long)]
        now: Option<String>,
    },
    /// Apply the retention rules (or, with --dry-run, count and audit only).
    Sweep {
        #[command(flatten)]
        scope: commands::SweepScope,
        /// Logical time (RFC 3339; default now).
        #[arg(long)]
        now: Option<String>,
        /// Count and audit without changing rows.
        #[arg(long)]
        dry_run: bool,
        /// Accept a --now later than the database clock for a mutating run
        /// (refused by default: it moves every cutoff forward).
        #[arg(long)]
        allow_future_now: bool,
    },
    /// Erase one data subject's rows in a tenant, or in the tenantless
    /// entities (right to erasure).
    Erase {
        /// The tenant (a negative number is a value).
        #[arg(
            long,
            required_unless_present = "tenantless",
            conflicts_with = "tenantless",
            allow_negative_numbers = true
        )]
        tenant: Option<String>,
        /// Erase from the tenantless entities instead of a tenant's.
        #[arg(long)]
        tenantless: bool,
        /// The subject id (compared exactly with each subject column, in its
        /// type). A negative number is a value (`--subject -42`); other text
        /// starting with `-` needs `--subject=-x`.
        #[arg(long, allow_negative_numbers = true)]
        subject: String,
        /// Only subject columns of this kind.
        #[arg(long)]
        kind: Option<String>,
        /// Accept soft deletion as erasure for categories that soft-delete.
        #[arg(long)]
        allow_soft_delete: bool,
        /// For categories in stages: erase as stage N does (1 first)
        /// instead of the last stage.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
        stage: Option<u16>,
        /// Count and audit without changing rows.
        #[arg(long)]
        dry_run: bool,
        /// Logical time (RFC 3339; default now).
        #[arg(long)]
        now: Option<String>,
        /// Accept a --now later than the database clock for a mutating run
        /// (refused by default: it moves every cutoff forward).
        #[arg(long)]
        allow_future_now: bool,
        /// Open an erasure request with this reference (unique), followed
        /// until it completes; an existing request not completed, for the
        /// same subject, runs again. Needs the hash key.
        #[arg(long, conflicts_with = "dry_run")]
        reference: Option<String>,
        /// When the request is due: a period after --now (60d, 2mo), a date
        /// (its end, UTC) or an RFC 3339 time (default: 30 days).
        #[arg(long, requires = "reference")]
        due: Option<String>,
        /// Why the request has this due date.
        #[arg(long, requires = "due")]
        due_reason: Option<String>,
        /// The requester's note, kept with the request.
        #[arg(long, requires = "reference")]
        note: Option<String>,
    },
    /// Erasure requests: list them, show one with its history, move a due
    /// date.
    #[command(subcommand)]
    EraseRequests(commands::RequestsCommand),
    /// Legal holds.
    #[command(subcommand)]
    Holds(commands::HoldsCommand),
    /// The audit ledger.
    #[command(subcommand)]
    Runs(commands::RunsCommand),
    /// Deliver queued work of the policy file's handlers (--once: what is due
    /// now, then exit; otherwise until SIGINT/SIGTERM).
    Dispatch {
        /// Deliver what is due now and exit.
        #[arg(long)]
        once: bool,
    },
    /// One maintenance pass, as the worker runs every minute: resume the
    /// erasure requests that may finish (a hold released or expired, a
    /// legal minimum passed), settle runs a lost process left started,
    /// dead-letter handler work no registered handler (of this policy or
    /// a live peer) can deliver, and scrub old payloads. With or without
    /// handlers; for cron and for the person on call.
    Maintain {
        /// Run one pass and exit (the only mode: the continuous service
        /// runs inside `cohort worker`).
        #[arg(long)]
        once: bool,
    },
    /// Row-handler work that will not be delivered without an operator.
    #[command(subcommand, name = "dead-letters")]
    DeadLetters(commands::DeadLettersCommand),
    /// Run the scheduled worker, the dispatcher and the history pruner
    /// until SIGINT/SIGTERM, then stop gracefully (exit 0).
    Worker {
        /// Serve Prometheus metrics at http://ADDR/metrics and a health
        /// check at /healthz (e.g. 127.0.0.1:9464; port 0 picks a free one).
        #[arg(long, value_name = "ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Start even though the database lacks what the journal holds (a
        /// restored backup not yet replayed). Refused by default.
        #[arg(long)]
        ignore_restore_gap: bool,
    },
    /// Compare the database with the journal: the erasure requests and
    /// holds it holds that the database lacks (exit 0 none, 1 some).
    RestoreCheck,
    /// Bring the database back to the journal after a restore: place and
    /// release its holds, restore and run again its erasure requests.
    Replay {
        /// Say what would be done, and do nothing.
        #[arg(long)]
        dry_run: bool,
        /// Replay onto a copy of the journal in this directory (copied
        /// there first): a restore drill on another cluster leaves the
        /// production journal as it was. Required on a cluster other than
        /// the one the journal was written for.
        #[arg(long, value_name = "DIR")]
        journal_copy: Option<PathBuf>,
    },
    /// The live settings every worker replica reads (kill_switch, dry_run),
    /// and the live pacing every sweep reads (max_rows_per_second,
    /// max_replica_lag, pauses).
    #[command(subcommand)]
    Settings(services::SettingsCommand),
    /// Pause an entity's sweeps on every replica: a sweep skips it, or
    /// stops before its next batch, and reports it paused.
    Pause {
        /// The entity's name or id.
        entity: String,
    },
    /// Resume a paused entity: its next sweep goes on as usual.
    Resume {
        /// The entity's name or id.
        entity: String,
    },
    /// Serve the read-only operations console (runs, holds, handler queue,
    /// dead letters, settings) until SIGINT/SIGTERM. Off loopback it needs
    /// COHORT_SERVE_TOKEN, and then every request a bearer token.
    Serve {
        /// Address to listen on (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:8765", value_name = "ADDR")]
        listen: std::net::SocketAddr,
    },
    /// The evidence of retention for a period, read from the ledger alone:
    /// rules in force, runs, rows removed per month and kept and why,
    /// erasure requests served, holds and failures.
    Report {
        /// First day of the period (YYYY-MM-DD, UTC).
        #[arg(long, value_name = "DATE")]
        from: String,
        /// Last day of the period, included (YYYY-MM-DD, UTC).
        #[arg(long, value_name = "DATE")]
        to: String,
        /// Only this tenant's runs, and the holds that reach it.
        #[arg(long, value_name = "TENANT")]
        tenant: Option<String>,
        /// html (one self-contained page), csv (one row per figure) or json.
        /// The global --json flag means json.
        #[arg(long, value_enum, default_value_t = report::Format::Html)]
        format: report::Format,
        /// Write here (replacing the file whole) instead of stdout.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Sign the report with this signing key (PREFIX.key of `cohort
        /// keys generate`): writes FILE.manifest.json and FILE.sig beside it.
        #[arg(long, value_name = "KEY_FILE", requires = "output")]
        sign: Option<PathBuf>,
        /// Sign even though the ledger's chain does not verify (refused
        /// otherwise, exit 1); the manifest records that it was broken.
        #[arg(long, requires = "sign")]
        sign_broken_chain: bool,
    },
    /// Key pairs for signed reports.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Verify the ledger's hash chain (reads with SELECT only), or with
    /// --report a signed report offline (no database, no policy file):
    /// exit 0 when it holds, 1 when it does not, naming the first record
    /// that differs, 2 on bad input. The chain needs no policy file: a
    /// database URL and --schema are enough.
    Verify {
        /// Cohort's schema, for verifying without a policy file (default:
        /// COHORT_SCHEMA, else public). With a policy file, its own.
        #[arg(long, value_name = "SCHEMA", conflicts_with = "report")]
        schema: Option<String>,
        /// A chain head recorded earlier (N:HASH, as a report prints it):
        /// the chain must still hold it.
        #[arg(long, value_name = "N:HASH", conflicts_with = "report")]
        head: Option<String>,
        /// The report file (its FILE.manifest.json beside it).
        #[arg(long, value_name = "FILE", requires_all = ["signature", "public_key"])]
        report: Option<PathBuf>,
        /// The detached signature (FILE.sig).
        #[arg(long, value_name = "SIG", requires = "report")]
        signature: Option<PathBuf>,
        /// The signer's public key (PREFIX.pub of `cohort keys generate`).
        #[arg(long, value_name = "KEY", requires = "report")]
        public_key: Option<PathBuf>,
        /// The period the report must be of (FROM..TO, as given to
        /// `cohort report`): a report of another period fails.
        #[arg(long, value_name = "FROM..TO", requires = "report")]
        period: Option<String>,
        /// The tenant the report must be of: a report of another tenant
        /// (or of all) fails.
        #[arg(long, value_name = "TENANT", requires = "report")]
        tenant: Option<String>,
    },
    /// One history-pruning pass now, with the policy's [cohort.prune] limits.
    Prune {
        /// Count what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// `cohort keys`.
#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Write a new Ed25519 key pair: PREFIX.key (private, mode 0600) and
    /// PREFIX.pub. Existing files are never overwritten.
    Generate {
        /// Path prefix of the two files.
        #[arg(long, value_name = "PREFIX")]
        out: PathBuf,
    },
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, with the enclosing spans' fields.
    Json,
}

fn main() -> ExitCode {
    let json_requested = std::env::args().any(|a| a == "--json");
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Usage errors follow --json like every other error: one JSON
        // document on stdout and exit 2. Help and version print as usual.
        Err(e) if json_requested && e.use_stderr() => {
            output::usage_error(&e.render().to_string());
            return ExitCode::from(2);
        }
        Err(e) => e.exit(),
    };
    use std::io::IsTerminal;
    // Long-running services say what they do (occurrences, passes); other
    // commands only warn; the demo narrates its own held rows and failing
    // handler, so only errors interrupt it. RUST_LOG overrides them all.
    let default_level = match cli.command {
        Command::Worker { .. } | Command::Dispatch { once: false } | Command::Serve { .. } => {
            "info"
        }
        Command::Demo { .. } => "error",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match cli.log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cohort: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let json = cli.json;
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(json),
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    match &cli.command {
        Command::Demo {
            write_policy: Some(path),
        } => demo::write_policy(path),
        Command::Demo { write_policy: None } => demo::run(cli.json).await,
        Command::NewId => {
            let id = uuid::Uuid::new_v4();
            if cli.json {
                output::print_json(&serde_json::json!({ "id": id }));
            } else {
                outln!("{id}");
            }
            Ok(())
        }
        Command::Init {
            schema,
            output,
            update: true,
            ..
        } => init::update(&cli, schema.as_deref(), output).await,
        Command::Init {
            schema,
            output,
            force,
            update: false,
        } => {
            let schema = schema.as_deref().unwrap_or(init::DEFAULT_SCHEMA);
            // Before connecting; `init::write` checks again as it creates.
            if !force && output.exists() {
                return Err(init::kept(output));
            }
            let policy = load_policy(&cli, false).ok().flatten();
            let url = database_url(&cli, policy.as_ref())?;
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
        Command::Migrate { schema, move_from } => {
            let policy = load_policy(&cli, false)?;
            let schema = schema
                .clone()
                .or_else(|| policy.as_ref().map(|p| p.config.schema.clone()))
                .unwrap_or_else(|| CohortConfig::default().schema);
            let url = database_url(&cli, policy.as_ref())?;
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
        Command::Validate => {
            let policy = load_policy(&cli, true)?.expect("required");
            let url = database_url(&cli, Some(&policy))?;
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
        Command::Preview { scope, now } => {
            let (cohort, _) = open(&cli).await?;
            commands::preview(&cohort, cli.json, scope, now.as_deref()).await
        }
        Command::Sweep {
            scope,
            now,
            dry_run,
            allow_future_now,
        } => {
            let (cohort, _) = open(&cli).await?;
            commands::sweep(
                &cohort,
                cli.json,
                scope,
                now.as_deref(),
                (*dry_run, *allow_future_now),
            )
            .await
        }
        Command::Erase {
            tenant,
            tenantless: _,
            subject,
            kind,
            allow_soft_delete,
            stage,
            dry_run,
            now,
            allow_future_now,
            reference,
            due,
            due_reason,
            note,
        } => {
            let terms = commands::RequestTerms::new(reference, due, due_reason, note)?;
            let (cohort, _) = open(&cli).await?;
            let mut scope =
                cohort::erasure::ErasureScope::new(subject).allow_soft_delete(*allow_soft_delete);
            if let Some(k) = kind {
                scope = scope.kind(k);
            }
            if let Some(n) = stage {
                scope = scope.stage(*n);
            }
            commands::erase(
                &cohort,
                cli.json,
                tenant.as_deref(),
                scope,
                now.as_deref(),
                (*dry_run, *allow_future_now),
                terms,
            )
            .await
        }
        Command::EraseRequests(cmd) => {
            let (cohort, _) = open(&cli).await?;
            commands::requests(&cohort, cli.json, cmd).await
        }
        Command::Holds(cmd) => {
            let (cohort, _) = open(&cli).await?;
            commands::holds(&cohort, cli.json, cmd).await
        }
        Command::Runs(cmd) => {
            let (cohort, _) = open(&cli).await?;
            commands::runs(&cohort, cli.json, cmd).await
        }
        Command::Dispatch { once } => {
            let (cohort, policy) = open_with(&cli, true, false).await?;
            commands::dispatch(&cohort, &policy, cli.json, *once).await
        }
        Command::Maintain { once } => {
            if !once {
                return Err(Failure::Input(Error::InvalidInput(
                    "cohort maintain runs one pass with --once; the maintenance service runs continuously inside `cohort worker`".into(),
                )));
            }
            let (cohort, _) = open_with(&cli, true, false).await?;
            services::maintain_once(&cohort, cli.json).await
        }
        Command::DeadLetters(cmd) => {
            let (cohort, _) = open(&cli).await?;
            commands::dead_letters(&cohort, cli.json, cmd).await
        }
        Command::Worker {
            metrics_addr,
            ignore_restore_gap,
        } => {
            let (cohort, _) = open_with(&cli, true, metrics_addr.is_some()).await?;
            restore::refuse_gap(&cohort, *ignore_restore_gap).await?;
            services::worker(&cohort, *metrics_addr).await
        }
        Command::RestoreCheck => {
            let (cohort, _) = open(&cli).await?;
            restore::check(&cohort, cli.json).await
        }
        Command::Replay {
            dry_run,
            journal_copy,
        } => {
            let (cohort, _) = open(&cli).await?;
            restore::replay(&cohort, cli.json, *dry_run, journal_copy.as_deref()).await
        }
        Command::Settings(cmd) => {
            let (cohort, _) = open(&cli).await?;
            services::settings(&cohort, cli.json, cmd).await
        }
        Command::Pause { entity } => {
            let (cohort, _) = open(&cli).await?;
            pacing::pause(&cohort, cli.json, entity, true).await
        }
        Command::Resume { entity } => {
            let (cohort, _) = open(&cli).await?;
            pacing::pause(&cohort, cli.json, entity, false).await
        }
        Command::Serve { listen } => {
            let token = console::token(*listen)?;
            let (cohort, _) = open(&cli).await?;
            console::serve(cohort, *listen, token).await
        }
        Command::Report {
            from,
            to,
            tenant,
            format,
            output,
            sign,
            sign_broken_chain,
        } => {
            let (cohort, loaded) = open_ledger(&cli).await?;
            let format = if cli.json {
                report::Format::Json
            } else {
                *format
            };
            let policy = cli
                .config
                .clone()
                .unwrap_or_else(|| PathBuf::from("cohort.toml"));
            let args = report::Args {
                from,
                to,
                tenant: tenant.as_deref(),
                format,
                output: output.as_deref(),
                sign: sign.as_deref().map(|key| (key, policy.as_path())),
                sign_broken_chain: *sign_broken_chain,
                evidence: &loaded.evidence,
            };
            report::run(&cohort, args).await
        }
        Command::Keys {
            command: KeysCommand::Generate { out },
        } => {
            let (private, public) = evidence::generate(out)?;
            if cli.json {
                output::print_json(&serde_json::json!({
                    "private_key": private.display().to_string(),
                    "public_key": public.display().to_string(),
                }));
            } else {
                outln!(
                    "Wrote {} (the signing key: keep it secret) and {} (its public key: give it to whoever verifies).",
                    private.display(),
                    public.display()
                );
            }
            Ok(())
        }
        Command::Verify {
            report: Some(report),
            signature: Some(signature),
            public_key: Some(public_key),
            period,
            tenant,
            ..
        } => {
            let expect = evidence::Expected::parse(period.as_deref(), tenant.as_deref())?;
            let verified = evidence::verify(report, signature, public_key, &expect)?;
            if cli.json {
                output::print_json(&serde_json::to_value(&verified).expect("serialises"));
            } else if verified.valid {
                outln!(
                    "{}: the signature and the report's digest hold ({}).",
                    report.display(),
                    verified.manifest
                );
                for line in verified.summary() {
                    outln!("  {line}");
                }
            } else {
                eprintln!(
                    "cohort: {}",
                    verified.problem.as_deref().unwrap_or("not valid")
                );
            }
            if verified.valid {
                Ok(())
            } else {
                Err(Failure::Status(1))
            }
        }
        Command::Verify {
            report: None,
            head,
            schema,
            ..
        } => {
            let expected = head
                .as_deref()
                .map(str::parse::<cohort::chain::ExpectedHead>)
                .transpose()?;
            if cli.config.is_some() && schema.is_some() {
                return Err(Failure::Input(Error::InvalidInput(
                    "--schema is for verifying without a policy file; with --config the policy file names the schema".into(),
                )));
            }
            let policy_file = cli.config.is_some()
                || (schema.is_none() && std::path::Path::new("cohort.toml").exists());
            if policy_file {
                let (cohort, _) = open_ledger(&cli).await?;
                evidence::verify_chain(&cohort, cli.json, expected, true).await
            } else {
                let cohort = open_auditor(&cli, schema.as_deref()).await?;
                evidence::verify_chain(&cohort, cli.json, expected, false).await
            }
        }
        Command::Verify { .. } => Err(Failure::Input(cohort::Error::InvalidInput(
            "--report needs --signature SIG and --public-key KEY".into(),
        ))),
        Command::Prune { dry_run } => {
            let (cohort, _) = open(&cli).await?;
            services::prune(&cohort, cli.json, *dry_run).await
        }
    }
}

/// Loads the policy, connects, and builds a validated handle.
async fn open(cli: &Cli) -> Result<(Cohort, PolicyFile), Failure> {
    open_with(cli, false, false).await
}

/// A handle for a command that reads only the ledger (`report`): the
/// policy names the database and Cohort's schema, and is not validated
/// against the catalog, so evidence stays readable after the retained
/// tables have changed.
async fn open_ledger(cli: &Cli) -> Result<(Cohort, PolicyFile), Failure> {
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
async fn open_auditor(cli: &Cli, schema: Option<&str>) -> Result<Cohort, Failure> {
    let mut config = CohortConfig::default();
    config.apply_env(std::env::vars().filter(|(k, _)| {
        k.as_str() != console::TOKEN_VAR && k.as_str() != cohort::journal::KEY_ENV
    }))?;
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
async fn open_with(
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
fn load_policy(cli: &Cli, required: bool) -> Result<Option<PolicyFile>, Failure> {
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
    policy.config.apply_env(std::env::vars().filter(|(k, _)| {
        k.as_str() != console::TOKEN_VAR && k.as_str() != cohort::journal::KEY_ENV
    }))?;
    Ok(Some(policy))
}

/// `--database-url`, then `DATABASE_URL`, then the policy file.
fn database_url(cli: &Cli, policy: Option<&PolicyFile>) -> Result<String, Failure> {
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
async fn connect(url: &str) -> Result<sqlx::PgConnection, Failure> {
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
async fn pool(url: &str, max: u32) -> Result<sqlx::PgPool, Failure> {
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
