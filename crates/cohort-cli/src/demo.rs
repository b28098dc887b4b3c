//! `cohort demo`: a throw-away PostgreSQL, sample tables and a policy file,
//! Cohort's schema migrated, the policy validated and the retention plan
//! printed. Needs only Rust and the PostgreSQL server binaries.

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::holds::HoldRequest;
use cohort::policy::{PolicyFile, TenantEntry};
use cohort::rules::{ResolutionContext, TenantContext};
use cohort::validate::ValidatedModel;
use cohort::{Cohort, PreviewRequest, SweepRequest};
use cohort_pgtemp::Cluster;
use serde_json::json;
use sqlx::Connection;

use crate::output;
use crate::Failure;

/// The demo's policy file, also a worked example of the format.
pub(crate) const DEMO_POLICY: &str = r#"
[cohort]
schema = "cohort"            # Cohort's ledger lives apart from the application's tables

[[entity]]
name = "SessionNote"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.session_notes"
category = "session-notes"
anchor = "created_at"

[[entity]]
name = "CaseContact"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "app.case_contacts"
category = "case-contacts"
anchor = "created_at"
subjects = ["user_id", { column = "delegate_user_id", kind = "user" }]
anonymise = { email = "null", full_name = "empty", phone = { literal = "[redacted]" }, reference = "hash" }

[[entity]]
name = "Ticket"
id = "3c1f0d4e-8a7b-4c2d-9e6f-0a1b2c3d4e5f"
table = "app.tickets"
category = "tickets"
anchor = "closed_at"
subjects = ["requester_id"]

[[entity]]
name = "Invoice"
id = "9e8d7c6b-5a49-4838-a726-1514f3e2d1c0"
table = "app.invoices"
category = "invoices"
anchor = "issued_at"

[[entity]]
name = "LoginEvent"
id = "5f0e9d8c-7b6a-4594-8382-716e5d4c3b2a"
table = "app.login_events"
category = "login-events"
anchor = "created_at"
subjects = [{ column = "user_id", kind = "user" }]
anonymise = { ip_address = "null" }
archive_table = "archive.login_events"     # moved here, with archived_at and run_id
archive_anonymise = true                   # the copy keeps no IP address

[[entity]]
name = "ArchivedLoginEvent"                # the archive is retained too, and erasure reaches it
id = "6a1f0e9d-8c7b-4a65-9493-827f6e5d4c3b"
table = "archive.login_events"
category = "login-archive"
anchor = "archived_at"
subjects = [{ column = "user_id", kind = "user" }]

[[category]]
name = "session-notes"
strategy = "purge"
period = "30d"
source = "retention policy v3"
reason = "operational notes"

[[category]]
name = "case-contacts"
strategy = "anonymise"
period = "90d"
audit = "per_row"

[[category.override]]
tenant = "22222222-2222-2222-2222-222222222222"
period = "180d"

[[category]]
name = "tickets"
strategy = "soft_delete"
period = "10d"
legal_min = "14d"

[[category]]
name = "invoices"
strategy = "exempt"
period = "0d"
reason = "kept for the tax authority"

[[category]]
name = "login-events"
strategy = "archive"
period = "60d"

[[category]]
name = "login-archive"
strategy = "purge"
period = "2y"

[[tenant]]
id = "11111111-1111-1111-1111-111111111111"
jurisdiction = "UK"

[[tenant]]
id = "22222222-2222-2222-2222-222222222222"
jurisdiction = "EU"
"#;

/// Sample tables and rows: two tenants, rows of several ages, rows exactly
/// on a cutoff and rows with NULL anchors.
pub(crate) const DEMO_SQL: &str = r#"
CREATE SCHEMA app;
CREATE TABLE app.session_notes (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id uuid NOT NULL,
    created_at timestamptz,
    body text NOT NULL
);
CREATE INDEX ON app.session_notes (tenant_id, created_at);
CREATE TABLE app.case_contacts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id uuid NOT NULL,
    created_at timestamptz NOT NULL,
    anonymised_at timestamptz,
    email text,
    full_name text NOT NULL,
    phone text NOT NULL,
    reference text NOT NULL,
    user_id uuid NOT NULL,
    delegate_user_id uuid
);
CREATE INDEX ON app.case_contacts (tenant_id, created_at) WHERE anonymised_at IS NULL;
CREATE INDEX ON app.case_contacts (user_id);
CREATE INDEX ON app.case_contacts (delegate_user_id);
CREATE TABLE app.tickets (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id uuid NOT NULL,
    closed_at timestamptz,
    is_deleted boolean NOT NULL DEFAULT false,
    deleted_at timestamptz,
    requester_id uuid NOT NULL,
    subject text NOT NULL
);
CREATE INDEX ON app.tickets (tenant_id, closed_at) WHERE is_deleted IS NOT TRUE;
CREATE INDEX ON app.tickets (requester_id);
CREATE TABLE app.invoices (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id uuid NOT NULL,
    issued_at timestamptz NOT NULL,
    amount_pence bigint NOT NULL
);

