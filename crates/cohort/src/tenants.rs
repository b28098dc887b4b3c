//! Tenants: an entry of the tenant directory (`[[tenant]]`) and where an
//! all-tenants sweep takes its tenants from. Pure values; discovery runs
//! in `run::passes`.

use serde::Deserialize;

/// A tenant the worker sweeps, from `[[tenant]]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantEntry {
    /// The tenant id as it appears in tenant columns.
    pub id: String,
    /// Its jurisdiction, passed to the rule provider.
    pub jurisdiction: Option<String>,
}

/// Where the tenants of an all-tenants sweep come from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TenantSource {
    /// The tenant directory given to the builder (`[[tenant]]` entries).
    Directory,
    /// A query of the policy author's own (`tenants_query`): the first
    /// column is the tenant id (uuid, integer or text), an optional second
    /// text column its jurisdiction. Run as written, read-only.
    Query(String),
    /// The caller's own list.
    List(Vec<TenantEntry>),
}
