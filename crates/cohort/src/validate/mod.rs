//! Startup validation against the live catalog (SPEC §4).
//!
//! Reads only `pg_catalog`, never changes anything, and reports every
//! problem it finds in one [`Error::Validation`]. Missing-index advice is
//! returned as warnings, not errors. Building a handle (`Cohort::ready`,
//! `cohort validate`) runs every check, the model's (`validate`) and the
//! handle's own (`handle`: the pooler probe, handlers, captures, the
//! tenant directory), so no public entry validates less.

mod archive;
mod catalog;
pub(crate) mod chain_key;
mod checks;
mod handle;
mod pacing;
mod partitions;
pub(crate) mod pooling;
pub(crate) mod requests;

use crate::domain::rules::TenantIdentity;
use crate::sql::Casts;

use std::collections::BTreeMap;

use sqlx::PgConnection;

pub use checks::MIN_SERVER_VERSION_NUM;
pub(crate) use handle::{handle, Inputs};

use crate::base::ident::QualifiedName;
use crate::config::CohortConfig;
use crate::domain::model::{
    parse_entity_id, resolve, EntityDeclaration, EntityDescriptor, ExemptEntity, Marker, Resolved,
};
use crate::domain::rules::{CategoryCapabilities, RuleProvider};
use crate::error::{Error, Problem, Problems, Result};
use crate::schema::CohortTable;
use crate::sql::KeyType;

/// What validation established: the resolved entities Cohort may act on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ValidatedModel {
    /// Retained entities, in declaration order.
    pub entities: Vec<EntityDescriptor>,
    /// Explicitly exempt entities.
    pub exempt: Vec<ExemptEntity>,
    /// Each entity's category capabilities, by entity id.
    pub capabilities: BTreeMap<uuid::Uuid, CategoryCapabilities>,
    /// Advice (missing indexes); not errors.
    pub warnings: Vec<String>,
    /// `server_version_num` of the server validated against.
    pub server_version_num: i32,
    /// Entity ids in processing order: dependents (tables with foreign keys
    /// into other retained tables) before the tables they reference.
    pub order: Vec<uuid::Uuid>,
    /// Store types of the key-like columns, by entity id.
    pub(crate) facts: BTreeMap<uuid::Uuid, TableFacts>,
    /// The tenant columns' store type (every tenant-scoped entity agrees).
    pub(crate) tenant_key: Option<KeyType>,
}

/// What the engine needs to know about a validated entity's columns.
#[derive(Debug, Clone)]
pub(crate) struct TableFacts {
    pub(crate) record: KeyType,
    pub(crate) tenant: Option<KeyType>,
    /// Erasure-subject columns and their store types.
    pub(crate) subjects: BTreeMap<String, KeyType>,
    /// Foreign keys that forbid deleting a referenced row (NO ACTION,
    /// RESTRICT): purge leaves such rows alone and reports them as skipped.
    pub(crate) blocking_references: Vec<catalog::IncomingKey>,
    /// The tables whose blocking references keep rows of this entity for
    /// good (Cohort never deletes their rows), as a run's note names them;
    /// empty when none, or when the entity never purges or archives.
    pub(crate) kept_by_references: Vec<String>,
    /// The `{tenant}` literals written into a column of bounded length:
    /// each tenant's own id decides whether its sweeps can write them.
    pub(crate) tenant_literals: Vec<TenantLiteral>,
    /// Key-like columns compared in their own type (citext).
    pub(crate) casts: Casts,
    /// A plain table (not partitioned): a row's address (`ctid`) names
    /// it alone, so a sweep's mutation can find its locked rows by address.
    pub(crate) plain: bool,
}

/// A literal anonymise method with `{tenant}`, writing into a column of
/// bounded length (`varchar(n)`, `char(n)`, through domains too).
#[derive(Debug, Clone)]
pub(crate) struct TenantLiteral {
    pub(crate) column: String,
    pub(crate) display_type: String,
    pub(crate) max_chars: usize,
    pub(crate) template: String,
}

