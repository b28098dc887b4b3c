//! Live settings of the background services: `kill_switch` and `dry_run`.
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

impl LiveSettings {
    /// One setting.
    pub fn get(&self, setting: Setting) -> &SettingValue {
        match setting {
            Setting::KillSwitch => &self.kill_switch,
            Setting::DryRun => &self.dry_run,
        }
    }
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
