//! What opt-in partition purge (`partitions = "drop"`) needs from the
//! table, read from the catalog and checked at start-up: every problem is
//! named with what to change, so a run never finds out half-way.

use crate::sql::catalog as statements;
use sqlx::postgres::types::Oid;
use sqlx::PgConnection;

use super::catalog::TableInfo;
use crate::base::ident::QualifiedName;
use crate::domain::model::EntityDescriptor;
use crate::domain::rules::{CategoryCapabilities, Strategy};

/// The partitioning of a table, as partition purge sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Partitioning {
    /// `pg_partitioned_table.partstrat`: `r` range, `l` list, `h` hash.
    pub(crate) strategy: String,
    /// The partition key's columns (an expression shows as an empty name).
    pub(crate) key: Vec<String>,
    /// Tables of the partition tree (the parent included) that the
    /// current role cannot detach or drop: (table, owner).
    pub(crate) not_owned: Vec<(QualifiedName, String)>,
    /// Foreign keys referencing the table or any of its partitions:
    /// (constraint, referencing table, referenced table).
    pub(crate) referenced_by: Vec<(String, QualifiedName, QualifiedName)>,
}

/// Reads the partitioning of the table `oid`; `None` when it is not a
/// partitioned table.
pub(crate) async fn load(
    conn: &mut PgConnection,
    oid: u32,
) -> Result<Option<Partitioning>, sqlx::Error> {
    let oid = Oid(oid);
    let Some(row) = statements::partitioning(oid)
        .query_as::<statements::PartitioningRow>()
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let not_owned = statements::partitions_not_owned(oid)
        .query_as::<statements::OwnerRow>()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    let referenced_by = statements::partition_tree_referenced_by(oid)
        .query_as::<statements::TreeKeyRow>()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(Some(Partitioning {
        strategy: row.strategy,
        key: row.key,
        not_owned,
        referenced_by,
    }))
}

