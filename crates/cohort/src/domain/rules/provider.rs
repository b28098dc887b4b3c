//! The rule-provider port and the ready-made static provider.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::rule::{CategoryCapabilities, RetentionRule, Strategy};

/// How two spellings of a tenant id compare. It follows the type of the
/// tenant columns (validation requires every tenant-scoped entity to agree),
/// and it is the one rule used for rule overrides, the `[[tenant]]`
/// directory, holds, erasure and the ledger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TenantIdentity {
    /// `text` / `varchar`: exactly as written, never trimmed or case-folded.
    #[default]
    Exact,
    /// `uuid`: every spelling of the same uuid (case, hyphens, braces,
    /// `urn:uuid:`); canonical form lower-case hyphenated.
    Uuid,
    /// Integer types: the same number (`0042` is `42`).
    Integer,
    /// `citext`: case-insensitively; canonical form lower case.
    CaseInsensitive,
}

impl TenantIdentity {
    /// The tenant column types of this identity, as a message names them.
    pub fn column_types(self) -> &'static str {
        match self {
            TenantIdentity::Exact => "text or varchar: exactly as written",
            TenantIdentity::Uuid => "uuid",
            TenantIdentity::Integer => "integer",
            TenantIdentity::CaseInsensitive => "citext",
        }
    }

    fn key_type(self) -> crate::domain::model::KeyType {
        use crate::domain::model::KeyType;
        match self {
            TenantIdentity::Exact => KeyType::Text,
            TenantIdentity::Uuid => KeyType::Uuid,
            TenantIdentity::Integer => KeyType::Int8,
            TenantIdentity::CaseInsensitive => KeyType::CiText,
        }
    }

    /// The canonical form of `id`, or `None` when it is not a valid tenant
    /// id of this kind.
    pub fn canonical(self, id: &str) -> Option<String> {
        self.key_type().canonical_text(id)
    }

    /// Whether `a` and `b` name the same tenant.
    pub fn same(self, a: &str, b: &str) -> bool {
        match (self.canonical(a), self.canonical(b)) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }
}

/// Who a rule is being resolved for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TenantContext {
    /// The tenant's canonical id; `None` for the tenantless pass.
    pub tenant_id: Option<String>,
    /// The tenant's jurisdiction, when the tenant source knows it (e.g. `"EU"`).
    pub jurisdiction: Option<String>,
    /// The tenant's tags, as the tenant source lists them (e.g. `"vip"`,
    /// `"healthcare"`); empty when it lists none.
    pub tags: Vec<String>,
    /// How tenant spellings compare (set by Cohort from the tenant
    /// columns' type); providers match tenant ids with [`TenantContext::is`].
    pub identity: TenantIdentity,
}

impl TenantContext {
    /// The tenantless context.
    pub fn tenantless() -> Self {
        Self::default()
    }

    /// A tenant without a known jurisdiction (compared exactly until
    /// [`TenantContext::with_identity`] says otherwise).
    pub fn tenant(id: impl Into<String>) -> Self {
        Self {
            tenant_id: Some(id.into()),
            jurisdiction: None,
            tags: Vec::new(),
            identity: TenantIdentity::Exact,
        }
    }

    /// Sets how tenant spellings compare.
    pub fn with_identity(mut self, identity: TenantIdentity) -> Self {
        self.identity = identity;
        self
    }

    /// Whether `written` (e.g. an override's tenant) names this tenant.
    pub fn is(&self, written: &str) -> bool {
        self.tenant_id
            .as_deref()
            .is_some_and(|id| self.identity.same(id, written))
    }

    /// Adds the jurisdiction.
    pub fn with_jurisdiction(mut self, jurisdiction: impl Into<String>) -> Self {
        self.jurisdiction = Some(jurisdiction.into());
        self
    }

    /// Sets the tags.
    pub fn with_tags<I, S>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tags = tags.into_iter().map(Into::into).collect();
        self
    }

    /// Whether the tenant carries `tag` (compared exactly).
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag)
    }
}

/// Everything a provider may use to pick a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResolutionContext {
    /// The category asked for (the entity's declared category).
    pub category: String,
    /// The tenant being processed.
    pub tenant: TenantContext,
    /// The run's logical time (UTC).
    pub now: DateTime<Utc>,
    /// Categories followed through aliases so far, starting with `category`.
    pub alias_path: Vec<String>,
}

impl ResolutionContext {
    /// A context for `category`, with an alias path holding just that category.
    pub fn new(category: impl Into<String>, tenant: TenantContext, now: DateTime<Utc>) -> Self {
        let category = category.into();
        Self {
            alias_path: vec![category.clone()],
            category,
            tenant,
            now,
        }
    }
}

