//! Strategies, rules and category capabilities: pure values, no I/O.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

pub use crate::domain::model::audit::AuditDetail;

use chrono::{DateTime, Utc};

use super::period::Period;

/// What happens to a row once it is past its cutoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// Delete the row.
    Purge,
    /// Set the soft-delete flag (and deleted-at when mapped).
    SoftDelete,
    /// Scrub the marked columns and stamp anonymised-at, once per row.
    Anonymise,
    /// Do nothing, visibly: the run reports zero mutations.
    Exempt,
    /// Copy the row into the entity's archive table and delete it from the
    /// source, in one statement of the batch transaction.
    Archive,
}

impl Strategy {
    /// Every strategy, in a fixed order.
    pub const ALL: [Strategy; 5] = [
        Strategy::Purge,
        Strategy::SoftDelete,
        Strategy::Anonymise,
        Strategy::Exempt,
        Strategy::Archive,
    ];

    /// The policy-file and audit spelling (`purge`, `soft_delete`,
    /// `anonymise`, `exempt`, `archive`).
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Purge => "purge",
            Strategy::SoftDelete => "soft_delete",
            Strategy::Anonymise => "anonymise",
            Strategy::Exempt => "exempt",
            Strategy::Archive => "archive",
        }
    }

    /// Whether the strategy changes or removes rows.
    pub fn mutates(self) -> bool {
        !matches!(self, Strategy::Exempt)
    }

    /// The marker the strategy stamps on each row it changes (`deleted_at`
    /// for a soft delete, `anonymised_at` for an anonymisation), from which
    /// a later stage can be measured; `None` for the others.
    pub fn marker(self) -> Option<crate::domain::model::Marker> {
        match self {
            Strategy::SoftDelete => Some(crate::domain::model::Marker::DeletedAt),
            Strategy::Anonymise => Some(crate::domain::model::Marker::AnonymisedAt),
            _ => None,
        }
    }

    /// Whether the strategy deletes rows from the entity's table (purge,
    /// archive): foreign keys into the table and their cascades apply.
    pub fn deletes(self) -> bool {
        matches!(self, Strategy::Purge | Strategy::Archive)
    }
}

impl serde::Serialize for Strategy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown strategy name (American spellings are not aliases: every
/// key and value of Cohort is spelled one way, `anonymise`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown strategy {0:?}: expected purge, soft_delete, anonymise, exempt or archive{suggestion}", suggestion = crate::base::suggest::did_you_mean(.0, Strategy::ALL.iter().map(|s| s.as_str())))]
pub struct UnknownStrategy(pub String);

impl FromStr for Strategy {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "purge" => Ok(Strategy::Purge),
            "soft_delete" => Ok(Strategy::SoftDelete),
            "anonymise" => Ok(Strategy::Anonymise),
            "exempt" => Ok(Strategy::Exempt),
            "archive" => Ok(Strategy::Archive),
            other => Err(UnknownStrategy(other.to_owned())),
        }
    }
}

/// Why a rule could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// Provenance text was given but empty.
    #[error("rule {field} must not be empty when given")]
    EmptyProvenance {
        /// `rule_source` or `rule_reason`.
        field: &'static str,
    },
    /// An exempt rule cannot ask for per-row audit: it never touches a row.
    #[error("an exempt rule cannot ask for per-row audit detail (it never mutates a row)")]
    PerRowOnExempt,
    /// A stage that cannot follow the stages before it.
    #[error("stage {stage}: {reason}")]
    Stage {
        /// The stage's position, 2 for the first later stage.
        stage: usize,
        /// Why.
        reason: String,
    },
}

/// What a later stage's period is measured from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum StageAnchor {
    /// The marker the previous stage wrote: `deleted_at` after a soft
    /// delete, `anonymised_at` after an anonymisation. Only rows that
    /// stage has done qualify.
    Previous,
    /// The entity's own anchor, like the first stage.
    Anchor,
}

impl StageAnchor {
    /// The policy-file spelling (`previous`, `anchor`).
    pub fn as_str(self) -> &'static str {
        match self {
            StageAnchor::Previous => "previous",
            StageAnchor::Anchor => "anchor",
        }
    }
}

