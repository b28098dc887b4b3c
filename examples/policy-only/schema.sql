-- The application tables this example's policy file retains (in a real
-- deployment they already exist: they are your application's).
CREATE SCHEMA IF NOT EXISTS app;
CREATE TABLE IF NOT EXISTS app.tenants (id uuid PRIMARY KEY, region text NOT NULL, active boolean NOT NULL DEFAULT true);
CREATE TABLE IF NOT EXISTS app.session_notes (
    id uuid PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz NOT NULL,
    author_id uuid NOT NULL, body text NOT NULL);
CREATE INDEX IF NOT EXISTS session_notes_tenant_created_idx ON app.session_notes (tenant_id, created_at);
CREATE TABLE IF NOT EXISTS app.case_contacts (
    id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz NOT NULL,
    anonymised_at timestamptz, email text, full_name text NOT NULL, user_id uuid NOT NULL);
CREATE INDEX IF NOT EXISTS case_contacts_tenant_created_idx ON app.case_contacts (tenant_id, created_at);
CREATE TABLE IF NOT EXISTS app.access_log (id bigint PRIMARY KEY, occurred_at timestamptz NOT NULL, path text NOT NULL);
CREATE INDEX IF NOT EXISTS access_log_occurred_idx ON app.access_log (occurred_at);
