//! Row handlers from the policy file (SPEC §8a), for people who do not
//! write Rust. The listed columns are captured before the mutation; each
//! delivery carries one JSON document:
//! - `command`: the program (argv, no shell) gets it on stdin. Exit 0 =
//!   delivered; any other exit, or the time-out (the process is killed), is
//!   a failed attempt. Its stderr is logged, never stored.
//! - `url`: an HTTP POST; 2xx = delivered. With `secret_env`, signed with
//!   `Cohort-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
//!   The response body is never logged or stored.

use std::process::Stdio;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;
use tokio::io::AsyncWriteExt;

use super::{AfterContext, BeforeContext, ErasedHandler, HandlerError, SafeReason, SnapshotValue};

/// Where a policy-file handler delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandlerTarget {
    /// Run this program (argv, no shell) with the document on stdin.
    Command(Vec<String>),
    /// POST the document to this URL, signed with the secret in the named
    /// environment variable when one is given.
    Url {
        /// The endpoint.
        url: String,
        /// The environment variable holding the signing secret.
        secret_env: Option<String>,
    },
}

/// A `[[entity.handler]]`, as loaded from the policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyHandler {
    /// The entity's durable id.
    pub entity_id: uuid::Uuid,
    /// The entity's display name (in the delivery document).
    pub entity: String,
    /// The handler's stable identity (`name`).
    pub name: String,
    /// When its work becomes due.
    pub phase: super::Phase,
    /// Delivery order (lowest first; unset last).
    pub priority: Option<i32>,
    /// Columns copied into the snapshot before the mutation.
    pub capture: Vec<String>,
    /// How long one delivery may take (at most 9/10 of the claim time-out,
    /// which the dispatcher enforces too).
    pub timeout: Option<Duration>,
    /// Where it delivers.
    pub target: HandlerTarget,
}

pub(crate) struct CommandHandler {
    pub(crate) spec: PolicyHandler,
}

/// A column's value as a snapshot value, whatever its (common) type.
fn column_value(row: &PgRow, column: &str) -> Result<SnapshotValue, HandlerError> {
    macro_rules! try_as {
        ($($t:ty => $conv:expr),* $(,)?) => {$(
            if let Ok(v) = row.try_get::<Option<$t>, _>(column) {
                #[allow(clippy::redundant_closure_call)]
                return Ok(v.map_or(SnapshotValue::Null, $conv));
            }
        )*};
    }
    try_as!(
        String => SnapshotValue::Text,
        i64 => SnapshotValue::Int,
        i32 => |n: i32| SnapshotValue::Int(n.into()),
        i16 => |n: i16| SnapshotValue::Int(n.into()),
        bool => SnapshotValue::Bool,
        f64 => SnapshotValue::Float,
        uuid::Uuid => SnapshotValue::Uuid,
        DateTime<Utc> => SnapshotValue::Timestamp,
        NaiveDateTime => |t: NaiveDateTime| SnapshotValue::Text(t.to_string()),
        NaiveDate => |d: NaiveDate| SnapshotValue::Text(d.to_string()),
        serde_json::Value => |v: serde_json::Value| SnapshotValue::Text(v.to_string()),
    );
    Err(format!("column {column:?} has a type a command handler cannot capture").into())
}

/// A snapshot value as plain JSON (SPEC §8a: text, numbers, booleans, null;
/// uuid and timestamps as strings).
fn plain(value: &SnapshotValue) -> serde_json::Value {
    use serde_json::Value;
    match value {
        SnapshotValue::Null => Value::Null,
        SnapshotValue::Bool(b) => Value::Bool(*b),
        SnapshotValue::Int(n) => Value::from(*n),
        SnapshotValue::Float(f) => Value::from(*f),
        SnapshotValue::Text(s) | SnapshotValue::Decimal(s) => Value::String(s.clone()),
        SnapshotValue::Uuid(u) => Value::String(u.hyphenated().to_string()),
        SnapshotValue::Timestamp(t) => {
            Value::String(t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
        }
        SnapshotValue::Enum { value, .. } => Value::String(value.clone()),
        SnapshotValue::List(items) => Value::Array(items.iter().map(plain).collect()),
        SnapshotValue::Map(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), plain(v))).collect())
        }
    }
}

impl CommandHandler {
    /// The delivery document (SPEC §8a).
    fn document(&self, ctx: &AfterContext) -> serde_json::Value {
        serde_json::json!({
            "delivery_id": ctx.work_id.to_string(),
            "handler": self.spec.name,
            "entity_id": ctx.entity_id,
            "entity": self.spec.entity,
            "record_id": ctx.record_id,
            "tenant": ctx.tenant,
            "run_id": ctx.run_id,
            "run_kind": ctx.run_kind.as_str(),
            "strategy": ctx.strategy.as_str(),
            "attempt": ctx.attempt,
            "snapshot": ctx
                .snapshot
                .values()
                .iter()
                .map(|(k, v)| (k.clone(), plain(v)))
                .collect::<serde_json::Map<_, _>>(),
        })
    }
}

