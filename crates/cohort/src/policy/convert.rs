//! Turning the file's tables into what the engine runs on: entity
//! declarations (the same the derive yields), category rules and policy
//! handlers. Every problem is collected, with its place in the file.

use super::file::*;
use crate::domain::handlers::{HandlerTarget, Phase, PolicyHandler};
use crate::domain::model::{AnonymiseMethod, EntityDeclaration, Marker, Origin, Partitions};
use crate::domain::rules::{
    AuditDetail, CategoryCapabilities, Period, RetentionRule, RuleOverride, Stage, StageAnchor,
    Strategy,
};

/// The `[[entity.handler]]` tables of one entity, checked.
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
        check_handler_name(&at, h, &mut names, &mut problems);
        let phase = handler_phase(&at, h, &mut problems);
        let (target, program) = handler_target(&at, h, &mut problems);
        check_capture_and_timeout(&at, h, claim_timeout, &mut problems);
        out.push(PolicyHandler {
            entity_id,
            entity: e.name.clone(),
            name: h.name.clone(),
            phase,
            priority: h.priority,
            capture: h.capture.clone(),
            timeout: Some(handler_timeout(h, claim_timeout)),
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

/// A handler's name is not empty, nor one an earlier handler of the entity has.
fn check_handler_name(
    at: &str,
    h: &RawHandler,
    names: &mut std::collections::BTreeSet<String>,
    problems: &mut Vec<String>,
) {
    if h.name.trim().is_empty() {
        problems.push(format!("{at}: name must not be empty"));
    } else if !names.insert(h.name.clone()) {
        problems.push(format!(
            "{at}: two handlers of this entity are named {:?}",
            h.name
        ));
    }
}

/// A handler's phase: immediate when unset, or when unknown (a problem).
fn handler_phase(at: &str, h: &RawHandler, problems: &mut Vec<String>) -> Phase {
    match h.phase.as_deref() {
        None | Some("immediate") => Phase::Immediate,
        Some("after_sweep_settled") => Phase::AfterSweepSettled,
        Some(other) => {
            problems.push(format!(
                "{at}: phase {other:?} is unknown: use \"immediate\" or \"after_sweep_settled\""
            ));
            Phase::Immediate
        }
    }
}

/// Where a handler delivers (command or url), and the command's program, resolved.
fn handler_target(
    at: &str,
    h: &RawHandler,
    problems: &mut Vec<String>,
) -> (Option<HandlerTarget>, Option<std::path::PathBuf>) {
    match (&h.command, &h.url) {
        (Some(_), Some(_)) => {
            problems.push(format!("{at}: give either command or url, not both"));
            (None, None)
        }
        (Some(argv), None) => command_target(at, argv, h, problems),
        (None, Some(url)) => (Some(url_target(at, url, h, problems)), None),
        (None, None) => {
            problems.push(format!(
                "{at}: give command = [\"program\", \"arg\", ...] or url = \"https://...\""
            ));
            (None, None)
        }
    }
}

/// A command handler's target and resolved program; a command takes no `secret_env`.
fn command_target(
    at: &str,
    argv: &[String],
    h: &RawHandler,
    problems: &mut Vec<String>,
) -> (Option<HandlerTarget>, Option<std::path::PathBuf>) {
    let mut program = None;
    if argv.is_empty() || argv[0].trim().is_empty() {
        problems.push(format!("{at}: command must name a program"));
    } else {
        match crate::domain::handlers::command::resolve_program(&argv[0]) {
            Ok(path) => program = Some(path),
            Err(e) => problems.push(format!("{at}: command: {e}")),
        }
    }
    if h.secret_env.is_some() {
        problems.push(format!(
            "{at}: secret_env signs webhooks only (url handlers)"
        ));
    }
    (Some(HandlerTarget::Command(argv.to_vec())), program)
}

/// A webhook handler's target: a url Cohort accepts, and a `secret_env` that is set.
fn url_target(at: &str, url: &str, h: &RawHandler, problems: &mut Vec<String>) -> HandlerTarget {
    if let Err(e) = crate::domain::handlers::command::check_url(url) {
        problems.push(format!("{at}: {e}"));
    }
    if let Some(var) = &h.secret_env {
        if std::env::var(var).map_or(true, |v| v.is_empty()) {
            problems.push(format!(
                "{at}: secret_env names {var}, which is not set: webhooks could not be signed"
            ));
        }
    }
    HandlerTarget::Url {
        url: url.to_owned(),
        secret_env: h.secret_env.clone(),
    }
}

/// No empty captured column; a fixed timeout above zero, within the delivery deadline.
fn check_capture_and_timeout(
    at: &str,
    h: &RawHandler,
    claim_timeout: Period,
    problems: &mut Vec<String>,
) {
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
            > claim_timeout.as_seconds() as f64 * crate::domain::handlers::DELIVERY_SOFT_DEADLINE
        {
            problems.push(format!(
                "{at}: timeout {t} exceeds the delivery deadline (85% of dispatch.claim_timeout {claim_timeout}); past it the work could be reclaimed and run twice at once"
            ));
        }
    }
}

/// A handler's timeout: 30 s when unset, never past the delivery deadline.
fn handler_timeout(h: &RawHandler, claim_timeout: Period) -> std::time::Duration {
    std::time::Duration::from_secs_f64(
        h.timeout.map_or(30.0, |p| p.as_seconds() as f64).min(
            claim_timeout.as_seconds() as f64 * crate::domain::handlers::DELIVERY_SOFT_DEADLINE,
        ),
    )
}

/// One `[[entity]]` table as the declaration the derive would yield.
pub(super) fn entity(e: &RawEntity) -> std::result::Result<EntityDeclaration, Vec<String>> {
    let mut problems = Vec::new();
    let mut d = EntityDeclaration::new(&e.name, &e.id).origin(Origin::PolicyFile);
    if e.name.trim().is_empty() {
        problems.push("name must not be empty".into());
    }
    d = with_table(d, e, &mut problems);
    d = with_scope(d, e);
    d = with_audit_and_partitions(d, e, &mut problems);
    d = with_archive(d, e, &mut problems);
    if matches!(&e.record_id, Some(RawRecordKey::Composite(c)) if c.is_empty()) {
        problems.push(
            "record_id = [] names no column: give the key column, or its columns in key order"
                .into(),
        );
    }
    d = with_columns(d, e);
    d = with_anonymise(d, e, &mut problems);
    if problems.is_empty() {
        Ok(d)
    } else {
        Err(problems)
    }
}

/// The entity's table: required, and a name the policy file may use.
fn with_table(
    mut d: EntityDeclaration,
    e: &RawEntity,
    problems: &mut Vec<String>,
) -> EntityDeclaration {
    if let Some(t) = &e.table {
        if let Some(problem) = crate::base::ident::policy_table_problem(t) {
            problems.push(problem);
        } else if let Err(problem) =
            crate::base::ident::QualifiedName::resolve(Some(t), t, e.schema.as_deref(), "public")
        {
            problems.push(problem);
        }
        d = d.table(t);
    } else {
        problems.push("table is required".into());
    }
    d
}

/// The schema, category, anchor, tenancy and exemption, as given.
fn with_scope(mut d: EntityDeclaration, e: &RawEntity) -> EntityDeclaration {
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
    d
}

/// The audit detail and partition handling (each a known word), and the parallelism.
fn with_audit_and_partitions(
    mut d: EntityDeclaration,
    e: &RawEntity,
    problems: &mut Vec<String>,
) -> EntityDeclaration {
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
    if let Some(n) = e.max_rows_per_second {
        d = d.max_rows_per_second(n);
    }
    if let Some(lag) = e.max_replica_lag {
        match lag.as_replica_lag() {
            Ok(lag) => d = d.max_replica_lag(lag),
            Err(why) => problems.push(format!("max_replica_lag = {lag}: {why}")),
        }
    }
    d
}

/// The archive settings; `archive_columns` (not empty) and anonymise need `archive_table`.
fn with_archive(
    mut d: EntityDeclaration,
    e: &RawEntity,
    problems: &mut Vec<String>,
) -> EntityDeclaration {
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
    d
}

/// The marker columns and the erasure subjects, as given.
fn with_columns(mut d: EntityDeclaration, e: &RawEntity) -> EntityDeclaration {
    match &e.record_id {
        Some(RawRecordKey::One(c)) => d = d.marker(Marker::RecordId, c),
        Some(RawRecordKey::Composite(cols)) => d = d.record_key(cols.iter().cloned()),
        None => {}
    }
    for (marker, column) in [
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
    d
}

/// The anonymised columns; an unknown method is a problem and its column left out.
fn with_anonymise(
    mut d: EntityDeclaration,
    e: &RawEntity,
    problems: &mut Vec<String>,
) -> EntityDeclaration {
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
    d
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
            .map_err(|e: crate::domain::rules::UnknownStrategy| problems.push(e.to_string()))
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

/// One `[[category]]` table: its rule, stages, overrides and strategies, or an alias.
pub(super) fn category(c: &RawCategory) -> std::result::Result<Built, Vec<String>> {
    let mut problems = Vec::new();
    if let Some(target) = &c.alias_of {
        return alias(c, target);
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
    let stages = later_stages(c, &mut problems);
    let base = base.and_then(|b| staged(b, &stages, None, &mut problems));
    let overrides = overrides(c, s, base.as_ref(), &stages, &mut problems);
    let caps = category_capabilities(c, &mut problems);
    match base {
        Some(base) if problems.is_empty() => Ok(Built::Rules(base, overrides, caps)),
        _ => Err(problems),
    }
}

/// An alias (`alias_of`), which defines nothing of its own.
fn alias(c: &RawCategory, target: &str) -> std::result::Result<Built, Vec<String>> {
    if c.strategy.is_some() || c.period.is_some() || !c.overrides.is_empty() || !c.stages.is_empty()
    {
        return Err(vec![
            "an alias (alias_of) cannot also define strategy, period, stages or overrides".into(),
        ]);
    }
    Ok(Built::Alias(target.to_owned()))
}

/// The stages after the first, in order; one with an unknown word is a problem, left out.
fn later_stages(c: &RawCategory, problems: &mut Vec<String>) -> Vec<Stage> {
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
    stages
}

/// `rule` then `stages`, in order, with an override's `periods` (one per stage) if given.
fn staged(
    rule: RetentionRule,
    stages: &[Stage],
    periods: Option<&[Period]>,
    problems: &mut Vec<String>,
) -> Option<RetentionRule> {
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
}

/// The category's overrides on its rule `base`; each problem names its override.
fn overrides(
    c: &RawCategory,
    s: Option<Strategy>,
    base: Option<&RetentionRule>,
    stages: &[Stage],
    problems: &mut Vec<String>,
) -> Vec<RuleOverride> {
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
        if let (Some(os), Some(base)) = (os, base) {
            overrides.extend(override_of(o, os, base, stages, &mut local));
        }
        problems.extend(
            local
                .into_iter()
                .map(|p| format!("override #{}: {p}", i + 1)),
        );
    }
    overrides
}

/// One override: what it leaves out comes from `base`; it runs through the stages.
fn override_of(
    o: &RawOverride,
    os: Strategy,
    base: &RetentionRule,
    stages: &[Stage],
    local: &mut Vec<String>,
) -> Option<RuleOverride> {
    let built = rule(
        os,
        o.period.unwrap_or(base.period()),
        o.legal_min.or(base.legal_min()),
        o.audit.as_deref().or(Some(base.audit().as_str())),
        o.source.as_deref().or(base.source()),
        o.reason.as_deref().or(base.reason()),
        local,
    );
    let rule = built.and_then(|r| staged(r, stages, o.stage_periods.as_deref(), local))?;
    Some(RuleOverride {
        tenant: o.tenant.clone(),
        jurisdiction: o.jurisdiction.clone(),
        tag: o.tag.as_deref().map(|t| t.trim().to_owned()),
        rule,
    })
}

/// The strategies the category may use (`strategies`), when it lists them.
fn category_capabilities(
    c: &RawCategory,
    problems: &mut Vec<String>,
) -> Option<CategoryCapabilities> {
    let list = c.strategies.as_ref()?;
    let parsed: Vec<Strategy> = list
        .iter()
        .filter_map(|s| {
            s.parse()
                .map_err(|e: crate::domain::rules::UnknownStrategy| problems.push(e.to_string()))
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
