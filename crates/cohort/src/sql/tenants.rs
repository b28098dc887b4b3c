//! The rows of a `tenants_query` (the user's own statement, run read-only
//! by `run::passes`): decoded here, by position and type.

use sqlx::Row;

use crate::domain::tenants::TenantEntry;
use crate::error::{Error, Result};

/// One row of a tenants query: the id in the tenant column's own type or
/// text, then an optional text jurisdiction, then optional tags (`text[]`
/// or comma-separated text). `Err(Error)` when the query's shape is wrong
/// (every row would be); `Ok(Err(reason))` when only this row cannot be a
/// tenant.
pub(crate) fn tenant_row(
    row: &sqlx::postgres::PgRow,
) -> Result<std::result::Result<TenantEntry, String>> {
    use sqlx::{Column, TypeInfo, ValueRef};
    let columns = row.len();
    if !(1..=3).contains(&columns) {
        return Err(Error::InvalidInput(format!(
            "tenants_query must return one to three columns (tenant id, then jurisdiction, then tags), not {columns}"
        )));
    }
    let type_of = |i: usize| row.columns()[i].type_info().name().to_ascii_lowercase();
    if row.try_get_raw(0).is_ok_and(|v| v.is_null()) {
        return Ok(Err("its tenant id is NULL".into()));
    }
    let Ok(id) = row
        .try_get::<String, _>(0)
        .or_else(|_| row.try_get::<uuid::Uuid, _>(0).map(|u| u.to_string()))
        .or_else(|_| row.try_get::<i64, _>(0).map(|n| n.to_string()))
        .or_else(|_| row.try_get::<i32, _>(0).map(|n| n.to_string()))
        .or_else(|_| row.try_get::<i16, _>(0).map(|n| n.to_string()))
    else {
        return Ok(Err(format!(
            "its tenant id is of type {}; expected uuid, an integer or text",
            type_of(0)
        )));
    };
    let mut entry = TenantEntry::new(id);
    if columns >= 2 {
        match row.try_get::<Option<String>, _>(1) {
            Ok(j) => entry.jurisdiction = j,
            Err(_) => {
                return Ok(Err(format!(
                    "its jurisdiction (the second column) is of type {}; expected text",
                    type_of(1)
                )))
            }
        }
    }
    if columns == 3 {
        let tags = row
            .try_get::<Option<Vec<Option<String>>>, _>(2)
            .map(|list| {
                list.unwrap_or_default()
                    .into_iter()
                    .flatten()
                    .collect::<Vec<String>>()
            })
            .or_else(|_| {
                row.try_get::<Option<String>, _>(2).map(|text| {
                    text.map(|t| t.split(',').map(str::to_owned).collect())
                        .unwrap_or_default()
                })
            });
        match tags {
            Ok(tags) => entry.tags = tags,
            Err(_) => {
                return Ok(Err(format!(
                    "its tags (the third column) are of type {}; expected text[] or comma-separated text",
                    type_of(2)
                )))
            }
        }
    }
    Ok(Ok(entry))
}
