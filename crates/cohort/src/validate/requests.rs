//! What a request names (an entity id, a record id, a tenant, a subject
//! and its kind), checked against the validated model the same way for
//! every request: holds, guarded deletion, erasure and the hold check.

use super::{TableFacts, ValidatedModel};
use crate::domain::model::{EntityDescriptor, SubjectColumn};
use crate::error::{Error, Result};

/// Whether a request for subjects of `kind` reaches `column`: a column of
/// that kind, or one that declares no kind (it holds the subject whatever
/// its kind); every column when the request names no kind.
pub(crate) fn reaches(column: &SubjectColumn, kind: Option<&str>) -> bool {
    column.kind.is_none() || kind.is_none() || column.kind.as_deref() == kind
}

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

    /// A subject and its kind against the model, before anything runs
    /// (.NET 0.9's rules, for erasure and subject holds alike): the
    /// subject is not empty; when subject columns declare kinds, a kind is
    /// required; an unknown kind is refused; so is a subject that no column
    /// the request reaches can hold. `how` says how to name a kind (e.g.
    /// "ErasureScope::kind, `cohort erase --kind KIND`"). The subject itself
    /// is never echoed (it is personal data).
    pub(crate) fn check_subject(&self, subject: &str, kind: Option<&str>, how: &str) -> Result<()> {
        if subject.trim().is_empty() {
            return Err(Error::InvalidInput("the subject must not be empty".into()));
        }
        if kind.is_some_and(|k| k.trim().is_empty()) {
            return Err(Error::InvalidInput(
                "a subject kind must not be empty".into(),
            ));
        }
        let declared: std::collections::BTreeSet<&str> = self
            .entities
            .iter()
            .flat_map(|e| e.subjects.iter().filter_map(|s| s.kind.as_deref()))
            .collect();
        let list = || {
            declared
                .iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match kind {
            None if !declared.is_empty() => {
                return Err(Error::InvalidInput(format!(
                    "subject columns declare kinds ({}): name the subject's kind ({how})",
                    list()
                )));
            }
            Some(kind) if !declared.contains(kind) => {
                return Err(Error::InvalidInput(if declared.is_empty() {
                    format!("no subject column declares a kind, so there is no kind {kind:?}; leave the kind out")
                } else {
                    format!(
                        "no subject column declares the kind {kind:?}; the kinds are {}",
                        list()
                    )
                }));
            }
            _ => {}
        }
        let types: Vec<crate::sql::KeyType> = self
            .entities
            .iter()
            .flat_map(|e| {
                e.subjects
                    .iter()
                    .filter(|s| reaches(s, kind))
                    .map(move |s| self.facts[&e.id].subjects[&s.column])
            })
            .collect();
        if types.is_empty() {
            return Err(Error::InvalidInput(
                "no retained entity declares a subject column, so no row can hold a subject".into(),
            ));
        }
        if !types.iter().any(|ty| ty.parse(subject).is_ok()) {
            let mut names: Vec<&str> = types.iter().map(|t| t.name()).collect();
            names.sort_unstable();
            names.dedup();
            let (what, request) = match kind {
                Some(k) => (format!("a {k:?} value"), format!("a {k:?} request")),
                None => ("a subject".to_owned(), "the request".to_owned()),
            };
            return Err(Error::InvalidInput(format!(
                "the subject cannot be {what}: every subject column {request} reaches is of type {}",
                names.join(" or ")
            )));
        }
        Ok(())
    }
}

impl TableFacts {
    /// A record id a request names, in the key column's type (refused,
    /// naming `entity`, when it cannot be one).
    pub(crate) fn record_key(&self, entity: &str, raw: &str) -> Result<crate::sql::KeyValue> {
        let parsed = if self.casts.composite() {
            let parts: Vec<_> = self.casts.key.iter().map(|p| p.ty).collect();
            crate::domain::model::parse_composite(&parts, raw).map(crate::sql::KeyValue::Text)
        } else {
            self.record.parse(raw)
        };
        parsed.map_err(|msg| Error::InvalidInput(format!("record id for {entity}: {msg}")))
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