/// Why a rule could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// The category is not known to the provider.
    #[error("unknown retention category {0:?}")]
    UnknownCategory(String),
    /// Aliases loop back on themselves.
    #[error("category alias cycle: {}", .0.join(" -> "))]
    AliasCycle(Vec<String>),
    /// The provider failed for its own reasons.
    #[error("rule provider failed: {0}")]
    Provider(String),
}

/// Supplies retention rules. Capabilities are synchronous and fixed (startup
/// validates every strategy a category can ever return); resolution is async
/// so a provider may consult a database or a service.
#[async_trait]
pub trait RuleProvider: Send + Sync + 'static {
    /// Every strategy `category` can ever resolve to, or `None` if unknown.
    fn capabilities(&self, category: &str) -> Option<CategoryCapabilities>;

    /// The rule for a category, tenant and time.
    async fn resolve(&self, ctx: &ResolutionContext) -> Result<RetentionRule, ResolveError>;

    /// Tenant ids the provider's rules name, with the category naming each
    /// (e.g. tenant overrides). Validation checks each is a valid id for
    /// the tenant columns, so an override cannot silently match nothing.
    fn named_tenants(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// The categories the provider knows, for the message that names an
    /// unknown one ("did you mean"). Empty when the provider cannot list
    /// them.
    fn known_categories(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A tenant-, jurisdiction- or tag-specific variation of a category's rule;
/// it applies when every condition it names holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleOverride {
    /// Applies to this tenant id only.
    pub tenant: Option<String>,
    /// Applies to tenants of this jurisdiction only.
    pub jurisdiction: Option<String>,
    /// Applies to tenants carrying this tag only.
    pub tag: Option<String>,
    /// The rule used when the override matches.
    pub rule: RetentionRule,
}

impl RuleOverride {
    fn matches(&self, tenant: &TenantContext) -> bool {
        let tenant_ok = self.tenant.as_ref().is_none_or(|t| tenant.is(t));
        let jurisdiction_ok = self
            .jurisdiction
            .as_ref()
            .is_none_or(|j| tenant.jurisdiction.as_deref() == Some(j.as_str()));
        let tag_ok = self.tag.as_ref().is_none_or(|t| tenant.has_tag(t));
        tenant_ok && jurisdiction_ok && tag_ok
    }
}

/// One category of the static provider.
#[derive(Debug, Clone)]
enum CategoryEntry {
    Rules {
        rule: RetentionRule,
        overrides: Vec<RuleOverride>,
        capabilities: CategoryCapabilities,
    },
    Alias(String),
}

/// Problems found while building a [`StaticRuleProvider`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StaticProviderError {
    /// Two categories with one name.
    #[error("category {0:?} is defined twice")]
    Duplicate(String),
    /// Declared capabilities miss a strategy the category can return.
    #[error(
        "category {category:?} can return {strategy} but its declared strategies do not include it"
    )]
    UndeclaredStrategy {
        /// The category.
        category: String,
        /// The strategy missing from the capabilities.
        strategy: Strategy,
    },
    /// An override that matches nothing.
    #[error("an override of category {0:?} names no tenant, jurisdiction or tag")]
    EmptyOverride(String),
}

/// A provider of fixed rules, built in code or from the policy file.
/// Overrides are tried in order; the first match wins.
///
/// ```
/// use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
/// let provider = StaticRuleProvider::builder()
///     .category("session-notes", RetentionRule::new("30d".parse().unwrap(), Strategy::Purge))
///     .build()
///     .unwrap();
/// # let _ = provider;
/// ```
#[derive(Debug, Clone, Default)]
pub struct StaticRuleProvider {
    categories: BTreeMap<String, CategoryEntry>,
}

/// Builds a [`StaticRuleProvider`], collecting every problem.
#[derive(Debug, Default)]
pub struct StaticRuleProviderBuilder {
    entries: Vec<(String, CategoryEntry, Option<CategoryCapabilities>)>,
}

impl StaticRuleProviderBuilder {
    /// Adds a category whose capabilities are its rule's strategy plus its overrides' strategies.
    pub fn category(self, name: impl Into<String>, rule: RetentionRule) -> Self {
        self.category_with(name, rule, Vec::new(), None)
    }

