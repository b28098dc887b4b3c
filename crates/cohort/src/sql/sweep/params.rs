//! What a sweep's statements bind and what they return, typed.
//!
//! The statements' text numbers its parameters (`$1`, `$2`, …) in the
//! files beside this one; the structs here bind their fields in that
//! order, and the readers below decode the rows the statements return. A
//! run fills a [`Scope`], a [`Batch`], a [`Change`] and an [`Audit`], and
//! reads [`LockedRows`], [`Changed`] and key ranges: it never counts
//! placeholders or reads a column by position.

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{PgConnection, Postgres, Row};
use uuid::Uuid;

use super::rows::{CountsRow, KeptRow, LockedRow, OldestRow};
use super::{marks, SweepStatements, Targets, Values};
use crate::domain::rules::Strategy;
use crate::sql::ledger::DetailRow;
use crate::sql::statement::{typed, Typed};
use crate::sql::{bind_array, BindKey, BoundHolds, DecodeKey, KeyType, KeyValue};

/// A query being bound.
pub(crate) type Query<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

/// Which rows a work's statements take, bound after the entity id.
#[derive(Debug, Clone)]
pub(crate) enum Scope {
    /// A sweep's: rows anchored before `cutoff`, in the tenant and, for
    /// a stage measured from a marker, whose own anchor is before the
    /// legal minimum's floor (`Some(None)`: that stage has no floor).
    Sweep {
        cutoff: DateTime<Utc>,
        tenant: Option<KeyValue>,
        floor: Option<Option<DateTime<Utc>>>,
    },
    /// An erasure's: the rows holding the subject in any of the subject
    /// columns the request applies to (one value each, in the plan's
    /// column order), in the tenant, past the legal minimum's cutoff when
    /// the rule has one.
    Erasure {
        tenant: Option<KeyValue>,
        cutoff: Option<DateTime<Utc>>,
        subject: Vec<KeyValue>,
    },
}

impl Scope {
    /// The same scope with a sweep's cutoff moved to `bound` (an erasure's
    /// is its legal minimum's, which nothing moves).
    pub(crate) fn with_cutoff(&self, bound: DateTime<Utc>) -> Scope {
        match self {
            Scope::Sweep { tenant, floor, .. } => Scope::Sweep {
                cutoff: bound,
                tenant: tenant.clone(),
                floor: *floor,
            },
            Scope::Erasure { .. } => self.clone(),
        }
    }

    /// Whether a batch cursor starts with the anchor: a sweep's walks in
    /// (anchor, key) order, an erasure's in key order.
    pub(crate) fn cursor_has_anchor(&self) -> bool {
        matches!(self, Scope::Sweep { .. })
    }

    /// The lock statements' values after the entity id: a sweep's `$2`
    /// cutoff, `$3` limit, then the tenant and the floor; an erasure's
    /// `$2` limit, then the tenant, the cutoff and the subject's values.
    fn bind_with_limit<'q>(&'q self, q: Query<'q>, limit: i64) -> Query<'q> {
        match self {
            Scope::Sweep { cutoff, .. } => self.bind_rest(q.bind(*cutoff).bind(limit)),
            Scope::Erasure { .. } => self.bind_rest(q.bind(limit)),
        }
    }

    /// The counts' values after the entity id: a sweep's cutoff, tenant
    /// and floor; an erasure's as its lock statements' (their `$2` limit
    /// is not read by the counts, bound so the numbering is shared).
    fn bind_counts<'q>(&'q self, q: Query<'q>) -> Query<'q> {
        match self {
            Scope::Sweep { cutoff, .. } => self.bind_rest(q.bind(*cutoff)),
            Scope::Erasure { .. } => self.bind_rest(q.bind(0_i64)),
        }
    }

    /// The re-checks a mutation binds after the strategy's values: a
    /// sweep's cutoff, tenant and floor; an erasure's tenant, cutoff and
    /// subject's values.
    fn bind_recheck<'q>(&'q self, q: Query<'q>) -> Query<'q> {
        match self {
            Scope::Sweep { cutoff, .. } => self.bind_rest(q.bind(*cutoff)),
            Scope::Erasure { .. } => self.bind_rest(q),
        }
    }