/// A stage after a rule's first: its own strategy and period, measured
/// from [`StageAnchor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stage {
    /// What happens to the stage's rows.
    pub strategy: Strategy,
    /// How long after its anchor.
    pub period: Period,
    /// What the period is measured from.
    pub after: StageAnchor,
}

impl Stage {
    /// A stage measured from the marker the previous stage wrote.
    pub fn after_previous(strategy: Strategy, period: Period) -> Self {
        Self {
            strategy,
            period,
            after: StageAnchor::Previous,
        }
    }

    /// A stage measured from the entity's anchor.
    pub fn after_anchor(strategy: Strategy, period: Period) -> Self {
        Self {
            strategy,
            period,
            after: StageAnchor::Anchor,
        }
    }
}

/// The retention rule for one category, tenant and time: immutable once
/// built, and only built through [`RetentionRule::new`] and its `with_*`
/// methods, which validate. Negative durations are unrepresentable
/// ([`Period`] refuses them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionRule {
    period: Period,
    strategy: Strategy,
    legal_min: Option<Period>,
    audit: AuditDetail,
    source: Option<String>,
    reason: Option<String>,
    /// The stages after the first (the rule's own strategy and period).
    stages: Vec<Stage>,
}

impl RetentionRule {
    /// A rule with a period and a strategy, summary audit, no legal minimum.
    pub fn new(period: Period, strategy: Strategy) -> Self {
        Self {
            period,
            strategy,
            legal_min: None,
            audit: AuditDetail::Summary,
            source: None,
            reason: None,
            stages: Vec::new(),
        }
    }

    /// Adds a stage after the last: retention in stages (the rule's own
    /// strategy and period are the first). Refused when it cannot follow:
    /// nothing follows a purge or an archive (the row is gone) or an
    /// exempt stage, a stage is never exempt, a strategy appears once, a
    /// stage measured from the previous stage's marker needs a previous
    /// stage that writes one (soft delete, anonymise), and a stage measured
    /// from the anchor may not come due before an earlier stage measured
    /// from the anchor (it would act before that stage ran).
    pub fn then(mut self, stage: Stage) -> Result<Self, RuleError> {
        let position = self.stages.len() + 2;
        let refuse = |reason: String| RuleError::Stage {
            stage: position,
            reason,
        };
        let earlier: Vec<(Strategy, Period, StageAnchor)> =
            std::iter::once((self.strategy, self.period, StageAnchor::Anchor))
                .chain(self.stages.iter().map(|s| (s.strategy, s.period, s.after)))
                .collect();
        let previous = earlier.last().expect("the first stage").0;
        if stage.strategy == Strategy::Exempt || previous == Strategy::Exempt {
            return Err(refuse(
                "an exempt stage changes nothing; retention in stages needs a mutating strategy at every stage".into(),
            ));
        }
        if previous.deletes() {
            return Err(refuse(format!(
                "it follows a {previous} stage, after which no row is left"
            )));
        }
        if earlier.iter().any(|(s, _, _)| *s == stage.strategy) {
            return Err(refuse(format!(
                "{} is already a stage of this rule; each strategy appears once",
                stage.strategy
            )));
        }
        match stage.after {
            StageAnchor::Previous if previous.marker().is_none() => {
                return Err(refuse(format!(
                    "it is measured from the previous stage's marker, but a {previous} stage writes none"
                )));
            }
            StageAnchor::Anchor => {
                let now = Utc::now();
                if let Some((s, p, _)) = earlier.iter().find(|(_, p, a)| {
                    *a == StageAnchor::Anchor
                        && stage
                            .period
                            .before(now)
                            .zip(p.before(now))
                            .is_some_and(|(mine, theirs)| mine > theirs)
                }) {
                    return Err(refuse(format!(
                        "{} after {} from the anchor would come due before the {s} stage ({p} from the anchor) ran",
                        stage.strategy, stage.period
                    )));
                }
            }
            StageAnchor::Previous => {}
        }
        self.stages.push(stage);
        Ok(self)
    }

