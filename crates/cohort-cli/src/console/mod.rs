//! `cohort serve --listen ADDR`: the read-only operations console.
//!
//! Server-rendered HTML (maud templates compiled into the binary; no
//! JavaScript at all): recent runs, one run's per-entity outcomes and
//! failures, active holds, the handler queue and dead letters, and the
//! settings page: every live setting (configuration, database, effective),
//! the live pacing (pauses first) beside the configured, and whether the
//! database lacks what the journal holds (the last restore check, reused
//! for a few minutes). The runs page's header says whether retention keeps
//! up: the last successful runs and the next occurrence (the ledger, the
//! schedule), each entity's backlog (one indexed read of each retained
//! table: the role needs SELECT on them for it, and without it the header
//! says so) and rows per day per category as an inline SVG. It only reads
//! (the ledger, the queue, the settings, the retained tables' oldest
//! eligible anchors, the journal), and shows nothing personal beyond record
//! ids and request references: no row values, no hold reasons (free text
//! that may name people), no secrets.
//!
//! Access: it listens on loopback unless told otherwise. On any other
//! address it refuses to start without `COHORT_SERVE_TOKEN`; when the token
//! is set (on any address) every request must carry
//! `Authorization: Bearer <token>`, compared in constant time. Every
//! response forbids scripts, framing and caching.

mod pages;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use cohort::{Cohort, Error};
use subtle::ConstantTimeEq;

use crate::Failure;

/// The environment variable holding the bearer token.
pub(crate) const TOKEN_VAR: &str = "COHORT_SERVE_TOKEN";
/// Shortest token accepted: a guessable token is refused, not used.
const MIN_TOKEN_LEN: usize = 16;
/// What every page may load: its own stylesheet, nothing else.
const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// How long the runs page reuses a backlog read. The backlog reads every
/// retained table once per tenant; reused, a page reloaded by several
/// operators costs one such read per interval, not one per load.
const BACKLOG_REUSE: std::time::Duration = std::time::Duration::from_secs(30);

/// How long the settings page reuses a restore check. The check reads the
/// whole journal (every entry hashed, its MAC checked; from another server
/// when the journal is a database) and every request's and hold's state:
/// a cost that grows with the journal, too much for every load, and a gap
/// it finds lasts until someone replays.
const RESTORE_CHECK_REUSE: std::time::Duration =
    std::time::Duration::from_secs(pages::RESTORE_CHECK_MINUTES * 60);

struct Console {
    cohort: Cohort,
    token: Option<String>,
    /// The last backlog read. Behind an async mutex so that concurrent
    /// loads wait for one read instead of each starting its own.
    backlog: tokio::sync::Mutex<Option<BacklogRead>>,
    /// The last restore check, and when it ran (the same way).
    restore: tokio::sync::Mutex<Option<(std::time::Instant, pages::Journal)>>,
}

/// One backlog read and when it happened.
#[derive(Clone)]
struct BacklogRead {
    taken: std::time::Instant,
    read_at: chrono::DateTime<chrono::Utc>,
    value: Result<Vec<cohort::telemetry::EntityBacklog>, String>,
}

/// The token `serve` must require on `listen`, from the environment;
/// refused (exit 2, before connecting) when the address is not loopback
/// and none is set, or when it is too short.
pub(crate) fn token(listen: SocketAddr) -> Result<Option<String>, Failure> {
    token_for(listen, std::env::var(TOKEN_VAR).ok())
}

/// `cohort serve`: the access token settled before the database is
/// opened, then [`serve`].
pub(crate) async fn serve_command(cli: &crate::Cli, listen: SocketAddr) -> Result<(), Failure> {
    let token = token(listen)?;
    let (cohort, _) = crate::open::open(cli).await?;
    serve(cohort, listen, token).await
}

