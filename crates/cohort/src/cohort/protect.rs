//! What the handle protects and erases on request: legal holds, guarded
//! deletions, and erasure requests.

use crate::error::Result;

use super::Cohort;

impl Cohort {
    /// Erasure requests as `filter` selects them, oldest received first
    /// (see [`crate::domain::erasure_requests`]).
    pub async fn erasure_requests(
        &self,
        filter: crate::domain::erasure_requests::RequestFilter,
    ) -> Result<Vec<crate::domain::erasure_requests::RequestRecord>> {
        let ready = self.cx.ready().await?;
        crate::run::requests::list(&ready, filter).await
    }

    /// One erasure request by its reference, with its history; an unknown
    /// reference is [`crate::Error::NotFound`].
    pub async fn erasure_request(
        &self,
        reference: &str,
    ) -> Result<crate::domain::erasure_requests::RequestHistory> {
        let ready = self.cx.ready().await?;
        crate::run::requests::show(&ready, reference).await
    }

    /// Moves an erasure request's due date, recording why (a line of its
    /// history). Refused for a completed request and for a date in the
    /// past.
    pub async fn extend_erasure_request(
        &self,
        reference: &str,
        due: crate::domain::erasure_requests::Due,
        reason: &str,
    ) -> Result<crate::domain::erasure_requests::RequestRecord> {
        let ready = self.cx.ready().await?;
        crate::run::requests::extend(&ready, reference, due, reason).await
    }

    /// Runs again, at `now`, every erasure request that may have something
    /// left to do: waiting ones whose legal minimum has passed or for which
    /// a hold was released or expired since their last attempt, and
    /// attempts a lost process left in progress. The maintenance service
    /// calls it every pass with the clock's `now`; `allow_future_now` as
    /// for an erasure (a later `now` erases rows whose legal minimum has
    /// not passed yet).
    pub async fn resume_erasure_requests<Tz: chrono::TimeZone>(
        &self,
        now: chrono::DateTime<Tz>,
        allow_future_now: bool,
    ) -> Result<crate::domain::erasure_requests::ResumeReport> {
        self.cx.ready().await?;
        let now = crate::domain::outcome::logical_now(now);
        crate::run::resolve::check_now(&self.cx, now, true, allow_future_now).await?;
        let ready = self.cx.ready().await?;
        crate::run::requests::resume(&ready, now, allow_future_now, &crate::Cancel::new()).await
    }

    /// Erasure requests per state and those overdue, read now; also sets
    /// `cohort_erasure_requests{state}` and `cohort_erasure_requests_overdue`
    /// (see [`crate::domain::telemetry`]).
    pub async fn erasure_request_counts(
        &self,
    ) -> Result<crate::domain::erasure_requests::RequestCounts> {
        let ready = self.cx.ready().await?;
        let counts = crate::run::requests::counts(&ready).await?;
        counts.record();
        Ok(counts)
    }

