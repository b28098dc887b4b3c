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
mod open;
mod output;
mod pacing;
mod report;
mod restore;
mod services;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cohort::Cohort;

pub(crate) use exit::Failure;
use open::open;

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
    Init(commands::setup::InitArgs),
    /// Install or upgrade Cohort's tables (or, with --move-from, move them
    /// to --schema with their data).
    Migrate(commands::setup::MigrateArgs),
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
    Erase(commands::EraseArgs),
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
    Report(commands::audit::ReportArgs),
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
    Verify(commands::audit::VerifyArgs),
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
    let json = cli.json;
    match &cli.command {
        Command::Demo { write_policy } => demo::start(write_policy.as_deref(), json).await,
        Command::NewId => commands::new_id(json),
        Command::Init(args) if args.update => {
            init::update(&cli, args.schema.as_deref(), &args.output).await
        }
        Command::Init(args) => commands::setup::init(&cli, args).await,
        Command::Migrate(args) => commands::setup::migrate(&cli, args).await,
        Command::Validate => commands::setup::validate(&cli).await,
        Command::Preview { scope, now } => {
            opened(&cli, async |c| {
                commands::preview(c, json, scope, now.as_deref()).await
            })
            .await
        }
        Command::Sweep {
            scope,
            now,
            dry_run,
            allow_future_now,
        } => {
            let flags = (*dry_run, *allow_future_now);
            opened(&cli, async |c| {
                commands::sweep(c, json, scope, now.as_deref(), flags).await
            })
            .await
        }
        Command::Erase(args) => commands::erase(&cli, args).await,
        Command::EraseRequests(cmd) => {
            opened(&cli, async |c| commands::requests(c, json, cmd).await).await
        }
        Command::Holds(cmd) => opened(&cli, async |c| commands::holds(c, json, cmd).await).await,
        Command::Runs(cmd) => opened(&cli, async |c| commands::runs(c, json, cmd).await).await,
        Command::Dispatch { once } => commands::dispatch_command(&cli, *once).await,
        Command::Maintain { once } => services::maintain(&cli, *once).await,
        Command::DeadLetters(cmd) => {
            opened(&cli, async |c| commands::dead_letters(c, json, cmd).await).await
        }
        Command::Worker {
            metrics_addr,
            ignore_restore_gap,
        } => services::worker_command(&cli, *metrics_addr, *ignore_restore_gap).await,
        Command::RestoreCheck => opened(&cli, async |c| restore::check(c, json).await).await,
        Command::Replay {
            dry_run,
            journal_copy,
        } => {
            let copy = journal_copy.as_deref();
            opened(&cli, async |c| {
                restore::replay(c, json, *dry_run, copy).await
            })
            .await
        }
        Command::Settings(cmd) => {
            opened(&cli, async |c| services::settings(c, json, cmd).await).await
        }
        Command::Pause { entity } => {
            opened(&cli, async |c| pacing::pause(c, json, entity, true).await).await
        }
        Command::Resume { entity } => {
            opened(&cli, async |c| pacing::pause(c, json, entity, false).await).await
        }
        Command::Serve { listen } => console::serve_command(&cli, *listen).await,
        Command::Report(args) => commands::audit::report(&cli, args).await,
        Command::Keys {
            command: KeysCommand::Generate { out },
        } => commands::audit::keys_generate(&cli, out),
        Command::Verify(args) => commands::audit::verify(&cli, args).await,
        Command::Prune { dry_run } => {
            opened(&cli, async |c| services::prune(c, json, *dry_run).await).await
        }
    }
}

/// Runs `command` on the handle the policy file and database open.
async fn opened(
    cli: &Cli,
    command: impl AsyncFnOnce(&Cohort) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let (cohort, _) = open(cli).await?;
    command(&cohort).await
}