/// Binds and serves until SIGINT/SIGTERM.
pub(crate) async fn serve(
    cohort: Cohort,
    listen: SocketAddr,
    token: Option<String>,
) -> Result<(), Failure> {
    cohort
        .check_grants(&[cohort::services::Access::Console])
        .await?;
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        Failure::Input(Error::Config(
            format!("--listen {listen}: cannot listen there: {e}").into(),
        ))
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::Run(Error::Config(format!("--listen: {e}").into())))?;
    let protected = token.is_some();
    let app = router(Arc::new(Console {
        cohort,
        token,
        backlog: tokio::sync::Mutex::new(None),
        restore: tokio::sync::Mutex::new(None),
    }));
    tracing::info!(%bound, token_required = protected, "console at http://{bound}/ (read-only; stop with SIGINT or SIGTERM)");
    axum::serve(listener, app)
        .with_graceful_shutdown(crate::services::wait_for_signal())
        .await
        .map_err(|e| Failure::Run(Error::Config(format!("the console stopped: {e}").into())))?;
    Ok(())
}

/// The token to require, if any: refused when it is empty or short, and
/// required when the address is not loopback.
fn token_for(listen: SocketAddr, token: Option<String>) -> Result<Option<String>, Failure> {
    let refuse = |msg: String| Err(Failure::Input(Error::Config(msg.into())));
    match token {
        Some(t) if t.trim().chars().count() < MIN_TOKEN_LEN => refuse(format!(
            "{TOKEN_VAR} must be at least {MIN_TOKEN_LEN} characters (it is {}); nothing served",
            t.trim().chars().count()
        )),
        Some(t) => Ok(Some(t.trim().to_string())),
        None if !listen.ip().is_loopback() => refuse(format!(
            "--listen {listen} is not a loopback address: set {TOKEN_VAR} (every request must then \
             send `Authorization: Bearer <token>`), or listen on 127.0.0.1; nothing served"
        )),
        None => Ok(None),
    }
}

fn router(state: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/runs") }))
        .route("/runs", get(runs))
        .route("/runs/{id}", get(run))
        .route("/holds", get(holds))
        .route("/erasure-requests", get(requests))
        .route("/queue", get(queue))
        .route("/settings", get(settings))
        .route("/style.css", get(style))
        .fallback(|| async { page_error(StatusCode::NOT_FOUND, "No such page.") })
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            authorise,
        ))
        .layer(axum::middleware::from_fn(secure_headers))
        .with_state(state)
}

/// With a token configured, a request without the right bearer token gets
/// 401 and nothing else. Without one (loopback only), a request must name
/// a loopback host: a web page whose name was rebound to 127.0.0.1 (DNS
/// rebinding) sends its own name and gets 421, so it cannot read the console
/// through the operator's browser.
async fn authorise(State(console): State<Arc<Console>>, request: Request, next: Next) -> Response {
    let Some(expected) = &console.token else {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !is_loopback_host(host) {
            return page_error(
                StatusCode::MISDIRECTED_REQUEST,
                "This console answers only to a loopback host name (localhost, 127.0.0.1, [::1]).",
            );
        }
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        next.run(request).await
    } else {
        let mut response = page_error(
            StatusCode::UNAUTHORIZED,
            "This console needs a bearer token (Authorization: Bearer <token>).",
        );
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"cohort\""),
        );
        response
    }
}