#[async_trait::async_trait]
impl ErasedHandler for CommandHandler {
    async fn before(&self, row: &PgRow, ctx: &mut BeforeContext) -> Result<(), HandlerError> {
        for column in &self.spec.capture {
            ctx.snapshot
                .insert(column.clone(), column_value(row, column)?)?;
        }
        Ok(())
    }

    async fn after(&self, ctx: &AfterContext) -> Result<(), HandlerError> {
        let body = serde_json::to_vec(&self.document(ctx))?;
        match &self.spec.target {
            HandlerTarget::Command(argv) => self.run(argv, body, ctx).await,
            HandlerTarget::Url { url, secret_env } => {
                self.post(url, secret_env.as_deref(), body, ctx).await
            }
        }
    }
}

impl CommandHandler {
    async fn run(
        &self,
        argv: &[String],
        body: Vec<u8>,
        ctx: &AfterContext,
    ) -> Result<(), HandlerError> {
        let (program, args) = argv.split_first().ok_or("the command is empty")?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .env("COHORT_DELIVERY_ID", ctx.work_id.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| SafeReason(format!("cannot start {program:?}: {}", e.kind())))?;
        if let Some(mut stdin) = child.stdin.take() {
            // Written beside the wait, so a program that writes stderr before
            // reading stdin cannot deadlock against us; a program that exits
            // without reading is judged by its status.
            tokio::spawn(async move {
                let _ = stdin.write_all(&body).await;
            });
        }
        let waited = match self.spec.timeout {
            Some(limit) => tokio::time::timeout(limit, child.wait_with_output()).await,
            None => Ok(child.wait_with_output().await),
        };
        let output = match waited {
            Ok(output) => output
                .map_err(|e| SafeReason(format!("waiting for {program:?} failed: {}", e.kind())))?,
            Err(_) => {
                return Err(SafeReason(format!(
                    "timed out after {}s",
                    self.spec.timeout.unwrap_or_default().as_secs_f64()
                ))
                .into())
            }
        };
        if !output.stderr.is_empty() {
            // Logged for the operator; never stored (it may hold personal data).
            let shown = &output.stderr[..output.stderr.len().min(4096)];
            tracing::warn!(handler = %self.spec.name, stderr = %String::from_utf8_lossy(shown).trim(), "command handler wrote to stderr");
        }
        if output.status.success() {
            Ok(())
        } else {
            Err(SafeReason(match output.status.code() {
                Some(code) => format!("exit status {code}"),
                None => "killed by a signal".to_string(),
            })
            .into())
        }
    }

    async fn post(
        &self,
        url: &str,
        secret_env: Option<&str>,
        body: Vec<u8>,
        ctx: &AfterContext,
    ) -> Result<(), HandlerError> {
        let signature = match secret_env {
            Some(var) => {
                let secret = std::env::var(var).map_err(|_| {
                    SafeReason(format!("the signing secret variable {var} is not set"))
                })?;
                let t = Utc::now().timestamp();
                Some(format!("t={t},v1={}", sign(secret.as_bytes(), t, &body)))
            }
            None => None,
        };
        let timeout = self.spec.timeout.unwrap_or(Duration::from_secs(30));
        let url = url.to_owned();
        let delivery = ctx.work_id.to_string();
        let status = tokio::task::spawn_blocking(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .timeout_global(Some(timeout))
                .http_status_as_error(false)
                .build()
                .into();
            let mut request = agent
                .post(&url)
                .header("Content-Type", "application/json")
                .header("Cohort-Delivery", &delivery);
            if let Some(sig) = &signature {
                request = request.header("Cohort-Signature", sig);
            }
            // The response body is never read into logs or the ledger.
            request.send(&body[..]).map(|r| r.status().as_u16())
        })
        .await
        .map_err(|_| SafeReason("the delivery task panicked".into()))?;
        match status {
            Ok(code) if (200..300).contains(&code) => Ok(()),
            Ok(code) => Err(SafeReason(format!("http status {code}")).into()),
            Err(ureq::Error::Timeout(_)) => {
                Err(SafeReason(format!("timed out after {}s", timeout.as_secs_f64())).into())
            }
            Err(e) => Err(SafeReason(format!("cannot deliver: {}", classify(&e))).into()),
        }
    }
}

/// A transport failure as a safe reason (no URL credentials, no bodies).
fn classify(e: &ureq::Error) -> &'static str {
    match e {
        ureq::Error::Io(_) => "connection failed",
        ureq::Error::HostNotFound => "host not found",
        ureq::Error::ConnectionFailed => "connection failed",
        ureq::Error::Tls(_) => "TLS failed",
        _ => "transport error",
    }
}

/// The `v1` signature: hex HMAC-SHA256 of `"<t>.<body>"` under `secret`.
pub(crate) fn sign(secret: &[u8], t: i64, body: &[u8]) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