CREATE TABLE app.login_events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id uuid NOT NULL,
    created_at timestamptz NOT NULL,
    user_id uuid NOT NULL,
    ip_address text
);
CREATE INDEX ON app.login_events (tenant_id, created_at);
CREATE INDEX ON app.login_events (user_id);
CREATE SCHEMA archive;
CREATE TABLE archive.login_events (
    id bigint PRIMARY KEY,
    tenant_id uuid NOT NULL,
    created_at timestamptz NOT NULL,
    user_id uuid NOT NULL,
    ip_address text,
    archived_at timestamptz NOT NULL,
    run_id uuid NOT NULL
);
CREATE INDEX ON archive.login_events (tenant_id, archived_at);
CREATE INDEX ON archive.login_events (user_id);

INSERT INTO app.login_events (tenant_id, created_at, user_id, ip_address)
VALUES
 ('11111111-1111-1111-1111-111111111111', now() - interval '100 days', 'aaaaaaaa-0000-0000-0000-000000000001', '198.51.100.7'),
 ('11111111-1111-1111-1111-111111111111', now() - interval '10 days', 'aaaaaaaa-0000-0000-0000-000000000001', '198.51.100.7'),
 ('11111111-1111-1111-1111-111111111111', now() - interval '100 days', 'aaaaaaaa-0000-0000-0000-000000000002', '203.0.113.9'),
 ('22222222-2222-2222-2222-222222222222', now() - interval '100 days', 'aaaaaaaa-0000-0000-0000-000000000001', '192.0.2.44');

INSERT INTO app.session_notes (tenant_id, created_at, body)
SELECT t::uuid, now() - make_interval(days => d), 'note ' || d || ' days old'
FROM unnest(ARRAY['11111111-1111-1111-1111-111111111111', '22222222-2222-2222-2222-222222222222']) t,
     unnest(ARRAY[1, 29, 31, 45, 400]) d;
INSERT INTO app.session_notes (tenant_id, created_at, body)
VALUES ('11111111-1111-1111-1111-111111111111', NULL, 'note without a creation time');

INSERT INTO app.case_contacts (tenant_id, created_at, email, full_name, phone, reference, user_id, delegate_user_id)
VALUES
 ('11111111-1111-1111-1111-111111111111', now() - interval '120 days', 'ada@example.com', 'Ada Lovelace', '+44 20 7946 0001', 'REF-1001', 'aaaaaaaa-0000-0000-0000-000000000001', NULL),
 ('11111111-1111-1111-1111-111111111111', now() - interval '10 days', 'ada@example.com', 'Ada Lovelace', '+44 20 7946 0001', 'REF-1002', 'aaaaaaaa-0000-0000-0000-000000000001', NULL),
 ('11111111-1111-1111-1111-111111111111', now() - interval '200 days', 'alan@example.com', 'Alan Turing', '+44 20 7946 0002', 'REF-1003', 'aaaaaaaa-0000-0000-0000-000000000002', 'aaaaaaaa-0000-0000-0000-000000000001'),
 ('11111111-1111-1111-1111-111111111111', now() - interval '30 days', 'ada@example.com', 'Ada Lovelace', '+44 20 7946 0001', 'REF-1004', 'aaaaaaaa-0000-0000-0000-000000000001', NULL),
 ('22222222-2222-2222-2222-222222222222', now() - interval '120 days', 'grace@example.com', 'Grace Hopper', '+1 555 0100', 'REF-2001', 'aaaaaaaa-0000-0000-0000-000000000001', NULL);

INSERT INTO app.tickets (tenant_id, closed_at, requester_id, subject)
SELECT '11111111-1111-1111-1111-111111111111', now() - make_interval(days => d), 'aaaaaaaa-0000-0000-0000-000000000001', 'ticket closed ' || d || ' days ago'
FROM unnest(ARRAY[3, 12, 20]) d;
INSERT INTO app.tickets (tenant_id, closed_at, requester_id, subject)
VALUES ('11111111-1111-1111-1111-111111111111', NULL, 'aaaaaaaa-0000-0000-0000-000000000002', 'still open');

