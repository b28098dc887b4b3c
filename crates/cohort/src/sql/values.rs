//! Values of the retained tables' own columns, named by the policy and
//! read by a command handler's capture: decoded here, by name and type.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::domain::handlers::{HandlerError, SnapshotValue};

/// A column's value as a snapshot value, whatever its (common) type.
pub(crate) fn snapshot_value(row: &PgRow, column: &str) -> Result<SnapshotValue, HandlerError> {
    macro_rules! try_as {
        ($($t:ty => $conv:expr),* $(,)?) => {$(
            if let Ok(v) = row.try_get::<Option<$t>, _>(column) {
                #[allow(clippy::redundant_closure_call)]
                return Ok(v.map_or(SnapshotValue::Null, $conv));
            }
        )*};
    }
    try_as!(
        String => SnapshotValue::Text,
        i64 => SnapshotValue::Int,
        i32 => |n: i32| SnapshotValue::Int(n.into()),
        i16 => |n: i16| SnapshotValue::Int(n.into()),
        bool => SnapshotValue::Bool,
        f64 => SnapshotValue::Float,
        uuid::Uuid => SnapshotValue::Uuid,
        DateTime<Utc> => SnapshotValue::Timestamp,
        NaiveDateTime => |t: NaiveDateTime| SnapshotValue::Text(t.to_string()),
        NaiveDate => |d: NaiveDate| SnapshotValue::Text(d.to_string()),
        serde_json::Value => |v: serde_json::Value| SnapshotValue::Text(v.to_string()),
    );
    Err(format!("column {column:?} has a type a command handler cannot capture").into())
}
