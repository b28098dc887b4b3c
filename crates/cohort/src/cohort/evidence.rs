//! The handle's evidence: the run history, the compliance report, the
//! hash chain's verification and key, and the journal's restore check
//! and replay.

use crate::error::{Error, Result};

use super::Cohort;

impl Cohort {
    /// Compares the database with the journal (see [`crate::ops::restore`]):
    /// the erasure requests and holds it holds that the database lacks.
    /// Reads only. Refused without a journal, and when the journal's chain
    /// is broken (naming the entry).
    pub async fn restore_check(&self) -> Result<crate::ops::restore::RestoreCheck> {
        let ready = self.cx.ready().await?;
        crate::ops::restore::check(&ready).await
    }

    /// Brings the database back to the journal after a restore (see
    /// [`crate::ops::restore`]); with `dry_run`, only says what it would do.
    pub async fn replay(&self, dry_run: bool) -> Result<crate::ops::restore::ReplayReport> {
        let ready = self.cx.ready().await?;
        crate::ops::restore::replay(&ready, dry_run, None).await
    }

    /// [`Cohort::replay`] onto a copy of the journal in `dir` (copied
    /// there first, unless a copy is there already): what a restore drill
    /// on another cluster runs, so that the production journal gains no
    /// entry. A replay without a copy is refused on a cluster other than
    /// the one the journal was written for (its system identifier).
    pub async fn replay_onto_copy(
        &self,
        dry_run: bool,
        dir: &std::path::Path,
    ) -> Result<crate::ops::restore::ReplayReport> {
        let ready = self.cx.ready().await?;
        crate::ops::restore::replay(&ready, dry_run, Some(dir)).await
    }

    /// Whether a journal is configured.
    pub fn has_journal(&self) -> bool {
        self.cx.journal.is_some()
    }

    /// The most recent runs, newest first.
    pub async fn list_runs(&self, limit: i64) -> Result<Vec<crate::ops::history::RunLine>> {
        crate::ops::history::list(&self.cx, limit).await
    }

    /// The id of the run whose id starts with `prefix` (the 8 characters the
    /// tables print are usually enough); an ambiguous prefix is refused,
    /// naming the matches.
    pub async fn find_run(&self, prefix: &str) -> Result<uuid::Uuid> {
        crate::ops::history::find_run(&self.cx, prefix).await
    }

    /// What happened to one record across runs, oldest first: the detail
    /// rows the ledger holds for it (per-row audit, rows set aside), each
    /// with its run. An index lookup however large the ledger. The record
    /// id is read in the entity's key type (`"0042"` finds `42`).
    pub async fn record_history(
        &self,
        entity_id: uuid::Uuid,
        record_id: &str,
    ) -> Result<Vec<crate::ops::history::RecordEvent>> {
        let ready = self.cx.ready().await?;
        crate::ops::history::record_history(&ready, entity_id, record_id).await
    }

    /// One run as recorded in the ledger, with its entity summaries.
    pub async fn show_run(&self, run_id: uuid::Uuid) -> Result<crate::SweepResult> {
        crate::ops::history::show(&self.cx, run_id).await
    }

    /// The evidence of retention for a period, read from the ledger alone
    /// (no policy or catalog is consulted, so it works on a ledger whose
    /// entities have since changed): rules in force, runs, rows removed
    /// per month and kept and why, erasure requests served, holds and
    /// failures. Runs the pruner removed are not in it.
    pub async fn report(
        &self,
        request: &crate::ops::report::ReportRequest,
    ) -> Result<crate::ops::report::Report> {
        let ready = self.cx.ready().await?;
        crate::ops::report::build(&ready, request).await
    }

    /// Walks the ledger's hash chain (see [`crate::ops::verify`]) in one
    /// read-only snapshot: every link in order, every record it stands for
    /// against the ledger's rows now, every run settled since the chain
    /// started. With `expected`, a head recorded earlier (`N:HASH`, as a
    /// report prints it), the chain must still hold it. Reads with
    /// `SELECT` only; needs no hash key and no valid policy. Refused
    /// before schema 19 (run `cohort migrate`).
    pub async fn verify_chain(
        &self,
        expected: Option<crate::domain::chain::ExpectedHead>,
    ) -> Result<crate::domain::chain::ChainReport> {
        self.require_chain().await?;
        crate::ops::verify::verify(&self.cx, expected, true).await
    }

    /// [`Self::verify_chain`] as an auditor has it: a database URL and
    /// Cohort's schema, no policy file. Every link, MAC (with the ledger
    /// key in this handle's configuration), record and head is checked as
    /// by `verify_chain`; only the checkpoints' cutoffs are not held to a
    /// policy's history limits (the report says so when there are any).
    pub async fn verify_chain_without_policy(
        &self,
        expected: Option<crate::domain::chain::ExpectedHead>,
    ) -> Result<crate::domain::chain::ChainReport> {
        self.require_chain().await?;
        crate::ops::verify::verify(&self.cx, expected, false).await
    }

    /// Keys the ledger's hash chain with this handle's ledger key
    /// ([`crate::CohortConfig::ledger_key`], `COHORT_LEDGER_KEY`): appends
    /// a `key` link, after which every link carries a MAC under it and
    /// `verify` refuses one without. Returns the key link's number, or
    /// `None` when the chain is already keyed with this key; refused
    /// without a key, and when the chain is keyed with another.
    /// `cohort migrate` calls it when the key is in its environment.
    pub async fn key_chain(&self) -> Result<Option<i64>> {
        self.require_chain().await?;
        let key = self.cx.config.ledger_key.as_ref().ok_or_else(|| {
            Error::Config(crate::error::Problems::one(format!(
                "keying the ledger's chain needs {} (32 bytes as 64 hexadecimal characters: openssl rand -hex 32)",
                crate::domain::chain::LEDGER_KEY_ENV
            )))
        })?;
        let mut conn = self.cx.pool.acquire().await?;
        crate::run::chain::key_chain(&mut conn, &self.cx.config.schema, key).await
    }

    /// The id of the key the ledger's hash chain is keyed with
    /// ([`crate::domain::chain::LedgerKey::id`]), or `None` when it is not keyed.
    pub async fn chain_key_id(&self) -> Result<Option<String>> {
        self.require_chain().await?;
        let mut conn = self.cx.pool.acquire().await?;
        Ok(crate::validate::chain_key::keyed_with(&mut conn, &self.cx.config.schema).await?)
    }

    /// The newest link of the ledger's hash chain linked at or before
    /// `at` (the newest of all with `None`): the head a report carries.
    pub async fn chain_head(
        &self,
        at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Option<crate::domain::chain::ChainHead>> {
        self.require_chain().await?;
        crate::ops::verify::head(&self.cx, at).await
    }

    async fn require_chain(&self) -> Result<()> {
        let mut conn = self.cx.pool.acquire().await?;
        let installed = crate::schema::installed_version(&mut conn, &self.cx.config.schema).await?;
        match installed {
            Some(v) if v >= crate::sql::tables::CHAIN_SINCE_VERSION => Ok(()),
            Some(v) => Err(crate::error::Error::InvalidInput(format!(
                "the ledger in schema {:?} is at version {v}; its hash chain starts at version {}: run `cohort migrate`",
                self.cx.config.schema,
                crate::sql::tables::CHAIN_SINCE_VERSION
            ))),
            None => Err(crate::error::Error::InvalidInput(format!(
                "no Cohort ledger in schema {:?}: run `cohort migrate`",
                self.cx.config.schema
            ))),
        }
    }
}
