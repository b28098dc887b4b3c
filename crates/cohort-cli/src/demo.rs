//! `cohort demo`: a throw-away PostgreSQL, sample tables and a policy file,
//! Cohort's schema migrated, the policy validated and the retention plan
//! printed. Needs only Rust and the PostgreSQL server binaries.

use std::time::Instant;

use chrono::Utc;
use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::holds::HoldRequest;
use cohort::policy::PolicyFile;
use cohort::rules::{ResolutionContext, TenantContext};
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
CREATE INDEX ON app.case_contacts (tenant_id, created_at);
CREATE INDEX ON app.case_contacts (user_id);
CREATE TABLE app.tickets (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id uuid NOT NULL,
    closed_at timestamptz,
    is_deleted boolean NOT NULL DEFAULT false,
    deleted_at timestamptz,
    requester_id uuid NOT NULL,
    subject text NOT NULL
);
CREATE TABLE app.invoices (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id uuid NOT NULL,
    issued_at timestamptz NOT NULL,
    amount_pence bigint NOT NULL
);

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

pub(crate) async fn run(json: bool) -> Result<(), Failure> {
    let say = |text: &str| {
        if !json {
            outln!("{text}");
        }
    };
    say("Cohort demo: a throw-away PostgreSQL with sample tables.\n");
    let started = Instant::now();
    let cluster = Cluster::start().await.map_err(|e| {
        Failure::Run(cohort::Error::Config(
            format!("cannot start a throw-away PostgreSQL: {e}").into(),
        ))
    })?;
    say(&format!(
        "1. Started PostgreSQL from {} in {:.1} s (it is removed when the demo ends).",
        cluster.binaries().bin_dir().display(),
        started.elapsed().as_secs_f64()
    ));

    let mut conn = sqlx::PgConnection::connect_with(&cluster.connect_options())
        .await
        .map_err(|e| Failure::Run(e.into()))?;
    sqlx::raw_sql(DEMO_SQL)
        .execute(&mut conn)
        .await
        .map_err(|e| Failure::Run(e.into()))?;
    say("2. Created app.session_notes, app.case_contacts, app.tickets and app.invoices for two tenants,\n   with rows of several ages and some without an anchor time.");

    let dir = tempfile_dir()?;
    let policy_path = dir.join("cohort.toml");
    // The demo's policy adds two command handlers to the session notes: one
    // that fails its first attempt and succeeds on the retry, one that
    // always fails and ends as a dead letter.
    let notified = dir.join("notified.jsonl");
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
    std::fs::write(&policy_path, policy_text).map_err(|e| {
        Failure::Run(cohort::Error::Config(
            format!("cannot write the demo policy: {e}").into(),
        ))
    })?;
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
    let schema = policy.config.schema.clone();
    let report = cohort::schema::migrate(&mut conn, &schema).await?;
    say(&format!(
        "3. Installed Cohort's tables in schema {:?} (schema version {}), as `cohort migrate` does.",
        report.schema, report.to_version
    ));

    let tenants = policy.tenants.clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(cluster.connect_options())
        .await
        .map_err(|e| Failure::Run(e.into()))?;
    let cohort = Cohort::builder(pool).policy(policy).build().await?;
    let model = cohort.ready().await?;
    say(&format!(
        "4. Validated the policy file against the live catalog: {} entities, no problems.\n",
        model.entities.len()
    ));
    if !json {
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

    // The plan: each entity's rule and cutoff for each tenant, now.
    let now = Utc::now();
    let mut rows = Vec::new();
    let mut plan = Vec::new();
    for tenant in &tenants {
        for e in &model.entities {
            let mut ctx = TenantContext::tenant(&tenant.id);
            if let Some(j) = &tenant.jurisdiction {
                ctx = ctx.with_jurisdiction(j);
            }
            let rule = cohort
                .rules()
                .resolve(&ResolutionContext::new(&e.category, ctx, now))
                .await
                .map_err(|err| Failure::Input(cohort::Error::Config(err.to_string().into())))?;
            let cutoff = rule
                .sweep_cutoff(now)
                .map_err(|err| Failure::Input(cohort::Error::Config(err.to_string().into())))?;
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
                cutoff_text.clone(),
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
    if !json {
        outln!("\n5. The retention plan at {} (UTC): rows anchored strictly before the cutoff are eligible;\n   rows exactly on it, newer rows and rows without an anchor are kept.\n", now.format("%Y-%m-%d %H:%M"));
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
        for w in &model.warnings {
            outln!("\nadvice: {w}");
        }
    }

    // 6. Preview tenant 1: counts only.
    let uk = &tenants[0];
    let now_fixed = now.fixed_offset();
    let preview = cohort
        .preview(PreviewRequest::tenanted(&uk.id, now_fixed))
        .await?;
    if !json {
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

    // 7. A legal hold on one note that is due for purging.
    let held: uuid::Uuid = sqlx::query_scalar(
        "SELECT id FROM app.session_notes WHERE tenant_id = $1::uuid AND body = 'note 45 days old'",
    )
    .bind(&uk.id)
    .fetch_one(&mut conn)
    .await
    .map_err(|e| Failure::Run(e.into()))?;
    let hold = cohort
        .create_hold(
            HoldRequest::new(
                model.find_entity("SessionNote").expect("demo entity").id,
                held.to_string(),
                "Litigation hold - case #12345",
            )
            .tenant(&uk.id),
        )
        .await?;
    if !json {
        outln!(
            "\n7. Placed legal hold {} on session note {} (45 days old, past its 30-day cutoff).",
            short(&hold.hold_id.to_string()),
            short(&held.to_string())
        );
    }

    // 8. Sweep both tenants.
    let before = snapshot(&mut conn).await?;
    let mut sweeps = Vec::new();
    if !json {
        outln!("\n8. Swept both tenants, as `cohort sweep --tenant T` does:");
    }
    for t in &tenants {
        let mut req = SweepRequest::tenanted(&t.id, now_fixed);
        if let Some(j) = &t.jurisdiction {
            req = req.jurisdiction(j);
        }
        let result = cohort.sweep(req).await?;
        if !json {
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
    let after = snapshot(&mut conn).await?;

    // 9. What changed, and the audit trail.
    let contact: (Option<String>, String, String, String) = sqlx::query_as(
        "SELECT email, full_name, phone, reference FROM app.case_contacts WHERE anonymised_at IS NOT NULL ORDER BY id LIMIT 1",
    )
    .fetch_one(&mut conn)
    .await
    .map_err(|e| Failure::Run(e.into()))?;
    let still_there: i64 =
        sqlx::query_scalar("SELECT count(*) FROM app.session_notes WHERE id = $1")
            .bind(held)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| Failure::Run(e.into()))?;
    let audit: Vec<(String, String, String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT r.tenant_id, s.entity_type, s.strategy, s.affected_count, s.held_count, s.null_anchor_count, \
                (SELECT count(*) FROM cohort.sweep_run_row_detail d WHERE d.run_id = r.run_id AND d.retention_entity_id = s.retention_entity_id) \
         FROM cohort.sweep_run r JOIN cohort.sweep_run_entity_summary s USING (run_id) ORDER BY r.started_at, s.summary_id",
    )
    .fetch_all(&mut conn)
    .await
    .map_err(|e| Failure::Run(e.into()))?;
    // 11. Right to erasure for Ada in tenant 1; one of her rows is under a legal hold.
    let ada = "aaaaaaaa-0000-0000-0000-000000000001";
    let held_contact: i64 =
        sqlx::query_scalar("SELECT id FROM app.case_contacts WHERE reference = 'REF-1004'")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| Failure::Run(e.into()))?;
    let contact_hold = cohort
        .create_hold(
            HoldRequest::new(
                model.find_entity("CaseContact").expect("demo entity").id,
                held_contact.to_string(),
                "Subject access dispute - keep until resolved",
            )
            .tenant(&uk.id),
        )
        .await?;
    let erasure = cohort
        .erase(ErasureRequest::tenanted(
            &uk.id,
            ErasureScope::new(ada).kind("user").allow_soft_delete(true),
            now_fixed,
        ))
        .await?;
    let ada_rows: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT tenant_id::text, left(reference, 12), anonymised_at IS NOT NULL FROM app.case_contacts \
         WHERE user_id = $1::uuid OR delegate_user_id = $1::uuid ORDER BY tenant_id, id",
    )
    .bind(ada)
    .fetch_all(&mut conn)
    .await
    .map_err(|e| Failure::Run(e.into()))?;

    // 12. Deliver the row handlers' work: notify-archive fails its first
    // attempt and succeeds after the 1 s backoff; crm-forget always fails
    // and is dead-lettered after its second attempt.
    let dispatcher = cohort.dispatcher();
    let first_pass = dispatcher.flush().await?;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let second_pass = dispatcher.flush().await?;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let third_pass = dispatcher.flush().await?;
    let letters = cohort
        .dead_letters(&cohort::handlers::DeadLetterFilter::all())
        .await?;
    let notified_lines = std::fs::read_to_string(&notified)
        .map(|t| t.lines().filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(0);

    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "dispatch": [first_pass, second_pass, third_pass],
                "dead_letters": letters,
                "notified": notified_lines,
                "schema": schema,
                "entities": model.entities.iter().map(|e| output::entity_json(e, &model)).collect::<Vec<_>>(),
                "plan": plan,
                "warnings": model.warnings,
                "preview": preview,
                "hold": hold,
                "sweeps": sweeps,
                "rows_before": before,
                "rows_after": after,
                "held_row_kept": still_there == 1,
                "erasure": erasure,
            }))
            .expect("JSON values serialise")
        );
    } else {
        outln!("\n9. What changed (rows per table, before -> after):\n");
        let changes: Vec<Vec<String>> = before
            .iter()
            .zip(&after)
            .map(|((name, b), (_, a))| vec![name.clone(), b.to_string(), a.to_string()])
            .collect();
        outln!("{}", output::table(&["TABLE", "BEFORE", "AFTER"], &changes));
        outln!(
            "\n   The held note is still there: {}.\n   An anonymised contact now reads: email={}, full_name={}, phone={}, reference={}…",
            if still_there == 1 { "yes" } else { "NO" },
            shown(contact.0.as_deref()),
            shown(Some(contact.1.as_str())),
            shown(Some(contact.2.as_str())),
            &contact.3[..12.min(contact.3.len())]
        );
        outln!("\n10. The audit trail in schema \"cohort\" (sweep_run, sweep_run_entity_summary, sweep_run_row_detail):\n");
        let rows: Vec<Vec<String>> = audit
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
        outln!(
            "\n11. Placed legal hold {} on Ada's contact REF-1004 (a subject access dispute), then erased\n    Ada (user {}) in tenant {}, as `cohort erase --tenant T --subject S --kind user` does: run {} {}.\n    The held contact row stays, her tickets are kept by their 14-day legal minimum (KEPT), and\n    her row in tenant 22222222-2222-2222-2222-222222222222 is out of scope.\n",
            short(&contact_hold.hold_id.to_string()),
            ada,
            uk.id,
            short(&erasure.run_id.to_string()),
            erasure.status.as_str()
        );
        outln!(
            "{}",
            output::table(
                &output::OUTCOME_HEADERS,
                &output::outcome_rows(&erasure.entities)
            )
        );
        let rows: Vec<Vec<String>> = ada_rows
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
        outln!(
            "\n12. Delivered the row handlers' work (`cohort dispatch --once` does the same). Each purged note\n    queued two deliveries in its batch's transaction: notify-archive, which fails its first attempt,\n    and crm-forget, which always fails.\n"
        );
        let passes: Vec<Vec<String>> = [
            ("first", &first_pass),
            ("after 1 s", &second_pass),
            ("after 2 s", &third_pass),
        ]
        .iter()
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
            "\n   {notified_lines} notification(s) reached the archive script, each with the note's captured body.\n   Dead letters (`cohort dead-letters list`; `cohort dead-letters retry ID` requeues one):\n"
        );
        let rows: Vec<Vec<String>> = letters
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
        outln!("\nOn your own database: `cohort init` writes a starter policy file from your schema (or\n`cohort demo --write-policy cohort.toml` the demo's); then run `cohort migrate`, `cohort validate`, `cohort preview --tenant T`,\n`cohort sweep --tenant T` and `cohort erase --tenant T --subject S [--kind K]`. Run ids may be given\nby the 8 characters printed here (`cohort runs show {}`).", short(&erasure.run_id.to_string()));
    }
    drop(conn);
    cohort.pool().close().await;
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
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
         UNION ALL SELECT 'app.invoices', count(*) FROM app.invoices",
    )
    .fetch_all(conn)
    .await
    .map_err(|e| Failure::Run(e.into()))?;
    Ok(rows)
}