impl TenantLiteral {
    /// Why the literal cannot be written for `tenant` (its id as the run
    /// renders it), or `None` when it fits.
    pub(crate) fn misfit(&self, tenant: &str) -> Option<String> {
        let written = crate::domain::model::render_literal(
            &self.template,
            chrono::DateTime::UNIX_EPOCH,
            Some(tenant),
        )
        .ok()?
        .chars()
        .count();
        (written > self.max_chars).then(|| {
            format!(
                "the literal for column {:?} ({}) writes {written} characters for tenant {tenant:?}, more than the column holds: every anonymisation of this tenant's rows would fail (value too long, SQLSTATE 22001). Widen the column or shorten the literal",
                self.column, self.display_type
            )
        })
    }
}

impl TableFacts {
    /// Why anonymising this entity's rows of `tenant` cannot write its
    /// `{tenant}` literals (the first that does not fit), or `None`.
    pub(crate) fn literal_misfit(&self, tenant: &str) -> Option<String> {
        self.tenant_literals.iter().find_map(|l| l.misfit(tenant))
    }
    /// A row's stored tenant text in canonical form (so it compares with a
    /// canonical request tenant however the row spells it, e.g. citext).
    pub(crate) fn canonical_owner(&self, stored: Option<String>) -> Option<String> {
        stored.map(|o| {
            self.tenant
                .and_then(|ty| ty.canonical_text(&o))
                .unwrap_or(o)
        })
    }
}

impl ValidatedModel {
    /// Whether `strategy` writes `e`'s anonymise methods: an anonymisation,
    /// or an archive whose copy is anonymised.
    pub(crate) fn writes_literals(
        e: &EntityDescriptor,
        strategy: crate::domain::rules::Strategy,
    ) -> bool {
        use crate::domain::rules::Strategy;
        strategy == Strategy::Anonymise
            || (strategy == Strategy::Archive && e.archive.as_ref().is_some_and(|a| a.anonymise))
    }

    /// The entity with this id.
    pub fn entity(&self, id: uuid::Uuid) -> Option<&EntityDescriptor> {
        self.entities.iter().find(|e| e.id == id)
    }

    /// The entity with this display name or id (as text).
    pub fn find_entity(&self, id_or_name: &str) -> Option<&EntityDescriptor> {
        let id = uuid::Uuid::parse_str(id_or_name.trim()).ok();
        self.entities
            .iter()
            .find(|e| Some(e.id) == id || e.name == id_or_name)
    }

    /// Entities in processing order.
    pub fn ordered(&self) -> impl Iterator<Item = &EntityDescriptor> {
        self.order.iter().filter_map(|id| self.entity(*id))
    }

    /// How tenant ids compare, from the tenant columns' type.
    pub fn tenant_identity(&self) -> TenantIdentity {
        identity_of(self.tenant_key)
    }
}

fn identity_of(key: Option<KeyType>) -> TenantIdentity {
    match key {
        Some(KeyType::Uuid) => TenantIdentity::Uuid,
        Some(KeyType::Int2 | KeyType::Int4 | KeyType::Int8) => TenantIdentity::Integer,
        Some(KeyType::CiText) => TenantIdentity::CaseInsensitive,
        Some(KeyType::Text) | None => TenantIdentity::Exact,
    }
}

