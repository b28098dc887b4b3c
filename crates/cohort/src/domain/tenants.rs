//! Tenants: an entry of the tenant directory (`[[tenant]]`) and where an
//! all-tenants sweep takes its tenants from. Pure values; discovery runs
//! in `run::passes`.

use serde::Deserialize;

/// A tenant the worker sweeps, from `[[tenant]]`, a `tenants_query` row
/// or the caller's list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantEntry {
    /// The tenant id as it appears in tenant columns.
    pub id: String,
    /// Its jurisdiction, passed to the rule provider.
    pub jurisdiction: Option<String>,
    /// Its tags (e.g. `"vip"`), passed to the rule provider; a
    /// `[[category.override]]` can match on one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl TenantEntry {
    /// A tenant with neither jurisdiction nor tags.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            jurisdiction: None,
            tags: Vec::new(),
        }
    }

    /// Sets the jurisdiction.
    pub fn jurisdiction(mut self, jurisdiction: impl Into<String>) -> Self {
        self.jurisdiction = Some(jurisdiction.into());
        self
    }

    /// Sets the tags (trimmed; empty ones and repeats dropped).
    pub fn tags<I, S>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tags = normalise_tags(tags.into_iter().map(Into::into));
        self
    }

    /// Whether another listing of the same tenant says the same of it: the
    /// same jurisdiction and the same tags, in any order.
    pub(crate) fn agrees_with(&self, other: &TenantEntry) -> bool {
        self.jurisdiction == other.jurisdiction && same_tags(&self.tags, &other.tags)
    }
}

/// Whether two lists hold the same tags, in any order.
pub(crate) fn same_tags(a: &[String], b: &[String]) -> bool {
    fn set(t: &[String]) -> std::collections::BTreeSet<&str> {
        t.iter().map(String::as_str).collect()
    }
    set(a) == set(b)
}

/// What a run knows of its tenant besides the id, from the request or the
/// tenant directory: what rule providers see.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TenantFacts {
    pub(crate) jurisdiction: Option<String>,
    pub(crate) tags: Vec<String>,
}

impl TenantFacts {
    /// What a request says of `tenant` (its jurisdiction and tags, when it
    /// gives them), checked against the tenant's listing when both are
    /// known (a request that contradicts it is refused), else the
    /// listing's.
    pub(crate) fn merged(
        tenant: &str,
        listed: Option<&TenantEntry>,
        jurisdiction: Option<&str>,
        tags: Option<&[String]>,
    ) -> crate::error::Result<Self> {
        let refused = |msg: String| Err(crate::error::Error::InvalidInput(msg));
        let listed_jurisdiction = listed.and_then(|e| e.jurisdiction.as_deref());
        let jurisdiction = match (jurisdiction, listed_jurisdiction) {
            (Some(r), Some(l)) if r != l => {
                return refused(format!(
                    "tenant {tenant} is listed with jurisdiction {l:?}, but the request says {r:?}"
                ))
            }
            (Some(r), _) => Some(r.to_owned()),
            (None, listed) => listed.map(str::to_owned),
        };
        let tags = match (tags, listed) {
            (Some(r), Some(l)) if !same_tags(r, &l.tags) => {
                return refused(format!(
                    "tenant {tenant} is listed with tags {:?}, but the request says {r:?}",
                    l.tags
                ))
            }
            (Some(r), _) => r.to_vec(),
            (None, Some(l)) => l.tags.clone(),
            (None, None) => Vec::new(),
        };
        Ok(TenantFacts { jurisdiction, tags })
    }
}

/// Tags as a tenant carries them: trimmed, without empty ones or repeats,
/// in first-listed order.
pub(crate) fn normalise_tags(tags: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for tag in tags {
        let tag = tag.trim();
        if !tag.is_empty() && !out.iter().any(|t| t == tag) {
            out.push(tag.to_owned());
        }
    }
    out
}

/// Where the tenants of an all-tenants sweep come from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TenantSource {
    /// The tenant directory given to the builder (`[[tenant]]` entries).
    Directory,
    /// A query of the policy author's own (`tenants_query`): the first
    /// column is the tenant id (uuid, integer or text), an optional second
    /// text column its jurisdiction, an optional third its tags (`text[]`,
    /// or comma-separated text). Run as written, read-only.
    Query(String),
    /// The caller's own list.
    List(Vec<TenantEntry>),
}

/// The tenant a run request names (`None`: the tenantless entities) and
/// what the request says of it: what every single-pass request shares
/// (sweep, preview, erasure).
#[derive(Debug, Clone, Default)]
pub(crate) struct TenantScope {
    pub(crate) tenant: Option<String>,
    /// The tenant's jurisdiction, when the request gives it.
    pub(crate) jurisdiction: Option<String>,
    /// The tenant's tags, normalised, when the request gives them.
    pub(crate) tags: Option<Vec<String>>,
}

impl TenantScope {
    /// A request for `tenant` that says nothing more of it.
    pub(crate) fn of(tenant: Option<String>) -> Self {
        TenantScope {
            tenant,
            ..TenantScope::default()
        }
    }

    /// A tenant as its source lists it, with its jurisdiction and tags.
    pub(crate) fn listed(entry: &TenantEntry) -> Self {
        TenantScope {
            tenant: Some(entry.id.clone()),
            jurisdiction: entry.jurisdiction.clone(),
            tags: Some(entry.tags.clone()),
        }
    }
}

/// The builder methods of every request naming one tenant: the tenant's
/// jurisdiction and tags, kept in the request's `tenancy`.
macro_rules! tenancy_builders {
    () => {
        /// The tenant's jurisdiction, passed to the rule provider (overrides
        /// by jurisdiction can raise the legal minimum or change the
        /// strategy). A tenant listed by the tenant source has its listed
        /// jurisdiction; a request that says otherwise is refused.
        pub fn jurisdiction(mut self, jurisdiction: impl Into<String>) -> Self {
            self.tenancy.jurisdiction = Some(jurisdiction.into());
            self
        }

        /// The tenant's tags, passed to the rule provider (a tenant listed
        /// by the tenant source has its listed tags unless the request
        /// gives its own, which must agree).
        pub fn tags<I, S>(mut self, tags: I) -> Self
        where
            I: IntoIterator<Item = S>,
            S: Into<String>,
        {
            self.tenancy.tags = Some(crate::domain::tenants::normalise_tags(
                tags.into_iter().map(Into::into),
            ));
            self
        }
    };
}
pub(crate) use tenancy_builders;
