//! The values a mutation binds after its rows, fixed by the entity:
//! literal templates and per-run anonymisers (rendered once per run),
//! values computed in Rust per row (custom anonymisers, hashed columns),
//! archive's run id, and the run's `now` for the marker.

use crate::base::ident::SqlText;
use crate::domain::model::{AnonymiseMethod, CustomAnonymiser, EntityDescriptor};
use crate::domain::rules::Strategy;
use crate::sql::fragments::Casts;

/// A value of the anonymise statement computed once per run.
#[derive(Debug, Clone)]
pub(crate) enum RunValue {
    /// A literal's template (rendered with the run's `now` and tenant),
    /// bound as text.
    Template(String),
    /// A per-run custom anonymiser of this column, bound as a JSON object
    /// holding the column's new value (converted to the column's type by
    /// PostgreSQL, as per-row values are).
    PerRun(String, CustomAnonymiser),
}

/// The entity's mutation values.
#[derive(Debug, Clone, Default)]
pub(crate) struct Values {
    /// Values computed once per run and bound after `$2` by the anonymise
    /// statement, in declaration order: literal templates and per-run
    /// custom anonymisers.
    pub(crate) literals: Vec<RunValue>,
    /// Custom anonymisers, in parameter order: (column, anonymiser).
    pub(crate) custom: Vec<(String, CustomAnonymiser)>,
    /// Whether `archive` applies the anonymise methods to the copy (it
    /// then binds the anonymise parameters after the run id).
    pub(crate) archive_anonymises: bool,
}

impl Values {
    /// The entity's values; hashed columns hash with `hasher` (validated:
    /// an entity that hashes has one).
    pub(super) fn of(e: &EntityDescriptor, hasher: Option<&CustomAnonymiser>) -> Self {
        let mut v = Values {
            archive_anonymises: e.archive.as_ref().is_some_and(|a| a.anonymise),
            ..Values::default()
        };
        for a in &e.anonymise {
            match &a.method {
                AnonymiseMethod::Literal(t) => v.literals.push(RunValue::Template(t.clone())),
                AnonymiseMethod::Custom(c) if c.is_per_run() => v
                    .literals
                    .push(RunValue::PerRun(a.column.clone(), c.clone())),
                // Hashed in Rust (HMAC-SHA256 under the configured key), like a
                // custom anonymiser: the key never reaches the server, its
                // statements or its logs.
                AnonymiseMethod::Hash => v.custom.push((
                    a.column.clone(),
                    hasher.cloned().expect("validated: hashing needs a key"),
                )),
                AnonymiseMethod::Custom(c) => v.custom.push((a.column.clone(), c.clone())),
                _ => {}
            }
        }
        v
    }

    /// Parameters the anonymise statement binds after the keys (`$2`):
    /// literals, then the JSON array of values computed in Rust (custom
    /// anonymisers and hashed columns). Counted apart from the numbering
    /// in `slots`, so the placeholder tests check one against the other.
    #[cfg(test)]
    pub(crate) fn anonymise_params(&self) -> usize {
        self.literals.len() + usize::from(!self.custom.is_empty())
    }

    /// Parameters `mutate` binds after the keys for `strategy`: the
    /// anonymise ones; for archive, the run id (`$3`), then the anonymise
    /// ones when the copy is anonymised.
    ///
    /// Last of them, for a strategy that marks its rows ([`marks`]), the
    /// run's logical `now`, which the marker (`deleted_at`,
    /// `anonymised_at`, the archive's `archived_at`) is set to: a run's
    /// marks and its cutoffs read one clock.
    #[cfg(test)]
    pub(crate) fn params_after_keys(&self, strategy: Strategy) -> usize {
        let own = match strategy {
            Strategy::Anonymise => self.anonymise_params(),
            Strategy::Archive if self.archive_anonymises => 1 + self.anonymise_params(),
            Strategy::Archive => 1,
            _ => 0,
        };
        own + usize::from(marks(strategy))
    }

    /// Whether `strategy`'s statement needs values computed in Rust for
    /// each row (custom anonymisers, hashed columns).
    pub(crate) fn computes_per_row(&self, strategy: Strategy) -> bool {
        !self.custom.is_empty()
            && (strategy == Strategy::Anonymise
                || (strategy == Strategy::Archive && self.archive_anonymises))
    }
}

/// Whether `strategy` stamps the rows it changes with a marker (set to
/// the run's `now`, bound last of the strategy's values).
pub(crate) fn marks(strategy: Strategy) -> bool {
    matches!(
        strategy,
        Strategy::SoftDelete | Strategy::Anonymise | Strategy::Archive
    )
}

/// Each anonymised column's new value, in declaration order: literal and
/// per-run values bound from `$first_literal` on (in `Values::literals`
/// order), per-row values read from `v.j` (see [`per_row_values`]).
pub(super) fn anonymised_values(
    e: &EntityDescriptor,
    first_literal: usize,
) -> Vec<(&str, SqlText)> {
    let mut next_literal = first_literal;
    let mut out = Vec::with_capacity(e.anonymise.len());
    for a in &e.anonymise {
        let mut v = SqlText::default();
        match &a.method {
            AnonymiseMethod::Null => {
                v.push("NULL");
            }
            AnonymiseMethod::Empty => {
                v.push("''");
            }
            AnonymiseMethod::Literal(_) => {
                v.param(next_literal);
                next_literal += 1;
            }
            AnonymiseMethod::Custom(c) if c.is_per_run() => {
                // Computed once per run: one JSON object for the whole
                // batch, converted like per-row values.
                v.push("(pg_catalog.jsonb_populate_record(NULL::")
                    .table(&e.table)
                    .push(", ")
                    .param(next_literal)
                    .push("::jsonb)).")
                    .ident(&a.column);
                next_literal += 1;
            }
            AnonymiseMethod::Custom(_) | AnonymiseMethod::Hash => {
                // Rust computes a JSON object per row; PostgreSQL converts
                // each value to the column's own type through the table's
                // row type (no type names in SQL, no text casts).
                v.push("(pg_catalog.jsonb_populate_record(NULL::")
                    .table(&e.table)
                    .push(", v.j)).")
                    .ident(&a.column);
            }
        }
        out.push((a.column.as_str(), v));
    }
    out
}

/// `ROWS FROM (…) AS v(k, j)`: the batch's keys (`$keys`) aligned with
/// one JSON object of values computed in Rust per key (`$values`).
pub(super) fn per_row_values(
    e: &EntityDescriptor,
    casts: &Casts,
    (keys, values): (usize, usize),
) -> SqlText {
    let mut s = SqlText::new("ROWS FROM (pg_catalog.unnest(");
    casts.key_array(&mut s, e, keys);
    s.push("), pg_catalog.unnest(")
        .param(values)
        .push("::jsonb[])) AS v(k, j)");
    s
}
