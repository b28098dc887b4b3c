//! The policy file's TOML schema as serde reads it: every table and key
//! of SPEC §2, with unknown keys refused. Conversion into declarations,
//! rules and handlers is `convert`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::CohortConfig;
use crate::domain::rules::Period;
pub(super) use crate::domain::tenants::TenantEntry;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    #[serde(default)]
    pub(super) database: RawDatabase,
    #[serde(default)]
    pub(super) cohort: CohortConfig,
    #[serde(default)]
    pub(super) entity: Vec<RawEntity>,
    #[serde(default)]
    pub(super) category: Vec<RawCategory>,
    #[serde(default)]
    pub(super) tenant: Vec<TenantEntry>,
    pub(super) tenants_query: Option<String>,
    #[serde(default)]
    pub(super) evidence: RawEvidence,
    pub(super) journal: Option<RawJournal>,
}

/// `[journal]`: where erasure requests and holds are journaled, outside
/// the retained database (one of `dir` and `url`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJournal {
    pub(super) dir: Option<std::path::PathBuf>,
    pub(super) url: Option<String>,
}

/// `[evidence]`: what a signed report's manifest states beyond the ledger.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEvidence {
    pub(super) backup_retention: Option<Period>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDatabase {
    pub(super) url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEntity {
    pub(super) name: String,
    pub(super) id: String,
    pub(super) table: Option<String>,
    pub(super) schema: Option<String>,
    pub(super) category: Option<String>,
    pub(super) anchor: Option<String>,
    pub(super) record_id: Option<RawRecordKey>,
    pub(super) tenant: Option<String>,
    #[serde(default)]
    pub(super) tenantless: bool,
    #[serde(default)]
    pub(super) not_tenant: Vec<String>,
    pub(super) soft_delete: Option<String>,
    pub(super) deleted_at: Option<String>,
    pub(super) anonymised_at: Option<String>,
    #[serde(default)]
    pub(super) subjects: Vec<RawSubject>,
    #[serde(default)]
    pub(super) anonymise: BTreeMap<String, RawMethod>,
    pub(super) exempt: Option<String>,
    pub(super) partitions: Option<String>,
    pub(super) sweep_parallelism: Option<u32>,
    pub(super) max_rows_per_second: Option<u32>,
    pub(super) max_replica_lag: Option<Period>,
    pub(super) audit: Option<String>,
    pub(super) archive_table: Option<String>,
    pub(super) archive_columns: Option<Vec<String>>,
    pub(super) archive_anonymise: Option<bool>,
    #[serde(default)]
    pub(super) handler: Vec<RawHandler>,
}

/// `record_id = "id"`, or a composite key `record_id = ["id", "logged_at"]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawRecordKey {
    One(String),
    Composite(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHandler {
    pub(super) name: String,
    pub(super) phase: Option<String>,
    pub(super) priority: Option<i32>,
    #[serde(default)]
    pub(super) capture: Vec<String>,
    pub(super) timeout: Option<Period>,
    pub(super) command: Option<Vec<String>>,
    pub(super) url: Option<String>,
    pub(super) secret_env: Option<String>,
    #[serde(default)]
    pub(super) requires_earlier: bool,
}

/// The `[[entity.handler]]` tables of one entity, checked.

#[derive(Debug)]
pub(super) enum RawSubject {
    Column(String),
    WithKind {
        column: String,
        kind: Option<String>,
    },
}

/// A subject is a column name or `{ column, kind }`; any other key is an
/// error naming the key (with its line, from the TOML parser), never
/// silently ignored (`knd = "user"` would widen the subject to every kind).
impl<'de> Deserialize<'de> for RawSubject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawSubject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a column name or { column = \"...\", kind = \"...\" }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<RawSubject, E> {
                Ok(RawSubject::Column(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<RawSubject, A::Error> {
                const FIELDS: &[&str] = &["column", "kind"];
                let (mut column, mut kind) = (None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "column" => column = Some(map.next_value::<String>()?),
                        "kind" => kind = Some(map.next_value::<String>()?),
                        other => return Err(serde::de::Error::unknown_field(other, FIELDS)),
                    }
                }
                let column = column.ok_or_else(|| serde::de::Error::missing_field("column"))?;
                Ok(RawSubject::WithKind { column, kind })
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawMethod {
    Named(String),
    Literal { literal: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCategory {
    pub(super) name: String,
    pub(super) strategy: Option<String>,
    pub(super) period: Option<Period>,
    pub(super) legal_min: Option<Period>,
    pub(super) strategies: Option<Vec<String>>,
    pub(super) audit: Option<String>,
    pub(super) source: Option<String>,
    pub(super) reason: Option<String>,
    pub(super) alias_of: Option<String>,
    #[serde(default, rename = "override")]
    pub(super) overrides: Vec<RawOverride>,
    #[serde(default, rename = "stage")]
    pub(super) stages: Vec<RawStage>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStage {
    pub(super) strategy: String,
    pub(super) period: Period,
    pub(super) after: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOverride {
    pub(super) tenant: Option<String>,
    pub(super) jurisdiction: Option<String>,
    pub(super) tag: Option<String>,
    pub(super) strategy: Option<String>,
    pub(super) period: Option<Period>,
    pub(super) legal_min: Option<Period>,
    pub(super) audit: Option<String>,
    pub(super) source: Option<String>,
    pub(super) reason: Option<String>,
    pub(super) stage_periods: Option<Vec<Period>>,
}
