//! Each declaration resolved against its table: ids unique, exempt ones
//! documented, retained ones checked against the catalog (the table, its
//! columns, its category, its archive table and partitions).

use std::collections::BTreeMap;

use sqlx::PgConnection;

use super::{archive, catalog, entity, partitions};
use crate::base::ident::QualifiedName;
use crate::config::CohortConfig;
use crate::domain::model::{
    parse_entity_id, resolve, EntityDeclaration, EntityDescriptor, Marker, Resolved,
};
use crate::domain::rules::{CategoryCapabilities, RuleProvider};
use crate::error::{Problem, Result};
use crate::schema::CohortTable;

/// The table a declaration points at, before conventions: needed first so
/// policy-file entities can take their columns from the catalog.
fn declared_table(
    decl: &EntityDeclaration,
    default_schema: &str,
) -> std::result::Result<QualifiedName, String> {
    QualifiedName::resolve(
        decl.table.as_deref(),
        &heck::ToSnakeCase::to_snake_case(decl.name.as_str()),
        decl.schema.as_deref(),
        default_schema,
    )
}

/// The declarations, resolved against their tables.
pub(super) struct Declared {
    /// The retained entities, in declaration order.
    pub(super) entities: Vec<EntityDescriptor>,
    /// Each retained entity's table, in `entities`' order.
    pub(super) tables: Vec<catalog::TableInfo>,
    /// The exempt entities.
    pub(super) exempt: Vec<crate::domain::model::ExemptEntity>,
    /// The tables of exempt declarations, by display name.
    pub(super) exempt_tables: Vec<(String, QualifiedName)>,
    /// Each retained entity's category capabilities, by entity id.
    pub(super) capabilities: BTreeMap<uuid::Uuid, CategoryCapabilities>,
}

/// Resolves every declaration (ids unique, exempt ones documented,
/// retained ones checked against their table), adding what is wrong to
/// `problems`.
pub(super) async fn resolve_declarations(
    conn: &mut PgConnection,
    config: &CohortConfig,
    declarations: &[EntityDeclaration],
    rules: &dyn RuleProvider,
    problems: &mut Vec<Problem>,
) -> Result<Declared> {
    let conventions = &config.conventions;
    let tenant_candidates: Vec<&str> = conventions
        .get(Marker::Tenant)
        .into_iter()
        .chain(std::iter::once(Marker::Tenant.default_column()))
        .collect();

    let mut entities = Vec::new();
    let mut exempt = Vec::new();
    let mut tables: Vec<catalog::TableInfo> = Vec::new();
    let mut ids: BTreeMap<uuid::Uuid, &str> = BTreeMap::new();
    let mut capabilities = BTreeMap::new();
    let mut exempt_tables: Vec<(String, QualifiedName)> = Vec::new();

    for decl in declarations {
        if let Ok(id) = parse_entity_id(decl.raw_id()) {
            if let Some(first) = ids.insert(id, decl.name()) {
                problems.push(Problem::entity(
                    decl.name(),
                    format!("retained-entity id {id} is also used by {first}; ids must be unique"),
                ));
            }
        }
        if decl.is_exempt() {
            if let Ok(t) = declared_table(decl, config.table_schema()) {
                exempt_tables.push((decl.name().to_owned(), t));
            }
            match resolve(decl, conventions, config.table_schema(), &[]) {
                Ok(Resolved::Exempt(e)) => exempt.push(e),
                Ok(Resolved::Retained(_)) => unreachable!("exempt declarations resolve as exempt"),
                Err(ps) => problems.extend(ps.into_iter().map(|p| Problem::entity(decl.name(), p))),
            }
            continue;
        }
        if let Some((descriptor, table, caps)) =
            resolve_retained(conn, config, decl, rules, &tenant_candidates, problems).await?
        {
            if let Some(c) = caps {
                capabilities.insert(descriptor.id, c);
            }
            entities.push(descriptor);
            tables.push(table);
        }
    }
    Ok(Declared {
        entities,
        tables,
        exempt,
        exempt_tables,
        capabilities,
    })
}