INSERT INTO app.invoices (tenant_id, issued_at, amount_pence)
VALUES ('11111111-1111-1111-1111-111111111111', now() - interval '3000 days', 12000),
       ('22222222-2222-2222-2222-222222222222', now() - interval '5 days', 990);
"#;

/// Writes the demo's policy file to `path` to start from (never over an
/// existing file).
/// `cohort demo`: writes the demo's policy file to `write_policy`, or
/// runs the demo.
pub(crate) async fn start(
    write_policy: Option<&std::path::Path>,
    json: bool,
) -> Result<(), Failure> {
    match write_policy {
        Some(path) => self::write_policy(path),
        None => run(json).await,
    }
}

pub(crate) fn write_policy(path: &std::path::Path) -> Result<(), Failure> {
    use std::io::Write;
    let text = format!(
        "# The policy file of `cohort demo`, to adapt to your own tables.\n\
         # The `hash` anonymise method needs a secret key of 16 bytes or more:\n\
         # export COHORT_HASH_KEY=... (keep it outside this file and the database).\n{DEMO_POLICY}"
    );
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| {
            Failure::Input(cohort::Error::Config(
                format!("cannot write {}: {e}", path.display()).into(),
            ))
        })?;
    file.write_all(text.as_bytes()).map_err(|e| {
        Failure::Run(cohort::Error::Config(
            format!("cannot write {}: {e}", path.display()).into(),
        ))
    })?;
    outln!("Wrote the demo policy to {}.", path.display());
    Ok(())
}

/// Runs the demo: a sequence of named steps, each printing what it did
/// (or, with `--json`, one document at the end).
pub(crate) async fn run(json: bool) -> Result<(), Failure> {
    if !json {
        outln!("Cohort demo: a throw-away PostgreSQL with sample tables.\n");
    }
    let cluster = start_cluster(json).await?;
    let conn = create_tables(&cluster, json).await?;
    let dir = tempfile_dir()?;
    let notified = dir.join("notified.jsonl");
    let policy = demo_policy(&dir, &notified)?;
    let mut demo = install_and_validate(&cluster, conn, policy, json).await?;
    let plan = demo.retention_plan().await?;
    let preview = demo.preview().await?;
    let (held, hold) = demo.hold_a_due_note().await?;
    let subject_hold = demo.hold_alan().await?;
    let before = snapshot(&mut demo.conn).await?;
    let sweeps = demo.sweep_every_tenant().await?;
    let after = snapshot(&mut demo.conn).await?;
    let trail = demo.audit_trail(held).await?;
    let erasure = demo.erase_ada().await?;
    let delivery = demo.deliver(&notified).await?;

    if json {
        let model = &demo.model;
        outln!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "dispatch": delivery.passes,
                "dead_letters": delivery.letters,
                "notified": delivery.notified,
                "schema": demo.schema,
                "entities": model.entities.iter().map(|e| output::entity_json(e, model)).collect::<Vec<_>>(),
                "plan": plan,
                "warnings": model.warnings,
                "preview": preview,
                "hold": hold,
                "subject_hold": subject_hold,
                "sweeps": sweeps,
                "rows_before": before,
                "rows_after": after,
                "held_row_kept": trail.held_row_kept,
                "subject_row_kept": trail.subject_row_kept,
                "archived": trail.archived.0,
                "archived_with_ip_address": trail.archived.1,
                "erasure": erasure.result,
            }))
            .expect("JSON values serialise")
        );
    } else {
        print_changes(&before, &after, &trail);
        print_erasure(&demo.tenants[0].id, &erasure);
        print_delivery(&delivery);
        outln!("\nOn your own database: `cohort init` writes a starter policy file from your schema (or\n`cohort demo --write-policy cohort.toml` the demo's); then run `cohort migrate`, `cohort validate`, `cohort preview --tenant T`,\n`cohort sweep --tenant T` and `cohort erase --tenant T --subject S [--kind K]`. Run ids may be given\nby the 8 characters printed here (`cohort runs show {}`).", short(&erasure.result.run_id.to_string()));
    }
    drop(demo.conn);
    demo.cohort.pool().close().await;
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A database error of the demo's own queries.
fn db(e: sqlx::Error) -> Failure {
    Failure::Run(e.into())
}

/// A setup problem of the demo itself (a file it cannot write, a server it
/// cannot start).
fn setup(message: String) -> Failure {
    Failure::Run(cohort::Error::Config(message.into()))
}