/// Checks an entity that asks for partition purge. Pure.
pub(crate) fn check(
    entity: &EntityDescriptor,
    table: &TableInfo,
    partitioning: Option<&Partitioning>,
    capabilities: Option<&CategoryCapabilities>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let t = table.name.display_plain();
    let prefix = "partitions = \"drop\"";
    // A tenant column is allowed: a partition then goes only when every
    // tenant's rows in it are due (`run::partitions::tenants_due`).
    if capabilities.is_some_and(|c| !c.allows(Strategy::Purge)) {
        problems.push(format!(
            "{prefix} has no effect: category {:?} never purges (partition purge only replaces purge's row path)",
            entity.category
        ));
    }
    let Some(p) = partitioning else {
        problems.push(format!(
            "{prefix} needs a partitioned table, but {t} is not one (create it with PARTITION BY RANGE ({:?}))",
            entity.anchor
        ));
        return problems;
    };
    if p.strategy != "r" || p.key.len() != 1 || p.key[0] != entity.anchor {
        let how = match p.strategy.as_str() {
            "r" => "RANGE",
            "l" => "LIST",
            "h" => "HASH",
            _ => "an unknown strategy",
        };
        let key = p
            .key
            .iter()
            .map(|c| {
                if c.is_empty() {
                    "an expression".to_owned()
                } else {
                    format!("{c:?}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        problems.push(format!(
            "{prefix} needs {t} range-partitioned on the anchor alone (PARTITION BY RANGE ({:?})), so that a partition's upper bound says when all of its rows expire; it is partitioned by {how} ({key})",
            entity.anchor
        ));
    }
    for (name, child, parent) in &p.referenced_by {
        problems.push(format!(
            "{prefix}: foreign key {name:?} of {} references {}; a partition that rows elsewhere may reference cannot be dropped whole (drop the foreign key or use the row path)",
            child.display_plain(),
            parent.display_plain()
        ));
    }
    if !p.not_owned.is_empty() {
        let list = p
            .not_owned
            .iter()
            .map(|(table, owner)| format!("{} (owner {owner:?})", table.display_plain()))
            .collect::<Vec<_>>()
            .join(", ");
        problems.push(format!(
            "{prefix}: detaching and dropping a partition needs the owner's rights on the table and the partition, and the current role is not a member of the owner of {list}; run Cohort as (a member of) that owner, e.g. GRANT <owner> TO <cohort role>"
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::model::{EntityDeclaration, Partitions};

    fn entity(tenantless: bool) -> EntityDescriptor {
        let mut d = EntityDeclaration::new("Event", "b7316df4-7db5-46ad-aea7-f65c4b430f73")
            .category("events")
            .anchor("created_at")
            .table("app.events")
            .partitions(Partitions::Drop);
        let mut cols = vec!["id".to_string(), "created_at".to_string()];
        if tenantless {
            d = d.tenantless();
        } else {
            cols.push("tenant_id".into());
        }
        match crate::domain::model::resolve(&d, &Default::default(), "public", &cols) {
            Ok(crate::domain::model::Resolved::Retained(e)) => *e,
            other => panic!("{other:?}"),
        }
    }

    fn table() -> TableInfo {
        TableInfo {
            oid: 1,
            name: QualifiedName::new("app", "events"),
            relkind: "p".into(),
            is_partition: false,
            inherits: false,
            has_inheritance_children: false,
            comment: None,
            columns: Vec::new(),
            indexes: Vec::new(),
            foreign_keys: Vec::new(),
            referenced_by: Vec::new(),
        }
    }

    fn range_on(key: &[&str]) -> Partitioning {
        Partitioning {
            strategy: "r".into(),
            key: key.iter().map(|s| s.to_string()).collect(),
            not_owned: Vec::new(),
            referenced_by: Vec::new(),
        }
    }

    #[test]
    fn what_partition_purge_needs_table() {
        let purge = CategoryCapabilities::new([Strategy::Purge]).unwrap();
        let anonymise = CategoryCapabilities::new([Strategy::Anonymise]).unwrap();
        let good = range_on(&["created_at"]);
        let mut list = good.clone();
        list.strategy = "l".into();
        let mut foreign = good.clone();
        foreign.referenced_by.push((
            "fk".into(),
            QualifiedName::new("app", "notes"),
            QualifiedName::new("app", "events_2024_01"),
        ));
        let mut owned = good.clone();
        owned
            .not_owned
            .push((QualifiedName::new("app", "events_2024_01"), "admin".into()));
        let cases: Vec<(
            EntityDescriptor,
            Option<Partitioning>,
            &CategoryCapabilities,
            &[&str],
        )> = vec![
            (entity(true), Some(good.clone()), &purge, &[]),
            (entity(false), Some(good.clone()), &purge, &[]),
            (
                entity(true),
                Some(good.clone()),
                &anonymise,
                &["never purges"],
            ),
            (entity(true), None, &purge, &["needs a partitioned table"]),
            (
                entity(true),
                Some(list),
                &purge,
                &["it is partitioned by LIST"],
            ),
            (
                entity(true),
                Some(range_on(&["other"])),
                &purge,
                &["RANGE (\"other\")"],
            ),
            (
                entity(true),
                Some(range_on(&["created_at", "id"])),
                &purge,
                &["on the anchor alone"],
            ),
            (
                entity(true),
                Some(range_on(&[""])),
                &purge,
                &["an expression"],
            ),
            (
                entity(true),
                Some(foreign),
                &purge,
                &["foreign key \"fk\" of app.notes references app.events_2024_01"],
            ),
            (
                entity(true),
                Some(owned),
                &purge,
                &["app.events_2024_01 (owner \"admin\")"],
            ),
        ];
        for (e, p, caps, expected) in cases {
            let problems = check(&e, &table(), p.as_ref(), Some(caps));
            assert_eq!(problems.len(), expected.len(), "{problems:#?}");
            for (problem, want) in problems.iter().zip(expected) {
                assert!(problem.contains(want), "{problem:?} lacks {want:?}");
            }
        }
    }
}