/// Dependents first: an entity whose table references another retained
/// table comes before it; ties keep declaration order. Foreign keys among
/// entities that may purge must not form a cycle: no order would delete
/// every row's dependents first, so one is refused, the cycle named
/// (`Err` lists its entities, each referencing the next, the last the
/// first). A cycle through entities that never purge is harmless (their
/// mutations delete nothing) and is ordered in declaration order.
fn dependency_order(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    purges: impl Fn(&EntityDescriptor) -> bool,
) -> std::result::Result<Vec<uuid::Uuid>, Vec<String>> {
    let n = entities.len();
    // referenced_by[p]: the entities whose tables reference p's (they come first).
    let mut waiting_on: Vec<usize> = vec![0; n];
    let mut referenced_by: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (child, table) in tables.iter().enumerate() {
        for fk in &table.foreign_keys {
            if let Some(parent) = tables.iter().position(|t| t.name == fk.references) {
                if parent != child && !referenced_by[parent].contains(&child) {
                    referenced_by[parent].push(child);
                    waiting_on[parent] += 1;
                }
            }
        }
    }
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    while order.len() < n {
        let next = match (0..n).find(|&i| !done[i] && waiting_on[i] == 0) {
            Some(i) => i,
            None => {
                if let Some(cycle) = purge_cycle(entities, &referenced_by, &done, &purges) {
                    return Err(cycle);
                }
                (0..n).find(|&i| !done[i]).expect("some entity is left")
            }
        };
        done[next] = true;
        order.push(entities[next].id);
        for parent in 0..n {
            if referenced_by[parent].contains(&next) && waiting_on[parent] > 0 {
                waiting_on[parent] -= 1;
            }
        }
    }
    Ok(order)
}

/// A cycle of references among the entities left (not `done`) that may
/// purge, by name, each referencing the next and the last the first.
fn purge_cycle(
    entities: &[EntityDescriptor],
    referenced_by: &[Vec<usize>],
    done: &[bool],
    purges: &impl Fn(&EntityDescriptor) -> bool,
) -> Option<Vec<String>> {
    let n = entities.len();
    let live = |i: usize| !done[i] && purges(&entities[i]);
    // Depth-first over "is referenced by" edges among live entities; a
    // back edge closes a cycle.
    let mut state = vec![0u8; n]; // 0 new, 1 on the path, 2 finished
    let mut path: Vec<usize> = Vec::new();
    fn visit(
        i: usize,
        referenced_by: &[Vec<usize>],
        live: &dyn Fn(usize) -> bool,
        state: &mut [u8],
        path: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        state[i] = 1;
        path.push(i);
        for &child in &referenced_by[i] {
            if !live(child) {
                continue;
            }
            if state[child] == 1 {
                let at = path.iter().position(|&p| p == child).expect("on the path");
                return Some(path[at..].to_vec());
            }
            if state[child] == 0 {
                if let Some(c) = visit(child, referenced_by, live, state, path) {
                    return Some(c);
                }
            }
        }
        path.pop();
        state[i] = 2;
        None
    }
    for start in (0..n).filter(|&i| live(i)) {
        if state[start] == 0 {
            if let Some(cycle) = visit(start, referenced_by, &live, &mut state, &mut path) {
                // The path runs parent → referencing child; name it the
                // other way round (each entity references the next),
                // starting from the one declared first.
                let mut ring: Vec<usize> = cycle.into_iter().rev().collect();
                let first = (0..ring.len()).min_by_key(|&k| ring[k]).expect("a cycle");
                ring.rotate_left(first);
                return Some(ring.iter().map(|&i| entities[i].name.clone()).collect());
            }
        }
    }
    None
}

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

/// The columns of a table with their base type names (for checks made
/// after validation).
pub(crate) async fn column_types(
    conn: &mut PgConnection,
    table: &QualifiedName,
) -> Result<Vec<(String, String)>> {
    Ok(catalog::load_table(conn, table)
        .await?
        .map(|t| {
            t.columns
                .into_iter()
                .map(|c| (c.name, c.type_name))
                .collect()
        })
        .unwrap_or_default())
}