    /// Adds a category with overrides and, optionally, explicit capabilities.
    pub fn category_with(
        mut self,
        name: impl Into<String>,
        rule: RetentionRule,
        overrides: Vec<RuleOverride>,
        capabilities: Option<CategoryCapabilities>,
    ) -> Self {
        let mut derived = CategoryCapabilities::of_rule(&rule);
        for o in &overrides {
            derived.add_rule(&o.rule);
        }
        self.entries.push((
            name.into(),
            CategoryEntry::Rules {
                rule,
                overrides,
                capabilities: derived,
            },
            capabilities,
        ));
        self
    }

    /// Makes `name` resolve as `target` (the alias path records the hop).
    pub fn alias(mut self, name: impl Into<String>, target: impl Into<String>) -> Self {
        self.entries
            .push((name.into(), CategoryEntry::Alias(target.into()), None));
        self
    }

    /// Validates and builds, reporting every problem.
    pub fn build(self) -> Result<StaticRuleProvider, Vec<StaticProviderError>> {
        let mut problems = Vec::new();
        let mut categories = BTreeMap::new();
        for (name, mut entry, declared) in self.entries {
            if let CategoryEntry::Rules {
                overrides,
                capabilities,
                ..
            } = &mut entry
            {
                if overrides
                    .iter()
                    .any(|o| o.tenant.is_none() && o.jurisdiction.is_none() && o.tag.is_none())
                {
                    problems.push(StaticProviderError::EmptyOverride(name.clone()));
                }
                if let Some(mut declared) = declared {
                    for strategy in capabilities.iter() {
                        if !declared.allows(strategy) {
                            problems.push(StaticProviderError::UndeclaredStrategy {
                                category: name.clone(),
                                strategy,
                            });
                        }
                    }
                    // Stages measured from a marker come with the rules.
                    for (strategy, previous) in capabilities.marker_stages() {
                        declared = declared.with_marker_stage(strategy, previous);
                    }
                    *capabilities = declared;
                }
            }
            if categories.insert(name.clone(), entry).is_some() {
                problems.push(StaticProviderError::Duplicate(name));
            }
        }
        if problems.is_empty() {
            Ok(StaticRuleProvider { categories })
        } else {
            Err(problems)
        }
    }
}

impl StaticRuleProvider {
    /// Starts a builder.
    pub fn builder() -> StaticRuleProviderBuilder {
        StaticRuleProviderBuilder::default()
    }

    /// The category names this provider knows, aliases included.
    pub fn category_names(&self) -> impl Iterator<Item = &str> {
        self.categories.keys().map(String::as_str)
    }

    /// Follows aliases from the end of `start`; returns the path walked (the
    /// start included) and the entry at its end.
    fn follow_entry(
        &self,
        start: &[String],
    ) -> Result<(Vec<String>, &CategoryEntry), ResolveError> {
        let mut path = start.to_vec();
        let mut current = path.last().cloned().unwrap_or_default();
        loop {
            match self.categories.get(&current) {
                None => return Err(ResolveError::UnknownCategory(current)),
                Some(CategoryEntry::Alias(target)) => {
                    if path.contains(target) {
                        path.push(target.clone());
                        return Err(ResolveError::AliasCycle(path));
                    }
                    path.push(target.clone());
                    current = target.clone();
                }
                Some(entry) => return Ok((path, entry)),
            }
        }
    }
}

#[async_trait]
impl RuleProvider for StaticRuleProvider {
    fn named_tenants(&self) -> Vec<(String, String)> {
        self.categories
            .iter()
            .filter_map(|(name, entry)| match entry {
                CategoryEntry::Rules { overrides, .. } => Some((name, overrides)),
                CategoryEntry::Alias(_) => None,
            })
            .flat_map(|(name, overrides)| {
                overrides
                    .iter()
                    .filter_map(|o| o.tenant.clone().map(|t| (name.clone(), t)))
            })
            .collect()
    }

    fn known_categories(&self) -> Vec<String> {
        self.category_names().map(str::to_owned).collect()
    }

    fn capabilities(&self, category: &str) -> Option<CategoryCapabilities> {
        match self.follow_entry(&[category.to_owned()]) {
            Ok((_, CategoryEntry::Rules { capabilities, .. })) => Some(capabilities.clone()),
            _ => None,
        }
    }

    async fn resolve(&self, ctx: &ResolutionContext) -> Result<RetentionRule, ResolveError> {
        let start = if ctx.alias_path.is_empty() {
            vec![ctx.category.clone()]
        } else {
            ctx.alias_path.clone()
        };
        let (_, entry) = self.follow_entry(&start)?;
        let CategoryEntry::Rules {
            rule, overrides, ..
        } = entry
        else {
            unreachable!("follow_entry only returns rule entries")
        };
        Ok(overrides
            .iter()
            .find(|o| o.matches(&ctx.tenant))
            .map_or(rule, |o| &o.rule)
            .clone())
    }
}

