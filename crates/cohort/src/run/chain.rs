//! Appending to the ledger's hash chain ([`crate::domain::chain`]), in the
//! transaction that writes what the link stands for: a run's settled row,
//! a hold placed or released, the pruner's deletions. And reading the
//! records back, the same way for the writer and for `verify`, so that a
//! record rebuilt from unchanged rows is the text that was linked.
//!
//! What the chain relies on: every appender takes the chain's advisory
//! lock (`LockKey::Chain`) inside a READ COMMITTED transaction (set
//! explicitly, whatever the role's default), so the head it reads after
//! the lock is the newest committed and links never fork or skip a number
//! (`ledger_link_pkey` refuses a duplicate). Nothing relies on writers
//! being honest: a run settled, a hold released or a record changed by
//! anyone else (raw SQL, a restore, an older binary) is what `verify`
//! reports, not something the chain can prevent.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::chain::{
    self, CheckpointRecord, DetailsDigest, HoldRecord, Interval, LedgerKey, LinkKind, PruneCutoffs,
    PrunedLink, ReleaseRecord, RequestEventPart, RequestPart, RequestRecord, RunRecord,
    SummaryRecord,
};
use crate::sql::chain as statements;

fn interval(i: PgInterval) -> Interval {
    [i64::from(i.months), i64::from(i.days), i.microseconds]
}

fn micros(t: Option<DateTime<Utc>>) -> Option<i64> {
    t.map(chain::micros)
}

/// The rows are taken apart field by field, never with `..`: a column
/// added to a covered row (`sql::chain::covered_row!`) stops the build
/// here until its record says what it does with it.
fn summary(r: statements::SummaryRow) -> SummaryRecord {
    let statements::SummaryRow {
        summary_id,
        run_id: _,
        retention_entity_id,
        entity_type,
        category,
        tenant_id,
        strategy,
        stage,
        affected_count,
        held_count,
        held_by_subject_count,
        skipped_count,
        null_anchor_count,
        kept_by_legal_min_count,
        kept_by_policy_count,
        cutoff,
        resolved_period,
        legal_min,
        rule_source,
        rule_reason,
        error,
        batch_size,
        note,
        paused,
        throttled_ms,
        lag_waited_ms,
        dead_tuples_before,
        dead_tuples_after,
        table_bytes_before,
        table_bytes_after,
        vacuumed,
    } = r;
    SummaryRecord {
        summary_id,
        retention_entity_id,
        entity_type,
        category,
        tenant_id,
        strategy,
        stage,
        affected_count,
        held_count,
        held_by_subject_count,
        skipped_count,
        null_anchor_count,
        kept_by_legal_min_count,
        kept_by_policy_count,
        cutoff: micros(cutoff),
        resolved_period: interval(resolved_period),
        legal_min: legal_min.map(interval),
        rule_source,
        rule_reason,
        error,
        batch_size,
        note,
        paused,
        throttled_ms,
        lag_waited_ms,
        dead_tuples_before,
        dead_tuples_after,
        table_bytes_before,
        table_bytes_after,
        vacuumed,
    }
}

fn run(r: statements::RunRow, summaries: Vec<SummaryRecord>, details: DetailsDigest) -> RunRecord {
    let statements::RunRow {
        run_id,
        kind,
        trigger,
        dry_run,
        tenant_id,
        status,
        logical_now,
        started_at,
        settled_at,
        error,
        failures,
        occurrence,
        occurrence_pass,
        occurrence_passes,
        policy_fingerprint,
        erasure_subject_kind,
    } = r;
    RunRecord {
        run_id,
        kind,
        trigger,
        dry_run,
        tenant_id,
        status,
        logical_now: chain::micros(logical_now),
        started_at: chain::micros(started_at),
        settled_at: micros(settled_at),
        error,
        failures,
        occurrence: micros(occurrence),
        occurrence_pass,
        occurrence_passes,
        policy_fingerprint,
        erasure_subject_kind,
        summaries,
        details: Some(details),
    }
}

