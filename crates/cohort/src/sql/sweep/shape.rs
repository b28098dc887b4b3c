//! What every statement of one entity (or one stage of it) is built
//! from: the entity, its casts, the hold and reference checks, and, for a
//! stage measured from a marker, the stage's scope.

use super::slots::{Filter, Scoped};
use crate::base::ident::SqlText;
use crate::domain::model::EntityDescriptor;
use crate::domain::rules::Strategy;
use crate::sql::fragments::{not_done, tenant_filter, Casts};

/// How a stage measured from a previous stage's marker narrows an
/// entity's statements (built on a descriptor whose anchor is the marker).
#[derive(Debug, Clone)]
pub(crate) struct StageScope {
    /// ` AND …`: rows the previous stage has done (its marker set and, after
    /// a soft delete, the flag still set: a restored row is not purged).
    pub(crate) previous_done: SqlText,
    /// The entity's own anchor: a row is only touched when it is older than
    /// the legal minimum's floor, bound after the tenant (NULL: no floor).
    pub(crate) floor: String,
}

impl StageScope {
    /// The scope of a stage measured from the marker a `previous` stage
    /// writes, and the descriptor its statements are built on (anchored on
    /// that marker, never dropping partitions). `None` when the strategy
    /// writes no marker or the entity has none (validation refuses both).
    pub(crate) fn after(
        e: &EntityDescriptor,
        previous: Strategy,
    ) -> Option<(EntityDescriptor, Self)> {
        let marker = e.marker(previous.marker()?)?;
        let mut done = SqlText::new(" AND ");
        done.col(marker).push(" IS NOT NULL");
        if previous == Strategy::SoftDelete {
            // A restored row keeps its stale deleted_at: the flag decides.
            done.push(" AND ")
                .col(e.soft_delete.as_deref()?)
                .push(" IS TRUE");
        }
        let mut staged = e.clone();
        staged.anchor = marker.to_owned();
        staged.partitions = crate::domain::model::Partitions::Rows;
        Some((
            staged,
            StageScope {
                previous_done: done,
                floor: e.anchor.clone(),
            },
        ))
    }
}

/// The entity and the checks every statement of it shares.
pub(super) struct Shape<'a> {
    pub(super) e: &'a EntityDescriptor,
    pub(super) casts: &'a Casts,
    pub(super) cohort_schema: &'a str,
    /// `EXISTS` over the active holds on the row's record or on a subject
    /// it holds (`$1` entity id).
    pub(super) held: SqlText,
    /// The subject half of `held` (`None`: no subject columns).
    pub(super) subject_held: Option<SqlText>,
    /// `EXISTS (…)` for rows another row still references through a NO
    /// ACTION / RESTRICT foreign key (`None`: nothing references the table).
    pub(super) referenced: Option<SqlText>,
    pub(super) stage: Option<&'a StageScope>,
}

impl Shape<'_> {
    /// What the entity's scope binds besides the cutoff.
    pub(super) fn scoped(&self) -> Scoped {
        Scoped {
            tenant: self.e.tenant.is_some(),
            floor: self.stage.is_some(),
        }
    }

    /// The tenant filter, then, for a stage measured from a marker,
    /// ` AND (anchor < $n OR $n IS NULL)` on the entity's own anchor (the
    /// legal minimum's floor, NULL: no floor), each where `at` binds it.
    pub(super) fn filter(&self, at: &Filter) -> SqlText {
        let mut s = SqlText::default();
        if let Some(n) = at.tenant {
            s.append(&tenant_filter(self.e, self.casts, n));
        }
        if let (Some(stage), Some(n)) = (self.stage, at.floor) {
            s.push(" AND (")
                .col(&stage.floor)
                .push(" < ")
                .param(n)
                .push(" OR ")
                .param(n)
                .push("::timestamptz IS NULL)");
        }
        s
    }

    /// ` AND …`: rows `strategy` has not done yet, and, in a stage, rows
    /// the previous stage has done.
    pub(super) fn not_done(&self, strategy: Strategy) -> SqlText {
        let mut done = not_done(self.e, strategy);
        if let Some(stage) = self.stage {
            done.append(&stage.previous_done);
        }
        done
    }
}