/// Step 1: a throw-away PostgreSQL from the installed server binaries.
async fn start_cluster(json: bool) -> Result<Cluster, Failure> {
    let started = Instant::now();
    let cluster = Cluster::start()
        .await
        .map_err(|e| setup(format!("cannot start a throw-away PostgreSQL: {e}")))?;
    if !json {
        outln!(
            "1. Started PostgreSQL from {} in {:.1} s (it is removed when the demo ends).",
            cluster.binaries().bin_dir().display(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(cluster)
}

/// Step 2: the sample tables, rows of several ages for two tenants.
async fn create_tables(cluster: &Cluster, json: bool) -> Result<sqlx::PgConnection, Failure> {
    let mut conn = sqlx::PgConnection::connect_with(&cluster.connect_options())
        .await
        .map_err(db)?;
    sqlx::raw_sql(DEMO_SQL)
        .execute(&mut conn)
        .await
        .map_err(db)?;
    if !json {
        outln!("2. Created app.session_notes, app.case_contacts, app.tickets and app.invoices for two tenants,\n   with rows of several ages and some without an anchor time.");
    }
    Ok(conn)
}

/// The demo's policy file, written to `dir` and loaded: [`DEMO_POLICY`]
/// plus two command handlers on the session notes, one that fails its
/// first attempt and succeeds on the retry (appending to `notified`), one
/// that always fails and ends as a dead letter.
fn demo_policy(dir: &std::path::Path, notified: &std::path::Path) -> Result<PolicyFile, Failure> {
    let handlers = "[cohort.dispatch]\nbase_backoff = \"1s\"\nmax_attempts = 2\n\n";
    let note_handlers = format!(
        "[[entity.handler]]\nname = \"notify-archive\"\npriority = 1\ncapture = [\"body\"]\n\
         command = [\"sh\", \"-c\", \"f='{seen}'/seen-$COHORT_DELIVERY_ID; if [ -f \\\"$f\\\" ]; then d=$(cat); printf '%s\\\\n' \\\"$d\\\" >> '{out}'; else touch \\\"$f\\\"; exit 1; fi\"]\n\n\
         [[entity.handler]]\nname = \"crm-forget\"\npriority = 2\ncommand = [\"sh\", \"-c\", \"exit 3\"]\n\n",
        seen = dir.display(),
        out = notified.display()
    );
    let policy_text = DEMO_POLICY
        .replacen(
            "schema = \"cohort\"            # Cohort's ledger lives apart from the application's tables\n",
            &format!("schema = \"cohort\"            # Cohort's ledger lives apart from the application's tables\n\n{handlers}"),
            1,
        )
        .replacen(
            "anchor = \"created_at\"\n\n[[entity]]\nname = \"CaseContact\"",
            &format!("anchor = \"created_at\"\n\n{note_handlers}[[entity]]\nname = \"CaseContact\""),
            1,
        );
    let policy_path = dir.join("cohort.toml");
    std::fs::write(&policy_path, policy_text)
        .map_err(|e| setup(format!("cannot write the demo policy: {e}")))?;
    let mut policy = PolicyFile::load(&policy_path)?;
    if policy.config.hash_key.is_none() {
        // The `hash` method is keyed (HMAC-SHA256); a throw-away demo uses a
        // random key. Real deployments set COHORT_HASH_KEY and keep it.
        let key = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        policy.config.hash_key = Some(cohort::config::HashKey::new(key));
    }
    Ok(policy)
}

/// What the steps after validation share.
struct Demo {
    json: bool,
    /// A connection for the demo's own look at the tables.
    conn: sqlx::PgConnection,
    cohort: Cohort,
    model: Arc<ValidatedModel>,
    schema: String,
    tenants: Vec<TenantEntry>,
    /// The logical time of every run of the demo.
    now: chrono::DateTime<Utc>,
}

/// Steps 3 and 4: Cohort's tables installed, as `cohort migrate` does,
/// then the policy validated against the live catalog.
async fn install_and_validate(
    cluster: &Cluster,
    mut conn: sqlx::PgConnection,
    policy: PolicyFile,
    json: bool,
) -> Result<Demo, Failure> {
    let schema = policy.config.schema.clone();
    let report = cohort::schema::migrate(&mut conn, &schema).await?;
    if !json {
        outln!(
            "3. Installed Cohort's tables in schema {:?} (schema version {}), as `cohort migrate` does.",
            report.schema, report.to_version
        );
    }
    let tenants = policy.tenants.clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(cluster.connect_options())
        .await
        .map_err(db)?;
    let cohort = Cohort::builder(pool).policy(policy).build().await?;
    let model = cohort.ready().await?;
    if !json {
        outln!(
            "4. Validated the policy file against the live catalog: {} entities, no problems.\n",
            model.entities.len()
        );
        outln!(
            "{}",
            output::table(
                &[
                    "ENTITY",
                    "TABLE",
                    "CATEGORY",
                    "STRATEGIES",
                    "TENANT",
                    "ANCHOR"
                ],
                &output::entity_rows(&model)
            )
        );
    }
    Ok(Demo {
        json,
        conn,
        cohort,
        model,
        schema,
        tenants,
        now: Utc::now(),
    })
}

/// What the audit trail and the tables show after the sweeps.
struct Trail {
    /// The first anonymised contact: email, full name, phone, reference.
    contact: (Option<String>, String, String, String),
    held_row_kept: bool,
    /// Whether Alan's due case contact, under the hold on him, is untouched.
    subject_row_kept: bool,
    /// Login events moved to the archive, and how many of them still carry
    /// an IP address (none should).
    archived: (i64, i64),
    /// Per run and entity: tenant, entity, strategy, affected, held, NULL
    /// anchor, row details.
    summaries: Vec<(String, String, String, i64, i64, i64, i64)>,
}

/// Ada's erasure: the hold placed first, the run, and her rows after.
struct Erasure {
    hold_id: uuid::Uuid,
    result: cohort::ErasureResult,
    /// Tenant, reference, anonymised.
    rows: Vec<(String, String, bool)>,
}

/// The three dispatch passes and what they left.
struct Delivery {
    passes: [cohort::services::FlushReport; 3],
    letters: Vec<cohort::handlers::DeadLetter>,
    notified: usize,
}

impl Demo {
    /// Step 5: each entity's rule and cutoff for each tenant, now.
    async fn retention_plan(&self) -> Result<Vec<serde_json::Value>, Failure> {
        let input = |err: String| Failure::Input(cohort::Error::Config(err.into()));
        let mut rows = Vec::new();
        let mut plan = Vec::new();
        for tenant in &self.tenants {
            for e in &self.model.entities {
                let mut ctx = TenantContext::tenant(&tenant.id).with_tags(tenant.tags.clone());
                if let Some(j) = &tenant.jurisdiction {
                    ctx = ctx.with_jurisdiction(j);
                }
                let rule = self
                    .cohort
                    .rules()
                    .resolve(&ResolutionContext::new(&e.category, ctx, self.now))
                    .await
                    .map_err(|err| input(err.to_string()))?;
                let cutoff = rule
                    .sweep_cutoff(self.now)
                    .map_err(|err| input(err.to_string()))?;
                let cutoff_text = if rule.strategy().mutates() {
                    cutoff.format("%Y-%m-%d %H:%M").to_string()
                } else {
                    "never".into()
                };
                rows.push(vec![
                    tenant.id.clone(),
                    e.name.clone(),
                    rule.strategy().to_string(),
                    rule.period().to_string(),
                    rule.legal_min()
                        .map(|m| m.to_string())
                        .unwrap_or_else(|| "-".into()),
                    cutoff_text,
                ]);
                plan.push(json!({
                    "tenant": tenant.id,
                    "entity_id": e.id,
                    "entity": e.name,
                    "strategy": rule.strategy().as_str(),
                    "period": rule.period().to_string(),
                    "legal_min": rule.legal_min().map(|m| m.to_string()),
                    "cutoff": rule.strategy().mutates().then_some(cutoff),
                }));
            }
        }
        if !self.json {
            outln!("\n5. The retention plan at {} (UTC): rows anchored strictly before the cutoff are eligible;\n   rows exactly on it, newer rows and rows without an anchor are kept.\n", self.now.format("%Y-%m-%d %H:%M"));
            outln!(
                "{}",
                output::table(
                    &[
                        "TENANT",
                        "ENTITY",
                        "STRATEGY",
                        "PERIOD",
                        "LEGAL MIN",
                        "CUTOFF"
                    ],
                    &rows
                )
            );
            for w in &self.model.warnings {
                outln!("\nadvice: {w}");
            }
        }
        Ok(plan)
    }

    /// Step 6: the first tenant's preview, counts only.
    async fn preview(&self) -> Result<cohort::PreviewResult, Failure> {
        let uk = &self.tenants[0];
        let preview = self
            .cohort
            .preview(PreviewRequest::tenanted(&uk.id, self.now.fixed_offset()))
            .await?;
        if !self.json {
            outln!(
                "\n6. Preview for tenant {} (counts only, nothing written):\n",
                short(&uk.id)
            );
            outln!(
                "{}",
                output::table(
                    &output::OUTCOME_HEADERS,
                    &output::outcome_rows(&preview.entities)
                )
            );
        }
        Ok(preview)
    }

    /// Step 7: a legal hold on one note of the first tenant that is due
    /// for purging.
    async fn hold_a_due_note(&mut self) -> Result<(uuid::Uuid, cohort::holds::Hold), Failure> {
        let uk = &self.tenants[0];
        let held: uuid::Uuid = sqlx::query_scalar(
            "SELECT id FROM app.session_notes WHERE tenant_id = $1::uuid AND body = 'note 45 days old'",
        )
        .bind(&uk.id)
        .fetch_one(&mut self.conn)
        .await
        .map_err(db)?;
        let hold = self
            .cohort
            .create_hold(
                HoldRequest::new(
                    self.model
                        .find_entity("SessionNote")
                        .expect("demo entity")
                        .id,
                    held.to_string(),
                    "Litigation hold - case #12345",
                )
                .tenant(&uk.id),
            )
            .await?;
        if !self.json {
            outln!(
                "\n7. Placed legal hold {} on session note {} (45 days old, past its 30-day cutoff).",
                short(&hold.hold_id.to_string()),
                short(&held.to_string())
            );
        }
        Ok((held, hold))
    }

    /// Step 7, continued: a hold on a person, Alan (as a `user`): his
    /// 200-day-old case contact is past its cutoff, and every row of his,
    /// in any entity and tenant, now stays until the hold is released.
    async fn hold_alan(&mut self) -> Result<cohort::holds::Hold, Failure> {
        let hold = self
            .cohort
            .create_hold(
                HoldRequest::subject(
                    ALAN,
                    "Regulator's inquiry - keep everything about this person",
                )
                .kind("user"),
            )
            .await?;
        if !self.json {
            outln!(
                "   Placed hold {} on a person (kind `user`, as `cohort holds create --subject S --kind user`):
                    every row naming them, in any entity and tenant, now stays; his case contact REF-1003 is 200 days old.",
                short(&hold.hold_id.to_string()),
            );
        }
        Ok(hold)
    }

    /// Step 8: every tenant swept, as `cohort sweep --tenant T` does.
    async fn sweep_every_tenant(&self) -> Result<Vec<cohort::SweepResult>, Failure> {
        if !self.json {
            outln!("\n8. Swept both tenants, as `cohort sweep --tenant T` does:");
        }
        let mut sweeps = Vec::new();
        for t in &self.tenants {
            let mut req =
                SweepRequest::tenanted(&t.id, self.now.fixed_offset()).tags(t.tags.clone());
            if let Some(j) = &t.jurisdiction {
                req = req.jurisdiction(j);
            }
            let result = self.cohort.sweep(req).await?;
            if !self.json {
                outln!(
                    "\n   Tenant {} ({}): run {} {}.\n",
                    t.id,
                    t.jurisdiction.as_deref().unwrap_or("-"),
                    short(&result.run_id.to_string()),
                    result.status.as_str()
                );
                outln!(
                    "{}",
                    output::table(
                        &output::OUTCOME_HEADERS,
                        &output::outcome_rows(&result.entities)
                    )
                );
            }
            sweeps.push(result);
        }
        Ok(sweeps)
    }

    /// Steps 9 and 10 (read now, printed at the end): an anonymised
    /// contact, whether the held note is still there, and the ledger.
    async fn audit_trail(&mut self, held: uuid::Uuid) -> Result<Trail, Failure> {
        let contact = sqlx::query_as(
            "SELECT email, full_name, phone, reference FROM app.case_contacts WHERE anonymised_at IS NOT NULL ORDER BY id LIMIT 1",
        )
        .fetch_one(&mut self.conn)
        .await
        .map_err(db)?;
        let still_there: i64 =
            sqlx::query_scalar("SELECT count(*) FROM app.session_notes WHERE id = $1")
                .bind(held)
                .fetch_one(&mut self.conn)
                .await
                .map_err(db)?;
        let subject_row_kept: bool = sqlx::query_scalar(
            "SELECT anonymised_at IS NULL FROM app.case_contacts WHERE reference = 'REF-1003'",
        )
        .fetch_one(&mut self.conn)
        .await
        .map_err(db)?;
        let archived =
            sqlx::query_as("SELECT count(*), count(ip_address) FROM archive.login_events")
                .fetch_one(&mut self.conn)
                .await
                .map_err(db)?;
        let summaries = sqlx::query_as(
            "SELECT r.tenant_id, s.entity_type, s.strategy, s.affected_count, s.held_count, s.null_anchor_count, \
                    (SELECT count(*) FROM cohort.sweep_run_row_detail d WHERE d.run_id = r.run_id AND d.retention_entity_id = s.retention_entity_id) \
             FROM cohort.sweep_run r JOIN cohort.sweep_run_entity_summary s USING (run_id) ORDER BY r.started_at, s.summary_id",
        )
        .fetch_all(&mut self.conn)
        .await
        .map_err(db)?;
        Ok(Trail {
            contact,
            held_row_kept: still_there == 1,
            subject_row_kept,
            archived,
            summaries,
        })
    }

    /// Step 11: Ada's right to erasure in the first tenant, while one of
    /// her rows is under a legal hold.
    async fn erase_ada(&mut self) -> Result<Erasure, Failure> {
        let uk = &self.tenants[0];
        let held_contact: i64 =
            sqlx::query_scalar("SELECT id FROM app.case_contacts WHERE reference = 'REF-1004'")
                .fetch_one(&mut self.conn)
                .await
                .map_err(db)?;
        let hold = self
            .cohort
            .create_hold(
                HoldRequest::new(
                    self.model
                        .find_entity("CaseContact")
                        .expect("demo entity")
                        .id,
                    held_contact.to_string(),
                    "Subject access dispute - keep until resolved",
                )
                .tenant(&uk.id),
            )
            .await?;
        let result = self
            .cohort
            .erase(ErasureRequest::tenanted(
                &uk.id,
                ErasureScope::new(ADA).kind("user").allow_soft_delete(true),
                self.now.fixed_offset(),
            ))
            .await?;
        let rows = sqlx::query_as(
            "SELECT tenant_id::text, left(reference, 12), anonymised_at IS NOT NULL FROM app.case_contacts \
             WHERE user_id = $1::uuid OR delegate_user_id = $1::uuid ORDER BY tenant_id, id",
        )
        .bind(ADA)
        .fetch_all(&mut self.conn)
        .await
        .map_err(db)?;
        Ok(Erasure {
            hold_id: hold.hold_id,
            result,
            rows,
        })
    }

    /// Step 12: the row handlers' work delivered. notify-archive fails its
    /// first attempt and succeeds after the 1 s backoff; crm-forget always
    /// fails and is dead-lettered after its second attempt. The waits are
    /// the demo's own backoff, shown to the reader, not synchronisation.
    async fn deliver(&self, notified: &std::path::Path) -> Result<Delivery, Failure> {
        let dispatcher = self.cohort.dispatcher();
        let first = dispatcher.flush().await?;
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let second = dispatcher.flush().await?;
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let third = dispatcher.flush().await?;
        let letters = self
            .cohort
            .dead_letters(&cohort::handlers::DeadLetterFilter::all())
            .await?;
        let notified = std::fs::read_to_string(notified)
            .map(|t| t.lines().filter(|l| !l.trim().is_empty()).count())
            .unwrap_or(0);
        Ok(Delivery {
            passes: [first, second, third],
            letters,
            notified,
        })
    }
}

/// The data subject the demo erases.
const ADA: &str = "aaaaaaaa-0000-0000-0000-000000000001";
/// The person under a subject hold in the demo.
const ALAN: &str = "aaaaaaaa-0000-0000-0000-000000000002";

/// Steps 9 and 10, printed.
fn print_changes(before: &[(String, i64)], after: &[(String, i64)], trail: &Trail) {
    outln!("\n9. What changed (rows per table, before -> after):\n");
    let changes: Vec<Vec<String>> = before
        .iter()
        .zip(after)
        .map(|((name, b), (_, a))| vec![name.clone(), b.to_string(), a.to_string()])
        .collect();
    outln!("{}", output::table(&["TABLE", "BEFORE", "AFTER"], &changes));
    let contact = &trail.contact;
    outln!(
        "\n   The held note is still there: {}.\n   Alan's case contact, under the hold on him, is untouched: {}.\n   Login events moved to archive.login_events (each with archived_at and its run id): {}, with an IP address left: {}.\n   An anonymised contact now reads: email={}, full_name={}, phone={}, reference={}…",
        if trail.held_row_kept { "yes" } else { "NO" },
        if trail.subject_row_kept { "yes" } else { "NO" },
        trail.archived.0,
        trail.archived.1,
        shown(contact.0.as_deref()),
        shown(Some(contact.1.as_str())),
        shown(Some(contact.2.as_str())),
        &contact.3[..12.min(contact.3.len())]
    );
    outln!("\n10. The audit trail in schema \"cohort\" (sweep_run, sweep_run_entity_summary, sweep_run_row_detail):\n");
    let rows: Vec<Vec<String>> = trail
        .summaries
        .iter()
        .map(|r| {
            vec![
                r.0.clone(),
                r.1.clone(),
                r.2.clone(),
                r.3.to_string(),
                r.4.to_string(),
                r.5.to_string(),
                r.6.to_string(),
            ]
        })
        .collect();
    outln!(
        "{}",
        output::table(
            &[
                "TENANT",
                "ENTITY",
                "STRATEGY",
                "AFFECTED",
                "HELD",
                "NULL ANCHOR",
                "ROW DETAILS"
            ],
            &rows
        )
    );
}

/// Step 11, printed.
fn print_erasure(tenant: &str, erasure: &Erasure) {
    outln!(
        "\n11. Placed legal hold {} on Ada's contact REF-1004 (a subject access dispute), then erased\n    Ada (user {}) in tenant {}, as `cohort erase --tenant T --subject S --kind user` does: run {} {}.\n    The held contact row stays, her tickets are kept by their 14-day legal minimum (KEPT), and\n    her row in tenant 22222222-2222-2222-2222-222222222222 is out of scope.\n",
        short(&erasure.hold_id.to_string()),
        ADA,
        tenant,
        short(&erasure.result.run_id.to_string()),
        erasure.result.status.as_str()
    );
    outln!(
        "{}",
        output::table(
            &output::OUTCOME_HEADERS,
            &output::outcome_rows(&erasure.result.entities)
        )
    );
    let rows: Vec<Vec<String>> = erasure
        .rows
        .iter()
        .map(|r| {
            vec![
                r.0.clone(),
                r.1.clone(),
                if r.2 { "anonymised" } else { "intact" }.to_string(),
            ]
        })
        .collect();
    outln!(
        "\n{}",
        output::table(&["TENANT", "CONTACT", "STATE"], &rows)
    );
}

/// Step 12, printed.
fn print_delivery(delivery: &Delivery) {
    outln!(
        "\n12. Delivered the row handlers' work (`cohort dispatch --once` does the same). Each purged note\n    queued two deliveries in its batch's transaction: notify-archive, which fails its first attempt,\n    and crm-forget, which always fails.\n"
    );
    let passes: Vec<Vec<String>> = ["first", "after 1 s", "after 2 s"]
        .iter()
        .zip(&delivery.passes)
        .map(|(when, r)| {
            vec![
                when.to_string(),
                r.delivered.to_string(),
                r.failed.to_string(),
                r.dead_lettered.to_string(),
                r.pending.to_string(),
            ]
        })
        .collect();
    outln!(
        "{}",
        output::table(
            &["PASS", "DELIVERED", "FAILED", "DEAD-LETTERED", "PENDING"],
            &passes
        )
    );
    outln!(
        "\n   {} notification(s) reached the archive script, each with the note's captured body.\n   Dead letters (`cohort dead-letters list`; `cohort dead-letters retry ID` requeues one):\n",
        delivery.notified
    );
    let rows: Vec<Vec<String>> = delivery
        .letters
        .iter()
        .map(|l| {
            vec![
                l.id.to_string(),
                l.entity.clone(),
                l.handler.clone(),
                l.attempts.to_string(),
                l.last_error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    outln!(
        "{}",
        output::table(&["ID", "ENTITY", "HANDLER", "ATTEMPTS", "REASON"], &rows)
    );
}

/// A scrubbed value as SQL shows it (`NULL`, or quoted text).
fn shown(value: Option<&str>) -> String {
    value.map_or_else(|| "NULL".into(), |v| format!("'{v}'"))
}

fn short(id: &str) -> String {
    id.chars().take(8).collect()
}

fn tempfile_dir() -> Result<std::path::PathBuf, Failure> {
    let dir = std::env::temp_dir().join(format!("cohort-demo-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).map_err(|e| {
        Failure::Run(cohort::Error::Config(
            format!("cannot create {}: {e}", dir.display()).into(),
        ))
    })?;
    Ok(dir)
}

/// Row counts per demo table (soft-deleted and anonymised rows shown apart).
async fn snapshot(conn: &mut sqlx::PgConnection) -> Result<Vec<(String, i64)>, Failure> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT 'app.session_notes', count(*) FROM app.session_notes \
         UNION ALL SELECT 'app.case_contacts (not anonymised)', count(*) FROM app.case_contacts WHERE anonymised_at IS NULL \
         UNION ALL SELECT 'app.tickets (not deleted)', count(*) FROM app.tickets WHERE NOT is_deleted \
         UNION ALL SELECT 'app.invoices', count(*) FROM app.invoices \
         UNION ALL SELECT 'app.login_events', count(*) FROM app.login_events \
         UNION ALL SELECT 'archive.login_events (no IP address)', count(*) FROM archive.login_events WHERE ip_address IS NULL",
    )
    .fetch_all(conn)
    .await
    .map_err(|e| Failure::Run(e.into()))?;
    Ok(rows)
}