/// A hold as read: its placing's record and, when released, the time.
pub(crate) struct HoldRows {
    pub(crate) placed: HoldRecord,
    pub(crate) released_at: Option<DateTime<Utc>>,
}

fn hold(r: statements::HoldRow) -> HoldRows {
    let statements::HoldRow {
        hold_id,
        retention_entity_id,
        record_id,
        tenant_id,
        reason,
        created_at,
        expires_at,
        released_at,
        subject_kind,
        subject_text,
        subject_citext,
        subject_uuid,
        subject_int,
        journal_entry,
        journal_hash,
    } = r;
    let forms = subject_text.as_ref().map(|_| {
        let text = [subject_citext, subject_uuid, subject_int]
            .iter()
            .map(|f| f.as_deref().unwrap_or("\u{0}"))
            .collect::<Vec<_>>()
            .join("\n");
        chain::salted(hold_id, &text)
    });
    HoldRows {
        placed: HoldRecord {
            hold_id,
            retention_entity_id,
            record_id,
            tenant_id,
            reason: chain::salted(hold_id, &reason),
            created_at: chain::micros(created_at),
            expires_at: micros(expires_at),
            subject_kind,
            subject: subject_text.map(|s| chain::salted(hold_id, &s)),
            forms,
            journal: match (journal_entry, journal_hash) {
                (Some(seq), Some(hash)) => Some(format!("{seq}:{hash}")),
                _ => None,
            },
        },
        released_at,
    }
}

/// The runs of `ids` as records, with their summaries.
pub(crate) async fn read_runs(
    conn: &mut PgConnection,
    schema: &str,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, RunRecord>, sqlx::Error> {
    let mut by_run: HashMap<Uuid, Vec<SummaryRecord>> = HashMap::new();
    for r in statements::summaries(schema, ids.to_vec())
        .query_as::<statements::SummaryRow>()
        .fetch_all(&mut *conn)
        .await?
    {
        by_run.entry(r.run_id).or_default().push(summary(r));
    }
    let mut digests: HashMap<Uuid, DetailsDigest> = HashMap::new();
    for r in statements::details_digests(schema, ids.to_vec())
        .query_as::<statements::DetailsRow>()
        .fetch_all(&mut *conn)
        .await?
    {
        let digest = DetailsDigest {
            rows: r.rows,
            sha256: r.sha256,
        };
        digests.insert(r.run_id, digest);
    }
    let mut out = HashMap::new();
    for r in statements::runs(schema, ids.to_vec())
        .query_as::<statements::RunRow>()
        .fetch_all(&mut *conn)
        .await?
    {
        let id = r.run_id;
        let details = digests.remove(&id).unwrap_or_else(|| DetailsDigest {
            rows: 0,
            sha256: chain::digest(""),
        });
        out.insert(id, run(r, by_run.remove(&id).unwrap_or_default(), details));
    }
    Ok(out)
}

/// The holds of `ids`.
pub(crate) async fn read_holds(
    conn: &mut PgConnection,
    schema: &str,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, HoldRows>, sqlx::Error> {
    let rows = statements::holds(schema, ids.to_vec())
        .query_as::<statements::HoldRow>()
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let h = hold(r);
            (h.placed.hold_id, h)
        })
        .collect())
}