    /// What follows the cutoff (a sweep's) or the limit (an erasure's).
    fn bind_rest<'q>(&'q self, mut q: Query<'q>) -> Query<'q> {
        match self {
            Scope::Sweep { tenant, floor, .. } => {
                if let Some(t) = tenant {
                    q = t.bind(q);
                }
                match floor {
                    Some(floor) => q.bind(*floor),
                    None => q,
                }
            }
            Scope::Erasure {
                tenant,
                cutoff,
                subject,
            } => {
                if let Some(t) = tenant {
                    q = t.bind(q);
                }
                if let Some(c) = cutoff {
                    q = q.bind(*c);
                }
                for v in subject {
                    q = v.bind(q);
                }
                q
            }
        }
    }
}

/// The previous batch's last row: its anchor (a sweep's; an erasure
/// walks by key alone) and key.
pub(crate) type Cursor = (Option<DateTime<Utc>>, KeyValue);

/// The bounds of one batch.
pub(crate) struct Batch<'a> {
    pub(crate) entity_id: Uuid,
    pub(crate) scope: &'a Scope,
    /// At most this many rows.
    pub(crate) limit: i64,
    /// After this row, exclusive (`None`: from the first candidate).
    pub(crate) after: Option<&'a Cursor>,
    /// Up to a key range's last (anchor, key), inclusive (`None`: to the
    /// last candidate).
    pub(crate) until: Option<&'a (DateTime<Utc>, KeyValue)>,
}

impl Batch<'_> {
    /// The cursor, then the range's end, as the statements bind them
    /// after every other value.
    fn bind_bounds<'q>(&'q self, mut q: Query<'q>) -> Query<'q> {
        if let Some((anchor, key)) = self.after {
            if let Some(anchor) = anchor {
                q = q.bind(*anchor);
            }
            q = key.bind(q);
        }
        if let Some((anchor, key)) = self.until {
            q = key.bind(q.bind(*anchor));
        }
        q
    }
}

/// A value of the anonymise statement computed for this run.
#[derive(Debug, Clone)]
pub(crate) enum RunParam {
    /// A rendered literal.
    Text(String),
    /// A per-run anonymiser's value: `{column: value}`.
    Json(serde_json::Value),
}

/// The values a strategy's mutation binds after its rows, the same for
/// every batch of a run: archive's run id, the anonymise values rendered
/// for the run, and the marker's value.
#[derive(Debug, Clone, Default)]
pub(crate) struct Change {
    /// Archive: the run the copies are stamped with.
    archive_run: Option<Uuid>,
    /// Anonymise, and archive anonymising its copy: the literals and
    /// per-run values, in the plan's order.
    literals: Vec<RunParam>,
    /// A strategy that marks its rows ([`marks`]): the run's logical
    /// `now`, so a run's marks and its cutoffs read one clock.
    mark: Option<DateTime<Utc>>,
}

impl Change {
    /// What `strategy` binds for a run `run_id` at `now` whose per-run
    /// values are `literals` (computed from `values`).
    pub(crate) fn of(
        strategy: Strategy,
        values: &Values,
        run_id: Uuid,
        literals: Vec<RunParam>,
        now: DateTime<Utc>,
    ) -> Self {
        let anonymises = strategy == Strategy::Anonymise
            || (strategy == Strategy::Archive && values.archive_anonymises);
        Change {
            archive_run: (strategy == Strategy::Archive).then_some(run_id),
            literals: if anonymises { literals } else { Vec::new() },
            mark: marks(strategy).then_some(now),
        }
    }

    /// Archive's run id, then the literals.
    fn bind_own<'q>(&'q self, mut q: Query<'q>) -> Query<'q> {
        if let Some(run) = self.archive_run {
            q = q.bind(run);
        }
        for value in &self.literals {
            q = match value {
                RunParam::Text(text) => q.bind(text.as_str()),
                RunParam::Json(object) => q.bind(object),
            };
        }
        q
    }

    /// The marker's value, last of the strategy's values.
    fn bind_mark<'q>(&'q self, q: Query<'q>) -> Query<'q> {
        match self.mark {
            Some(now) => q.bind(now),
            None => q,
        }
    }
}

/// The row details an audited statement writes: one per changed row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Audit<'a> {
    pub(crate) run_id: Uuid,
    /// The entity's display name.
    pub(crate) entity: &'a str,
    pub(crate) tenant: Option<&'a str>,
    pub(crate) action: &'static str,
}

