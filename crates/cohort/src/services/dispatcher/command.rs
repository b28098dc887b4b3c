//! Delivering the row handlers of the policy file
//! (`handlers::command` declares them): a `command` runs the program
//! with the document on stdin, its process group killed on time-out; a
//! `url` is POSTed to, signed when the handler names a secret.

use std::process::Stdio;
use std::time::Duration;

use chrono::Utc;
use sqlx::postgres::PgRow;

use tokio::io::AsyncWriteExt;

use crate::domain::handlers::{
    AfterContext, BeforeContext, ErasedHandler, HandlerError, HandlerRegistration, HandlerTarget,
    PolicyHandler, Registered, SafeReason, SnapshotValue,
};

/// A policy-file handler, registered for its entity.
pub(crate) fn registered(spec: PolicyHandler) -> Registered {
    let mut registration = HandlerRegistration::new(spec.entity_id, spec.name.clone());
    registration.priority = spec.priority;
    registration.phase = spec.phase;
    registration.requires_earlier = spec.requires_earlier;
    Registered {
        registration,
        capture: spec.capture.clone(),
        handler: std::sync::Arc::new(CommandHandler { spec }),
    }
}

pub(crate) struct CommandHandler {
    pub(crate) spec: PolicyHandler,
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
            "record_id": ctx.record_key,
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
            ctx.snapshot.insert(
                column.clone(),
                crate::sql::values::snapshot_value(row, column)?,
            )?;
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

/// The most of a command's stderr kept in memory: its tail, for the log.
pub(crate) const STDERR_TAIL_BYTES: usize = 4096;

/// Kills a command's whole process group (the command and everything it
/// started) unless disarmed: on time-out, and when the delivery is dropped
/// at shutdown. Disarmed once the command was reaped, so a pid reused
/// after that is never signalled.
struct GroupGuard {
    pgid: Option<i32>,
}

impl GroupGuard {
    fn kill(&mut self) {
        let Some(pgid) = self.pgid.take() else {
            return;
        };
        // Never pid 1 or below: kill(-1) would signal every process.
        #[cfg(unix)]
        if let Some(pid) = rustix::process::Pid::from_raw(pgid).filter(|_| pgid > 1) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        #[cfg(not(unix))]
        let _ = pgid;
    }

    fn disarm(&mut self) {
        self.pgid = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads `from` to its end, keeping only the last [`STDERR_TAIL_BYTES`].
async fn tail(mut from: impl tokio::io::AsyncRead + Unpin) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut kept: Vec<u8> = Vec::with_capacity(STDERR_TAIL_BYTES);
    let mut buf = [0u8; 8192];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > STDERR_TAIL_BYTES {
                    kept.drain(..kept.len() - STDERR_TAIL_BYTES);
                }
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
        let mut command = self.command(program, args, ctx);
        let mut child = command
            .spawn()
            .map_err(|e| SafeReason(format!("cannot start {program:?}: {}", e.kind())))?;
        // Declared after the child, so it is dropped (and kills the group)
        // first, while the child is not yet reaped.
        let mut group = GroupGuard {
            pgid: child.id().and_then(|id| i32::try_from(id).ok()),
        };
        if let Some(mut stdin) = child.stdin.take() {
            // Written beside the wait, so a program that writes stderr before
            // reading stdin cannot deadlock against us; a program that exits
            // without reading is judged by its status.
            tokio::spawn(async move {
                let _ = stdin.write_all(&body).await;
            });
        }
        let stderr = child.stderr.take().map(|e| tokio::spawn(tail(e)));
        let waited = match self.spec.timeout {
            Some(limit) => tokio::time::timeout(limit, child.wait()).await,
            None => Ok(child.wait().await),
        };
        let status = match waited {
            Ok(status) => {
                group.disarm();
                status.map_err(|e| {
                    SafeReason(format!("waiting for {program:?} failed: {}", e.kind()))
                })?
            }
            Err(_) => {
                group.kill();
                let _ = child.kill().await;
                return Err(SafeReason(format!(
                    "timed out after {}s (its process group was killed)",
                    self.spec.timeout.unwrap_or_default().as_secs_f64()
                ))
                .into());
            }
        };
        // A grandchild still holding stderr open must not keep us waiting.
        let shown = match stderr {
            Some(task) => tokio::time::timeout(Duration::from_secs(1), task)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default(),
            None => Vec::new(),
        };
        if !shown.is_empty() {
            // Logged for the operator (its last bytes); never stored (it may
            // hold personal data).
            tracing::warn!(handler = %self.spec.name, stderr = %String::from_utf8_lossy(&shown).trim(), "command handler wrote to stderr");
        }
        if status.success() {
            Ok(())
        } else {
            Err(SafeReason(match status.code() {
                Some(code) => format!("exit status {code}"),
                None => "killed by a signal".to_string(),
            })
            .into())
        }
    }

    /// The program with its arguments and the delivery id in its
    /// environment, the document to go on stdin, stdout discarded, stderr
    /// piped, in a process group of its own (so a time-out or shutdown
    /// ends everything it started, not only itself).
    fn command(
        &self,
        program: &str,
        args: &[String],
        ctx: &AfterContext,
    ) -> tokio::process::Command {
        let resolved: &std::ffi::OsStr = match &self.spec.program {
            Some(path) => path.as_os_str(),
            None => program.as_ref(),
        };
        let mut command = tokio::process::Command::new(resolved);
        command
            .args(args)
            .env("COHORT_DELIVERY_ID", ctx.work_id.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        #[cfg(unix)]
        command.process_group(0);
        command
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
            // Redirects are never followed: a hook that answers 3xx did
            // not take the delivery, whatever answers at the new address.
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .timeout_global(Some(timeout))
                .http_status_as_error(false)
                .max_redirects(0)
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
            Ok(code) if (300..400).contains(&code) => Err(SafeReason(format!(
                "http status {code}: a redirect, which is never followed (point the handler at the final URL)"
            ))
            .into()),
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
    crate::base::digest::hmac_hex(secret, &[format!("{t}.").as_bytes(), body])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stderr_keeps_only_its_tail() {
        let mut big: Vec<u8> = (0..10_000_000u32).map(|i| (i % 251) as u8).collect();
        big.extend_from_slice(b"the end");
        let kept = tail(&big[..]).await;
        assert_eq!(kept.len(), STDERR_TAIL_BYTES);
        assert_eq!(&kept[..], &big[big.len() - STDERR_TAIL_BYTES..]);
        assert_eq!(tail(&b"short"[..]).await, b"short");
    }
}
