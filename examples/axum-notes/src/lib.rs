//! Cohort in an axum application.
//!
//! - [`Note`]: a row type deriving `Retained` (purged 30 days after it was
//!   written; its author is an erasure subject).
//! - [`LogDeletion`]: a durable row handler: for every note Cohort purges
//!   (by sweep or erasure), a line in `app.deletion_log`, delivered at
//!   least once after the purge commits.
//! - [`router`]: `DELETE /tenants/{tenant}/notes/{id}` (the application's
//!   own delete, guarded against legal holds) and `POST
//!   /tenants/{tenant}/erasure` (right to erasure; the subject travels in
//!   the body, never in a URL that access logs keep).
//! - [`retention`]: the validated Cohort handle; `main.rs` spawns the
//!   background services (scheduled worker, dispatcher) beside the server.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::guarded::{Guarded, GuardedDeletion};
use cohort::handlers::{
    AfterContext, BeforeContext, HandlerError, HandlerRegistration, RowHandler, SnapshotValue,
};
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::sqlx::PgPool;
use cohort::{Cohort, ErrorKind, Retained};
use uuid::Uuid;

/// The tables this application owns (its own migrations would create them).
pub const SCHEMA_SQL: &str = "CREATE SCHEMA IF NOT EXISTS app;
    CREATE TABLE IF NOT EXISTS app.notes (id uuid PRIMARY KEY, tenant_id uuid NOT NULL,
        author_id uuid NOT NULL, created_at timestamptz NOT NULL, body text NOT NULL);
    CREATE INDEX IF NOT EXISTS notes_tenant_created_idx ON app.notes (tenant_id, created_at);
    CREATE TABLE IF NOT EXISTS app.deletion_log (note_id uuid NOT NULL, run_id uuid NOT NULL,
        action text NOT NULL, PRIMARY KEY (note_id, run_id));";

/// Cohort's ledger schema in this application.
pub const COHORT_SCHEMA: &str = "retention";

/// A note.
#[derive(Debug, Clone, Retained, sqlx::FromRow)]
#[retain(
    category = "notes",
    anchor = "created_at",
    id = "0e2c6a53-1c6f-4b0e-9f1a-7d3b2c5e8a41",
    table = "app.notes"
)]
pub struct Note {
    /// The note's id.
    pub id: Uuid,
    /// The owning tenant.
    pub tenant_id: Uuid,
    /// Who wrote it: erasing this person erases their notes.
    #[erasure_subject]
    pub author_id: Uuid,
    /// When it was written (the retention anchor).
    pub created_at: DateTime<Utc>,
    /// The text (never captured, logged or shown).
    pub body: String,
}

/// Writes one line per purged note to `app.deletion_log`, idempotently
/// (a delivery may be repeated).
pub struct LogDeletion {
    /// Where to write.
    pub pool: PgPool,
}

#[cohort::async_trait]
impl RowHandler<Note> for LogDeletion {
    async fn on_before(&self, row: &Note, ctx: &mut BeforeContext) -> Result<(), HandlerError> {
        // Capture only what the side effect needs: the id, not the text.
        ctx.snapshot.insert("id", row.id)?;
        Ok(())
    }

    async fn on_after(&self, ctx: &AfterContext) -> Result<(), HandlerError> {
        let Some(SnapshotValue::Uuid(id)) = ctx.snapshot.get("id") else {
            return Err("no id captured".into());
        };
        cohort::sqlx::query(
            "INSERT INTO app.deletion_log (note_id, run_id, action) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(ctx.run_id)
        .bind(ctx.strategy.as_str())
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// The validated Cohort handle: notes purged after 30 days, deletions
/// logged by [`LogDeletion`]. `config` comes from the environment
/// (`COHORT_…` variables) in `main.rs`.
pub async fn retention(
    pool: PgPool,
    config: cohort::CohortConfig,
) -> Result<Cohort, cohort::Error> {
    let rules = StaticRuleProvider::builder()
        .category(
            "notes",
            RetentionRule::new("30d".parse().expect("a period"), Strategy::Purge),
        )
        .build()
        .expect("consistent rules");
    Cohort::builder(pool.clone())
        .config(config)
        .entity::<Note>()
        .rules(rules)
        .handler::<Note, _>(
            HandlerRegistration::new(Note::RETENTION_ENTITY_ID, "deletion-log"),
            LogDeletion { pool },
        )
        .build()
        .await
}

/// The routes, on a shared handle.
pub fn router(cohort: Cohort) -> Router {
    Router::new()
        .route("/tenants/{tenant}/notes/{id}", delete(delete_note))
        .route("/tenants/{tenant}/erasure", post(erase))
        .with_state(Arc::new(cohort))
}

/// A Cohort error as an HTTP answer: bad input 400, unknown 404, refusals
/// 409, anything else 500 (its text only in the log).
fn failure(e: cohort::Error) -> Response {
    let status = match e.kind() {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Refused | ErrorKind::Conflict => StatusCode::CONFLICT,
        k if k.is_bad_input() => StatusCode::BAD_REQUEST,
        _ => {
            tracing::error!(error = %e, "request failed");
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(serde_json::json!({"error": "internal error"})),
            )
                .into_response();
        }
    };
    (status, Json(serde_json::json!({ "error": e.to_string() }))).into_response()
}

async fn delete_note(
    State(cohort): State<Arc<Cohort>>,
    Path((tenant, id)): Path<(String, String)>,
) -> Response {
    let request = GuardedDeletion::new(Note::RETENTION_ENTITY_ID, [id.clone()]).tenant(tenant);
    let outcome = cohort
        .guarded_delete(request, move |tx| {
            Box::pin(async move {
                let id: Uuid = id.parse()?;
                cohort::sqlx::query("DELETE FROM app.notes WHERE id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                Ok(())
            })
        })
        .await;
    match outcome {
        Ok(Guarded::Completed(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Guarded::Protected { held }) => (
            StatusCode::CONFLICT,
            Json(serde_json::json!({ "error": "under legal hold", "held": held })),
        )
            .into_response(),
        Err(e) => failure(e),
    }
}

/// `POST /tenants/{tenant}/erasure` body.
#[derive(serde::Deserialize)]
pub struct ErasureBody {
    /// The person's id.
    pub subject: String,
}

async fn erase(
    State(cohort): State<Arc<Cohort>>,
    Path(tenant): Path<String>,
    Json(body): Json<ErasureBody>,
) -> Response {
    let request = ErasureRequest::tenanted(tenant, ErasureScope::new(body.subject), Utc::now());
    match cohort.erase(request).await {
        Ok(r) => Json(serde_json::json!({
            "run_id": r.run_id,
            "status": r.status,
            "affected": r.affected(),
            "held": r.entities.iter().map(|e| e.held).sum::<u64>(),
        }))
        .into_response(),
        Err(e) => failure(e),
    }
}
