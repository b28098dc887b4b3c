//! Background services: the scheduled worker, the row-handler dispatcher,
//! the history pruner and the maintenance service (always), started
//! together on the host's tokio runtime and stopped together.
//!
//! ```no_run
//! # async fn f(cohort: cohort::Cohort) -> Result<(), cohort::Error> {
//! use std::time::Duration;
//! // Worker if `schedule` is set, dispatcher if handlers are registered,
//! // pruner if `[prune]` limits are set; maintenance always.
//! let services = cohort::services::Services::new(&cohort)?
//!     .grace_period(Duration::from_secs(30))
//!     .try_spawn()?;
//! // ... the application runs ...
//! let report = services.shutdown().await; // graceful: see `ServicesHandle`
//! assert!(report.clean());
//! # Ok(()) }
//! ```
//!
//! Each service has its own validated settings ([`WorkerConfig`],
//! [`PrunerConfig`], [`MaintenanceConfig`], the dispatcher's
//! [`crate::config::DispatchConfig`]);
//! [`Services::new`] reads them from the handle's configuration, and the
//! setters replace or switch off one service.

pub mod dispatcher;
pub mod events;
pub(crate) mod grants;
pub mod pruner;
mod reports;
pub mod rescuer;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::base::cancel::Cancel;
use crate::context::Context;
use crate::error::Result;

pub use dispatcher::{Dispatcher, DispatcherConfig, FlushReport};
pub use events::{OccurrenceOutcome, ServiceEvent};
pub use grants::Access;
pub use pruner::{PruneRequest, PrunerConfig};
pub use reports::{MaintenanceReport, PruneReport};
pub use rescuer::MaintenanceConfig;
pub use worker::WorkerConfig;

/// The default time in-flight handler deliveries get to finish at shutdown.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);

/// How long a service may take to stop once the grace period is over and
/// its in-flight work was told to stop, before it is aborted.
pub const FORCE_WAIT: Duration = Duration::from_secs(5);

/// Which services to start, and how; see the module documentation.
#[derive(Clone)]
pub struct Services {
    cx: Arc<Context>,
    worker: Option<WorkerConfig>,
    dispatcher: bool,
    pruner: Option<PrunerConfig>,
    maintenance: MaintenanceConfig,
    grace: Duration,
    events: events::Events,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("worker", &self.worker)
            .field("dispatcher", &self.dispatcher)
            .field("pruner", &self.pruner)
            .field("maintenance", &self.maintenance)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl Services {
    /// The services the configuration of `cx` asks for (see
    /// `Services::new`, in the facade, which hands the handle's context).
    pub(crate) fn from_context(cx: Arc<Context>) -> Result<Self> {
        Ok(Self {
            worker: WorkerConfig::from_config(&cx.config)?,
            dispatcher: !cx.handlers.is_empty(),
            pruner: PrunerConfig::from_config(&cx.config)?,
            maintenance: MaintenanceConfig::from_config(&cx.config)?,
            grace: cx.config.shutdown_grace_period(),
            events: events::Events::new(),
            cx,
        })
    }

    /// Events of the services about to start: subscribe before
    /// [`Services::spawn`] to see their first occurrence or pass too.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<ServiceEvent> {
        self.events.subscribe()
    }

    /// Replaces the worker's settings (`None`: no worker).
    pub fn worker(mut self, worker: Option<WorkerConfig>) -> Self {
        self.worker = worker;
        self
    }

    /// Starts the dispatcher or not.
    pub fn dispatcher(mut self, on: bool) -> Self {
        self.dispatcher = on;
        self
    }

    /// Replaces the pruner's settings (`None`: no pruner).
    pub fn pruner(mut self, pruner: Option<PrunerConfig>) -> Self {
        self.pruner = pruner;
        self
    }

