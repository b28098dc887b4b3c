//! The long-running and operator commands of the background services:
//! `worker`, `dispatch` (continuous), `settings`, `prune`, and the signal
//! handling every long-running command shares.

use clap::Subcommand;
use cohort::services::{PruneRequest, PrunerConfig, Services, WorkerConfig};
use cohort::settings::{LivePacing, LiveSettings, PacingLimit, Setting};
use cohort::{Cancel, Cohort, Error};
use serde_json::json;

use crate::output::{print_json, table};
use crate::Failure;

/// Fires `cancel` on the first SIGINT or SIGTERM, after printing `what`.
pub(crate) fn cancel_on_signal(cancel: &Cancel, what: &'static str) {
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        eprintln!("cohort: {what}");
        on_signal.cancel();
    });
}

/// The first SIGINT or SIGTERM.
pub(crate) async fn wait_for_signal() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops this command");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// SIGINT and SIGTERM watched from the moment this is created (tokio
/// installs the handlers then, not at the first wait): a long-running
/// command creates it first, so a signal that arrives while it still
/// starts up (checking grants, binding the metrics port) stops it
/// gracefully instead of killing it.
pub(crate) struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    pub(crate) fn watch() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        let watch = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, signal = name, "cannot watch this signal");
                None
            }
        };
        Self {
            term: watch(SignalKind::terminate(), "SIGTERM"),
            int: watch(SignalKind::interrupt(), "SIGINT"),
        }
    }

    /// The next SIGINT or SIGTERM.
    pub(crate) async fn recv(&mut self) {
        async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        tokio::select! {
            _ = next(&mut self.term) => {}
            _ = next(&mut self.int) => {}
        }
    }
}

/// What the maintenance service (and `cohort maintain --once`) does, as
/// the worker's startup line says it.
const MAINTENANCE_DOES: &str = "every minute: resumes waiting erasure requests (a hold released or expired, a legal minimum passed), settles runs a lost process left started, dead-letters handler work nothing registered can deliver, scrubs old payloads";

/// `cohort maintain --once`: one maintenance pass, what it did on stdout;
/// exit 0 whatever it found (an erasure request still waiting is not a
/// failure of the pass).
/// `cohort maintain`: one pass with `--once`; refused without it (the
/// service runs continuously inside `cohort worker`).
pub(crate) async fn maintain(cli: &crate::Cli, once: bool) -> Result<(), Failure> {
    if !once {
        return Err(Failure::Input(Error::InvalidInput(
            "cohort maintain runs one pass with --once; the maintenance service runs continuously inside `cohort worker`".into(),
        )));
    }
    let (cohort, _) = crate::open::open_with(cli, true, false).await?;
    maintain_once(&cohort, cli.json).await
}

/// `cohort worker`: refused on a restore gap unless told to ignore it.
pub(crate) async fn worker_command(
    cli: &crate::Cli,
    metrics_addr: Option<std::net::SocketAddr>,
    ignore_restore_gap: bool,
) -> Result<(), Failure> {
    let (cohort, _) = crate::open::open_with(cli, true, metrics_addr.is_some()).await?;
    crate::restore::refuse_gap(&cohort, ignore_restore_gap).await?;
    worker(&cohort, metrics_addr).await
}

pub(crate) async fn maintain_once(cohort: &Cohort, json: bool) -> Result<(), Failure> {
    // Resuming a request runs its erasure: the grants of runs too.
    cohort
        .check_grants(&[
            cohort::services::Access::Maintenance,
            cohort::services::Access::Runs,
        ])
        .await?;
    let config = cohort::services::MaintenanceConfig::from_config(cohort.config())?;
    let r = cohort.maintain(&config).await?;
    if json {
        crate::output::print_json(&serde_json::to_value(r).expect("serialises"));
    } else {
        outln!(
            "Erasure requests resumed {}, completed {}; runs a lost process left settled {}; orphaned handler work dead-lettered {}; payloads scrubbed {}.",
            r.erasure_requests_resumed,
            r.erasure_requests_completed,
            r.recovered_runs,
            r.orphaned_work,
            r.scrubbed
        );
    }
    Ok(())
}

