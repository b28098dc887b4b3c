//! `cohort worker --metrics-addr ADDR`: the Prometheus exporter. Installs
//! the `metrics-exporter-prometheus` recorder (so every metric Cohort
//! records in this process is kept) and serves `/metrics` in the
//! Prometheus text format and `/healthz`, on its own small HTTP server.
//! Before each scrape the queue gauges, the erasure requests per state and
//! the last successful runs are
//! read from the database (at most once per [`GAUGE_REFRESH`]; a scrape
//! never waits longer than [`GAUGE_TIMEOUT`] for them, and serves the last
//! values if the database does not answer). The last successful runs are
//! also read once when the exporter starts, so the series exists before
//! the first scrape and the first run.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use cohort::{Cohort, Error};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::sync::Mutex;

use crate::Failure;

/// The queue gauges are read again only after this long.
const GAUGE_REFRESH: Duration = Duration::from_secs(5);
/// How long a scrape waits for the database before serving the last values.
const GAUGE_TIMEOUT: Duration = Duration::from_secs(2);

struct Exporter {
    handle: PrometheusHandle,
    cohort: Cohort,
    last_refresh: Mutex<Option<Instant>>,
    /// The services' names that have ended (a panicked service): `/healthz`
    /// answers 503 once any has.
    ended: Box<dyn Fn() -> Vec<String> + Send + Sync>,
}

/// A bound exporter, ready to serve.
pub(crate) struct Bound {
    listener: tokio::net::TcpListener,
    router: Router,
}

impl Bound {
    /// The address actually bound (port 0 picks a free one).
    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until the process ends.
    pub(crate) fn spawn(self) {
        tokio::spawn(async move {
            if let Err(e) = axum::serve(self.listener, self.router).await {
                tracing::error!(error = %e, "the metrics server stopped");
            }
        });
    }
}

/// Installs the recorder and binds `addr`; an address that cannot be bound
/// is a configuration error (exit 2) before any service starts.
pub(crate) async fn bind(
    addr: SocketAddr,
    cohort: &Cohort,
    ended: impl Fn() -> Vec<String> + Send + Sync + 'static,
) -> Result<Bound, Failure> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_duration_seconds".into()),
            cohort::telemetry::DURATION_BUCKETS,
        )
        .and_then(|b| b.install_recorder())
        .map_err(|e| {
            Failure::Run(Error::Config(
                format!("cannot install the metrics recorder: {e}").into(),
            ))
        })?;
    cohort::telemetry::describe();
    if let Err(e) = cohort.last_success().await {
        tracing::warn!(error = %e, "reading the last successful runs failed; the gauge is set after the next run");
    }
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        Failure::Input(Error::Config(
            format!("--metrics-addr {addr}: cannot listen there: {e}").into(),
        ))
    })?;
    let state = Arc::new(Exporter {
        handle,
        cohort: cohort.clone(),
        last_refresh: Mutex::new(None),
        ended: Box::new(ended),
    });
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(state);
    Ok(Bound { listener, router })
}

async fn metrics(State(x): State<Arc<Exporter>>) -> impl IntoResponse {
    {
        let mut last = x.last_refresh.lock().await;
        if last.is_none_or(|at| at.elapsed() >= GAUGE_REFRESH) {
            let read = async {
                x.cohort.queue_depth().await?;
                x.cohort.erasure_request_counts().await?;
                x.cohort.last_success().await
            };
            match tokio::time::timeout(GAUGE_TIMEOUT, read).await {
                Ok(Ok(_)) => *last = Some(Instant::now()),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "reading the handler queue or the ledger for the metrics failed; serving the last values")
                }
                Err(_) => tracing::warn!(
                    "the database did not answer within {GAUGE_TIMEOUT:?}; serving the last values"
                ),
            }
        }
    }
    x.handle.run_upkeep();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        x.handle.render(),
    )
}

async fn healthz(State(x): State<Arc<Exporter>>) -> impl IntoResponse {
    let ended = (x.ended)();
    if ended.is_empty() {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stopped: {}\n", ended.join(", ")),
        )
    }
}