    /// Replaces the maintenance service's settings. It cannot be switched
    /// off: without it a run whose process died stays `started` for good
    /// and captured personal data is never scrubbed.
    pub fn maintenance(mut self, maintenance: MaintenanceConfig) -> Self {
        self.maintenance = maintenance;
        self
    }

    /// How long in-flight handler deliveries may take to finish at
    /// shutdown before they are stopped and their claims released
    /// (default: the configuration's `shutdown_grace_period`, 30 s).
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The services that would start, by name.
    pub fn names(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.worker.is_some() {
            out.push("worker");
        }
        if self.dispatcher {
            out.push("dispatcher");
        }
        if self.pruner.is_some() {
            out.push("pruner");
        }
        out.push("maintenance");
        out
    }

    /// The fewest pool connections these services can work with: the
    /// worker holds its occurrence lock on one while a run uses another
    /// and reads settings on a third (a run sweeping an entity on N
    /// connections, `sweep_parallelism`, takes N - 1 more); the pruner's
    /// batch transaction and its settings read need two; the dispatcher and
    /// maintenance one.
    pub fn connections_needed(&self) -> u32 {
        let mut n = 1;
        if self.worker.is_some() {
            let lanes = self
                .cx
                .declarations
                .iter()
                .filter_map(|d| d.sweep_parallelism)
                .chain([self.cx.config.sweep_parallelism])
                .max()
                .unwrap_or(1)
                .max(1);
            n = n.max(2 + lanes);
        }
        if self.pruner.is_some() {
            n = n.max(2);
        }
        if self.dispatcher {
            n = n.max(1);
        }
        n
    }

    /// Checks, against the live grants, everything the services that would
    /// start need the role to be allowed (see [`Access`]); one error lists
    /// every missing grant. Call it before [`Services::try_spawn`] (the
    /// CLI's `worker` and `dispatch` do): a service started without them
    /// fails at its first statement that needs one, iteration after
    /// iteration.
    pub async fn check_grants(&self) -> Result<()> {
        let mut accesses = Vec::new();
        if self.worker.is_some() {
            accesses.push(Access::Runs);
        }
        if self.dispatcher {
            accesses.push(Access::Dispatcher);
        }
        if self.pruner.is_some() {
            accesses.push(Access::Pruner);
        }
        accesses.push(Access::Maintenance);
        let ready = self.cx.ready().await?;
        grants::check(&ready, &accesses).await
    }

    /// Starts them on the current tokio runtime (call it from within one).
    /// A pool smaller than [`Services::connections_needed`] is a
    /// configuration error: the services would fail every iteration.
    pub fn try_spawn(self) -> Result<ServicesHandle> {
        let have = self.cx.pool.options().get_max_connections();
        let need = self.connections_needed();
        if have < need {
            return Err(crate::error::Error::Config(crate::error::Problems::one(format!(
                "the pool allows {have} connection(s); the background services ({}) need at least {need}",
                self.names().join(", ")
            ))));
        }
        Ok(self.spawn())
    }

    /// Starts them on the current tokio runtime (call it from within one),
    /// without checking the pool's size (see [`Services::try_spawn`]).
    pub fn spawn(self) -> ServicesHandle {
        let soft = Cancel::new();
        let hard = Cancel::new();
        let mut tasks = Vec::new();
        if let Some(config) = self.worker {
            let cx = Arc::clone(&self.cx);
            let cancel = soft.clone();
            let events = self.events.clone();
            tasks.push((
                "worker",
                tokio::spawn(async move { worker::run(cx, config, cancel, events).await }),
            ));
        }
        if self.dispatcher {
            let dispatcher =
                dispatcher::Dispatcher::new(Arc::clone(&self.cx)).stopping_on(hard.clone());
            let cancel = soft.clone();
            tasks.push((
                "dispatcher",
                tokio::spawn(async move { dispatcher.run(cancel).await }),
            ));
        }
        if let Some(config) = self.pruner {
            let cx = Arc::clone(&self.cx);
            let cancel = soft.clone();
            let events = self.events.clone();
            tasks.push((
                "pruner",
                tokio::spawn(async move { pruner::run(cx, config, cancel, events).await }),
            ));
        }
        {
            let cx = Arc::clone(&self.cx);
            let cancel = soft.clone();
            let config = self.maintenance;
            let events = self.events.clone();
            tasks.push((
                "maintenance",
                tokio::spawn(async move { rescuer::run(cx, config, cancel, events).await }),
            ));
        }
        ServicesHandle {
            soft,
            hard,
            tasks,
            grace: self.grace,
            events: self.events,
        }
    }
}