impl Audit<'_> {
    fn bind<'q>(self, q: Query<'q>) -> Query<'q>
    where
        Self: 'q,
    {
        q.bind(self.run_id)
            .bind(self.entity)
            .bind(self.tenant)
            .bind(self.action)
    }
}

/// The rows a mutation changes.
pub(crate) enum Rows<'a> {
    /// At the locked rows' addresses ([`SweepStatements::by_address`]).
    Addresses(Vec<String>),
    /// By key.
    Keys(KeyType, &'a [KeyValue]),
    /// By key, each with its object of values computed in Rust.
    Computed(KeyType, Vec<KeyValue>, Vec<serde_json::Value>),
}

/// What a batch's lock (or fused) statement returned.
pub(crate) struct LockedRows {
    /// The locked rows' keys, in lock order (a complete fused statement
    /// returns its last row alone).
    pub(crate) keys: Vec<KeyValue>,
    /// Each returned row's address, aligned with `keys` (rows found by
    /// address only).
    pub(crate) addresses: Vec<String>,
    /// Where the next batch starts: the last returned row (`None`: no
    /// row, or the work has no statement after a cursor).
    pub(crate) next: Option<Cursor>,
    /// A fused statement's own account.
    pub(crate) fused: Option<FusedTail>,
}

/// What a fused statement did, from its last row.
pub(crate) struct FusedTail {
    /// Rows it locked.
    pub(crate) locked: u64,
    /// Rows it changed.
    pub(crate) changed: u64,
    /// The changed records as text (audited forms).
    pub(crate) ids: Vec<String>,
}

/// What a mutation changed.
#[derive(Default)]
pub(crate) struct Changed {
    /// The changed keys as text (none when only the count came back).
    pub(crate) keys: Vec<String>,
    /// How many rows.
    pub(crate) rows: u64,
    /// The row details it wrote (audited form), each with `row_detail_id`
    /// and `record_id`.
    pub(crate) details: Option<Vec<DetailRow>>,
}

/// What a mutation statement returns.
enum Returns {
    /// Its row details (`row_detail_id, record_id`).
    Details,
    /// The changed keys as text.
    Keys,
    /// Nothing: only the count.
    Count,
}

/// A mutation bound and ready to run.
pub(crate) struct Mutation<'q> {
    query: Query<'q>,
    returns: Returns,
}

impl Mutation<'_> {
    /// Runs it and reads what it changed.
    pub(crate) async fn run(self, conn: &mut PgConnection) -> Result<Changed, sqlx::Error> {
        Ok(match self.returns {
            Returns::Details => {
                let details = typed::<DetailRow>(self.query).fetch_all(&mut *conn).await?;
                let keys: Vec<String> = details.iter().map(|d| d.record_id.clone()).collect();
                Changed {
                    rows: keys.len() as u64,
                    keys,
                    details: Some(details),
                }
            }
            Returns::Keys => {
                let keys = self
                    .query
                    .fetch_all(&mut *conn)
                    .await?
                    .iter()
                    .map(|r| r.try_get::<String, _>(0))
                    .collect::<Result<Vec<_>, _>>()?;
                Changed {
                    rows: keys.len() as u64,
                    keys,
                    details: None,
                }
            }
            Returns::Count => Changed {
                rows: self.query.execute(&mut *conn).await?.rows_affected(),
                keys: Vec::new(),
                details: None,
            },
        })
    }
}