/// `localhost`, `127.0.0.1` (any 127/8 address) or `[::1]`, with or
/// without a port; a port is a number (`localhost:evil` is not loopback).
fn is_loopback_host(host: &str) -> bool {
    let port_ok = |port: &str| port.parse::<u16>().is_ok();
    let name = if let Some(v6) = host.strip_prefix('[') {
        match v6.split_once(']') {
            Some((ip, "")) => ip,
            Some((ip, rest)) if rest.strip_prefix(':').is_some_and(port_ok) => ip,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port_ok(port) => name,
            Some(_) => return false,
            None => host,
        }
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

async fn secure_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

fn page_error(status: StatusCode, message: &str) -> Response {
    (status, Html(pages::error(status, message).into_string())).into_response()
}

/// A failed read: bad input and unknown ids say so; anything else is
/// logged in full and shown as a generic message.
fn failed(e: Error) -> Response {
    match e.kind() {
        cohort::ErrorKind::NotFound => page_error(StatusCode::NOT_FOUND, &e.to_string()),
        k if k.is_bad_input() => page_error(StatusCode::BAD_REQUEST, &e.to_string()),
        _ => {
            tracing::error!(error = %e, "console read failed");
            page_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database could not be read; see the console's log.",
            )
        }
    }
}

#[derive(serde::Deserialize)]
struct Limit {
    limit: Option<i64>,
}

/// `?limit=N` (1..=1000, default 50); out of range is a 400 page.
fn limit(q: &Limit) -> Result<i64, Box<Response>> {
    match q.limit {
        None => Ok(50),
        Some(n) if (1..=1000).contains(&n) => Ok(n),
        Some(n) => Err(Box::new(page_error(
            StatusCode::BAD_REQUEST,
            &format!("limit must be between 1 and 1000, not {n}"),
        ))),
    }
}

async fn runs(State(c): State<Arc<Console>>, Query(q): Query<Limit>) -> Response {
    let n = match limit(&q) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    let keeping = match keeping_up(&c).await {
        Ok(k) => k,
        Err(e) => return failed(e),
    };
    match c.cohort.list_runs(n).await {
        Ok(runs) => Html(pages::runs(&runs, n, &keeping).into_string()).into_response(),
        Err(e) => failed(e),
    }
}

/// The runs page's header: the last successes and the next occurrence
/// (the ledger and the schedule), each entity's backlog now (one indexed
/// read per entity and tenant), and rows per day.
async fn keeping_up(c: &Console) -> Result<pages::Keeping, Error> {
    let cohort = &c.cohort;
    let rows_per_day = cohort.rows_per_day(pages::CHART_DAYS).await?;
    let next_occurrence = cohort.next_occurrence().await?;
    let backlog = backlog(c).await?;
    Ok(pages::Keeping {
        last_success: cohort.last_success().await?,
        backlog: backlog.value,
        backlog_read_at: backlog.read_at,
        next_occurrence,
        today: chrono::Utc::now().date_naive(),
        rows_per_day,
    })
}

/// The backlog, read again only when the last read is older than
/// [`BACKLOG_REUSE`]. It reads the retained tables themselves: a console
/// role granted only Cohort's tables gets the rest of the page and a note.
async fn backlog(c: &Console) -> Result<BacklogRead, Error> {
    let mut last = c.backlog.lock().await;
    if let Some(read) = last.as_ref().filter(|r| r.taken.elapsed() < BACKLOG_REUSE) {
        return Ok(read.clone());
    }
    let value = match c.cohort.backlog().await {
        Ok(b) => Ok(b),
        Err(Error::Database(sqlx::Error::Database(e))) if e.code().as_deref() == Some("42501") => {
            Err(
                "not readable: the console's role lacks SELECT on a retained table (the backlog \
                 reads each one's oldest eligible row)"
                    .to_string(),
            )
        }
        Err(e) => return Err(e),
    };
    let read = BacklogRead {
        taken: std::time::Instant::now(),
        read_at: chrono::Utc::now(),
        value,
    };
    *last = Some(read.clone());
    Ok(read)
}

async fn run(State(c): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    let Ok(run_id) = uuid::Uuid::parse_str(&id) else {
        return page_error(StatusCode::BAD_REQUEST, "A run id is a UUID.");
    };
    match c.cohort.show_run(run_id).await {
        Ok(result) => Html(pages::run(&result).into_string()).into_response(),
        Err(e) => failed(e),
    }
}

async fn holds(State(c): State<Arc<Console>>, Query(q): Query<Limit>) -> Response {
    let n = match limit(&q) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    let filter = cohort::holds::HoldFilter::all().active_only(true).limit(n);
    let model = match c.cohort.ready().await {
        Ok(m) => m,
        Err(e) => return failed(e),
    };
    match c.cohort.list_holds(&filter).await {
        Ok(holds) => Html(pages::holds(&holds, &model, n).into_string()).into_response(),
        Err(e) => failed(e),
    }
}

async fn requests(State(c): State<Arc<Console>>, Query(q): Query<Limit>) -> Response {
    let n = match limit(&q) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    let counts = match c.cohort.erasure_request_counts().await {
        Ok(counts) => counts,
        Err(e) => return failed(e),
    };
    let filter = cohort::erasure_requests::RequestFilter::new().limit(n);
    match c.cohort.erasure_requests(filter).await {
        Ok(list) => Html(pages::requests(&list, &counts, n).into_string()).into_response(),
        Err(e) => failed(e),
    }
}

async fn queue(State(c): State<Arc<Console>>, Query(q): Query<Limit>) -> Response {
    let n = match limit(&q) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    let depth = match c.cohort.queue_depth().await {
        Ok(d) => d,
        Err(e) => return failed(e),
    };
    let filter = cohort::handlers::DeadLetterFilter::all().limit(n);
    match c.cohort.dead_letters(&filter).await {
        Ok(dead) => Html(pages::queue(&depth, &dead, n).into_string()).into_response(),
        Err(e) => failed(e),
    }
}

/// Everything `cohort settings show` prints, the journal's state, the
/// peers and the configuration.
async fn settings(State(c): State<Arc<Console>>) -> Response {
    let cohort = &c.cohort;
    let read = async {
        let peers = cohort.peers().await?;
        let live = cohort.settings().await?;
        let pacing = cohort.pacing().await?;
        let model = cohort.ready().await?;
        Ok::<_, Error>((peers, live, pacing, model))
    };
    let (peers, live, pacing, model) = match read.await {
        Ok(read) => read,
        Err(e) => return failed(e),
    };
    let restore = journal(&c).await;
    let page = pages::SettingsPage {
        live: &live,
        pacing: &pacing,
        config: cohort.config(),
        model: &model,
        journal: &restore,
        peers: &peers,
    };
    Html(pages::settings(&page).into_string()).into_response()
}

/// The journal's state: the last restore check, run again only when it is
/// older than [`RESTORE_CHECK_REUSE`]. A check that cannot run (no key in
/// the console's environment, a broken chain, a journal out of reach) is
/// shown with why; a failed read of this database is logged, shown as
/// such, and tried again at the next load.
async fn journal(c: &Console) -> pages::Journal {
    if !c.cohort.has_journal() {
        return pages::Journal::NotConfigured;
    }
    let mut last = c.restore.lock().await;
    if let Some((_, journal)) = last
        .as_ref()
        .filter(|(taken, _)| taken.elapsed() < RESTORE_CHECK_REUSE)
    {
        return journal.clone();
    }
    let at = chrono::Utc::now();
    let (check, retry) = match c.cohort.restore_check().await {
        Ok(check) => (Ok(Box::new(check)), false),
        Err(Error::Database(e)) => {
            tracing::error!(error = %e, "the console's restore check could not read the database");
            (
                Err("the database could not be read for the check; see the console's log".into()),
                true,
            )
        }
        Err(e) => (Err(e.to_string()), false),
    };
    let journal = pages::Journal::Checked { at, check };
    *last = (!retry).then(|| (std::time::Instant::now(), journal.clone()));
    journal
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("style.css"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_host_names_table() {
        for ok in [
            "localhost",
            "localhost:8765",
            "LOCALHOST:1",
            "127.0.0.1",
            "127.0.0.1:8765",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8765",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:8765",
            "localhost.evil.example",
            "10.0.0.1:8765",
            "[::2]:1",
            "[::1]x",
            "127.0.0.1.evil.example",
            "localhost:evil",
            "localhost:",
            "127.0.0.1:80:80",
            "[::1]:evil",
            "[::1]:",
            "localhost:99999",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn token_rules_table() {
        let loopback: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let loopback6: SocketAddr = "[::1]:1".parse().unwrap();
        let open: SocketAddr = "0.0.0.0:1".parse().unwrap();
        let good = Some("0123456789abcdef".to_string());
        assert!(matches!(token_for(loopback, None), Ok(None)));
        assert!(matches!(token_for(loopback6, None), Ok(None)));
        assert!(matches!(token_for(open, None), Err(Failure::Input(_))));
        assert!(matches!(
            token_for(open, Some("short".into())),
            Err(Failure::Input(_))
        ));
        assert!(matches!(
            token_for(loopback, Some(String::new())),
            Err(Failure::Input(_))
        ));
        assert_eq!(
            token_for(open, good.clone()).ok().flatten(),
            good.clone(),
            "a token off loopback is used"
        );
        assert_eq!(
            token_for(loopback, good.clone()).ok().flatten(),
            good,
            "a token set on loopback is required too"
        );
        // Length counts characters, not bytes: eight two-byte characters
        // are 16 bytes but too short; sixteen are enough.
        assert!(matches!(
            token_for(open, Some("é".repeat(8))),
            Err(Failure::Input(_))
        ));
        assert!(token_for(open, Some("é".repeat(16))).is_ok());
    }
}
