//! What a request names (an entity id, a record id, a tenant), checked
//! against the validated model the same way for every request: holds,
//! guarded deletion and the hold check.

use super::{TableFacts, ValidatedModel};
use crate::error::{Error, Result};
use crate::model::EntityDescriptor;

impl ValidatedModel {
    /// The entity a request names by id: `NotFound` when none is
    /// registered with it (the same error for every request).
    pub(crate) fn requested_entity(&self, id: uuid::Uuid) -> Result<&EntityDescriptor> {
        self.entity(id).ok_or_else(|| {
            Error::NotFound(format!(
                "{id} is not the id of a registered retained entity"
            ))
        })
    }
}

impl TableFacts {
    /// A record id a request names, in the key column's type (refused,
    /// naming `entity`, when it cannot be one).
    pub(crate) fn record_key(&self, entity: &str, raw: &str) -> Result<crate::sql::KeyValue> {
        self.record
            .parse(raw)
            .map_err(|msg| Error::InvalidInput(format!("record id for {entity}: {msg}")))
    }

    /// The tenant a request names, canonical in the tenant column's type:
    /// a tenant-scoped entity needs one, a tenantless entity takes none.
    pub(crate) fn request_tenant(&self, entity: &str, raw: Option<&str>) -> Result<Option<String>> {
        match (self.tenant, raw) {
            (Some(ty), Some(t)) => Ok(Some(
                ty.parse(t)
                    .map_err(|msg| Error::InvalidInput(format!("tenant for {entity}: {msg}")))?
                    .canonical(),
            )),
            (Some(_), None) => Err(Error::InvalidInput(format!(
                "{entity} is tenant-scoped: the request needs the row's tenant; give the tenant of its rows"
            ))),
            (None, Some(_)) => Err(Error::InvalidInput(format!(
                "{entity} is tenantless: the request must not name a tenant; do not give a tenant for its rows"
            ))),
            (None, None) => Ok(None),
        }
    }
}