/// Appends one link under the chain's lock; `conn` is inside a READ
/// COMMITTED transaction the caller commits (the lock is held until then).
///
/// With the ledger's key the library computes the link (its hash over its
/// own time too) and its MAC; without it the server hashes it as schema
/// 19 did, and a chain whose newest link is keyed refuses the append: a
/// process started before the chain was keyed must be restarted with the
/// key (startup refuses it without one).
async fn append(
    conn: &mut PgConnection,
    schema: &str,
    key: Option<&LedgerKey>,
    link: NewLink,
) -> Result<i64, sqlx::Error> {
    statements::lock(schema).query().execute(&mut *conn).await?;
    let digest = chain::digest(&link.record);
    let Some(key) = key else {
        let values = statements::Append {
            kind: link.kind.as_str(),
            subject: link.subject,
            record: link.record,
            digest,
            covers: link.covers,
        };
        return statements::append(schema, values)
            .query_scalar::<i64>()
            .fetch_optional(&mut *conn)
            .await?
            .ok_or_else(|| {
                sqlx::Error::Protocol(format!(
                    "the ledger's hash chain has no unkeyed link to follow: it is keyed (this process has no {}: restart it with the key), or its start link is gone (run `cohort verify`)",
                    chain::LEDGER_KEY_ENV
                ))
            });
    };
    let head = statements::keyed_head(schema)
        .query_as::<(i64, String, DateTime<Utc>)>()
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| {
            sqlx::Error::Protocol(
                "the ledger's hash chain has no link to follow (its start link is gone): run `cohort verify`".into(),
            )
        })?;
    let (head_id, prev, now) = head;
    let link_id = head_id + 1;
    // The hash covers the time in microseconds, as stored.
    let linked_at = DateTime::<Utc>::from_timestamp_micros(chain::micros(now)).unwrap_or(now);
    let hash = chain::keyed_link_hash(
        &prev,
        link_id,
        link.kind,
        link.subject,
        &digest,
        chain::micros(linked_at),
    );
    let values = statements::AppendKeyed {
        link_id,
        kind: link.kind.as_str(),
        subject: link.subject,
        record: link.record,
        digest,
        prev,
        mac: key.mac(&hash),
        link: hash,
        covers: link.covers,
        linked_at,
    };
    statements::append_keyed(schema, values)
        .query()
        .execute(&mut *conn)
        .await?;
    Ok(link_id)
}

/// A link to append: what it stands for and its record.
struct NewLink {
    kind: LinkKind,
    subject: Option<Uuid>,
    record: String,
    covers: Vec<i64>,
}

impl NewLink {
    fn of(kind: LinkKind, subject: Option<Uuid>, record: String) -> Self {
        Self {
            kind,
            subject,
            record,
            covers: Vec::new(),
        }
    }
}

/// Keys the chain: appends a `key` link naming `key`, signed with it, in
/// its own transaction. Nothing when the newest `key` link already names
/// it; refused when the chain is keyed with another key.
pub(crate) async fn key_chain(
    conn: &mut PgConnection,
    schema: &str,
    key: &LedgerKey,
) -> Result<Option<i64>, crate::error::Error> {
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
    statements::lock(schema).query().execute(&mut *tx).await?;
    if let Some(id) = crate::validate::chain_key::keyed_with(&mut tx, schema).await? {
        tx.rollback().await?;
        return if id == key.id() {
            Ok(None)
        } else {
            Err(crate::error::Error::Config(crate::error::Problems::one(format!(
                "the ledger's chain is keyed with key {id}, and {} is key {}: a chain keeps one key",
                chain::LEDGER_KEY_ENV,
                key.id()
            ))))
        };
    }
    let record = chain::canonical(&chain::KeyRecord { key_id: key.id() });
    let link_id = append(
        &mut tx,
        schema,
        Some(key),
        NewLink::of(LinkKind::Key, None, record),
    )
    .await?;
    tx.commit().await?;
    Ok(Some(link_id))
}

/// How a run comes to be settled. [`settle_run`] writes it and links it
/// in one call: no other code runs these statements (the layer test holds
/// them to this file), so a settled run is never left out of the chain.
pub(crate) enum Settling {
    /// The executor settles its own run.
    Ran(crate::sql::ledger::SettleRun),
    /// A run a lost owner left `started`, settled `failed` (no row when it
    /// settled meanwhile).
    Recovered(crate::sql::queue::Recover),
    /// A scheduled pass that never started, recorded `failed` at once.
    NotStarted(crate::sql::ledger::InsertNotStarted),
}

