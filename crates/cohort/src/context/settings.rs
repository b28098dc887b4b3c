//! Reading and setting the live settings (`settings`) and the live pacing
//! (`retention_pacing`) in the database.

use super::Context;
use crate::domain::settings::{LivePacing, LiveSettings, Setting, SettingValue};
use crate::error::Result;
use crate::sql::pacing;
use crate::sql::settings as statements;

impl Context {
    /// Reads the database's values and combines them with this process's.
    pub(crate) async fn live_settings(&self) -> Result<LiveSettings> {
        let rows = statements::read(&self.config.schema)
            .query_as::<statements::SettingRow>()
            .fetch_all(&self.pool)
            .await?;
        let value = |setting: Setting| -> Result<SettingValue> {
            let process = self.switches.get(setting);
            let row = rows.iter().find(|r| r.name == setting.name());
            let (database, updated_at, updated_by) = match row {
                Some(r) => (r.enabled, Some(r.updated_at), Some(r.updated_by.clone())),
                None => (false, None, None),
            };
            Ok(SettingValue::new(process, database, updated_at, updated_by))
        };
        Ok(LiveSettings {
            kill_switch: value(Setting::KillSwitch)?,
            dry_run: value(Setting::DryRun)?,
        })
    }

    /// Sets the database's value (every replica sees it at its next check).
    pub(crate) async fn set_setting(
        &self,
        setting: Setting,
        enabled: bool,
    ) -> Result<LiveSettings> {
        let upsert = statements::Upsert {
            name: setting.name(),
            enabled,
        };
        statements::upsert(&self.config.schema, upsert)
            .query()
            .execute(&self.pool)
            .await?;
        tracing::warn!(
            setting = setting.name(),
            enabled,
            "live setting changed in the database"
        );
        self.live_settings().await
    }
}

impl Context {
    /// Every live pacing row, `*` first.
    pub(crate) async fn live_pacing(&self) -> Result<Vec<LivePacing>> {
        let rows = pacing::all(&self.config.schema)
            .query_as::<pacing::PacingRow>()
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| LivePacing {
                max_rows_per_second: r.rate(),
                max_replica_lag_ms: r.lag().map(|d| d.as_millis() as u64),
                entity: (r.entity_type != pacing::EVERY_ENTITY).then_some(r.entity_type),
                paused: r.paused,
                updated_at: r.updated_at,
                updated_by: r.updated_by,
            })
            .collect())
    }

    /// Refuses (bad input, naming the grant) when this role cannot read
    /// every standby's replay position, which a `max_replica_lag` needs.
    pub(crate) async fn lag_readable(&self) -> Result<()> {
        let (role, can_read): (String, bool) = pacing::can_read_lag()
            .query_as()
            .fetch_one(&self.pool)
            .await?;
        if can_read {
            return Ok(());
        }
        Err(crate::error::Error::InvalidInput(format!(
            "{}, or leave max_replica_lag off; nothing was set",
            crate::domain::settings::lag_unreadable(&role)
        )))
    }

    /// Sets one live pacing value for `scope` (an entity's name, or `*`).
    pub(crate) async fn set_pacing(
        &self,
        scope: &str,
        value: pacing::SetValue,
    ) -> Result<Vec<LivePacing>> {
        pacing::set(
            &self.config.schema,
            pacing::Set {
                scope: scope.to_owned(),
                value,
            },
        )
        .query()
        .execute(&self.pool)
        .await?;
        tracing::warn!(scope, value = ?value, "live pacing changed in the database");
        self.live_pacing().await
    }
}
