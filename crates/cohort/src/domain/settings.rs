//! Live settings of the background services: `kill_switch` and `dry_run`;
//! and the live pacing of sweeps ([`LivePacing`]: pauses,
//! `max_rows_per_second`, `max_replica_lag`), which every sweep reads
//! before each batch, manual or scheduled.
//!
//! Each has two sources, and the effective value is their OR:
//! - the process's own value, from configuration at start and flippable at
//!   run time through [`Switches`] (no restart);
//! - the database's, in Cohort's `retention_setting` table, which every
//!   replica reads at each occurrence and between tenant passes, so one
//!   `cohort settings set kill_switch on` reaches all of them at once.
//!
//! Only the scheduled worker and its pruner read them. Explicit requests
//! (`Cohort::sweep`, erasure, `cohort sweep`, `cohort prune`) carry their
//! own dry-run flag and are honoured as written.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};

/// A live setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Setting {
    /// Stops the scheduled worker between tenant passes, and the pruner
    /// after its batch; later occurrences are skipped while it is on.
    KillSwitch,
    /// Scheduled sweeps count and audit without changing rows.
    DryRun,
}

impl Setting {
    /// Both settings.
    pub const ALL: [Setting; 2] = [Setting::KillSwitch, Setting::DryRun];

    /// The name in the policy file, the database and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Setting::KillSwitch => "kill_switch",
            Setting::DryRun => "dry_run",
        }
    }
}

impl std::str::FromStr for Setting {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "kill_switch" => Ok(Setting::KillSwitch),
            "dry_run" => Ok(Setting::DryRun),
            other => Err(Error::InvalidInput(format!(
                "unknown setting {other:?}: the live settings are kill_switch and dry_run"
            ))),
        }
    }
}

/// The process's own values of the live settings: start from the
/// configuration, flip at run time (every clone shares them).
#[derive(Debug, Clone, Default)]
pub struct Switches {
    kill_switch: Arc<AtomicBool>,
    dry_run: Arc<AtomicBool>,
}

impl Switches {
    pub(crate) fn new(kill_switch: bool, dry_run: bool) -> Self {
        Self {
            kill_switch: Arc::new(AtomicBool::new(kill_switch)),
            dry_run: Arc::new(AtomicBool::new(dry_run)),
        }
    }

    fn cell(&self, setting: Setting) -> &AtomicBool {
        match setting {
            Setting::KillSwitch => &self.kill_switch,
            Setting::DryRun => &self.dry_run,
        }
    }

    /// This process's value.
    pub fn get(&self, setting: Setting) -> bool {
        self.cell(setting).load(Ordering::SeqCst)
    }

    /// Sets this process's value (the database's is unchanged).
    pub fn set(&self, setting: Setting, enabled: bool) {
        self.cell(setting).store(enabled, Ordering::SeqCst);
    }
}

/// One setting's sources and effective value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SettingValue {
    /// This process's value (configuration, or [`Switches::set`]).
    pub process: bool,
    /// The database's value (`false` when never set).
    pub database: bool,
    /// `process || database`.
    pub effective: bool,
    /// When the database value was last set.
    pub updated_at: Option<DateTime<Utc>>,
    /// Which database role last set it.
    pub updated_by: Option<String>,
}

/// Both live settings as a replica sees them now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LiveSettings {
    /// See [`Setting::KillSwitch`].
    pub kill_switch: SettingValue,
    /// See [`Setting::DryRun`].
    pub dry_run: SettingValue,
}

impl SettingValue {
    pub(crate) fn new(
        process: bool,
        database: bool,
        updated_at: Option<DateTime<Utc>>,
        updated_by: Option<String>,
    ) -> Self {
        Self {
            process,
            database,
            effective: process || database,
            updated_at,
            updated_by,
        }
    }
}

/// One row of live pacing, as the database holds it (`retention_pacing`):
/// for one entity, or for every entity (`entity: None`, written `*`).
/// A limit set here applies beside the configuration's; where several
/// are set, the strictest wins. Set with [`crate::Cohort::pause`],
/// [`crate::Cohort::resume`] and [`crate::Cohort::set_pacing`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LivePacing {
    /// The entity's name, or `None` for every entity.
    pub entity: Option<String>,
    /// Paused: sweeps skip the entity, or stop before their next batch.
    pub paused: bool,
    /// The live `max_rows_per_second`, when set here.
    pub max_rows_per_second: Option<u32>,
    /// The live `max_replica_lag` in milliseconds, when set here.
    pub max_replica_lag_ms: Option<u64>,
    /// When the row was last changed.
    pub updated_at: DateTime<Utc>,
    /// Which database role last changed it.
    pub updated_by: String,
}