    /// Runs the application's own deletion of `request.record_ids` inside a
    /// Cohort transaction, unless a target is under an active legal hold
    /// (see [`crate::ops::guarded`]).
    ///
    /// ```no_run
    /// # async fn f(cohort: cohort::Cohort, entity: uuid::Uuid) -> Result<(), cohort::Error> {
    /// use cohort::guarded::{Guarded, GuardedDeletion};
    /// let request = GuardedDeletion::new(entity, ["42"]).tenant("11111111-1111-1111-1111-111111111111");
    /// let outcome = cohort
    ///     .guarded_delete(request, |tx| Box::pin(async move {
    ///         let done = sqlx::query("DELETE FROM app.notes WHERE id = 42").execute(&mut *tx).await?;
    ///         Ok(done.rows_affected())
    ///     }))
    ///     .await?;
    /// if let Guarded::Protected { held } = outcome {
    ///     eprintln!("not deleted, under legal hold: {held:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn guarded_delete<T, F>(
        &self,
        request: crate::ops::guarded::GuardedDeletion,
        callback: F,
    ) -> Result<crate::ops::guarded::Guarded<T>>
    where
        F: for<'c> FnOnce(&'c mut sqlx::PgConnection) -> crate::ops::guarded::CallbackFuture<'c, T>,
    {
        let ready = self.cx.ready().await?;
        crate::ops::guarded::delete(&ready, request, callback).await
    }

    /// Guards a deletion the application makes in its **own** transaction
    /// (sqlx here; see docs/derive.md for SeaORM): locks the target rows
    /// `FOR UPDATE` in that transaction and checks for active holds after
    /// the locks. [`Guarded::Completed`](crate::ops::guarded::Guarded) means no
    /// target is held: delete them in the same transaction and commit (the
    /// locks keep any new hold waiting until then). [`Guarded::Protected`](crate::ops::guarded::Guarded)
    /// names the held ids: do not delete them; the transaction stays yours
    /// (the rows stay locked until it ends). Refused unless the transaction
    /// is READ COMMITTED (PostgreSQL's default). Errors leave the
    /// transaction for the caller to roll back.
    ///
    /// ```no_run
    /// # async fn f(cohort: &cohort::Cohort, pool: &cohort::sqlx::PgPool, entity: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
    /// use cohort::guarded::{Guarded, GuardedDeletion};
    /// let mut tx = pool.begin().await?;
    /// // ... the application's own work in `tx` ...
    /// let request = GuardedDeletion::new(entity, ["42"]).tenant("7d1c1c49-0b6a-4f3e-8a43-5d7b3c2f9e10");
    /// match cohort.guard_deletion(&mut tx, request).await? {
    ///     Guarded::Completed(()) => {
    ///         sqlx::query("DELETE FROM app.notes WHERE id = 42").execute(&mut *tx).await?;
    ///         tx.commit().await?;
    ///     }
    ///     Guarded::Protected { held } => {
    ///         tx.rollback().await?;
    ///         eprintln!("under legal hold, not deleted: {held:?}");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn guard_deletion(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        request: crate::ops::guarded::GuardedDeletion,
    ) -> Result<crate::ops::guarded::Guarded<()>> {
        let ready = self.cx.ready().await?;
        crate::ops::guarded::guard_in(&ready, tx, request).await
    }

    /// Places a legal hold (see [`crate::ops::holds`] for every check it makes).
    pub async fn create_hold(
        &self,
        request: crate::ops::holds::HoldRequest,
    ) -> Result<crate::ops::holds::Hold> {
        let ready = self.cx.ready().await?;
        crate::ops::holds::create(&ready, request).await
    }

    /// Whether a record is under an active hold now (database clock),
    /// whatever tenant it belongs to. An unknown entity is `NotFound`, a
    /// malformed record id `InvalidInput`.
    pub async fn is_held(&self, entity_id: uuid::Uuid, record_id: &str) -> Result<bool> {
        let ready = self.cx.ready().await?;
        crate::ops::holds::is_held(&ready, entity_id, record_id, None).await
    }

    /// Whether a record was (or, for a time to come, will still be) under
    /// an active hold at `as_of`: a hold created by then and neither
    /// released nor expired by then, whatever tenant the record belongs
    /// to. Errors as [`Cohort::is_held`].
    pub async fn is_held_as_of<Tz: chrono::TimeZone>(
        &self,
        entity_id: uuid::Uuid,
        record_id: &str,
        as_of: chrono::DateTime<Tz>,
    ) -> Result<bool> {
        let at = as_of.with_timezone(&chrono::Utc);
        let ready = self.cx.ready().await?;
        crate::ops::holds::is_held(&ready, entity_id, record_id, Some(at)).await
    }

    /// Lists holds.
    pub async fn list_holds(
        &self,
        filter: &crate::ops::holds::HoldFilter,
    ) -> Result<Vec<crate::ops::holds::Hold>> {
        let ready = self.cx.ready().await?;
        crate::ops::holds::list(&ready, filter).await
    }

    /// Releases an active hold now.
    pub async fn release_hold(&self, hold_id: uuid::Uuid) -> Result<crate::ops::holds::Hold> {
        let ready = self.cx.ready().await?;
        crate::ops::holds::release(&ready, hold_id).await
    }

    /// The id of the hold whose id starts with `prefix` (the 8 characters
    /// the console and `holds list` print are usually enough); an
    /// ambiguous prefix is refused, naming the matches.
    pub async fn find_hold(&self, prefix: &str) -> Result<uuid::Uuid> {
        crate::ops::history::find_hold(&self.cx, prefix).await
    }
}
