//! Retention rules: strategies, durations, capabilities and rule providers.
//! Pure values and one async port; no I/O of their own.

mod period;
mod provider;
mod rule;

pub use period::{Period, PeriodError, MAX_PERIOD_SECONDS};
pub use provider::{
    ResolutionContext, ResolveError, RuleOverride, RuleProvider, StaticProviderError,
    StaticRuleProvider, StaticRuleProviderBuilder, TenantContext, TenantIdentity,
};
pub use rule::{
    cutoff, AuditDetail, CategoryCapabilities, CutoffOutOfRange, EmptyCapabilities, RetentionRule,
    RuleError, Stage, StageAnchor, Strategy, UnknownStrategy,
};
