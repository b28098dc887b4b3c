//! Reading and setting the live settings (`settings`) in the database.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::Context;
use crate::error::Result;
use crate::settings::{LiveSettings, Setting, SettingValue};
use crate::sql::settings as statements;

impl Context {
    /// Reads the database's values and combines them with this process's.
    pub(crate) async fn live_settings(&self) -> Result<LiveSettings> {
        let rows = statements::read(&self.config.schema)
            .query()
            .fetch_all(&self.pool)
            .await?;
        let value = |setting: Setting| -> Result<SettingValue> {
            let process = self.switches.get(setting);
            let row = rows
                .iter()
                .find(|r| r.try_get::<String, _>("name").ok().as_deref() == Some(setting.name()));
            let (database, updated_at, updated_by) = match row {
                Some(r) => (
                    r.try_get::<bool, _>("enabled")?,
                    Some(r.try_get::<DateTime<Utc>, _>("updated_at")?),
                    Some(r.try_get::<String, _>("updated_by")?),
                ),
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
