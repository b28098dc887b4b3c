//! The [`Symbol`]s: names of the derive's attributes and of the keys
//! inside them, and the key lists that messages offer as alternatives.

use std::fmt;

/// The name of an attribute or of a key inside one.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct Symbol(&'static str);

impl Symbol {
    /// The name as written.
    pub(super) fn as_str(self) -> &'static str {
        self.0
    }
}

impl PartialEq<Symbol> for syn::Ident {
    fn eq(&self, word: &Symbol) -> bool {
        self == word.0
    }
}

impl PartialEq<Symbol> for syn::Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// `#[retain(...)]`, on the struct and on fields.
pub(super) const RETAIN: Symbol = Symbol("retain");
/// `#[anonymise(...)]`, on fields.
pub(super) const ANONYMISE: Symbol = Symbol("anonymise");
/// `#[erasure_subject]` / `#[erasure_subject(kind = "...")]`, on fields.
pub(super) const ERASURE_SUBJECT: Symbol = Symbol("erasure_subject");
/// `#[exempt_from_retention("reason")]`, on the struct.
pub(super) const EXEMPT_FROM_RETENTION: Symbol = Symbol("exempt_from_retention");
/// sqlx's attribute (read leniently).
pub(super) const SQLX: Symbol = Symbol("sqlx");
/// SeaORM's attribute (read leniently).
pub(super) const SEA_ORM: Symbol = Symbol("sea_orm");
/// Diesel's attribute (read leniently).
pub(super) const DIESEL: Symbol = Symbol("diesel");

/// Struct key: the retention category.
pub(super) const CATEGORY: Symbol = Symbol("category");
/// Struct key: the anchor field.
pub(super) const ANCHOR: Symbol = Symbol("anchor");
/// Struct key: the durable UUID.
pub(super) const ID: Symbol = Symbol("id");
/// Struct key: the table (`schema.table` or `table`).
pub(super) const TABLE: Symbol = Symbol("table");
/// Struct key: the schema.
pub(super) const SCHEMA: Symbol = Symbol("schema");
/// Struct key: the display name.
pub(super) const NAME: Symbol = Symbol("name");
/// Struct flag: no tenant column.
pub(super) const TENANTLESS: Symbol = Symbol("tenantless");
/// Struct key: `partitions = "drop"` (opt-in partition purge).
pub(super) const PARTITIONS: Symbol = Symbol("partitions");
/// Connections one sweep of the entity uses at once.
pub(super) const SWEEP_PARALLELISM: Symbol = Symbol("sweep_parallelism");
/// Struct key: the entity's own audit detail (`summary` or `per_row`).
pub(super) const AUDIT: Symbol = Symbol("audit");
/// Struct key: the archive table of the `archive` strategy.
pub(super) const ARCHIVE: Symbol = Symbol("archive");
/// Struct flag: the anonymise methods apply to the archived copy.
pub(super) const ANONYMISE_ON_ARCHIVE: Symbol = Symbol("anonymise_on_archive");
/// Field flag: the column is left out of the archived copy.
pub(super) const NOT_ARCHIVED: Symbol = Symbol("not_archived");
pub(super) const NOT_TENANT: Symbol = Symbol("not_tenant");

/// Field key: explicit column name.
pub(super) const COLUMN: Symbol = Symbol("column");
/// Field marker: the record key.
pub(super) const RECORD_ID: Symbol = Symbol("record_id");
/// Field marker: the tenant column.
pub(super) const TENANT: Symbol = Symbol("tenant");
/// Field marker: the soft-delete flag.
pub(super) const SOFT_DELETE: Symbol = Symbol("soft_delete");
/// Field marker: when the row was soft-deleted.
pub(super) const DELETED_AT: Symbol = Symbol("deleted_at");
/// Field marker: when the row was anonymised.
pub(super) const ANONYMISED_AT: Symbol = Symbol("anonymised_at");