/// Runs services until SIGINT/SIGTERM, then stops them gracefully; exit 0.
/// `ended` is kept up to date with the services that stopped by
/// themselves (read by `/healthz`).
async fn run_until_signal(
    services: Services,
    ended: Ended,
    mut signals: Signals,
) -> Result<(), Failure> {
    let names = services.names().join(", ");
    // Every grant the services need, before anything starts.
    services.check_grants().await?;
    let handle = services.try_spawn()?;
    tracing::info!(
        services = %names,
        maintenance = MAINTENANCE_DOES,
        "started; stop with SIGINT or SIGTERM"
    );
    // Until a signal, or a service ending by itself (it panicked).
    let signalled = tokio::select! {
        _ = signals.recv() => true,
        _ = async {
            while handle.ended().is_empty() {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        } => false,
    };
    *ended.lock().expect("not poisoned") = handle.ended().iter().map(|s| s.to_string()).collect();
    if !signalled {
        let ended = handle.ended().join(", ");
        let report = handle.shutdown().await;
        return Err(Failure::Run(Error::Config(
            format!(
                "service(s) stopped unexpectedly: {ended} (panicked: {})",
                report.panicked.join(", ")
            )
            .into(),
        )));
    }
    eprintln!("cohort: stopping ({names}); the open batch is rolled back, in-flight deliveries get the grace period (signal again to stop them now)");
    let now = handle.stop_now_token();
    tokio::spawn(async move {
        signals.recv().await;
        eprintln!("cohort: stopping in-flight deliveries now; their claims are released");
        now.cancel();
    });
    let report = handle.shutdown().await;
    if !report.forced.is_empty() {
        eprintln!(
            "cohort: {} did not finish within the grace period; in-flight deliveries were stopped and their claims released",
            report.forced.join(", ")
        );
    }
    if !report.panicked.is_empty() {
        return Err(Failure::Run(Error::Config(
            format!("service(s) panicked: {}", report.panicked.join(", ")).into(),
        )));
    }
    Ok(())
}

/// `cohort worker`: the scheduled worker, the dispatcher (when the policy
/// declares handlers), the pruner (when `[cohort.prune]` sets a limit) and
/// the maintenance service (always).
pub(crate) async fn worker(
    cohort: &Cohort,
    metrics_addr: Option<std::net::SocketAddr>,
) -> Result<(), Failure> {
    let signals = Signals::watch();
    let worker = WorkerConfig::from_config(cohort.config())?;
    let services = Services::new(cohort)?.worker(worker);
    if services.names() == ["maintenance"] {
        eprintln!(
            "cohort: note: only the maintenance service runs (settling runs whose process died, scrubbing old payloads): set [cohort] schedule for scheduled sweeps, declare [[entity.handler]] for the dispatcher, or set a [cohort.prune] limit for the pruner"
        );
    } else if cohort.config().schedule.is_none() {
        eprintln!("cohort: note: no [cohort] schedule; the scheduled worker stays idle");
    }
    let ended = Ended::default();
    if let Some(addr) = metrics_addr {
        let seen = ended.clone();
        let exporter = crate::exporter::bind(addr, cohort, move || {
            seen.lock().expect("not poisoned").clone()
        })
        .await?;
        let bound = exporter
            .local_addr()
            .map_err(|e| Failure::Run(Error::Config(format!("--metrics-addr: {e}").into())))?;
        tracing::info!(%bound, "metrics served at http://{bound}/metrics (health at /healthz)");
        exporter.spawn();
    }
    run_until_signal(services, ended, signals).await
}

/// The services that stopped by themselves, shared with `/healthz`.
type Ended = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// `cohort dispatch` without `--once`: the dispatcher alone.
pub(crate) async fn dispatch_until_signal(cohort: &Cohort) -> Result<(), Failure> {
    let signals = Signals::watch();
    let services = Services::new(cohort)?
        .worker(None)
        .pruner(None)
        .dispatcher(true);
    run_until_signal(services, Ended::default(), signals).await
}

/// `cohort settings`.
#[derive(Debug, Subcommand)]
pub(crate) enum SettingsCommand {
    /// The live settings: this process's value (configuration), the
    /// database's, and the effective one (their OR); and the live pacing
    /// rows (pauses and limits, per entity and for every entity).
    Show,
    /// Set a live setting in the database. kill_switch and dry_run (on or
    /// off): every worker replica sees them at its next occurrence or
    /// between tenant passes. max_rows_per_second (a number) and
    /// max_replica_lag (a period such as 30s), or off to clear: every
    /// sweep reads them before its next batch.
    Set {
        /// kill_switch, dry_run, max_rows_per_second or max_replica_lag.
        #[arg(value_parser = ["kill_switch", "dry_run", "max_rows_per_second", "max_replica_lag"])]
        name: String,
        /// on or off; a number or off; a period or off.
        value: String,
        /// The pacing limit of one entity (name or id) instead of every
        /// entity's (max_rows_per_second and max_replica_lag only).
        #[arg(long)]
        entity: Option<String>,
    },
}

pub(crate) async fn settings(
    cohort: &Cohort,
    json: bool,
    cmd: &SettingsCommand,
) -> Result<(), Failure> {
    let live = match cmd {
        SettingsCommand::Show => cohort.settings().await?,
        SettingsCommand::Set {
            name,
            value,
            entity,
        } => match name.parse::<Setting>() {
            Ok(setting) => {
                if entity.is_some() {
                    return Err(Failure::Input(Error::InvalidInput(format!(
                        "{name} is one value for every replica: --entity is for max_rows_per_second and max_replica_lag"
                    ))));
                }
                let enabled = match value.as_str() {
                    "on" => true,
                    "off" => false,
                    other => {
                        return Err(Failure::Input(Error::InvalidInput(format!(
                            "{name} {other:?}: on or off"
                        ))))
                    }
                };
                cohort.set_setting(setting, enabled).await?
            }
            Err(_) => {
                let limit = PacingLimit::parse(name, value)?;
                cohort.set_pacing(entity.as_deref(), limit).await?;
                cohort.settings().await?
            }
        },
    };
    let pacing = cohort.pacing().await?;
    print_settings(json, &live, &pacing, cohort.config());
    Ok(())
}

fn print_settings(
    json: bool,
    live: &LiveSettings,
    pacing: &[LivePacing],
    config: &cohort::CohortConfig,
) {
    if json {
        let one = |s: Setting| {
            let v = live.get(s);
            json!({
                "effective": v.effective,
                "configuration": v.process,
                "database": v.database,
                "updated_at": v.updated_at,
                "updated_by": v.updated_by,
            })
        };
        print_json(&json!({
            "kill_switch": live.kill_switch.effective,
            "dry_run": live.dry_run.effective,
            "sources": {
                "kill_switch": one(Setting::KillSwitch),
                "dry_run": one(Setting::DryRun),
            },
            "configured_pacing": {
                "max_rows_per_second": config.max_rows_per_second,
                "max_replica_lag": config.max_replica_lag.map(|p| p.to_string()),
            },
            "pacing": pacing,
        }));
        return;
    }
    let on = |b: bool| if b { "on" } else { "off" }.to_string();
    let rows: Vec<Vec<String>> = Setting::ALL
        .iter()
        .map(|&s| {
            let v = live.get(s);
            vec![
                s.name().to_string(),
                on(v.effective),
                on(v.process),
                on(v.database),
                match (&v.updated_at, &v.updated_by) {
                    (Some(at), Some(by)) => {
                        format!("{} by {by}", at.format("%Y-%m-%d %H:%M:%S UTC"))
                    }
                    _ => "never set".into(),
                },
            ]
        })
        .collect();
    outln!(
        "{}",
        table(
            &[
                "setting",
                "effective",
                "configuration",
                "database",
                "database value set"
            ],
            &rows
        )
    );
    crate::pacing::print_rows(pacing);
}

/// `cohort prune [--dry-run]`: one pass now with `[cohort.prune]`.
pub(crate) async fn prune(cohort: &Cohort, json: bool, dry_run: bool) -> Result<(), Failure> {
    let Some(config) = PrunerConfig::from_config(cohort.config())? else {
        return Err(Failure::Input(Error::Config(
            "nothing to prune: set [cohort.prune] succeeded_runs_older_than, failed_runs_older_than (or runs_older_than for both) and/or inactive_holds_older_than"
                .into(),
        )));
    };
    cohort
        .check_grants(&[cohort::services::Access::Pruner])
        .await?;
    if cohort
        .settings()
        .await
        .is_ok_and(|s| s.kill_switch.effective)
    {
        eprintln!("cohort: note: the kill switch stops the background pruner only; this explicit pass goes ahead");
    }
    let cancel = Cancel::new();
    cancel_on_signal(&cancel, "stopping after the current batch");
    let r = cohort
        .prune(
            PruneRequest::new(config)
                .dry_run(dry_run)
                .cancellation(cancel),
        )
        .await?;
    if json {
        print_json(&serde_json::to_value(&r).expect("report serialises"));
    } else {
        let verb = if dry_run { "Would delete" } else { "Deleted" };
        outln!(
            "{verb} {} run(s) ({} summaries, {} row details, {} finished handler deliveries) and {} inactive hold(s).",
            r.runs, r.summaries, r.row_details, r.handler_work, r.holds
        );
        if r.occurrences > 0 {
            outln!(
                "{verb} {} old scheduled occurrence(s) with their passes.",
                r.occurrences
            );
        }
        if r.runs_kept_for_handlers > 0 {
            outln!(
                "Kept {} old run(s) that still have pending or in-flight handler work.",
                r.runs_kept_for_handlers
            );
        }
    }
    if r.stopped {
        eprintln!("cohort: stopped before the pass finished");
        return Err(Failure::Status(1));
    }
    Ok(())
}