/// A live pacing limit to set or clear with [`crate::Cohort::set_pacing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PacingLimit {
    /// `max_rows_per_second` (`None` clears it; at least 1).
    MaxRowsPerSecond(Option<u32>),
    /// `max_replica_lag` (`None` clears it; a fixed period of at least 1s).
    MaxReplicaLag(Option<crate::domain::rules::Period>),
}

impl PacingLimit {
    /// The setting's name in the policy file, the database and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            PacingLimit::MaxRowsPerSecond(_) => "max_rows_per_second",
            PacingLimit::MaxReplicaLag(_) => "max_replica_lag",
        }
    }

    /// Parses `NAME VALUE` as the CLI takes them (`off` clears).
    pub fn parse(name: &str, value: &str) -> Result<Self> {
        let off = value.trim().eq_ignore_ascii_case("off");
        match name {
            "max_rows_per_second" => {
                if off {
                    return Ok(PacingLimit::MaxRowsPerSecond(None));
                }
                match value.trim().parse::<u32>() {
                    Ok(n) if n >= 1 => Ok(PacingLimit::MaxRowsPerSecond(Some(n))),
                    _ => Err(Error::InvalidInput(format!(
                        "max_rows_per_second {value:?}: a whole number of at least 1, or off"
                    ))),
                }
            }
            "max_replica_lag" => {
                if off {
                    return Ok(PacingLimit::MaxReplicaLag(None));
                }
                let lag = value.trim().parse::<crate::domain::rules::Period>().map_err(|e| {
                    Error::InvalidInput(format!("max_replica_lag {value:?}: {e}"))
                })?;
                lag.as_replica_lag().map_err(|why| {
                    Error::InvalidInput(format!("max_replica_lag {value:?}: {why}"))
                })?;
                Ok(PacingLimit::MaxReplicaLag(Some(lag)))
            }
            other => Err(Error::InvalidInput(format!(
                "unknown pacing setting {other:?}: the live pacing settings are max_rows_per_second and max_replica_lag"
            ))),
        }
    }
}

impl LiveSettings {
    /// One setting.
    pub fn get(&self, setting: Setting) -> &SettingValue {
        match setting {
            Setting::KillSwitch => &self.kill_switch,
            Setting::DryRun => &self.dry_run,
        }
    }
}

/// Why a `max_replica_lag` cannot be kept by `role`: PostgreSQL shows it
/// other roles' standbys without a replay position, which would read as
/// caught up. The grant that fixes it, in one wording for the live
/// setting and a sweep (validation writes the same words out, so that
/// docs/validation.md's test reads its message).
pub(crate) fn lag_unreadable(role: &str) -> String {
    format!(
        "max_replica_lag needs to read every standby's replay position, and role {role:?} cannot (PostgreSQL hides other roles' replication rows): GRANT pg_monitor TO \"{role}\" (or pg_read_all_stats)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for s in Setting::ALL {
            assert_eq!(s.name().parse::<Setting>().unwrap(), s);
        }
        let e = "killswitch".parse::<Setting>().unwrap_err();
        assert!(e.to_string().contains("kill_switch and dry_run"), "{e}");
        assert!("KILL_SWITCH".parse::<Setting>().is_err());
    }

    #[test]
    fn pacing_limits_parse_as_the_cli_takes_them() {
        assert_eq!(
            PacingLimit::parse("max_rows_per_second", "500").unwrap(),
            PacingLimit::MaxRowsPerSecond(Some(500))
        );
        assert_eq!(
            PacingLimit::parse("max_rows_per_second", "off").unwrap(),
            PacingLimit::MaxRowsPerSecond(None)
        );
        assert_eq!(
            PacingLimit::parse("max_replica_lag", "30s").unwrap(),
            PacingLimit::MaxReplicaLag(Some(
                crate::domain::rules::Period::from_seconds(30).unwrap()
            ))
        );
        for (name, value, says) in [
            ("max_rows_per_second", "0", "at least 1"),
            ("max_rows_per_second", "fast", "at least 1"),
            ("max_replica_lag", "1mo", "fixed period"),
            ("max_replica_lag", "0s", "at least 1s"),
            ("max_lag", "30s", "unknown pacing setting"),
        ] {
            let e = PacingLimit::parse(name, value).unwrap_err();
            assert!(e.to_string().contains(says), "{name} {value}: {e}");
            assert!(e.kind().is_bad_input(), "{e}");
        }
    }

    #[test]
    fn switches_are_shared_by_clones() {
        let a = Switches::new(false, true);
        let b = a.clone();
        b.set(Setting::KillSwitch, true);
        assert!(a.get(Setting::KillSwitch));
        assert!(a.get(Setting::DryRun));
        b.set(Setting::DryRun, false);
        assert!(!a.get(Setting::DryRun));
    }
}