    /// The stages after the first, in order.
    pub fn later_stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Whether the rule has stages after its first.
    pub fn is_staged(&self) -> bool {
        !self.stages.is_empty()
    }

    /// Stage `n` (1 is the rule's own strategy and period) as a rule of its
    /// own: its strategy and period, with this rule's legal minimum, audit
    /// and provenance, and no stages. `None` past the last stage.
    pub fn stage(&self, n: usize) -> Option<RetentionRule> {
        let (strategy, period) = match n {
            0 => return None,
            1 => (self.strategy, self.period),
            n => {
                let s = self.stages.get(n - 2)?;
                (s.strategy, s.period)
            }
        };
        Some(RetentionRule {
            period,
            strategy,
            stages: Vec::new(),
            ..self.clone()
        })
    }

    /// What stage `n` (2 or later) is measured from, with the strategy of
    /// the stage before it; `None` for the first stage or past the last.
    pub fn stage_anchor(&self, n: usize) -> Option<(StageAnchor, Strategy)> {
        if n < 2 {
            return None;
        }
        let stage = self.stages.get(n - 2)?;
        let previous = if n == 2 {
            self.strategy
        } else {
            self.stages[n - 3].strategy
        };
        Some((stage.after, previous))
    }

    /// The last stage as a rule (the rule itself when it has one stage).
    pub fn final_stage(&self) -> RetentionRule {
        self.stage(self.stages.len() + 1)
            .expect("the last stage exists")
    }

    /// Adds a legal minimum: rows are kept at least this long whatever the period.
    pub fn with_legal_min(mut self, legal_min: Period) -> Self {
        self.legal_min = Some(legal_min);
        self
    }

    /// Sets the audit detail.
    pub fn with_audit(mut self, audit: AuditDetail) -> Result<Self, RuleError> {
        if audit == AuditDetail::PerRow && self.strategy == Strategy::Exempt {
            return Err(RuleError::PerRowOnExempt);
        }
        self.audit = audit;
        Ok(self)
    }

    /// Records where the rule comes from (e.g. "retention policy v3").
    pub fn with_source(mut self, source: impl Into<String>) -> Result<Self, RuleError> {
        self.source = Some(non_empty(source.into(), "rule_source")?);
        Ok(self)
    }

    /// Records why the rule exists.
    pub fn with_reason(mut self, reason: impl Into<String>) -> Result<Self, RuleError> {
        self.reason = Some(non_empty(reason.into(), "rule_reason")?);
        Ok(self)
    }

    /// The same rule with another strategy (an erasure on an archiving
    /// entity deletes the subject's rows instead of copying them).
    pub(crate) fn with_strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// The ordinary retention period.
    pub fn period(&self) -> Period {
        self.period
    }

    /// What happens to eligible rows.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The legal minimum, if any.
    pub fn legal_min(&self) -> Option<Period> {
        self.legal_min
    }

    /// Whether the legal minimum is positive (it then also constrains erasure).
    pub fn has_positive_legal_min(&self) -> bool {
        self.legal_min.is_some_and(|m| !m.is_zero())
    }

    /// The audit detail.
    pub fn audit(&self) -> AuditDetail {
        self.audit
    }

    /// Provenance: where the rule comes from.
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// Provenance: why the rule exists.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// The age a row must exceed before a sweep touches it at `now`:
    /// `max(period, legal_min)`. With calendar units the longer of the two
    /// can depend on `now` (`1mo` against `30d`), so this is the one whose
    /// cutoff lies earlier at that time.
    pub fn effective_period_at(&self, now: DateTime<Utc>) -> Period {
        match self.legal_min {
            Some(min) if min.before(now) < self.period.before(now) => min,
            _ => self.period,
        }
    }