/// Validates the model (configuration, server, Cohort's tables, every
/// entity and rule) against the database behind `conn`. Nothing is
/// written. Returns every problem at once. A handle runs this and the
/// checks of [`handle()`]: `Cohort::ready` is the public way in.
pub(crate) async fn validate(
    conn: &mut PgConnection,
    config: &CohortConfig,
    declarations: &[EntityDeclaration],
    rules: &dyn RuleProvider,
) -> Result<ValidatedModel> {
    let mut problems: Vec<Problem> = Vec::new();
    if let Err(Error::Config(config_problems)) = config.validate() {
        problems.extend(config_problems.prefixed("configuration").0);
    }
    let server = check_server_and_schema(conn, config, &mut problems).await?;
    let Declared {
        entities,
        tables,
        exempt,
        exempt_tables,
        capabilities,
    } = resolve_declarations(conn, config, declarations, rules, &mut problems).await?;
    problems.extend(
        check_across_entities(conn, &entities, &tables, &capabilities, &exempt_tables).await?,
    );
    problems.extend(vacuum_after_problems(conn, config, &entities, &tables, &capabilities).await?);
    problems.extend(pacing::entity_problems(&entities));
    let (lag_problems, lag_warnings) = pacing::replica_lag_checks(conn, config, &entities).await?;
    problems.extend(lag_problems);
    let tenant_key = tenant_identity(&entities, &tables, rules, &mut problems);

    // The hash key is a secret only what changes rows needs: sweeps and
    // erasures refuse to start without it (`hash_key_missing`), and so do
    // the worker and `cohort validate` (the grants check for runs). A
    // read-only process (the console, history, holds, the report) works
    // without it.
    let unkeyed: Vec<String> = if config.hash_key.is_none() {
        entities
            .iter()
            .filter(|e| uses_hash(e))
            .map(|e| e.name.clone())
            .collect()
    } else {
        Vec::new()
    };

    let may_purge = |e: &EntityDescriptor| {
        capabilities
            .get(&e.id)
            .is_some_and(|c: &CategoryCapabilities| c.iter().any(|s| s.deletes()))
    };
    let order = match dependency_order(&entities, &tables, may_purge) {
        Ok(order) => order,
        Err(cycle) => {
            let mut ring = cycle.clone();
            ring.push(cycle[0].clone());
            problems.push(Problem::global(format!(
                "the foreign keys of entities that may purge form a cycle ({}): no order deletes every row's referencing rows first; break the cycle (drop or defer one foreign key), or give one of them a category that never purges",
                ring.join(" references ")
            )));
            Vec::new()
        }
    };
    if !problems.is_empty() {
        return Err(Error::Validation(Problems(problems)));
    }
    let mut warnings = advice(config, &entities, &tables, &capabilities, &unkeyed);
    warnings.extend(unmentioned_tables(conn, config, &entities, &exempt_tables).await?);
    warnings.extend(lag_warnings);
    if config.cdc_marker {
        let level = catalog::current_setting(conn, "wal_level").await?;
        if level != "logical" {
            warnings.push(format!(
                "cdc_marker is on, but wal_level is {level}: the markers are written, and no logical decoding consumer can read them until wal_level = logical (a server restart)"
            ));
        }
    }
    let kept_by = kept_by_references(&entities, &tables, &exempt_tables, may_purge, &mut warnings);
    let facts = table_facts(&entities, &tables, kept_by);
    Ok(ValidatedModel {
        tenant_key,
        order,
        facts,
        entities,
        exempt,
        capabilities,
        warnings,
        server_version_num: server.version_num,
    })
}

/// The server and Cohort's own tables: an unsupported server ends
/// validation at once (nothing else can be trusted there); problems with
/// Cohort's tables and the hold stamp trigger are added to `problems`.
async fn check_server_and_schema(
    conn: &mut PgConnection,
    config: &CohortConfig,
    problems: &mut Vec<Problem>,
) -> Result<catalog::ServerInfo> {
    let server = catalog::server_info(conn).await.map_err(|e| {
        Error::Validation(Problems(vec![Problem::global(format!(
            "could not read the server version ({e}); Cohort needs PostgreSQL 13 or newer"
        ))]))
    })?;
    let server_problems = checks::check_server(&server);
    if !server_problems.is_empty() {
        // Nothing else can be trusted on an unsupported server.
        problems.extend(server_problems);
        return Err(Error::Validation(Problems(std::mem::take(problems))));
    }

    let mut cohort_tables = Vec::new();
    for table in CohortTable::ALL {
        cohort_tables.push((
            table,
            catalog::load_table(conn, &table.qualified(&config.schema)).await?,
        ));
    }
    let schema_problems = checks::check_cohort_schema(&config.schema, &cohort_tables);
    if schema_problems.is_empty() {
        let trigger = catalog::hold_trigger(conn, &config.schema, "retention_hold_stamp").await?;
        problems.extend(checks::check_hold_stamp_trigger(
            &config.schema,
            trigger.as_ref(),
        ));
        let row = catalog::hold_trigger(conn, &config.schema, "retention_hold_reach").await?;
        let truncate =
            catalog::hold_trigger(conn, &config.schema, "retention_hold_reach_truncate").await?;
        problems.extend(checks::check_hold_reach_triggers(
            &config.schema,
            row.as_ref(),
            truncate.as_ref(),
        ));
    }
    problems.extend(schema_problems);

    Ok(server)
}

