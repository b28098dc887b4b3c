//! Binding and decoding typed keys (the values themselves are
//! `model::key`): record ids, tenants and subjects are bound as parameters
//! of their column's own type, so indexes on those columns are used and no
//! text is cast in SQL.

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row};

use crate::base::ident::QualifiedName;
pub(crate) use crate::domain::model::{KeyType, KeyValue};

/// A foreign key of another table (or this one) referencing this table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IncomingKey {
    pub(crate) name: String,
    /// `pg_constraint.confdeltype`: `a` NO ACTION, `r` RESTRICT, `c` CASCADE, …
    pub(crate) on_delete: String,
    pub(crate) child: QualifiedName,
    pub(crate) child_columns: Vec<String>,
    pub(crate) parent_columns: Vec<String>,
    /// Whether a valid, non-partial index of the child starts with its
    /// columns (in any order): how a purge finds the referencing rows.
    pub(crate) child_indexed: bool,
}

/// Reading a key column of a known type.
pub(crate) trait DecodeKey {
    /// Reads a column of this type from a row.
    fn decode(self, row: &PgRow, index: usize) -> Result<KeyValue, sqlx::Error>;
}

impl DecodeKey for KeyType {
    fn decode(self, row: &PgRow, index: usize) -> Result<KeyValue, sqlx::Error> {
        Ok(match self {
            KeyType::Uuid => KeyValue::Uuid(row.try_get(index)?),
            KeyType::Int2 => KeyValue::Int2(row.try_get(index)?),
            KeyType::Int4 => KeyValue::Int4(row.try_get(index)?),
            KeyType::Int8 => KeyValue::Int8(row.try_get(index)?),
            KeyType::Text | KeyType::CiText => KeyValue::Text(row.try_get(index)?),
        })
    }
}

/// Binding a key as a parameter of its own type.
pub(crate) trait BindKey {
    /// Binds the value as the next parameter of `q`.
    fn bind<'q>(&self, q: Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments>;
}

impl BindKey for KeyValue {
    fn bind<'q>(&self, q: Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> {
        match self.clone() {
            KeyValue::Uuid(v) => q.bind(v),
            KeyValue::Int2(v) => q.bind(v),
            KeyValue::Int4(v) => q.bind(v),
            KeyValue::Int8(v) => q.bind(v),
            KeyValue::Text(v) => q.bind(v),
        }
    }
}

/// An entity's active holds as values its statements bind as arrays, so
/// they find held rows through the key and subject indexes instead of
/// reading every row: the record holds' keys, then, per subject column (in
/// declaration order), the subject holds that can apply to it, in the
/// column's type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BoundHolds {
    pub(crate) records: Vec<KeyValue>,
    pub(crate) subjects: Vec<(KeyType, Vec<KeyValue>)>,
}

impl BoundHolds {
    /// No hold applies.
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty() && self.subjects.iter().all(|(_, v)| v.is_empty())
    }

    /// How many values are bound.
    pub(crate) fn len(&self) -> usize {
        self.records.len() + self.subjects.iter().map(|(_, v)| v.len()).sum::<usize>()
    }

    /// Binds the record keys, then one array per subject column.
    pub(crate) fn bind<'q>(
        &self,
        q: Query<'q, Postgres, PgArguments>,
        record: KeyType,
    ) -> Query<'q, Postgres, PgArguments> {
        let mut q = bind_array(q, record, &self.records);
        for (ty, values) in &self.subjects {
            q = bind_array(q, *ty, values);
        }
        q
    }
}

/// Binds a homogeneous list of keys as one array parameter.
pub(crate) fn bind_array<'q>(
    q: Query<'q, Postgres, PgArguments>,
    key_type: KeyType,
    keys: &[KeyValue],
) -> Query<'q, Postgres, PgArguments> {
    macro_rules! collect {
        ($variant:ident) => {
            keys.iter()
                .filter_map(|k| match k {
                    KeyValue::$variant(v) => Some(v.clone()),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
    }
    match key_type {
        KeyType::Uuid => q.bind(collect!(Uuid)),
        KeyType::Int2 => q.bind(collect!(Int2)),
        KeyType::Int4 => q.bind(collect!(Int4)),
        KeyType::Int8 => q.bind(collect!(Int8)),
        KeyType::Text | KeyType::CiText => q.bind(collect!(Text)),
    }
}