/// One retained declaration against its table (`None` when it cannot be
/// checked further: its problems are in `problems`).
async fn resolve_retained(
    conn: &mut PgConnection,
    config: &CohortConfig,
    decl: &EntityDeclaration,
    rules: &dyn RuleProvider,
    tenant_candidates: &[&str],
    problems: &mut Vec<Problem>,
) -> Result<
    Option<(
        EntityDescriptor,
        catalog::TableInfo,
        Option<CategoryCapabilities>,
    )>,
> {
    let table_name = match declared_table(decl, config.table_schema()) {
        Ok(t) => t,
        Err(e) => {
            problems.push(Problem::entity(decl.name(), e));
            return Ok(None);
        }
    };
    check_unqualified_table(conn, config, decl, &table_name, problems).await?;
    if refuse_ledger_table(conn, config, decl, &table_name, problems).await? {
        return Ok(None);
    }
    let Some(table) = load_declared_table(conn, decl, &table_name, problems).await? else {
        return Ok(None);
    };
    let Some(mut descriptor) = resolve_against(config, decl, &table, problems) else {
        return Ok(None);
    };
    let caps = rules.capabilities(&descriptor.category);
    check_against_table(
        rules,
        &descriptor,
        &table,
        caps.as_ref(),
        tenant_candidates,
        problems,
    );
    check_archive_and_partitions(
        conn,
        config,
        &mut descriptor,
        &table,
        caps.as_ref(),
        problems,
    )
    .await?;
    Ok(Some((descriptor, table, caps)))
}