/// Anonymise method: set to NULL.
pub(super) const NULL: Symbol = Symbol("null");
/// Anonymise method: set to the empty string.
pub(super) const EMPTY: Symbol = Symbol("empty");
/// Anonymise method: set to a fixed text.
pub(super) const LITERAL: Symbol = Symbol("literal");
/// Anonymise method: one-way hash.
pub(super) const HASH: Symbol = Symbol("hash");
/// Anonymise method: a Rust function.
pub(super) const WITH: Symbol = Symbol("with");

/// Erasure-subject key: the subject kind.
pub(super) const KIND: Symbol = Symbol("kind");

/// The keys of the struct-level `#[retain(...)]`.
pub(super) const CONTAINER_KEYS: &[Symbol] = &[
    CATEGORY,
    ANCHOR,
    ID,
    TABLE,
    SCHEMA,
    NAME,
    TENANTLESS,
    PARTITIONS,
    SWEEP_PARALLELISM,
    AUDIT,
    ARCHIVE,
    ANONYMISE_ON_ARCHIVE,
];
/// The keys of a field-level `#[retain(...)]`.
pub(super) const FIELD_KEYS: &[Symbol] = &[
    COLUMN,
    RECORD_ID,
    TENANT,
    SOFT_DELETE,
    DELETED_AT,
    ANONYMISED_AT,
    NOT_ARCHIVED,
    NOT_TENANT,
];
/// The methods of `#[anonymise(...)]`.
pub(super) const ANONYMISE_METHODS: &[Symbol] = &[NULL, EMPTY, LITERAL, HASH, WITH];
/// The keys of `#[erasure_subject(...)]`.
pub(super) const SUBJECT_KEYS: &[Symbol] = &[KIND];

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/derive.md`'s reference table lists exactly the keys the derive
    /// accepts, attribute by attribute.
    #[test]
    fn the_guides_table_lists_every_attribute_key() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/derive.md");
        let text = std::fs::read_to_string(path).expect("docs/derive.md");
        let table = text
            .split_once("## Reference: every attribute")
            .expect("the reference section")
            .1;
        let mut rows: Vec<(String, String, String)> = Vec::new();
        for line in table.lines().filter(|l| l.starts_with("| `#[")) {
            let cells: Vec<&str> = line.split('|').skip(1).map(str::trim).collect();
            let attribute = cells[0].trim_matches('`');
            let name = attribute
                .trim_start_matches("#[")
                .split('(')
                .next()
                .unwrap_or_default()
                .to_owned();
            rows.push((
                name,
                cells[1].trim_matches('`').to_owned(),
                cells[2].to_owned(),
            ));
        }
        let listed = |attribute: Symbol, on: &str| -> Vec<String> {
            let mut keys: Vec<String> = rows
                .iter()
                .filter(|(a, _, o)| a == attribute.as_str() && o == on)
                .map(|(_, k, _)| k.clone())
                .collect();
            keys.sort();
            keys
        };
        let known = |keys: &[Symbol]| -> Vec<String> {
            let mut keys: Vec<String> = keys.iter().map(|k| k.as_str().to_owned()).collect();
            keys.sort();
            keys
        };
        assert_eq!(
            listed(RETAIN, "struct"),
            known(CONTAINER_KEYS),
            "struct #[retain]"
        );
        assert_eq!(
            listed(RETAIN, "field"),
            known(FIELD_KEYS),
            "field #[retain]"
        );
        assert_eq!(
            listed(ANONYMISE, "field"),
            known(ANONYMISE_METHODS),
            "#[anonymise]"
        );
        assert_eq!(
            listed(ERASURE_SUBJECT, "field"),
            known(SUBJECT_KEYS),
            "#[erasure_subject]"
        );
        assert_eq!(listed(EXEMPT_FROM_RETENTION, "struct"), [String::new()]);
        let attributes: std::collections::BTreeSet<&str> =
            rows.iter().map(|(a, _, _)| a.as_str()).collect();
        let expected: std::collections::BTreeSet<&str> =
            [RETAIN, ANONYMISE, ERASURE_SUBJECT, EXEMPT_FROM_RETENTION]
                .iter()
                .map(|s| s.as_str())
                .collect();
        assert_eq!(attributes, expected);
    }
}