impl StaticRuleProvider {
    /// The alias path from `category` to the category that holds its rules,
    /// or the reason there is none (unknown category, alias cycle).
    pub fn alias_path(&self, category: &str) -> Result<Vec<String>, ResolveError> {
        self.follow_entry(&[category.to_owned()])
            .map(|(path, _)| path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::rules::Period;
    use chrono::TimeZone;

    fn rule(days: i64, strategy: Strategy) -> RetentionRule {
        RetentionRule::new(Period::from_days(days).unwrap(), strategy)
    }

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
    }

    #[tokio::test]
    async fn overrides_first_match_wins_and_capabilities_cover_them() {
        let provider = StaticRuleProvider::builder()
            .category_with(
                "notes",
                rule(30, Strategy::Purge),
                vec![
                    RuleOverride {
                        tenant: Some("t2".into()),
                        jurisdiction: None,
                        tag: None,
                        rule: rule(90, Strategy::Anonymise),
                    },
                    RuleOverride {
                        tenant: None,
                        jurisdiction: Some("EU".into()),
                        tag: None,
                        rule: rule(10, Strategy::Purge),
                    },
                    RuleOverride {
                        tenant: Some("t2".into()),
                        jurisdiction: None,
                        tag: None,
                        rule: rule(1, Strategy::Purge),
                    },
                ],
                None,
            )
            .build()
            .unwrap();
        let caps = provider.capabilities("notes").unwrap();
        assert_eq!(
            caps.iter().collect::<Vec<_>>(),
            vec![Strategy::Purge, Strategy::Anonymise]
        );
        let cases = [
            (TenantContext::tenant("t1"), 30, Strategy::Purge),
            (TenantContext::tenant("t2"), 90, Strategy::Anonymise),
            (
                TenantContext::tenant("t3").with_jurisdiction("EU"),
                10,
                Strategy::Purge,
            ),
            (TenantContext::tenantless(), 30, Strategy::Purge),
        ];
        for (tenant, days, strategy) in cases {
            let ctx = ResolutionContext::new("notes", tenant.clone(), now());
            let got = provider.resolve(&ctx).await.unwrap();
            assert_eq!(
                (got.period().as_seconds() / 86_400, got.strategy()),
                (days, strategy),
                "{tenant:?}"
            );
        }
    }

    #[tokio::test]
    async fn unknown_categories_and_alias_cycles_are_reported() {
        let provider = StaticRuleProvider::builder()
            .category("base", rule(5, Strategy::Purge))
            .alias("legacy", "base")
            .alias("a", "b")
            .alias("b", "a")
            .alias("dangling", "nowhere")
            .build()
            .unwrap();
        assert_eq!(
            provider.alias_path("legacy").unwrap(),
            vec!["legacy", "base"]
        );
        assert!(provider
            .capabilities("legacy")
            .unwrap()
            .allows(Strategy::Purge));
        let ctx = ResolutionContext::new("legacy", TenantContext::tenantless(), now());
        assert_eq!(
            provider.resolve(&ctx).await.unwrap().strategy(),
            Strategy::Purge
        );
        assert_eq!(
            provider.alias_path("a").unwrap_err(),
            ResolveError::AliasCycle(vec!["a".into(), "b".into(), "a".into()])
        );
        assert!(provider.capabilities("a").is_none());
        assert_eq!(
            provider.alias_path("dangling").unwrap_err(),
            ResolveError::UnknownCategory("nowhere".into())
        );
        let ctx = ResolutionContext::new("missing", TenantContext::tenantless(), now());
        assert_eq!(
            provider.resolve(&ctx).await.unwrap_err(),
            ResolveError::UnknownCategory("missing".into())
        );
    }

    #[test]
    fn builder_reports_every_problem() {
        let problems = StaticRuleProvider::builder()
            .category("x", rule(1, Strategy::Purge))
            .category("x", rule(2, Strategy::Purge))
            .category_with(
                "y",
                rule(1, Strategy::Purge),
                vec![RuleOverride {
                    tenant: None,
                    jurisdiction: None,
                    tag: None,
                    rule: rule(1, Strategy::SoftDelete),
                }],
                Some(CategoryCapabilities::only(Strategy::Purge)),
            )
            .build()
            .unwrap_err();
        assert_eq!(
            problems,
            vec![
                StaticProviderError::Duplicate("x".into()),
                StaticProviderError::EmptyOverride("y".into()),
                StaticProviderError::UndeclaredStrategy {
                    category: "y".into(),
                    strategy: Strategy::SoftDelete
                },
            ]
        );
    }
}
