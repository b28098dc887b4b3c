//! Locating the PostgreSQL server binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// A directory that contains the PostgreSQL server binaries
/// (`initdb`, `postgres` and usually `pg_ctl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgBinaries {
    bin_dir: PathBuf,
}

impl PgBinaries {
    /// Finds the server binaries.
    ///
    /// Search order:
    /// 1. the `PG_BIN` environment variable (an error if it is set but wrong),
    /// 2. `pg_config --bindir`, if that directory contains `initdb` and `postgres`,
    /// 3. the newest `/usr/lib/postgresql/<version>/bin` (Debian/Ubuntu layout),
    /// 4. a directory on `PATH` that contains both `initdb` and `postgres`.
    pub fn find() -> Result<Self> {
        let mut searched = Vec::new();

        if let Some(dir) = std::env::var_os("PG_BIN").filter(|d| !d.is_empty()) {
            let dir = PathBuf::from(dir);
            return if has_server_binaries(&dir) {
                Ok(Self { bin_dir: dir })
            } else {
                Err(Error::InvalidPgBin {
                    dir: dir.display().to_string(),
                })
            };
        }
        searched.push("PG_BIN (unset)".to_owned());

        match pg_config_bindir() {
            Some(dir) if has_server_binaries(&dir) => return Ok(Self { bin_dir: dir }),
            Some(dir) => searched.push(format!("pg_config --bindir ({})", dir.display())),
            None => searched.push("pg_config --bindir (pg_config not runnable)".to_owned()),
        }

        if let Some(dir) = newest_debian_bindir(Path::new("/usr/lib/postgresql")) {
            return Ok(Self { bin_dir: dir });
        }
        searched.push("/usr/lib/postgresql/*/bin".to_owned());

        if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path) {
                if has_server_binaries(&dir) {
                    return Ok(Self { bin_dir: dir });
                }
            }
        }
        searched.push("PATH".to_owned());

        Err(Error::BinariesNotFound {
            searched: searched.join(", "),
        })
    }

    /// Uses an explicit directory; fails unless it contains `initdb` and `postgres`.
    pub fn from_dir(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        if has_server_binaries(&dir) {
            Ok(Self { bin_dir: dir })
        } else {
            Err(Error::InvalidPgBin {
                dir: dir.display().to_string(),
            })
        }
    }

    /// The directory holding the binaries.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// Path of the `initdb` binary.
    pub fn initdb(&self) -> PathBuf {
        self.bin_dir.join("initdb")
    }

    /// Path of the `postgres` server binary.
    pub fn postgres(&self) -> PathBuf {
        self.bin_dir.join("postgres")
    }

    /// Path of the `pg_ctl` binary (may not exist on unusual installations).
    pub fn pg_ctl(&self) -> PathBuf {
        self.bin_dir.join("pg_ctl")
    }
}

fn has_server_binaries(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("postgres").is_file()
}

fn pg_config_bindir() -> Option<PathBuf> {
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| PathBuf::from(s))
}

/// Parses a version directory name like `15` or `9.6` into numeric parts.
fn parse_version(name: &str) -> Option<Vec<u64>> {
    name.split('.').map(|p| p.parse::<u64>().ok()).collect()
}

fn newest_debian_bindir(root: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(root).ok()?;
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let version = parse_version(&name)?;
            let bin = e.path().join("bin");
            has_server_binaries(&bin).then_some((version, bin))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, bin)| bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_numerically() {
        let mut v = [
            parse_version("9.6").unwrap(),
            parse_version("15").unwrap(),
            parse_version("10").unwrap(),
        ];
        v.sort();
        assert_eq!(v.last().unwrap(), &vec![15]);
        assert_eq!(parse_version("foo"), None);
    }
}