/// Refuses an unqualified table name that also exists in Cohort's own schema.
async fn check_unqualified_table(
    conn: &mut PgConnection,
    config: &CohortConfig,
    decl: &EntityDeclaration,
    table_name: &QualifiedName,
    problems: &mut Vec<Problem>,
) -> Result<()> {
    // Since the default table schema became `public`, an unqualified name
    // that also exists in Cohort's own schema would silently change
    // tables on upgrade: refuse the ambiguity.
    let text = decl
        .table
        .clone()
        .unwrap_or_else(|| heck::ToSnakeCase::to_snake_case(decl.name()));
    let unqualified = decl.schema.is_none()
        && config.default_table_schema.is_none()
        && config.schema != "public"
        && !text.is_empty()
        && QualifiedName::parse(&text, "public").ok()
            != QualifiedName::parse(&text, &config.schema).ok();
    if unqualified {
        let in_cohort_schema = QualifiedName::new(config.schema.clone(), table_name.name.clone());
        if catalog::load_table(conn, &in_cohort_schema)
            .await?
            .is_some()
        {
            problems.push(Problem::entity(
                decl.name(),
                format!(
                    "table {:?} names no schema: it resolves to {} (the default table schema), but {} exists too (earlier versions resolved it there); qualify the table or set default_table_schema",
                    text,
                    table_name.display_plain(),
                    in_cohort_schema.display_plain()
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses one of Cohort's own ledger tables (`true`: refused, the problem added).
async fn refuse_ledger_table(
    conn: &mut PgConnection,
    config: &CohortConfig,
    decl: &EntityDeclaration,
    table_name: &QualifiedName,
    problems: &mut Vec<Problem>,
) -> Result<bool> {
    if CohortTable::ALL.iter().any(|t| t.name() == table_name.name)
        && (table_name.schema == config.schema
            || catalog::is_cohort_schema(conn, &table_name.schema).await?)
    {
        problems.push(Problem::entity(
            decl.name(),
            format!(
                "{} is one of Cohort's own ledger tables; it cannot be a retained entity (purging it would drop holds and audit)",
                table_name.display_plain()
            ),
        ));
        return Ok(true);
    }
    Ok(false)
}

/// The declared table; `None` when it does not exist (that problem, and the id's, added).
async fn load_declared_table(
    conn: &mut PgConnection,
    decl: &EntityDeclaration,
    table_name: &QualifiedName,
    problems: &mut Vec<Problem>,
) -> Result<Option<catalog::TableInfo>> {
    let Some(table) = catalog::load_table(conn, table_name).await? else {
        let hint = catalog::did_you_mean_table(conn, table_name).await?;
        problems.push(Problem::entity(
            decl.name(),
            format!("table {} does not exist{hint}", table_name.display_plain()),
        ));
        if let Err(e) = parse_entity_id(decl.raw_id()) {
            problems.push(Problem::entity(decl.name(), e));
        }
        return Ok(None);
    };
    Ok(Some(table))
}

/// The declaration resolved against the table's columns (`None`: problems added).
fn resolve_against(
    config: &CohortConfig,
    decl: &EntityDeclaration,
    table: &catalog::TableInfo,
    problems: &mut Vec<Problem>,
) -> Option<EntityDescriptor> {
    let available: Vec<String> = table.columns.iter().map(|c| c.name.clone()).collect();
    match resolve(decl, &config.conventions, config.table_schema(), &available) {
        Ok(Resolved::Retained(d)) => Some(*d),
        Ok(Resolved::Exempt(_)) => unreachable!("non-exempt declarations resolve as retained"),
        Err(ps) => {
            problems.extend(ps.into_iter().map(|p| Problem::entity(decl.name(), p)));
            None
        }
    }
}

/// The entity's checks against its table and its category's capabilities.
fn check_against_table(
    rules: &dyn RuleProvider,
    descriptor: &EntityDescriptor,
    table: &catalog::TableInfo,
    caps: Option<&CategoryCapabilities>,
    tenant_candidates: &[&str],
    problems: &mut Vec<Problem>,
) {
    let known = if caps.is_none() {
        rules.known_categories()
    } else {
        Vec::new()
    };
    problems.extend(
        entity::check_entity(descriptor, table, caps, tenant_candidates, &known)
            .into_iter()
            .map(|p| Problem::entity(&descriptor.name, p)),
    );
}

/// The entity's archive table (its columns default to every column of
/// the source) and its partitions, when it drops them.
async fn check_archive_and_partitions(
    conn: &mut PgConnection,
    config: &CohortConfig,
    descriptor: &mut EntityDescriptor,
    table: &catalog::TableInfo,
    caps: Option<&CategoryCapabilities>,
    problems: &mut Vec<Problem>,
) -> Result<()> {
    let archive_table = match &mut descriptor.archive {
        Some(a) => {
            if a.columns.is_empty() {
                a.columns = table.columns.iter().map(|c| c.name.clone()).collect();
            }
            if CohortTable::ALL.iter().any(|t| t.name() == a.table.name)
                && (a.table.schema == config.schema
                    || catalog::is_cohort_schema(conn, &a.table.schema).await?)
            {
                problems.push(Problem::entity(
                    &descriptor.name,
                    format!(
                        "archive table {} is one of Cohort's own ledger tables",
                        a.table.display_plain()
                    ),
                ));
                None
            } else {
                catalog::load_table(conn, &a.table).await?
            }
        }
        None => None,
    };
    let hooks = match &archive_table {
        Some(t) => catalog::insert_hooks(conn, t.oid).await?,
        None => Vec::new(),
    };
    problems.extend(
        archive::check(descriptor, table, archive_table.as_ref(), &hooks, caps)
            .into_iter()
            .map(|p| Problem::entity(&descriptor.name, p)),
    );
    if descriptor.partitions == crate::domain::model::Partitions::Drop {
        let partitioning = partitions::load(conn, table.oid).await?;
        problems.extend(
            partitions::check(descriptor, table, partitioning.as_ref(), caps)
                .into_iter()
                .map(|p| Problem::entity(&descriptor.name, p)),
        );
    }
    Ok(())
}
