//! How much audit a mutation writes: a rule's setting, which an entity's
//! own setting overrides. Defined beside the model (entities carry it);
//! `cohort::rules::AuditDetail` is the public path.

use std::str::FromStr;

/// How much audit a rule asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub enum AuditDetail {
    /// Run and per-entity summary rows only.
    #[default]
    Summary,
    /// Also one row-detail record per mutated row.
    PerRow,
}

impl AuditDetail {
    /// The policy-file spelling (`summary`, `per_row`).
    pub fn as_str(self) -> &'static str {
        match self {
            AuditDetail::Summary => "summary",
            AuditDetail::PerRow => "per_row",
        }
    }
}

impl FromStr for AuditDetail {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "summary" => Ok(AuditDetail::Summary),
            "per_row" => Ok(AuditDetail::PerRow),
            other => Err(format!(
                "unknown audit setting {other:?}: expected \"summary\" or \"per_row\""
            )),
        }
    }
}