/// Running services. Dropping the handle leaves them running until the
/// runtime stops; call [`ServicesHandle::shutdown`] to stop them well.
#[derive(Debug)]
pub struct ServicesHandle {
    events: events::Events,
    soft: Cancel,
    hard: Cancel,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    grace: Duration,
}

/// How a shutdown went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Services that stopped within the grace period.
    pub stopped: Vec<&'static str>,
    /// Services stopped after the grace period (their in-flight handler
    /// deliveries were cancelled and their claims released).
    pub forced: Vec<&'static str>,
    /// Services that had panicked.
    pub panicked: Vec<&'static str>,
}

impl ShutdownReport {
    /// Every service stopped within the grace period, none had panicked.
    pub fn clean(&self) -> bool {
        self.forced.is_empty() && self.panicked.is_empty()
    }
}

impl ServicesHandle {
    /// Events of the running services from now on (see [`ServiceEvent`]).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<ServiceEvent> {
        self.events.subscribe()
    }

    /// Stops gracefully: the worker's open batch is rolled back and its run
    /// settled `Cancelled`, the pruner stops after its batch, the
    /// dispatcher claims nothing more and its in-flight deliveries get the
    /// grace period to finish; past it they are cancelled and their claims
    /// released. A service still busy [`FORCE_WAIT`] after that (a
    /// statement that will not end) is aborted: its connections are closed,
    /// so the server rolls its transaction back and releases its locks.
    pub async fn shutdown(self) -> ShutdownReport {
        self.soft.cancel();
        let deadline = tokio::time::Instant::now() + self.grace;
        let mut report = ShutdownReport::default();
        for (name, mut task) in self.tasks {
            let result = match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(r) => {
                    report.stopped.push(name);
                    r
                }
                Err(_) => {
                    tracing::warn!(
                        service = name,
                        "still busy after the grace period; stopping in-flight work now"
                    );
                    self.hard.cancel();
                    report.forced.push(name);
                    match tokio::time::timeout(FORCE_WAIT, &mut task).await {
                        Ok(r) => r,
                        Err(_) => {
                            tracing::warn!(service = name, "still busy; aborting it");
                            task.abort();
                            task.await
                        }
                    }
                }
            };
            if matches!(&result, Err(e) if e.is_panic()) {
                report.stopped.retain(|n| *n != name);
                report.forced.retain(|n| *n != name);
                report.panicked.push(name);
            }
        }
        report
    }

    /// Stops at once: like [`ServicesHandle::shutdown`] with no grace.
    pub async fn stop_now(self) -> ShutdownReport {
        self.hard.cancel();
        self.shutdown().await
    }

    /// A token that ends the grace period when fired: in-flight handler
    /// deliveries are cancelled and their claims released at once (e.g. on
    /// a second Ctrl-C while [`ServicesHandle::shutdown`] waits).
    pub fn stop_now_token(&self) -> Cancel {
        self.hard.clone()
    }

    /// Whether every service has stopped (they only stop when told, or
    /// when one panicked).
    pub fn is_finished(&self) -> bool {
        self.tasks.iter().all(|(_, t)| t.is_finished())
    }

    /// The services that have stopped although nobody asked them to (a
    /// panic): a host should stop too, or restart them.
    pub fn ended(&self) -> Vec<&'static str> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.is_finished())
            .map(|(n, _)| *n)
            .collect()
    }
}