/// Writes `settling` in the caller's transaction and links the run in the
/// chain there; the run as settled (`None`: nothing was settled, and
/// nothing linked).
pub(crate) async fn settle_run(
    tx: &mut PgConnection,
    ready: &crate::context::Prepared,
    (schema, key): (&str, Option<&LedgerKey>),
    run_id: Uuid,
    settling: Settling,
) -> Result<Option<crate::sql::ledger::SettledRow>, sqlx::Error> {
    let row: Option<crate::sql::ledger::SettledRow> = match settling {
        Settling::Ran(p) => {
            let statement = ready.ledger.settle_run(p);
            statement.query_as().fetch_optional(&mut *tx).await?
        }
        Settling::Recovered(p) => {
            let statement = ready.queue.recover_run(p);
            statement.query_as().fetch_optional(&mut *tx).await?
        }
        Settling::NotStarted(p) => {
            let statement = ready.ledger.insert_not_started(p);
            statement.query_as().fetch_optional(&mut *tx).await?
        }
    };
    if row.is_some() {
        link_run(tx, schema, key, run_id).await?;
    }
    Ok(row)
}

/// Places a hold in the caller's transaction and links it there; the
/// hold's row (`None`: its expiry was past, and nothing was written).
pub(crate) async fn place_hold(
    tx: &mut PgConnection,
    ready: &crate::context::Prepared,
    (schema, key): (&str, Option<&LedgerKey>),
    insert: crate::sql::ledger::InsertHold,
) -> Result<Option<crate::sql::ledger::HoldRow>, sqlx::Error> {
    let hold_id = insert.hold_id;
    let row = ready
        .ledger
        .insert_hold(insert)
        .query_as::<crate::sql::ledger::HoldRow>()
        .fetch_optional(&mut *tx)
        .await?;
    if row.is_some() {
        link_hold_placed(tx, schema, key, hold_id).await?;
    }
    Ok(row)
}

/// Releases a hold in the caller's transaction and links the release
/// there; the hold's row (`None`: no hold in force has that id).
pub(crate) async fn release_hold(
    tx: &mut PgConnection,
    ready: &crate::context::Prepared,
    (schema, key): (&str, Option<&LedgerKey>),
    hold_id: Uuid,
) -> Result<Option<crate::sql::ledger::HoldRow>, sqlx::Error> {
    let row = ready
        .ledger
        .release_hold(hold_id)
        .query_as::<crate::sql::ledger::HoldRow>()
        .fetch_optional(&mut *tx)
        .await?;
    if let Some(at) = row.as_ref().and_then(|r| r.released_at) {
        link_hold_released(tx, schema, key, hold_id, at).await?;
    }
    Ok(row)
}

/// Links a settled run (read back in this transaction, as settled).
async fn link_run(
    conn: &mut PgConnection,
    schema: &str,
    key: Option<&LedgerKey>,
    run_id: Uuid,
) -> Result<(), sqlx::Error> {
    let record = read_runs(&mut *conn, schema, &[run_id])
        .await?
        .remove(&run_id)
        .ok_or(sqlx::Error::RowNotFound)?;
    append(
        conn,
        schema,
        key,
        NewLink::of(LinkKind::Run, Some(run_id), chain::canonical(&record)),
    )
    .await
    .map(drop)
}

/// Links a hold just placed (read back in this transaction).
async fn link_hold_placed(
    conn: &mut PgConnection,
    schema: &str,
    key: Option<&LedgerKey>,
    hold_id: Uuid,
) -> Result<(), sqlx::Error> {
    let rows = read_holds(&mut *conn, schema, &[hold_id])
        .await?
        .remove(&hold_id)
        .ok_or(sqlx::Error::RowNotFound)?;
    append(
        conn,
        schema,
        key,
        NewLink::of(
            LinkKind::HoldPlaced,
            Some(hold_id),
            chain::canonical(&rows.placed),
        ),
    )
    .await
    .map(drop)
}

/// Links a hold's release.
async fn link_hold_released(
    conn: &mut PgConnection,
    schema: &str,
    key: Option<&LedgerKey>,
    hold_id: Uuid,
    released_at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    let record = ReleaseRecord {
        hold_id,
        released_at: chain::micros(released_at),
    };
    append(
        conn,
        schema,
        key,
        NewLink::of(
            LinkKind::HoldReleased,
            Some(hold_id),
            chain::canonical(&record),
        ),
    )
    .await
    .map(drop)
}