impl SweepStatements {
    /// Locks a batch: `lock`, or its form after a cursor, within a key
    /// range, or both.
    pub(crate) fn lock_batch<'q>(&'q self, b: &'q Batch<'q>) -> Query<'q> {
        let text = match (b.after.is_some(), b.until.is_some()) {
            (false, false) => Some(&self.lock),
            (true, false) => self.lock_after.as_ref(),
            (false, true) => self.lock_until.as_ref(),
            (true, true) => self.lock_after_until.as_ref(),
        }
        .expect("the work's statements bound its batches");
        let q = sqlx::query(text.sql()).bind(b.entity_id);
        b.bind_bounds(b.scope.bind_with_limit(q, b.limit))
    }

    /// Locks and changes a batch in one statement (see [`super::fused`]),
    /// writing its row details when `audit` is given; `None` when the
    /// strategy has no fused statement.
    pub(crate) fn fused_batch<'q>(
        &'q self,
        b: &'q Batch<'q>,
        change: &'q Change,
        audit: Option<Audit<'q>>,
    ) -> Option<Query<'q>> {
        let fused = self.fused.as_ref()?;
        let forms = if audit.is_some() {
            &fused.audited
        } else {
            &fused.count
        };
        let text = forms.pick(b.after.is_some(), b.until.is_some());
        let mut q = sqlx::query(text.sql()).bind(b.entity_id);
        q = change.bind_mark(change.bind_own(b.scope.bind_with_limit(q, b.limit)));
        if let Some(audit) = audit {
            q = audit.bind(q);
        }
        Some(b.bind_bounds(q))
    }

    /// Reads what [`Self::lock_batch`] or [`Self::fused_batch`] returned
    /// for a work in `scope` (`fused`: the latter; `ids`: an audited form).
    pub(crate) fn read_locked(
        &self,
        rows: &[PgRow],
        key_type: KeyType,
        scope: &Scope,
        (fused, ids): (bool, bool),
    ) -> Result<LockedRows, sqlx::Error> {
        // Every lock statement returns the key first, the anchor second
        // and (by address) the address third; the fused one names them
        // `k`, `a`, `addr` in that order.
        let keys: Vec<KeyValue> = rows
            .iter()
            .map(|row| key_type.decode(row, 0))
            .collect::<Result<_, _>>()?;
        let addresses = if self.by_address {
            rows.iter()
                .map(|row| row.try_get::<String, _>(2))
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        let next = match (&self.lock_after, rows.last(), keys.last()) {
            (Some(_), Some(last), Some(key)) => {
                let anchor = if scope.cursor_has_anchor() {
                    Some(last.try_get::<DateTime<Utc>, _>(1)?)
                } else {
                    None
                };
                Some((anchor, key.clone()))
            }
            _ => None,
        };
        let tail = match (fused, rows.last()) {
            (true, Some(last)) => Some(FusedTail {
                locked: last.try_get::<i64, _>("locked")?.max(0) as u64,
                changed: last.try_get::<i64, _>("changed")?.max(0) as u64,
                ids: if ids {
                    last.try_get::<Option<Vec<String>>, _>("ids")?
                        .unwrap_or_default()
                } else {
                    Vec::new()
                },
            }),
            _ => None,
        };
        Ok(LockedRows {
            keys,
            addresses,
            next,
            fused: tail,
        })
    }

    /// Changes a batch's locked rows in a new snapshot, re-checking the
    /// holds, the scope and that they are not done: writing their row
    /// details when `audit` is given and the strategy can, else returning
    /// their keys, or only the count when nothing more is wanted.
    pub(crate) fn mutate<'q>(
        &'q self,
        entity_id: Uuid,
        rows: Rows<'q>,
        change: &'q Change,
        scope: &'q Scope,
        audit: Option<Audit<'q>>,
    ) -> Mutation<'q> {
        let audited = self.mutate_audited.as_ref().filter(|_| audit.is_some());
        let count = self.mutate_count.as_ref().filter(|_| audit.is_none());
        let (text, returns) = match (audited, count) {
            (Some(t), _) => (t, Returns::Details),
            (None, Some(t)) => (t, Returns::Count),
            (None, None) => (&self.mutate, Returns::Keys),
        };
        let mut q = sqlx::query(text.sql()).bind(entity_id);
        let mut computed = None;
        q = match rows {
            Rows::Addresses(addresses) => q.bind(addresses),
            Rows::Keys(key_type, keys) => bind_array(q, key_type, keys),
            Rows::Computed(key_type, keys, values) => {
                computed = Some(values);
                bind_array(q, key_type, &keys)
            }
        };
        q = change.bind_own(q);
        if let Some(values) = computed {
            q = q.bind(values);
        }
        q = scope.bind_recheck(change.bind_mark(q));
        if let (Returns::Details, Some(audit)) = (&returns, audit) {
            q = audit.bind(q);
        }
        Mutation { query: q, returns }
    }

    /// The key ranges of a parallel sweep split into `n` (see
    /// [`SweepStatements::ranges`]); `None` without them.
    pub(crate) fn ranges_query<'q>(
        &'q self,
        entity_id: Uuid,
        scope: &'q Scope,
        n: usize,
    ) -> Option<Query<'q>> {
        let text = self.ranges.as_ref()?;
        let q = sqlx::query(text.sql()).bind(entity_id);
        Some(scope.bind_with_limit(q, n as i64))
    }

    /// Reads the key ranges: each range's last (anchor, key), in order.
    pub(crate) fn read_ranges(
        rows: &[PgRow],
        key_type: KeyType,
    ) -> Result<Vec<(DateTime<Utc>, KeyValue)>, sqlx::Error> {
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get::<DateTime<Utc>, _>("a")?,
                    key_type.decode(row, 0)?,
                ))
            })
            .collect()
    }

    /// The counts in scope (see [`SweepStatements::counts`]).
    pub(crate) fn counts_query<'q>(
        &'q self,
        entity_id: Uuid,
        scope: &'q Scope,
    ) -> Typed<'q, CountsRow> {
        typed(scope.bind_counts(sqlx::query(self.counts.sql()).bind(entity_id)))
    }

    /// The counts after a run, the entity's active holds bound (see
    /// [`SweepStatements::counts_after`]); `None` without that statement.
    pub(crate) fn counts_after_query<'q>(
        &'q self,
        entity_id: Uuid,
        scope: &'q Scope,
        holds: &'q BoundHolds,
        key_type: KeyType,
    ) -> Option<Typed<'q, CountsRow>> {
        let text = self.counts_after.as_ref()?;
        let q = scope.bind_counts(sqlx::query(text.sql()).bind(entity_id));
        Some(typed(holds.bind(q, key_type)))
    }

    /// The rows the legal minimum keeps past `period_cutoff`, column
    /// `kept_by_legal_min` (see [`SweepStatements::kept_by_legal_min`]);
    /// `None` without that statement.
    pub(crate) fn kept_by_legal_min_query<'q>(
        &'q self,
        entity_id: Uuid,
        scope: &'q Scope,
        period_cutoff: DateTime<Utc>,
    ) -> Option<Typed<'q, KeptRow>> {
        let text = self.kept_by_legal_min.as_ref()?;
        let q = scope.bind_counts(sqlx::query(text.sql()).bind(entity_id));
        Some(typed(q.bind(period_cutoff)))
    }

    /// The oldest eligible row's anchor, column `oldest` (see
    /// [`SweepStatements::backlog`]); `None` without that statement.
    pub(crate) fn backlog_query<'q>(
        &'q self,
        entity_id: Uuid,
        scope: &'q Scope,
    ) -> Option<Typed<'q, OldestRow>> {
        let text = self.backlog.as_ref()?;
        Some(typed(
            scope.bind_counts(sqlx::query(text.sql()).bind(entity_id)),
        ))
    }
}

