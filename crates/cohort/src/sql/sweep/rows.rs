//! The rows the sweep's statements return, decoded by column name here.

use chrono::{DateTime, Utc};

/// A locked target: its key as text and its tenant (the rows of
/// `lock_target` and `guard_lock`).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct LockedRow {
    pub(crate) record: String,
    pub(crate) tenant: Option<String>,
}

/// A key as text (the rows of `guard_held`).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RecordRow {
    pub(crate) record: String,
}

/// The same rows read through a SeaORM connection (`cohort::sea_orm`).
#[cfg(feature = "sea-orm")]
pub(crate) mod sea {
    use sea_orm::{DbErr, QueryResult, TryGetable};

    /// The first column of a one-column row (the isolation level, the
    /// ledger's comment).
    pub(crate) fn first<T: TryGetable>(r: &QueryResult) -> Result<T, DbErr> {
        r.try_get_by_index(0)
    }

    impl super::LockedRow {
        pub(crate) fn from_sea(r: &QueryResult) -> Result<Self, DbErr> {
            Ok(Self {
                record: r.try_get("", "record")?,
                tenant: r.try_get("", "tenant")?,
            })
        }
    }

    impl super::RecordRow {
        pub(crate) fn from_sea(r: &QueryResult) -> Result<Self, DbErr> {
            Ok(Self {
                record: r.try_get("", "record")?,
            })
        }
    }
}

/// An entity's counts (`counts`, `counts_after`). Negative counts read
/// as 0 (see [`CountsRow::count`]).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct CountsRow {
    pub(crate) eligible: i64,
    pub(crate) held: i64,
    pub(crate) held_by_subject: i64,
    pub(crate) null_anchor: i64,
    pub(crate) skipped: i64,
    pub(crate) kept_by_legal_min: i64,
    /// The oldest anchor a legal minimum keeps; only statements of an
    /// entity with a legal minimum have the column.
    #[sqlx(default)]
    pub(crate) legal_min_oldest: Option<DateTime<Utc>>,
}

impl CountsRow {
    /// A count as unsigned (a count is never negative; 0 if it were).
    pub(crate) fn count(n: i64) -> u64 {
        n.max(0) as u64
    }
}

/// The rows a legal minimum keeps past the period (`kept_by_legal_min`).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct KeptRow {
    pub(crate) kept_by_legal_min: i64,
}

/// The oldest eligible row's anchor (`backlog`).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct OldestRow {
    pub(crate) oldest: Option<DateTime<Utc>>,
}
