//! The policy file (TOML): entities, categories, tenants and settings for
//! people who drive Cohort from the CLI or keep policy out of Rust code.
//! It yields the same [`EntityDeclaration`]s the derive does, and a
//! [`StaticRuleProvider`]. The format is a public contract (SPEC §2).

use std::path::Path;

use crate::config::CohortConfig;
use crate::domain::handlers::PolicyHandler;
use crate::domain::model::EntityDeclaration;
use crate::domain::rules::StaticRuleProvider;
pub use crate::domain::tenants::TenantEntry;
use crate::error::{Error, Problems, Result};

mod convert;
mod file;

use convert::*;
use file::*;

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
    /// `[evidence]`: what signed reports state beyond the ledger.
    pub evidence: Evidence,
    /// `[journal]`: where erasure requests and holds are journaled (the
    /// key comes from `COHORT_JOURNAL_KEY` when the journal is used).
    pub journal: Option<crate::domain::journal::JournalConfig>,
}

/// `[evidence]` of a policy file: facts about the system around the
/// database that a signed report's manifest states (`cohort report
/// --sign`), since the ledger cannot know them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Evidence {
    /// How long base backups and the WAL archive are kept: copies of rows
    /// removed in a period may remain in them until the period's end plus
    /// this (`None`: not stated).
    pub backup_retention: Option<crate::domain::rules::Period>,
}

impl PolicyFile {
    /// The most connections one entity's sweep uses at once under this
    /// policy: the global `sweep_parallelism` or an entity's own, whichever
    /// is larger (a pool for this policy needs that many for a run).
    ///
    /// ```
    /// let policy = cohort::policy::PolicyFile::parse(
    ///     "[cohort]\nsweep_parallelism = 2\n",
    /// ).unwrap();
    /// assert_eq!(policy.max_sweep_parallelism(), 2);
    /// ```
    pub fn max_sweep_parallelism(&self) -> u32 {
        self.entities
            .iter()
            .filter_map(|e| e.sweep_parallelism)
            .chain([self.config.sweep_parallelism])
            .max()
            .unwrap_or(1)
            .max(1)
    }

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
        refuse_nul(&value)?;
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
        let entities = entity_declarations(&raw, &mut problems);
        let command_handlers = command_handlers(&raw, &mut problems);
        let rules = category_rules(&raw, &mut problems);
        check_tenants(&raw, &mut problems);
        if raw.evidence.backup_retention.is_some_and(|p| p.is_zero()) {
            problems.push(
                "[evidence] backup_retention must be longer than zero (how long backups and the WAL archive keep copies); leave it out if you do not state it".into(),
            );
        }
        let journal = match &raw.journal {
            None => None,
            Some(j) => {
                match (&j.dir, &j.url) {
                    (Some(d), None) if d.as_os_str().is_empty() => {
                        problems.push("[journal] dir must not be empty".into());
                        None
                    }
                    (Some(d), None) => Some(crate::domain::journal::JournalConfig::dir(d.clone())),
                    (None, Some(u))
                        if u.starts_with("postgres://") || u.starts_with("postgresql://") =>
                    {
                        Some(crate::domain::journal::JournalConfig::url(u.clone()))
                    }
                    (None, Some(_)) => {
                        problems.push("[journal] url must be a postgres:// URL (of a database on another server)".into());
                        None
                    }
                    _ => {
                        problems.push(
                            "[journal] takes one of dir = \"PATH\" and url = \"postgres://…\""
                                .into(),
                        );
                        None
                    }
                }
            }
        };
        if !problems.is_empty() {
            return Err(Error::Policy(Problems::global(problems)));
        }
        Ok(PolicyFile {
            database_url: raw.database.url,
            config: raw.cohort,
            entities,
            rules: rules.expect("no problems"),
            tenants: raw.tenant,
            tenants_query: raw.tenants_query,
            handlers: command_handlers,
            evidence: Evidence {
                backup_retention: raw.evidence.backup_retention,
            },
            journal,
        })
    }
}

impl RawPolicy {
    fn config_check(&self) -> Result<()> {
        self.cohort.validate()
    }
}

/// Refuses a document with a NUL character in a string or key, naming each place.
fn refuse_nul(value: &toml::Value) -> Result<()> {
    let mut nul = Vec::new();
    nul_strings(value, "", &mut nul);
    if !nul.is_empty() {
        return Err(Error::Policy(Problems::one(format!(
            "NUL characters are not allowed (PostgreSQL text cannot hold them), found in: {}",
            nul.join(", ")
        ))));
    }
    Ok(())
}

/// The `[[entity]]` declarations that convert; each problem names its entity.
fn entity_declarations(raw: &RawPolicy, problems: &mut Vec<String>) -> Vec<EntityDeclaration> {
    raw.entity
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
        .collect()
}

/// Every entity's command handlers; each problem names its entity.
fn command_handlers(raw: &RawPolicy, problems: &mut Vec<String>) -> Vec<PolicyHandler> {
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
    command_handlers
}

/// The `[[category]]` rules built into a provider; each category's problems name it.
fn category_rules(raw: &RawPolicy, problems: &mut Vec<String>) -> Option<StaticRuleProvider> {
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
    builder
        .build()
        .map_err(|ps| problems.extend(ps.into_iter().map(|p| p.to_string())))
        .ok()
}

/// Tenant tags are not empty; tenants come from `[[tenant]]` or tenants_query, not both.
fn check_tenants(raw: &RawPolicy, problems: &mut Vec<String>) {
    for t in &raw.tenant {
        if t.tags.iter().any(|tag| tag.trim().is_empty()) {
            problems.push(format!("[[tenant]] {:?}: a tag must not be empty", t.id));
        }
    }
    if !raw.tenant.is_empty() && raw.tenants_query.is_some() {
        problems.push("give either [[tenant]] entries or tenants_query, not both".into());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::model::AnonymiseMethod;
    use crate::domain::rules::{
        AuditDetail, ResolutionContext, RuleProvider, Strategy, TenantContext,
    };

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
                .with_identity(crate::domain::rules::TenantIdentity::Uuid),
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
