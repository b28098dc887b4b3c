//! Root detection and the unprivileged user the server runs as.

use std::process::Command;

use crate::error::{Error, Result};

/// An unprivileged account (uid/gid) used to run `initdb` and `postgres`
/// when this process is root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunAs {
    pub(crate) name: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// The effective uid of this process, read from `/proc/self/status`
/// (falling back to `id -u`). `None` if it cannot be determined.
pub(crate) fn effective_uid() -> Option<u32> {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(uid) = parse_status_euid(&status) {
            return Some(uid);
        }
    }
    let out = Command::new("id").arg("-u").output().ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

fn parse_status_euid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    // Uid: real effective saved fs
    line.split_whitespace().nth(2)?.parse().ok()
}

fn lookup_passwd(passwd: &str, user: &str) -> Option<RunAs> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        if name != user {
            return None;
        }
        let _password = fields.next()?;
        let uid = fields.next()?.parse().ok()?;
        let gid = fields.next()?.parse().ok()?;
        Some(RunAs {
            name: name.to_owned(),
            uid,
            gid,
        })
    })
}

/// If we are root, the account to run the server as (`postgres`, else
/// `nobody`); `None` when we are not root.
pub(crate) fn server_user() -> Result<Option<RunAs>> {
    if effective_uid() != Some(0) {
        return Ok(None);
    }
    let passwd =
        std::fs::read_to_string("/etc/passwd").map_err(|e| Error::io("reading /etc/passwd", e))?;
    ["postgres", "nobody"]
        .iter()
        .find_map(|u| lookup_passwd(&passwd, u))
        .filter(|r| r.uid != 0)
        .map(Some)
        .ok_or(Error::NoUnprivilegedUser)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_passwd() {
        let status = "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t0\t0\t0\t0\n";
        assert_eq!(parse_status_euid(status), Some(0));
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      postgres:x:101:104:PostgreSQL administrator,,,:/var/lib/postgresql:/bin/bash\n";
        assert_eq!(
            lookup_passwd(passwd, "postgres"),
            Some(RunAs {
                name: "postgres".into(),
                uid: 101,
                gid: 104
            })
        );
        assert_eq!(lookup_passwd(passwd, "nobody"), None);
    }
}