    /// The sweep cutoff for a logical `now`: rows whose anchor is strictly
    /// before it are eligible; rows exactly on it are kept. It is the
    /// earlier of `now - period` and `now - legal_min`.
    pub fn sweep_cutoff(&self, now: DateTime<Utc>) -> Result<DateTime<Utc>, CutoffOutOfRange> {
        let by_period = cutoff(now, self.period)?;
        match self.legal_min {
            Some(min) => Ok(by_period.min(cutoff(now, min)?)),
            None => Ok(by_period),
        }
    }

    /// The erasure cutoff: `now - legal_min` when the legal minimum is
    /// positive, otherwise none (the ordinary period never delays erasure).
    pub fn erasure_cutoff(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, CutoffOutOfRange> {
        match self.legal_min {
            Some(min) if !min.is_zero() => cutoff(now, min).map(Some),
            _ => Ok(None),
        }
    }
}

fn non_empty(text: String, field: &'static str) -> Result<String, RuleError> {
    if text.trim().is_empty() {
        Err(RuleError::EmptyProvenance { field })
    } else {
        Ok(text)
    }
}

/// `now - period` fell outside the representable time range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cutoff {now} minus {period} is outside the supported time range")]
pub struct CutoffOutOfRange {
    /// The logical time.
    pub now: DateTime<Utc>,
    /// The duration subtracted.
    pub period: Period,
}

/// `now - period`, checked, with calendar years and months as PostgreSQL
/// computes them ([`Period::before`]). The one place eligibility times are
/// computed.
pub fn cutoff(now: DateTime<Utc>, period: Period) -> Result<DateTime<Utc>, CutoffOutOfRange> {
    period.before(now).ok_or(CutoffOutOfRange { now, period })
}

/// Every strategy a category can ever return: non-empty, only real
/// strategies, immutable. Startup validates each entity against all of
/// them. A category with stages measured from a previous stage's marker
/// also lists each such (stage strategy, previous strategy) pair, so the
/// statements that read the marker are planned and checked up front, and
/// which strategies read rows by the entity's own anchor (validation's
/// index advice depends on it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CategoryCapabilities(
    BTreeSet<Strategy>,
    BTreeSet<(Strategy, Strategy)>,
    BTreeSet<Strategy>,
);

/// Capabilities must name at least one strategy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a category must declare at least one strategy")]
pub struct EmptyCapabilities;

impl CategoryCapabilities {
    /// Builds a capability set; empty input is refused.
    pub fn new(strategies: impl IntoIterator<Item = Strategy>) -> Result<Self, EmptyCapabilities> {
        let set: BTreeSet<Strategy> = strategies.into_iter().collect();
        if set.is_empty() {
            Err(EmptyCapabilities)
        } else {
            Ok(Self(set.clone(), BTreeSet::new(), set))
        }
    }

    /// A single strategy.
    pub fn only(strategy: Strategy) -> Self {
        Self(
            BTreeSet::from([strategy]),
            BTreeSet::new(),
            BTreeSet::from([strategy]),
        )
    }

    /// The capabilities a rule needs: each stage's strategy, and each stage
    /// measured from the previous stage's marker.
    pub fn of_rule(rule: &RetentionRule) -> Self {
        let mut caps = Self::only(rule.strategy());
        caps.add_rule(rule);
        caps
    }

    /// Adds what `rule` needs (see [`of_rule`](Self::of_rule)).
    pub fn add_rule(&mut self, rule: &RetentionRule) {
        self.0.insert(rule.strategy());
        self.2.insert(rule.strategy());
        for (i, stage) in rule.later_stages().iter().enumerate() {
            self.0.insert(stage.strategy);
            match rule.stage_anchor(i + 2) {
                Some((StageAnchor::Previous, previous)) => {
                    self.1.insert((stage.strategy, previous));
                }
                _ => {
                    self.2.insert(stage.strategy);
                }
            }
        }
    }

    /// Adds a stage of `strategy` measured from the marker a `previous`
    /// stage writes (for rule providers that declare capabilities).
    pub fn with_marker_stage(mut self, strategy: Strategy, previous: Strategy) -> Self {
        self.0.insert(strategy);
        self.1.insert((strategy, previous));
        self
    }