/// A line of a request's history as read: its request, what its link
/// records, and its text (the record holds only the text's digest).
pub(crate) struct EventLine {
    pub(crate) request_id: Uuid,
    pub(crate) part: RequestEventPart,
    pub(crate) detail: String,
}

/// The history lines of `ids`, by event id.
pub(crate) async fn read_request_events(
    conn: &mut PgConnection,
    schema: &str,
    ids: &[i64],
) -> Result<HashMap<i64, EventLine>, sqlx::Error> {
    let rows = statements::request_events(schema, ids.to_vec())
        .query_as::<statements::RequestEventRow>()
        .fetch_all(&mut *conn)
        .await?;
    let mut out = HashMap::new();
    for r in rows {
        let part = RequestEventPart {
            event_id: r.event_id,
            state: r.state,
            at: chain::micros(r.at),
            run_id: r.run_id,
            detail: chain::digest(&r.detail),
            recorded_by: r.recorded_by,
        };
        let line = EventLine {
            request_id: r.request_id,
            part,
            detail: r.detail,
        };
        out.insert(r.event_id, line);
    }
    Ok(out)
}

/// The requests of `ids`, as their links record them.
pub(crate) async fn read_requests(
    conn: &mut PgConnection,
    schema: &str,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, RequestPart>, sqlx::Error> {
    let rows = statements::requests(schema, ids.to_vec())
        .query_as::<statements::RequestRow>()
        .fetch_all(&mut *conn)
        .await?;
    let mut out = HashMap::new();
    for r in rows {
        let part = RequestPart {
            request_id: r.request_id,
            reference: r.reference,
            tenant_id: r.tenant_id,
            subject_hash: r.subject_hash,
            state: r.state,
            received_at: chain::micros(r.received_at),
            due_at: chain::micros(r.due_at),
            completed_at: micros(r.completed_at),
            scope: Some(chain::RequestScope {
                subject_kind: r.subject_kind,
                stage: r.stage,
                allow_soft_delete: r.allow_soft_delete,
            }),
        };
        out.insert(part.request_id, part);
    }
    Ok(out)
}

/// Links a line of a request's history just written (and the request as
/// it stands after it), in the same transaction, which must be READ
/// COMMITTED.
pub(crate) async fn link_request_event(
    conn: &mut PgConnection,
    schema: &str,
    key: Option<&LedgerKey>,
    event_id: i64,
) -> Result<(), sqlx::Error> {
    let EventLine {
        request_id,
        part: event,
        ..
    } = read_request_events(&mut *conn, schema, &[event_id])
        .await?
        .remove(&event_id)
        .ok_or(sqlx::Error::RowNotFound)?;
    let request = read_requests(&mut *conn, schema, &[request_id])
        .await?
        .remove(&request_id)
        .ok_or(sqlx::Error::RowNotFound)?;
    let record = chain::canonical(&RequestRecord { event, request });
    append(
        conn,
        schema,
        key,
        NewLink::of(LinkKind::Request, Some(request_id), record),
    )
    .await
    .map(drop)
}

/// Before the records of `subjects` (runs or holds) are deleted, in the
/// same transaction: a checkpoint link standing for their links, with the
/// pass's cutoffs. Nothing when none of them was linked.
pub(crate) async fn checkpoint(
    conn: &mut PgConnection,
    schema: &str,
    key: Option<&LedgerKey>,
    subjects: &[Uuid],
    cutoffs: PruneCutoffs,
) -> Result<(), sqlx::Error> {
    if subjects.is_empty() {
        return Ok(());
    }
    let pruned: Vec<PrunedLink> = statements::links_of(schema, subjects.to_vec())
        .query_as::<(i64, String)>()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|(link_id, digest)| PrunedLink { link_id, digest })
        .collect();
    if pruned.is_empty() {
        return Ok(());
    }
    let covers = pruned.iter().map(|p| p.link_id).collect();
    let record = chain::canonical(&CheckpointRecord { cutoffs, pruned });
    let link = NewLink {
        covers,
        ..NewLink::of(LinkKind::Checkpoint, None, record)
    };
    append(conn, schema, key, link).await.map(drop)
}
