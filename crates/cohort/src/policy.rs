//! The policy file (TOML): entities, categories, tenants and settings for
//! people who drive Cohort from the CLI or keep policy out of Rust code.
//! It yields the same [`EntityDeclaration`]s the derive does, and a
//! [`StaticRuleProvider`]. The format is a public contract (SPEC §2).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::config::CohortConfig;
use crate::error::{Error, Problems, Result};
use crate::handlers::{HandlerTarget, Phase, PolicyHandler};
use crate::model::{AnonymiseMethod, EntityDeclaration, Marker, Origin, Partitions};
use crate::rules::{
    AuditDetail, CategoryCapabilities, Period, RetentionRule, RuleOverride, StaticRuleProvider,
    Strategy,
};
pub use crate::tenants::TenantEntry;

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
    partitions: Option<String>,
    #[serde(default)]
    handler: Vec<RawHandler>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHandler {
    name: String,
    phase: Option<String>,
    priority: Option<i32>,
    #[serde(default)]
    capture: Vec<String>,
    timeout: Option<Period>,
    command: Option<Vec<String>>,
    url: Option<String>,
    secret_env: Option<String>,
    #[serde(default)]
    requires_earlier: bool,
}

/// The `[[entity.handler]]` tables of one entity, checked.
fn handlers(
    e: &RawEntity,
    claim_timeout: Period,
) -> std::result::Result<Vec<PolicyHandler>, Vec<String>> {
    let mut problems = Vec::new();
    let mut out = Vec::new();
    let Ok(entity_id) = uuid::Uuid::parse_str(e.id.trim()) else {
        return Ok(Vec::new()); // the entity's own id problem is reported already
    };
    let mut names = std::collections::BTreeSet::new();
    for (i, h) in e.handler.iter().enumerate() {
        let at = format!("handler #{} ({:?})", i + 1, h.name);
        if h.name.trim().is_empty() {
            problems.push(format!("{at}: name must not be empty"));
        } else if !names.insert(h.name.clone()) {
            problems.push(format!(
                "{at}: two handlers of this entity are named {:?}",
                h.name
            ));
        }
        let phase = match h.phase.as_deref() {
            None | Some("immediate") => Phase::Immediate,
            Some("after_sweep_settled") => Phase::AfterSweepSettled,
            Some(other) => {
                problems.push(format!(
                    "{at}: phase {other:?} is unknown: use \"immediate\" or \"after_sweep_settled\""
                ));
                Phase::Immediate
            }
        };
        let mut program = None;
        let target = match (&h.command, &h.url) {
            (Some(_), Some(_)) => {
                problems.push(format!("{at}: give either command or url, not both"));
                None
            }
            (Some(argv), None) => {
                if argv.is_empty() || argv[0].trim().is_empty() {
                    problems.push(format!("{at}: command must name a program"));
                } else {
                    match crate::handlers::command::resolve_program(&argv[0]) {
                        Ok(path) => program = Some(path),
                        Err(e) => problems.push(format!("{at}: command: {e}")),
                    }
                }
                if h.secret_env.is_some() {
                    problems.push(format!(
                        "{at}: secret_env signs webhooks only (url handlers)"
                    ));
                }
                Some(HandlerTarget::Command(argv.clone()))
            }
            (None, Some(url)) => {
                if let Err(e) = crate::handlers::command::check_url(url) {
                    problems.push(format!("{at}: {e}"));
                }
                if let Some(var) = &h.secret_env {
                    if std::env::var(var).map_or(true, |v| v.is_empty()) {
                        problems.push(format!(
                            "{at}: secret_env names {var}, which is not set: webhooks could not be signed"
                        ));
                    }
                }
                Some(HandlerTarget::Url {
                    url: url.clone(),
                    secret_env: h.secret_env.clone(),
                })
            }
            (None, None) => {
                problems.push(format!(
                    "{at}: give command = [\"program\", \"arg\", ...] or url = \"https://...\""
                ));
                None
            }
        };
        if h.capture.iter().any(|c| c.trim().is_empty()) {
            problems.push(format!("{at}: capture names an empty column"));
        }
        if h.timeout == Some(Period::ZERO) {
            problems.push(format!("{at}: timeout must be greater than zero"));
        }
        if let Some(Err(e)) = h.timeout.map(Period::require_fixed) {
            problems.push(format!("{at}: timeout: {e}"));
        }
        if let Some(t) = h.timeout {
            if t.as_seconds() as f64 > claim_timeout.as_seconds() as f64 * 0.85 {
                problems.push(format!(
                    "{at}: timeout {t} exceeds the delivery deadline (85% of dispatch.claim_timeout {claim_timeout}); past it the work could be reclaimed and run twice at once"
                ));
            }
        }
        out.push(PolicyHandler {
            entity_id,
            entity: e.name.clone(),
            name: h.name.clone(),
            phase,
            priority: h.priority,
            capture: h.capture.clone(),
            // Unset: 30 s, and never past the delivery deadline.
            timeout: Some(std::time::Duration::from_secs_f64(
                h.timeout
                    .map_or(30.0, |p| p.as_seconds() as f64)
                    .min(claim_timeout.as_seconds() as f64 * 0.85),
            )),
            target: target.unwrap_or(HandlerTarget::Command(Vec::new())),
            program,
            requires_earlier: h.requires_earlier,
        });
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

#[derive(Debug)]
enum RawSubject {
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
    /// `[[entity.handler]]` command handlers.
    pub handlers: Vec<PolicyHandler>,
}

impl PolicyFile {
    /// Reads and checks a policy file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Policy(Problems::one(format!(
                "cannot read {}: {e}",
                path.display()
            )))
        })?;
        Self::parse(&text).map_err(|e| match e {
            Error::Policy(problems) => {
                Error::Policy(problems.prefixed(&path.display().to_string()))
            }
            other => other,
        })
    }

    /// Parses and checks policy text, reporting every problem found.
    pub fn parse(text: &str) -> Result<Self> {
        let value: toml::Value = toml::from_str(text)
            .map_err(|e| Error::Policy(Problems::one(crate::config::toml_problem(text, &e))))?;
        let mut nul = Vec::new();
        nul_strings(&value, "", &mut nul);
        if !nul.is_empty() {
            return Err(Error::Policy(Problems::one(format!(
                "NUL characters are not allowed (PostgreSQL text cannot hold them), found in: {}",
                nul.join(", ")
            ))));
        }
        let raw: RawPolicy = toml::from_str(text)
            .map_err(|e| Error::Policy(Problems::one(crate::config::toml_problem(text, &e))))?;
        let mut problems = Vec::new();
        if let Err(Error::Config(config_problems)) = raw.config_check() {
            problems.extend(
                config_problems
                    .0
                    .into_iter()
                    .map(|p| format!("[cohort]: {}", p.message)),
            );
        }
        let entities: Vec<EntityDeclaration> = raw
            .entity
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                entity(e)
                    .map_err(|ps| {
                        problems.extend(
                            ps.into_iter()
                                .map(|p| format!("entity #{} ({}): {p}", i + 1, e.name)),
                        )
                    })
                    .ok()
            })
            .collect();
        let mut command_handlers = Vec::new();
        for (i, e) in raw.entity.iter().enumerate() {
            match handlers(e, raw.cohort.dispatch.claim_timeout) {
                Ok(hs) => command_handlers.extend(hs),
                Err(ps) => problems.extend(
                    ps.into_iter()
                        .map(|p| format!("entity #{} ({}): {p}", i + 1, e.name)),
                ),
            }
        }
        let mut builder = StaticRuleProvider::builder();
        for c in &raw.category {
            match category(c) {
                Ok(Built::Rules(rule, overrides, caps)) => {
                    builder = builder.category_with(&c.name, rule, overrides, caps)
                }
                Ok(Built::Alias(target)) => builder = builder.alias(&c.name, target),
                Err(ps) => problems.extend(
                    ps.into_iter()
                        .map(|p| format!("category {:?}: {p}", c.name)),
                ),
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
            return Err(Error::Policy(Problems::global(problems)));
        }
        Ok(PolicyFile {
            database_url: raw.database.url,
            config: raw.cohort,
            entities,
            rules: rules.expect("no problems"),
            tenants: raw
                .tenant
                .into_iter()
                .map(|t| TenantEntry {
                    id: t.id,
                    jurisdiction: t.jurisdiction,
                })
                .collect(),
            tenants_query: raw.tenants_query,
            handlers: command_handlers,
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
        if let Some(problem) = crate::ident::policy_table_problem(t) {
            problems.push(problem);
        } else if let Err(problem) =
            crate::ident::QualifiedName::resolve(Some(t), t, e.schema.as_deref(), "public")
        {
            problems.push(problem);
        }
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
    if let Some(p) = &e.partitions {
        match Partitions::parse(p) {
            Some(p) => d = d.partitions(p),
            None => problems.push(format!(
                "partitions = {p:?} is unknown: use \"drop\" (drop whole expired partitions) or \"rows\" (the default)"
            )),
        }
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

/// Every place in the document where a string (or a key) holds a NUL
/// character: PostgreSQL text cannot store one, so any run that wrote it
/// (a literal, a rule's source or reason, a name) would fail every time.
fn nul_strings(value: &toml::Value, path: &str, found: &mut Vec<String>) {
    match value {
        toml::Value::String(s) if s.contains('\0') => found.push(path.to_owned()),
        toml::Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                nul_strings(item, &format!("{path}[{i}]"), found);
            }
        }
        toml::Value::Table(table) => {
            for (k, v) in table {
                let here = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if k.contains('\0') {
                    found.push(format!("the key {here:?}"));
                }
                nul_strings(v, &here, found);
            }
        }
        _ => {}
    }
}

enum Built {
    Rules(
        RetentionRule,
        Vec<RuleOverride>,
        Option<CategoryCapabilities>,
    ),
    Alias(String),
}

fn strategy(text: &Option<String>, problems: &mut Vec<String>) -> Option<Strategy> {
    text.as_deref().and_then(|s| {
        s.parse()
            .map_err(|e: crate::rules::UnknownStrategy| problems.push(e.to_string()))
            .ok()
    })
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
    let mut step =
        |res: std::result::Result<RetentionRule, String>| res.map_err(|e| problems.push(e)).ok();
    if let Some(a) = audit {
        let detail = a.parse::<AuditDetail>().ok();
        r = match detail {
            Some(d) => step(r.with_audit(d).map_err(|e| e.to_string()))?,
            None => step(Err(format!(
                "unknown audit setting {a:?}: expected \"summary\" or \"per_row\""
            )))?,
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
            problems.push(
                "an alias (alias_of) cannot also define strategy, period or overrides".into(),
            );
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
        (Some(s), Some(p)) => rule(
            s,
            p,
            c.legal_min,
            c.audit.as_deref(),
            c.source.as_deref(),
            c.reason.as_deref(),
            &mut problems,
        ),
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
        problems.extend(
            local
                .into_iter()
                .map(|p| format!("override #{}: {p}", i + 1)),
        );
    }
    let caps = match &c.strategies {
        None => None,
        Some(list) => {
            let parsed: Vec<Strategy> = list
                .iter()
                .filter_map(|s| {
                    s.parse()
                        .map_err(|e: crate::rules::UnknownStrategy| problems.push(e.to_string()))
                        .ok()
                })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{ResolutionContext, RuleProvider, TenantContext};

    /// The example of the specification, verbatim in its keys.
    pub(crate) const EXAMPLE: &str = r#"
[database]
url = "postgres://app@localhost/app"

[cohort]
schema = "public"
sweep_batch_size = 5000
schedule = "0 2 * * *"
dry_run = false
kill_switch = false

[cohort.conventions]
tenant = "organisation_id"

[[entity]]
name = "SessionNote"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "public.session_notes"
category = "session-notes"
anchor = "created_at"

[[entity]]
name = "CaseContact"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "case_contacts"
category = "case-contacts"
anchor = "created_at"
subjects = ["user_id", { column = "delegate_user_id", kind = "user" }]
anonymise = { email = "null", full_name = "empty", phone = { literal = "[redacted]" }, reference = "hash" }

[[category]]
name = "session-notes"
strategy = "purge"
period = "30d"
legal_min = "0d"
strategies = ["purge"]
audit = "summary"
source = "retention policy v3"
reason = "ops data"

[[category]]
name = "case-contacts"
strategy = "anonymise"
period = "1d12h"
audit = "per_row"

[[category.override]]
tenant = "22222222-2222-2222-2222-222222222222"
period = "90d"
strategy = "purge"

[[category.override]]
tenant = "3333333333334333A333333333333333"
period = "7d"

[[tenant]]
id = "11111111-1111-1111-1111-111111111111"
jurisdiction = "UK"
"#;

    #[tokio::test]
    async fn the_specification_example_loads() {
        let p = PolicyFile::parse(EXAMPLE).unwrap();
        assert_eq!(
            p.database_url.as_deref(),
            Some("postgres://app@localhost/app")
        );
        assert_eq!(p.config.schedule.as_deref(), Some("0 2 * * *"));
        assert_eq!(
            p.config.conventions.tenant.as_deref(),
            Some("organisation_id")
        );
        assert_eq!(p.entities.len(), 2);
        let contact = &p.entities[1];
        assert_eq!(contact.subjects.len(), 2);
        assert_eq!(contact.subjects[1].kind.as_deref(), Some("user"));
        assert_eq!(contact.anonymise.len(), 4);
        assert!(contact.anonymise.contains(&(
            "phone".into(),
            AnonymiseMethod::Literal("[redacted]".into())
        )));
        assert_eq!(p.tenants[0].jurisdiction.as_deref(), Some("UK"));
        let caps = p.rules.capabilities("case-contacts").unwrap();
        assert!(caps.allows(Strategy::Anonymise) && caps.allows(Strategy::Purge));
        let now = chrono::Utc::now();
        let t2 = ResolutionContext::new(
            "case-contacts",
            TenantContext::tenant("22222222-2222-2222-2222-222222222222"),
            now,
        );
        let rule = p.rules.resolve(&t2).await.unwrap();
        // The override keeps the category's audit setting.
        assert_eq!(
            (rule.strategy(), rule.period().to_string(), rule.audit()),
            (Strategy::Purge, "90d".into(), AuditDetail::PerRow)
        );
        // An override written in upper case without hyphens still matches
        // the canonical tenant when tenants are uuids...
        let t3 = ResolutionContext::new(
            "case-contacts",
            TenantContext::tenant("33333333-3333-4333-a333-333333333333")
                .with_identity(crate::rules::TenantIdentity::Uuid),
            now,
        );
        assert_eq!(
            p.rules.resolve(&t3).await.unwrap().period().to_string(),
            "7d"
        );
        // ...and not when tenants are text: there the spelling is the identity.
        let exact = ResolutionContext::new(
            "case-contacts",
            TenantContext::tenant("33333333-3333-4333-a333-333333333333"),
            now,
        );
        assert_eq!(
            p.rules.resolve(&exact).await.unwrap().period().to_string(),
            "1d12h"
        );
        let notes = ResolutionContext::new("session-notes", TenantContext::tenantless(), now);
        let rule = p.rules.resolve(&notes).await.unwrap();
        assert_eq!(rule.source(), Some("retention policy v3"));
        assert_eq!(rule.reason(), Some("ops data"));
    }

    #[test]
    fn bad_policies_are_rejected_with_every_problem() {
        let text = r#"
[[entity]]
name = "A"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
category = "c"
anchor = "created_at"
anonymise = { email = "scramble" }

[[category]]
name = "c"
strategy = "shred"
period = "-5d"
"#;
        let err = PolicyFile::parse(text).unwrap_err().to_string();
        // A negative period is a TOML-level error reported with its position.
        assert!(err.contains("cannot be negative"), "{err}");

        let text = r#"
[[entity]]
name = "A"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
category = "c"
anchor = "created_at"
anonymise = { email = "scramble" }

[[category]]
name = "c"
strategy = "shred"
period = "5d"

[[category]]
name = "d"
strategy = "purge"
period = "5d"
strategies = ["anonymise"]

[[category]]
name = "e"
strategy = "exempt"
period = "1d"
audit = "per_row"
"#;
        let err = PolicyFile::parse(text).unwrap_err().to_string();
        for part in [
            "entity #1 (A): table is required",
            "entity #1 (A): anonymise method \"scramble\" for column \"email\" is unknown",
            "category \"c\": unknown strategy \"shred\"",
            "category \"d\" can return purge but its declared strategies do not include it",
            "category \"e\": an exempt rule cannot ask for per-row audit detail",
        ] {
            assert!(err.contains(part), "missing {part:?} in {err}");
        }
    }

    #[test]
    fn absurd_durations_unknown_keys_and_ranges_are_rejected() {
        for (text, fragment) in [
            ("[[category]]\nname = \"x\"\nstrategy = \"purge\"\nperiod = \"400000d\"\n", "cannot exceed 1000 years"),
            ("[[category]]\nname = \"x\"\nstrategy = \"purge\"\nperiod = \"30 days\"\n", "invalid duration"),
            ("[[category]]\nname = \"x\"\nstrategy = \"purge\"\nperiod = \"3d\"\nretention = \"x\"\n", "unknown field `retention`"),
            ("[cohort]\nsweep_batch_size = 0\n", "sweep_batch_size = 0 is out of range"),
            ("[cohort]\nschedule = \"whenever\"\n", "not a valid cron expression"),
            ("tenants_query = \"SELECT 1\"\n[[tenant]]\nid = \"a\"\n", "either [[tenant]] entries or tenants_query"),
            ("[[category]]\nname = \"x\"\nperiod = \"3d\"\n", "strategy is required"),
        ] {
            let err = PolicyFile::parse(text).unwrap_err().to_string();
            assert!(err.contains(fragment), "{text:?}: {err}");
        }
    }

    #[tokio::test]
    async fn aliases_resolve_through_the_static_provider() {
        let text = "[[category]]\nname = \"base\"\nstrategy = \"purge\"\nperiod = \"3d\"\n\n[[category]]\nname = \"old-name\"\nalias_of = \"base\"\n";
        let p = PolicyFile::parse(text).unwrap();
        assert_eq!(
            p.rules.alias_path("old-name").unwrap(),
            vec!["old-name", "base"]
        );
        let ctx =
            ResolutionContext::new("old-name", TenantContext::tenantless(), chrono::Utc::now());
        assert_eq!(
            p.rules.resolve(&ctx).await.unwrap().period().to_string(),
            "3d"
        );
    }

    #[test]
    fn unknown_subject_keys_are_named_with_their_line() {
        let text = "[[entity]]\nname = \"A\"\nid = \"a3f467fe-c5d0-4f17-9897-83c373cc1dc8\"\ncategory = \"c\"\nanchor = \"t\"\ntable = \"a\"\nsubjects = [{ column = \"user_id\", knd = \"user\" }]\n";
        let err = PolicyFile::parse(text).unwrap_err().to_string();
        assert!(err.contains("unknown field `knd`"), "{err}");
        assert!(err.contains("line 7"), "{err}");
        let ok = PolicyFile::parse(&text.replace("knd", "kind")).unwrap();
        assert_eq!(ok.entities.len(), 1);
        let err = PolicyFile::parse(
            &text.replace("column = \"user_id\", knd = \"user\"", "kind = \"user\""),
        )
        .unwrap_err();
        assert!(err.to_string().contains("missing field `column`"), "{err}");
    }

    #[test]
    fn parse_errors_name_the_line_but_never_quote_it() {
        let text = "[cohort]\nhash_key = 12345678901234567890\n";
        let err = PolicyFile::parse(text).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
        assert!(!err.contains("12345678901234567890"), "{err}");
        let text = "[database]\nurl = \"postgres://app:s3cret@db/app\"\nport = 1\n";
        let err = PolicyFile::parse(text).unwrap_err().to_string();
        assert!(!err.contains("s3cret"), "{err}");
    }
}