    /// Whether a stage of `strategy` measured from `previous`'s marker is declared.
    pub fn allows_marker_stage(&self, strategy: Strategy, previous: Strategy) -> bool {
        self.1.contains(&(strategy, previous))
    }

    /// The (stage strategy, previous strategy) pairs measured from a marker.
    pub fn marker_stages(&self) -> impl Iterator<Item = (Strategy, Strategy)> + '_ {
        self.1.iter().copied()
    }

    /// The strategies that read rows by the entity's own anchor: the
    /// first stage's, every stage measured from the anchor, and every
    /// strategy declared with [`new`](Self::new) or [`only`](Self::only)
    /// (a stage added by [`with_marker_stage`](Self::with_marker_stage)
    /// reads by its marker).
    pub fn anchor_reads(&self) -> impl Iterator<Item = Strategy> + '_ {
        self.2.iter().copied()
    }

    /// Whether the category may return `strategy`.
    pub fn allows(&self, strategy: Strategy) -> bool {
        self.0.contains(&strategy)
    }

    /// The strategies, in a fixed order.
    pub fn iter(&self) -> impl Iterator<Item = Strategy> + '_ {
        self.0.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn days(n: i64) -> Period {
        Period::from_days(n).unwrap()
    }

    #[test]
    fn anchor_reads_leave_out_stages_measured_from_a_marker() {
        let soft_then = |after: Stage| {
            RetentionRule::new(days(30), Strategy::SoftDelete)
                .then(after)
                .unwrap()
        };
        let by_marker = CategoryCapabilities::of_rule(&soft_then(Stage::after_previous(
            Strategy::Purge,
            days(30),
        )));
        assert_eq!(
            by_marker.anchor_reads().collect::<Vec<_>>(),
            vec![Strategy::SoftDelete]
        );
        assert!(by_marker.allows(Strategy::Purge));
        let by_anchor = CategoryCapabilities::of_rule(&soft_then(Stage::after_anchor(
            Strategy::Purge,
            days(365),
        )));
        assert_eq!(
            by_anchor.anchor_reads().collect::<Vec<_>>(),
            vec![Strategy::Purge, Strategy::SoftDelete]
        );
        // Declared strategies read by the anchor; a declared marker stage
        // adds its strategy without an anchor read.
        let declared = CategoryCapabilities::new([Strategy::SoftDelete])
            .unwrap()
            .with_marker_stage(Strategy::Purge, Strategy::SoftDelete);
        assert_eq!(
            declared.anchor_reads().collect::<Vec<_>>(),
            vec![Strategy::SoftDelete]
        );
    }

    #[test]
    fn cutoff_table() {
        let now = Utc.with_ymd_and_hms(2026, 3, 31, 12, 0, 0).unwrap();
        // (period, legal_min, expected sweep cutoff, expected erasure cutoff)
        let cases = [
            (
                days(30),
                None,
                Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap(),
                None,
            ),
            (days(0), None, now, None),
            (days(0), Some(days(0)), now, None),
            (
                days(30),
                Some(days(60)),
                Utc.with_ymd_and_hms(2026, 1, 30, 12, 0, 0).unwrap(),
                Some(Utc.with_ymd_and_hms(2026, 1, 30, 12, 0, 0).unwrap()),
            ),
            (
                days(90),
                Some(days(1)),
                Utc.with_ymd_and_hms(2025, 12, 31, 12, 0, 0).unwrap(),
                Some(Utc.with_ymd_and_hms(2026, 3, 30, 12, 0, 0).unwrap()),
            ),
            // Calendar units: seven calendar years, never 2555 days.
            (
                days(30),
                Some("7y".parse().unwrap()),
                Utc.with_ymd_and_hms(2019, 3, 31, 12, 0, 0).unwrap(),
                Some(Utc.with_ymd_and_hms(2019, 3, 31, 12, 0, 0).unwrap()),
            ),
            // On March 31st a calendar month reaches back 31 days, further than 30d.
            (
                days(30),
                Some("1mo".parse().unwrap()),
                Utc.with_ymd_and_hms(2026, 2, 28, 12, 0, 0).unwrap(),
                Some(Utc.with_ymd_and_hms(2026, 2, 28, 12, 0, 0).unwrap()),
            ),
            (
                "1mo".parse().unwrap(),
                Some(days(30)),
                Utc.with_ymd_and_hms(2026, 2, 28, 12, 0, 0).unwrap(),
                Some(Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap()),
            ),
            (
                "1d12h".parse().unwrap(),
                None,
                Utc.with_ymd_and_hms(2026, 3, 30, 0, 0, 0).unwrap(),
                None,
            ),
        ];
        for (period, legal_min, sweep, erasure) in cases {
            let mut rule = RetentionRule::new(period, Strategy::Purge);
            if let Some(m) = legal_min {
                rule = rule.with_legal_min(m);
            }
            assert_eq!(
                rule.sweep_cutoff(now).unwrap(),
                sweep,
                "{period} {legal_min:?}"
            );
            assert_eq!(
                rule.erasure_cutoff(now).unwrap(),
                erasure,
                "{period} {legal_min:?}"
            );
        }
    }

    #[test]
    fn cutoff_near_the_start_of_time_is_an_error_not_a_panic() {
        let now = DateTime::<Utc>::MIN_UTC + chrono::TimeDelta::days(1);
        let rule = RetentionRule::new(days(365_000), Strategy::Purge);
        assert!(rule.sweep_cutoff(now).is_err());
    }

    #[test]
    fn rule_invariants() {
        let rule = RetentionRule::new(days(30), Strategy::Exempt);
        assert_eq!(
            rule.clone().with_audit(AuditDetail::PerRow),
            Err(RuleError::PerRowOnExempt)
        );
        assert_eq!(
            RetentionRule::new(days(1), Strategy::Purge).with_source("  "),
            Err(RuleError::EmptyProvenance {
                field: "rule_source"
            })
        );
        assert_eq!(
            RetentionRule::new(days(1), Strategy::Purge).with_reason(""),
            Err(RuleError::EmptyProvenance {
                field: "rule_reason"
            })
        );
        let rule = RetentionRule::new(days(30), Strategy::Anonymise)
            .with_legal_min(days(10))
            .with_audit(AuditDetail::PerRow)
            .unwrap()
            .with_source("policy v3")
            .unwrap()
            .with_reason("contracts")
            .unwrap();
        assert_eq!(rule.effective_period_at(Utc::now()), days(30));
        assert_eq!(rule.audit(), AuditDetail::PerRow);
        assert_eq!(rule.source(), Some("policy v3"));
        assert_eq!(rule.reason(), Some("contracts"));
        assert!(rule.has_positive_legal_min());
        assert!(!RetentionRule::new(days(1), Strategy::Purge)
            .with_legal_min(Period::ZERO)
            .has_positive_legal_min());
    }

    #[test]
    fn capability_invariants() {
        assert_eq!(CategoryCapabilities::new([]), Err(EmptyCapabilities));
        let caps =
            CategoryCapabilities::new([Strategy::Purge, Strategy::Purge, Strategy::Anonymise])
                .unwrap();
        assert_eq!(
            caps.iter().collect::<Vec<_>>(),
            vec![Strategy::Purge, Strategy::Anonymise]
        );
        assert!(caps.allows(Strategy::Purge));
        assert!(!caps.allows(Strategy::SoftDelete));
        assert!(CategoryCapabilities::only(Strategy::Exempt).allows(Strategy::Exempt));
    }

    #[test]
    fn strategy_names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(s.as_str().parse::<Strategy>().unwrap(), s);
        }
        // One spelling, as for the `anonymise` keys; the error points to it.
        let err = "anonymize".parse::<Strategy>().unwrap_err().to_string();
        assert!(err.ends_with("; did you mean \"anonymise\"?"), "{err}");
        assert!("delete".parse::<Strategy>().is_err());
        assert!(!Strategy::Exempt.mutates());
        assert_eq!(
            "per_row".parse::<AuditDetail>().unwrap(),
            AuditDetail::PerRow
        );
        assert!("rows".parse::<AuditDetail>().is_err());
    }
}
