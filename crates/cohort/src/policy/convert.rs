//! Turning the file's tables into what the engine runs on: entity
//! declarations (the same the derive yields), category rules and policy
//! handlers. Every problem is collected, with its place in the file.

use super::file::*;
use crate::handlers::{HandlerTarget, Phase, PolicyHandler};
use crate::model::{AnonymiseMethod, EntityDeclaration, Marker, Origin, Partitions};
use crate::rules::{
    AuditDetail, CategoryCapabilities, Period, RetentionRule, RuleOverride, Stage, StageAnchor,
    Strategy,
};

pub(super) fn handlers(
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
            if t.as_seconds() as f64
                > claim_timeout.as_seconds() as f64 * crate::handlers::DELIVERY_SOFT_DEADLINE
            {
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
                h.timeout.map_or(30.0, |p| p.as_seconds() as f64).min(
                    claim_timeout.as_seconds() as f64 * crate::handlers::DELIVERY_SOFT_DEADLINE,
                ),
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

pub(super) fn entity(e: &RawEntity) -> std::result::Result<EntityDeclaration, Vec<String>> {
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
    for c in &e.not_tenant {
        d = d.not_tenant(c);
    }
    if let Some(r) = &e.exempt {
        d = d.exempt(r);
    }
    if let Some(a) = &e.audit {
        match a.parse::<AuditDetail>() {
            Ok(detail) => d = d.audit(detail),
            Err(err) => problems.push(err.to_string()),
        }
    }
    if let Some(p) = &e.partitions {
        match Partitions::parse(p) {
            Some(p) => d = d.partitions(p),
            None => problems.push(format!(
                "partitions = {p:?} is unknown: use \"drop\" (drop whole expired partitions) or \"rows\" (the default)"
            )),
        }
    }
    if let Some(n) = e.sweep_parallelism {
        d = d.sweep_parallelism(n);
    }
    match (&e.archive_table, &e.archive_columns, e.archive_anonymise) {
        (Some(t), columns, anonymise) => {
            d = d.archive_to(t);
            if let Some(c) = columns {
                if c.is_empty() {
                    problems.push(
                        "archive_columns is empty: list the columns to archive, or leave it out to archive every column".into(),
                    );
                }
                d = d.archive_columns(c.iter().cloned());
            }
            if anonymise == Some(true) {
                d = d.anonymise_on_archive();
            }
        }
        (None, None, None) => {}
        (None, _, _) => problems.push(
            "archive_columns and archive_anonymise need archive_table (the table the archive strategy moves rows to)".into(),
        ),
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

pub(super) enum Built {
    Rules(
        RetentionRule,
        Vec<RuleOverride>,
        Option<CategoryCapabilities>,
    ),
    Alias(String),
}

pub(super) fn strategy(text: &Option<String>, problems: &mut Vec<String>) -> Option<Strategy> {
    text.as_deref().and_then(|s| {
        s.parse()
            .map_err(|e: crate::rules::UnknownStrategy| problems.push(e.to_string()))
            .ok()
    })
}

#[allow(clippy::too_many_arguments)]
pub(super) fn rule(
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

pub(super) fn category(c: &RawCategory) -> std::result::Result<Built, Vec<String>> {
    let mut problems = Vec::new();
    if let Some(target) = &c.alias_of {
        if c.strategy.is_some()
            || c.period.is_some()
            || !c.overrides.is_empty()
            || !c.stages.is_empty()
        {
            problems.push(
                "an alias (alias_of) cannot also define strategy, period, stages or overrides"
                    .into(),
            );
            return Err(problems);
        }
        return Ok(Built::Alias(target.clone()));
    }
    let s = strategy(&c.strategy, &mut problems);
    if c.strategy.is_none() {
        problems
            .push("strategy is required (purge, soft_delete, anonymise, exempt or archive)".into());
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
    // The later stages, parsed once; each rule (the category's and every
    // override's) then takes them in order.
    let mut stages: Vec<Stage> = Vec::new();
    for (i, raw) in c.stages.iter().enumerate() {
        let at = |p: String| format!("stage {}: {p}", i + 2);
        let strategy = match raw.strategy.parse::<Strategy>() {
            Ok(s) => Some(s),
            Err(e) => {
                problems.push(at(e.to_string()));
                None
            }
        };
        let after = match raw.after.as_deref() {
            None | Some("previous") => Some(StageAnchor::Previous),
            Some("anchor") => Some(StageAnchor::Anchor),
            Some(other) => {
                problems.push(at(format!(
                    "after = {other:?} is unknown: use \"previous\" (the marker the stage before wrote, the default) or \"anchor\" (the entity's anchor)"
                )));
                None
            }
        };
        if let (Some(strategy), Some(after)) = (strategy, after) {
            stages.push(Stage {
                strategy,
                period: raw.period,
                after,
            });
        }
    }
    let staged = |rule: RetentionRule,
                  periods: Option<&Vec<Period>>,
                  problems: &mut Vec<String>|
     -> Option<RetentionRule> {
        if let Some(p) = periods {
            if p.len() != stages.len() {
                problems.push(format!(
                    "stage_periods lists {} period(s), but the category has {} stage(s) after its first",
                    p.len(),
                    stages.len()
                ));
                return None;
            }
        }
        let mut rule = rule;
        for (i, stage) in stages.iter().enumerate() {
            let mut stage = *stage;
            if let Some(p) = periods {
                stage.period = p[i];
            }
            rule = rule
                .then(stage)
                .map_err(|e| problems.push(e.to_string()))
                .ok()?;
        }
        Some(rule)
    };
    let base = base.and_then(|b| staged(b, None, &mut problems));
    let mut overrides = Vec::new();
    for (i, o) in c.overrides.iter().enumerate() {
        let mut local = Vec::new();
        if o.tag.as_deref().is_some_and(|t| t.trim().is_empty()) {
            local.push("tag must not be empty".to_owned());
        }
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
            let built = built.and_then(|r| staged(r, o.stage_periods.as_ref(), &mut local));
            if let Some(rule) = built {
                overrides.push(RuleOverride {
                    tenant: o.tenant.clone(),
                    jurisdiction: o.jurisdiction.clone(),
                    tag: o.tag.as_deref().map(|t| t.trim().to_owned()),
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