impl Targets {
    /// Reads the rows with these keys, key first, then every column.
    pub(crate) fn load_rows_query<'q>(
        &'q self,
        key_type: KeyType,
        keys: &'q [KeyValue],
    ) -> Query<'q> {
        bind_array(sqlx::query(self.load_rows.sql()), key_type, keys)
    }

    /// Locks the row with this key (see [`Targets::lock_target`]).
    pub(crate) fn lock_target_query<'q>(&'q self, record: &KeyValue) -> Typed<'q, LockedRow> {
        typed(record.bind(sqlx::query(self.lock_target.sql())))
    }

    /// Whether the record is held now, or at `as_of` (see
    /// [`Targets::is_held`], [`Targets::is_held_at`]).
    pub(crate) fn is_held_query<'q>(
        &'q self,
        entity_id: Uuid,
        record: &KeyValue,
        as_of: Option<DateTime<Utc>>,
    ) -> Query<'q> {
        let text = match as_of {
            Some(_) => &self.is_held_at,
            None => &self.is_held,
        };
        let q = record
            .bind(sqlx::query(text.sql()).bind(entity_id))
            .bind(record.canonical());
        match as_of {
            Some(at) => q.bind(at),
            None => q,
        }
    }

    /// What [`Self::is_held_query`] answered.
    pub(crate) fn read_is_held(row: &PgRow) -> Result<bool, sqlx::Error> {
        row.try_get(0)
    }
}
