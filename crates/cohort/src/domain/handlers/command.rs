//! Row handlers from the policy file (SPEC §8a), for people who do not
//! write Rust: what the file declares, and the checks made when it is
//! loaded. Their delivery runs in the dispatcher
//! (`services::dispatcher::command`). The listed columns are captured
//! before the mutation; each delivery carries one JSON document:
//! - `command`: the program (argv, no shell) gets it on stdin. Exit 0 =
//!   delivered; any other exit, or the time-out (its whole process group is
//!   killed), is a failed attempt. The tail of its stderr is logged, never
//!   stored; nothing unbounded is held in memory.
//! - `url`: an HTTP POST; 2xx = delivered; a redirect is never followed (a
//!   3xx is a failed attempt naming its status). With `secret_env`, signed with
//!   `Cohort-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
//!   The response body is never logged or stored.

use std::time::Duration;

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
    /// For a command: the program as resolved when the policy was loaded
    /// (an absolute path, found on `PATH` for a bare name), checked to be
    /// an executable file. It runs by this path.
    pub program: Option<std::path::PathBuf>,
    /// Runs only after every earlier handler (lower priority) of the same
    /// row succeeded: an earlier dead letter holds it until it is retried
    /// and delivered. Default `false`: it waits only while earlier work is
    /// still pending or in flight.
    pub requires_earlier: bool,
}

/// Resolves a command's program the way a shell without one would: a name
/// with a `/` is a path (relative to the working directory), a bare name is
/// looked up on `PATH`. The result must be a regular file the process may
/// execute; otherwise the reason, for the policy's problems.
pub(crate) fn resolve_program(name: &str) -> Result<std::path::PathBuf, String> {
    use std::path::{Path, PathBuf};
    let executable = |path: &Path| -> Result<(), String> {
        let meta = std::fs::metadata(path)
            .map_err(|e| format!("{} cannot be used: {}", path.display(), e.kind()))?;
        if !meta.is_file() {
            return Err(format!("{} is not a file", path.display()));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o111 == 0 {
                return Err(format!("{} is not executable", path.display()));
            }
        }
        Ok(())
    };
    if name.contains('/') {
        let path = PathBuf::from(name);
        let path = if path.is_absolute() {
            path
        } else {
            std::env::current_dir()
                .map_err(|e| format!("the working directory cannot be read: {}", e.kind()))?
                .join(path)
        };
        executable(&path)?;
        return Ok(path);
    }
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path_var) {
        let candidate = dir.join(name);
        if candidate.is_absolute() && executable(&candidate).is_ok() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "program {name:?} is not an executable file on PATH; give its absolute path"
    ))
}

/// Checks a `url` handler's address: an absolute `http://` or `https://`
/// URL with a host.
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| format!("url {url:?} is not a valid URL"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("url {url:?} must start with http:// or https://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("url {url:?} has no host"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_programs_are_checked() {
        assert!(check_url("https://crm.example/hook").is_ok());
        assert!(check_url("http://127.0.0.1:9/x").is_ok());
        for bad in [
            "ftp://x/",
            "http://",
            "/relative",
            "crm.example/hook",
            "https:///x",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        assert!(resolve_program("sh").is_ok_and(|p| p.is_absolute()));
        assert!(resolve_program("/bin/sh").is_ok());
        assert!(resolve_program("cohort-no-such-program").is_err());
        assert!(resolve_program("/").is_err());
    }
}