/// The declarations, resolved against their tables.
struct Declared {
    entities: Vec<EntityDescriptor>,
    /// Each retained entity's table, in `entities`' order.
    tables: Vec<catalog::TableInfo>,
    exempt: Vec<crate::domain::model::ExemptEntity>,
    /// The tables of exempt declarations, by display name.
    exempt_tables: Vec<(String, QualifiedName)>,
    capabilities: BTreeMap<uuid::Uuid, CategoryCapabilities>,
}

/// Resolves every declaration (ids unique, exempt ones documented,
/// retained ones checked against their table), adding what is wrong to
/// `problems`.
async fn resolve_declarations(
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
        checks::check_entity(descriptor, table, caps, tenant_candidates, &known)
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

/// What the entities set off together: checks across them, archive
/// pairs, and everything a purge would set off through foreign keys.
async fn check_across_entities(
    conn: &mut PgConnection,
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
    exempt_tables: &[(String, QualifiedName)],
) -> Result<Vec<Problem>> {
    let mut problems = Vec::new();
    let joined: Vec<_> = entities
        .iter()
        .zip(tables)
        .map(|(e, t)| (e, t, capabilities.get(&e.id)))
        .collect();
    problems.extend(checks::check_across(&joined));
    problems.extend(archive::check_pairs(entities));

    // Everything a purge would set off through foreign keys, to the end.
    let mut purgeable = Vec::new();
    for (e, t, caps) in &joined {
        if caps.is_some_and(|c| c.iter().any(|s| s.deletes())) {
            purgeable.push((*e, catalog::cascade_edges(conn, t.oid).await?));
        }
    }
    let kept_tables: Vec<(&str, &QualifiedName)> = entities
        .iter()
        .map(|e| (e.name.as_str(), &e.table))
        .chain(exempt_tables.iter().map(|(n, t)| (n.as_str(), t)))
        .collect();
    problems.extend(checks::check_cascades(&purgeable, &kept_tables));

    Ok(problems)
}

/// One tenant identity: every tenant column gives a spelling one meaning,
/// and every tenant a rule names is a valid id of it. Returns the tenant
/// key type (`None`: no entity has a tenant).
fn tenant_identity(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    rules: &dyn RuleProvider,
    problems: &mut Vec<Problem>,
) -> Option<KeyType> {
    let tenant_types: Vec<(&str, KeyType, &str)> = entities
        .iter()
        .zip(tables)
        .filter_map(|(e, t)| {
            let col = t.column(e.tenant.as_deref()?)?;
            Some((
                e.name.as_str(),
                KeyType::from_type_name(&col.type_name)?,
                col.display_type.as_str(),
            ))
        })
        .collect();
    let tenant_key = tenant_types.first().map(|(_, k, _)| *k);
    if tenant_types
        .iter()
        .any(|(_, k, _)| !k.same_identity(tenant_key.expect("non-empty")))
    {
        problems.push(Problem::global(format!(
            "tenant columns disagree on type ({}), so one tenant id could mean different tenants in different tables; give every tenant column the same type",
            tenant_types
                .iter()
                .map(|(n, _, d)| format!("{n}: {d}"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    if let Some(key) = tenant_key {
        for (category, tenant) in rules.named_tenants() {
            if key.canonical_text(&tenant).is_none() {
                problems.push(Problem::global(format!(
                    "category {category:?} has an override for tenant {tenant:?}, which is not a valid {} tenant id; it would never match",
                    tenant_types[0].2
                )));
            }
        }
    }

    tenant_key
}

/// The advice of a valid model: settings without effect, a missing hash
/// key, and the indexes sweeps need.
fn advice(
    config: &CohortConfig,
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
    unkeyed: &[String],
) -> Vec<String> {
    let mut warnings = settings_advice(config, entities, unkeyed);
    warnings.extend(anchor_index_advice(entities, tables, capabilities));
    warnings.extend(
        entities
            .iter()
            .zip(tables)
            .flat_map(|(e, t)| checks::subject_index_advice(e, t)),
    );
    // A stage measured from a marker finds its rows by that marker.
    warnings.extend(marker_index_advice(entities, tables, capabilities));
    // Soft deletes and anonymisations leave their rows where sweeps look:
    // by the anchor, or by the marker of the stage they follow.
    warnings.extend(done_rows_advice(entities, tables, capabilities));
    warnings
}

/// Tables with a `timestamptz` column, in the schemas the policy's tables
/// live in, that no entity names (retained, exempt, or an archive's copy)
/// and `ignore_tables` does not hold: a table added after the policy was
/// written holds rows nobody decided about. Also the `ignore_tables`
/// entries that silence nothing.
async fn unmentioned_tables(
    conn: &mut PgConnection,
    config: &CohortConfig,
    entities: &[EntityDescriptor],
    exempt_tables: &[(String, QualifiedName)],
) -> Result<Vec<String>> {
    let mentioned: std::collections::BTreeSet<QualifiedName> = entities
        .iter()
        .flat_map(|e| {
            std::iter::once(e.table.clone()).chain(e.archive.as_ref().map(|a| a.table.clone()))
        })
        .chain(exempt_tables.iter().map(|(_, t)| t.clone()))
        .collect();
    let schemas: std::collections::BTreeSet<String> =
        mentioned.iter().map(|t| t.schema.clone()).collect();
    if schemas.is_empty() {
        return Ok(Vec::new());
    }
    let found = catalog::timestamped_tables(conn, schemas.into_iter().collect()).await?;
    Ok(checks::unmentioned_advice(config, &mentioned, &found))
}

/// `vacuum_after` on a table the role does not own would do nothing
/// (PostgreSQL skips it with a warning): refused for each entity that
/// changes rows, naming the relations and their owners.
async fn vacuum_after_problems(
    conn: &mut PgConnection,
    config: &CohortConfig,
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
) -> Result<Vec<Problem>> {
    let mut problems = Vec::new();
    if config.vacuum_after == crate::config::VacuumAfter::Off {
        return Ok(problems);
    }
    for (e, t) in entities.iter().zip(tables) {
        let mutates = capabilities
            .get(&e.id)
            .is_some_and(|c| c.iter().any(|s| s.mutates()));
        if !mutates {
            continue;
        }
        let not_owned = catalog::not_owned(conn, t.oid).await?;
        if not_owned.is_empty() {
            continue;
        }
        let list: Vec<String> = not_owned
            .iter()
            .map(|(table, owner)| format!("{} (owner {owner:?})", table.display_plain()))
            .collect();
        problems.push(Problem::entity(
            &e.name,
            format!(
                "vacuum_after = {:?} needs the owner's rights on the table, and the current role is not a member of the owner of {}; PostgreSQL would skip it with a warning. Run Cohort as (a member of) that owner, or set vacuum_after = \"off\"",
                config.vacuum_after.as_str(),
                list.join(", ")
            ),
        ));
    }
    Ok(problems)
}

/// Settings without effect, and hash anonymisation without a hash key.
fn settings_advice(
    config: &CohortConfig,
    entities: &[EntityDescriptor],
    unkeyed: &[String],
) -> Vec<String> {
    let mut warnings: Vec<String> = config.settings_without_effect();
    if !unkeyed.is_empty() {
        warnings.push(format!(
            "{} anonymise with `hash`, and no hash key is set (COHORT_HASH_KEY or [cohort] hash_key): this process can read, but its sweeps and erasures are refused",
            unkeyed.join(", ")
        ));
    }
    if config.partition_lock_timeout != CohortConfig::default().partition_lock_timeout
        && !entities
            .iter()
            .any(|e| e.partitions == crate::domain::model::Partitions::Drop)
    {
        warnings.push(
            "partition_lock_timeout is set, but no entity has partitions = \"drop\": it has no effect"
                .into(),
        );
    }
    warnings
}

/// The anchor indexes of the entities whose category changes rows.
fn anchor_index_advice(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
) -> Vec<String> {
    entities
        .iter()
        .zip(tables)
        .filter_map(|(e, t)| {
            let c = capabilities.get(&e.id)?;
            if !c.iter().any(|s| s.mutates()) {
                return None;
            }
            let reads: Vec<_> = c.anchor_reads().collect();
            checks::index_advice(e, t, &reads)
        })
        .collect()
}

/// The indexes the stages measured from a marker need.
fn marker_index_advice(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    for (e, t) in entities.iter().zip(tables) {
        // Each marker, with the strategies of the stages that read by it.
        let mut markers: BTreeMap<&str, Vec<crate::domain::rules::Strategy>> = BTreeMap::new();
        for (stage, previous) in capabilities
            .get(&e.id)
            .into_iter()
            .flat_map(|c| c.marker_stages())
        {
            if let Some(marker) = previous.marker().and_then(|m| e.marker(m)) {
                markers.entry(marker).or_default().push(stage);
            }
        }
        for (marker, reads) in markers {
            let mut staged = e.clone();
            staged.anchor = marker.to_owned();
            warnings.extend(checks::index_advice(&staged, t, &reads));
        }
    }
    warnings
}

/// The indexes that let sweeps pass over rows already soft-deleted or anonymised.
fn done_rows_advice(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    for (e, t) in entities.iter().zip(tables) {
        let Some(c) = capabilities.get(&e.id) else {
            continue;
        };
        let mut advised = std::collections::BTreeSet::new();
        let from_markers: Vec<(crate::domain::rules::Strategy, &str)> = c
            .marker_stages()
            .filter_map(|(stage, previous)| Some((stage, e.marker(previous.marker()?)?)))
            .collect();
        let by_anchor = c
            .iter()
            .filter(|s| !from_markers.iter().any(|(m, _)| m == s))
            .map(|s| (s, e.anchor.as_str()));
        for (strategy, anchor) in by_anchor.chain(from_markers.iter().copied()) {
            if let Some(advice) = checks::done_rows_index_advice(e, t, strategy, anchor) {
                if advised.insert(advice.clone()) {
                    warnings.push(advice);
                }
            }
        }
    }
    warnings
}

/// Rows referenced from tables Cohort never empties are kept for good:
/// the advice naming each such key (added to `warnings`), and by entity
/// the referencing tables a run's note names.
fn kept_by_references(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    exempt_tables: &[(String, QualifiedName)],
    may_purge: impl Fn(&EntityDescriptor) -> bool,
    warnings: &mut Vec<String>,
) -> BTreeMap<uuid::Uuid, Vec<String>> {
    let retained: Vec<(&str, &QualifiedName, bool)> = entities
        .iter()
        .map(|e| (e.name.as_str(), &e.table, may_purge(e)))
        .collect();
    let exempt_named: Vec<(&str, &QualifiedName)> =
        exempt_tables.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut kept_by: BTreeMap<uuid::Uuid, Vec<String>> = BTreeMap::new();
    for (e, t) in entities.iter().zip(tables) {
        if !may_purge(e) {
            continue;
        }
        let found =
            checks::references_kept_for_good(e, &t.blocking_references(), &retained, &exempt_named);
        warnings.extend(found.warnings);
        kept_by.insert(e.id, found.tables);
    }
    kept_by
}

/// What the plans and runs need to know of each entity's table.
fn table_facts(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    mut kept_by: BTreeMap<uuid::Uuid, Vec<String>>,
) -> BTreeMap<uuid::Uuid, TableFacts> {
    entities
        .iter()
        .zip(tables)
        .map(|(e, t)| {
            let key = |c: &str| {
                t.column(c)
                    .and_then(|c| KeyType::from_type_name(&c.type_name))
            };
            // A composite key travels as its JSON text (see `sql::record_key`).
            let composite = e.has_composite_key();
            let facts = TableFacts {
                record: if composite {
                    KeyType::Text
                } else {
                    key(&e.record_id).expect("validated key type")
                },
                tenant: e
                    .tenant
                    .as_deref()
                    .map(|c| key(c).expect("validated tenant type")),
                subjects: e
                    .subjects
                    .iter()
                    .map(|s| {
                        (
                            s.column.clone(),
                            key(&s.column).expect("validated subject type"),
                        )
                    })
                    .collect(),
                blocking_references: t.blocking_references(),
                kept_by_references: kept_by.remove(&e.id).unwrap_or_default(),
                tenant_literals: e
                    .anonymise
                    .iter()
                    .filter_map(|a| {
                        let crate::domain::model::AnonymiseMethod::Literal(template) = &a.method
                        else {
                            return None;
                        };
                        let col = t.column(&a.column)?;
                        Some(TenantLiteral {
                            column: col.name.clone(),
                            display_type: col.display_type.clone(),
                            max_chars: usize::try_from(col.max_chars?).ok()?,
                            template: template.clone(),
                        })
                        .filter(|_| template.contains("{tenant}"))
                    })
                    .collect(),
                casts: Casts {
                    columns: t
                        .columns
                        .iter()
                        .filter(|c| KeyType::from_type_name(&c.type_name) == Some(KeyType::CiText))
                        .map(|c| (c.name.clone(), c.qualified_type()))
                        .collect(),
                    key: if composite {
                        e.record_key
                            .iter()
                            .map(|c| {
                                let col = t.column(c).expect("validated key column");
                                crate::sql::KeyPart {
                                    column: c.clone(),
                                    ty: crate::domain::model::PartType::from_type_name(
                                        &col.type_name,
                                    )
                                    .expect("validated key type"),
                                    sql_type: col.qualified_type(),
                                }
                            })
                            .collect()
                    } else {
                        Vec::new()
                    },
                },
                plain: t.relkind == "r",
            };
            (e.id, facts)
        })
        .collect()
}

/// Whether an entity anonymises a column with the keyed `hash` method.
pub(crate) fn uses_hash(e: &EntityDescriptor) -> bool {
    e.anonymise
        .iter()
        .any(|a| a.method == crate::domain::model::AnonymiseMethod::Hash)
}

/// The refusal of a run that would change rows of entities using `hash`
/// without the key (`None` when it has the key, or needs none). Checked
/// before anything is written.
pub(crate) fn hash_key_missing<'a>(
    config: &CohortConfig,
    entities: impl IntoIterator<Item = &'a EntityDescriptor>,
) -> Option<crate::error::Error> {
    if config.hash_key.is_some() {
        return None;
    }
    let names: Vec<&str> = entities
        .into_iter()
        .filter(|e| uses_hash(e))
        .map(|e| e.name.as_str())
        .collect();
    (!names.is_empty()).then(|| {
        crate::error::Error::Config(crate::error::Problems::one(format!(
            "{} anonymise with `hash`, which needs the secret key (COHORT_HASH_KEY or [cohort] hash_key, at least 16 bytes): \
             an unkeyed hash of an e-mail address or phone number is reversed by a dictionary; nothing was changed",
            names.join(", ")
        )))
    })
}
