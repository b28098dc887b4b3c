//! Reading and setting the live settings (`settings`) and the live pacing
//! (`retention_pacing`) in the database.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::Context;
use crate::domain::settings::{LivePacing, LiveSettings, Setting, SettingValue};
use crate::error::Result;
use crate::sql::pacing;
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

impl Context {
    /// Every live pacing row, `*` first.
    pub(crate) async fn live_pacing(&self) -> Result<Vec<LivePacing>> {
        let rows = pacing::all(&self.config.schema)
            .query()
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let entity: String = r.try_get("entity_type")?;
                Ok(LivePacing {
                    entity: (entity != pacing::EVERY_ENTITY).then_some(entity),
                    paused: r.try_get("paused")?,
                    max_rows_per_second: r
                        .try_get::<Option<i32>, _>("max_rows_per_second")?
                        .map(|n| n.max(1) as u32),
                    max_replica_lag_ms: r
                        .try_get::<Option<i64>, _>("lag_ms")?
                        .map(|ms| ms.max(0) as u64),
                    updated_at: r.try_get("updated_at")?,
                    updated_by: r.try_get("updated_by")?,
                })
            })
            .collect()
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
