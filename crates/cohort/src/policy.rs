//! The policy file (TOML): entities, categories, tenants and settings for
//! people who drive Cohort from the CLI or keep policy out of Rust code.
//! It yields the same [`EntityDeclaration`]s the derive does, and a
//! [`StaticRuleProvider`]. The format is a public contract (SPEC §2).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::config::CohortConfig;
use crate::error::{Error, Result};
use crate::model::{AnonymiseMethod, EntityDeclaration, Marker, Origin};
use crate::rules::{
    AuditDetail, CategoryCapabilities, Period, RetentionRule, RuleOverride, StaticRuleProvider,
    Strategy,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    database: RawDatabase,
    #[serde(default)]
    cohort: CohortConfig,
    #[serde(default)]
    entity: Vec<RawEntity>,
    #[serde(default)]
    category: Vec<RawCategory>,
    #[serde(default)]
    tenant: Vec<TenantEntry>,
    tenants_query: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDatabase {
    url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntity {
    name: String,
    id: String,
    table: Option<String>,
    schema: Option<String>,
    category: Option<String>,
    anchor: Option<String>,
    record_id: Option<String>,
    tenant: Option<String>,
    #[serde(default)]
    tenantless: bool,
    soft_delete: Option<String>,
    deleted_at: Option<String>,
    anonymised_at: Option<String>,
    #[serde(default)]
    subjects: Vec<RawSubject>,
    #[serde(default)]
    anonymise: BTreeMap<String, RawMethod>,
    exempt: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawSubject {
    Column(String),
    WithKind { column: String, kind: Option<String> },
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawMethod {
    Named(String),
    Literal { literal: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCategory {
    name: String,
    strategy: Option<String>,
    period: Option<Period>,
    legal_min: Option<Period>,
    strategies: Option<Vec<String>>,
    audit: Option<String>,
    source: Option<String>,
    reason: Option<String>,
    alias_of: Option<String>,
    #[serde(default, rename = "override")]
    overrides: Vec<RawOverride>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    tenant: Option<String>,
    jurisdiction: Option<String>,
    strategy: Option<String>,
    period: Option<Period>,
    legal_min: Option<Period>,
    audit: Option<String>,
    source: Option<String>,
    reason: Option<String>,
}

/// A tenant the worker sweeps, from `[[tenant]]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantEntry {
    /// The tenant id as it appears in tenant columns.
    pub id: String,
    /// Its jurisdiction, passed to the rule provider.
    pub jurisdiction: Option<String>,
}

/// A loaded, checked policy file.
#[derive(Debug, Clone)]
pub struct PolicyFile {
    /// `[database] url`, if given.
    pub database_url: Option<String>,
    /// `[cohort]` settings.
    pub config: CohortConfig,
    /// `[[entity]]` declarations.
    pub entities: Vec<EntityDeclaration>,
    /// `[[category]]` rules.
    pub rules: StaticRuleProvider,
    /// `[[tenant]]` entries.
    pub tenants: Vec<TenantEntry>,
    /// `tenants_query`, an alternative tenant source.
    pub tenants_query: Option<String>,
}

impl PolicyFile {
    /// Reads and checks a policy file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Policy(format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| match e {
            Error::Policy(msg) => Error::Policy(format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    /// Parses and checks policy text, reporting every problem found.
    pub fn parse(text: &str) -> Result<Self> {
        let raw: RawPolicy = toml::from_str(text).map_err(|e| Error::Policy(e.to_string()))?;
        let mut problems = Vec::new();
        if let Err(Error::Config(msg)) = raw.config_check() {
            problems.push(format!("[cohort]: {msg}"));
        }
        let entities: Vec<EntityDeclaration> = raw
            .entity
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                entity(e)
                    .map_err(|ps| {
                        problems.extend(ps.into_iter().map(|p| format!("entity #{} ({}): {p}", i + 1, e.name)))
                    })
                    .ok()
            })
            .collect();
        let mut builder = StaticRuleProvider::builder();
        for c in &raw.category {
            match category(c) {
                Ok(Built::Rules(rule, overrides, caps)) => {
                    builder = builder.category_with(&c.name, rule, overrides, caps)
                }
                Ok(Built::Alias(target)) => builder = builder.alias(&c.name, target),
                Err(ps) => problems.extend(ps.into_iter().map(|p| format!("category {:?}: {p}", c.name))),
            }
        }
        let rules = builder
            .build()
            .map_err(|ps| problems.extend(ps.into_iter().map(|p| p.to_string())))
            .ok();
        if !raw.tenant.is_empty() && raw.tenants_query.is_some() {
            problems.push("give either [[tenant]] entries or tenants_query, not both".into());
        }
        if !problems.is_empty() {
            return Err(Error::Policy(format!(
                "{} problem(s):\n  - {}",
                problems.len(),
                problems.join("\n  - ")
            )));
        }
        Ok(PolicyFile {
            database_url: raw.database.url,
            config: raw.cohort,
            entities,
            rules: rules.expect("no problems"),
            tenants: raw.tenant,
            tenants_query: raw.tenants_query,
        })
    }
}

impl RawPolicy {
    fn config_check(&self) -> Result<()> {
        self.cohort.validate()
    }
}

fn entity(e: &RawEntity) -> std::result::Result<EntityDeclaration, Vec<String>> {
    let mut problems = Vec::new();
    let mut d = EntityDeclaration::new(&e.name, &e.id).origin(Origin::PolicyFile);
    if e.name.trim().is_empty() {
        problems.push("name must not be empty".into());
    }
    if let Some(t) = &e.table {
        d = d.table(t);
    } else {
        problems.push("table is required".into());
    }
    if let Some(s) = &e.schema {
        d = d.schema(s);
    }
    if let Some(c) = &e.category {
        d = d.category(c);
    }
    if let Some(a) = &e.anchor {
        d = d.anchor(a);
    }
    if e.tenantless {
        d = d.tenantless();
    }
    if let Some(r) = &e.exempt {
        d = d.exempt(r);
    }
    for (marker, column) in [
        (Marker::RecordId, &e.record_id),
        (Marker::Tenant, &e.tenant),
        (Marker::SoftDelete, &e.soft_delete),
        (Marker::DeletedAt, &e.deleted_at),
        (Marker::AnonymisedAt, &e.anonymised_at),
    ] {
        if let Some(c) = column {
            d = d.marker(marker, c);
        }
    }
    for s in &e.subjects {
        d = match s {
            RawSubject::Column(c) => d.subject(c, None),
            RawSubject::WithKind { column, kind } => d.subject(column, kind.as_deref()),
        };
    }
    for (column, method) in &e.anonymise {
        let method = match method {
            RawMethod::Named(n) => match n.as_str() {
                "null" => AnonymiseMethod::Null,
                "empty" => AnonymiseMethod::Empty,
                "hash" => AnonymiseMethod::Hash,
                other => {
                    problems.push(format!(
                        "anonymise method {other:?} for column {column:?} is unknown: use \"null\", \"empty\", \"hash\" or {{ literal = \"...\" }} (custom anonymisers are written in Rust)"
                    ));
                    continue;
                }
            },
            RawMethod::Literal { literal } => AnonymiseMethod::Literal(literal.clone()),
        };
        d = d.anonymise(column, method);
    }
    if problems.is_empty() {
        Ok(d)
    } else {
        Err(problems)
    }
}

enum Built {
    Rules(RetentionRule, Vec<RuleOverride>, Option<CategoryCapabilities>),
    Alias(String),
}

fn strategy(text: &Option<String>, problems: &mut Vec<String>) -> Option<Strategy> {
    text.as_deref()
        .and_then(|s| s.parse().map_err(|e: crate::rules::UnknownStrategy| problems.push(e.to_string())).ok())
}

#[allow(clippy::too_many_arguments)]
fn rule(
    strategy: Strategy,
    period: Period,
    legal_min: Option<Period>,
    audit: Option<&str>,
    source: Option<&str>,
    reason: Option<&str>,
    problems: &mut Vec<String>,
) -> Option<RetentionRule> {
    let mut r = RetentionRule::new(period, strategy);
    if let Some(m) = legal_min {
        r = r.with_legal_min(m);
    }
    let mut step = |res: std::result::Result<RetentionRule, String>| res.map_err(|e| problems.push(e)).ok();
    if let Some(a) = audit {
        let detail = a.parse::<AuditDetail>().ok();
        r = match detail {
            Some(d) => step(r.with_audit(d).map_err(|e| e.to_string()))?,
            None => step(Err(format!("unknown audit setting {a:?}: expected \"summary\" or \"per_row\"")))?,
        };
    }
    if let Some(s) = source {
        r = step(r.with_source(s).map_err(|e| e.to_string()))?;
    }
    if let Some(s) = reason {
        r = step(r.with_reason(s).map_err(|e| e.to_string()))?;
    }
    Some(r)
}

fn category(c: &RawCategory) -> std::result::Result<Built, Vec<String>> {
    let mut problems = Vec::new();
    if let Some(target) = &c.alias_of {
        if c.strategy.is_some() || c.period.is_some() || !c.overrides.is_empty() {
            problems.push("an alias (alias_of) cannot also define strategy, period or overrides".into());
            return Err(problems);
        }
        return Ok(Built::Alias(target.clone()));
    }
    let s = strategy(&c.strategy, &mut problems);
    if c.strategy.is_none() {
        problems.push("strategy is required (purge, soft_delete, anonymise or exempt)".into());
    }
    if c.period.is_none() {
        problems.push("period is required (e.g. \"30d\")".into());
    }
    let base = match (s, c.period) {
        (Some(s), Some(p)) => rule(s, p, c.legal_min, c.audit.as_deref(), c.source.as_deref(), c.reason.as_deref(), &mut problems),
        _ => None,
    };
    let mut overrides = Vec::new();
    for (i, o) in c.overrides.iter().enumerate() {
        let mut local = Vec::new();
        let os = match &o.strategy {
            Some(_) => strategy(&o.strategy, &mut local),
            None => s,
        };
        if let (Some(os), Some(base)) = (os, &base) {
            let built = rule(
                os,
                o.period.unwrap_or(base.period()),
                o.legal_min.or(base.legal_min()),
                o.audit.as_deref().or(Some(base.audit().as_str())),
                o.source.as_deref().or(base.source()),
                o.reason.as_deref().or(base.reason()),
                &mut local,
            );
            if let Some(rule) = built {
                overrides.push(RuleOverride {
                    tenant: o.tenant.clone(),
                    jurisdiction: o.jurisdiction.clone(),
                    rule,
                });
            }
        }
        problems.extend(local.into_iter().map(|p| format!("override #{}: {p}", i + 1)));
    }
    let caps = match &c.strategies {
        None => None,
        Some(list) => {
            let parsed: Vec<Strategy> = list
                .iter()
                .filter_map(|s| s.parse().map_err(|e: crate::rules::UnknownStrategy| problems.push(e.to_string())).ok())
                .collect();
            match CategoryCapabilities::new(parsed) {
                Ok(c) => Some(c),
                Err(e) => {
                    problems.push(format!("strategies: {e}"));
                    None
                }
            }
        }
    };
    match base {
        Some(base) if problems.is_empty() => Ok(Built::Rules(base, overrides, caps)),
        _ => Err(problems),
    }
}
