-- Cohort schema version 1: the five tables of the retention ledger.
-- Table placeholders (a table name in braces) are replaced with quoted,
-- schema-qualified names by cohort::schema::migrations(schema).

CREATE TABLE {sweep_run} (
    run_id       uuid        NOT NULL,
    kind         text        NOT NULL,
    trigger      text        NOT NULL,
    dry_run      boolean     NOT NULL,
    tenant_id    text,
    status       text        NOT NULL,
    logical_now  timestamptz NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    settled_at   timestamptz,
    error        text,
    CONSTRAINT sweep_run_pkey PRIMARY KEY (run_id),
    CONSTRAINT sweep_run_kind_check CHECK (kind IN ('sweep', 'erasure')),
    CONSTRAINT sweep_run_trigger_check CHECK (trigger IN ('scheduled', 'manual')),
    CONSTRAINT sweep_run_status_check
        CHECK (status IN ('started', 'succeeded', 'partially_failed', 'failed', 'cancelled')),
    CONSTRAINT sweep_run_settled_check
        CHECK ((status = 'started') = (settled_at IS NULL))
);
-- Worker de-duplication and `runs list`: by trigger, kind and start.
CREATE INDEX sweep_run_trigger_kind_started_idx
    ON {sweep_run} (trigger, kind, dry_run, started_at);
CREATE INDEX sweep_run_started_at_idx ON {sweep_run} (started_at);
-- Recovery of runs left Started.
CREATE INDEX sweep_run_unsettled_idx ON {sweep_run} (started_at) WHERE settled_at IS NULL;

CREATE TABLE {sweep_run_entity_summary} (
    summary_id          bigint      GENERATED ALWAYS AS IDENTITY,
    run_id              uuid        NOT NULL,
    retention_entity_id uuid        NOT NULL,
    entity_type         text        NOT NULL,
    category            text        NOT NULL,
    tenant_id           text,
    strategy            text        NOT NULL,
    affected_count      bigint      NOT NULL DEFAULT 0,
    held_count          bigint      NOT NULL DEFAULT 0,
    skipped_count       bigint      NOT NULL DEFAULT 0,
    null_anchor_count   bigint      NOT NULL DEFAULT 0,
    cutoff              timestamptz,
    resolved_period     interval    NOT NULL,
    legal_min           interval,
    rule_source         text,
    rule_reason         text,
    error               text,
    updated_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT sweep_run_entity_summary_pkey PRIMARY KEY (summary_id),
    CONSTRAINT sweep_run_entity_summary_run_fkey FOREIGN KEY (run_id)
        REFERENCES {sweep_run} (run_id) ON DELETE CASCADE,
    CONSTRAINT sweep_run_entity_summary_strategy_check
        CHECK (strategy IN ('purge', 'soft_delete', 'anonymise', 'exempt')),
    CONSTRAINT sweep_run_entity_summary_counts_check
        CHECK (affected_count >= 0 AND held_count >= 0 AND skipped_count >= 0 AND null_anchor_count >= 0)
);
CREATE UNIQUE INDEX sweep_run_entity_summary_identity_idx
    ON {sweep_run_entity_summary}
    (run_id, retention_entity_id, category, (COALESCE(tenant_id, '')), strategy);

CREATE TABLE {sweep_run_row_detail} (
    row_detail_id       bigint      GENERATED ALWAYS AS IDENTITY,
    run_id              uuid        NOT NULL,
    retention_entity_id uuid        NOT NULL,
    entity_type         text        NOT NULL,
    record_id           text        NOT NULL,
    tenant_id           text,
    action              text        NOT NULL,
    recorded_at         timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT sweep_run_row_detail_pkey PRIMARY KEY (row_detail_id),
    CONSTRAINT sweep_run_row_detail_run_fkey FOREIGN KEY (run_id)
        REFERENCES {sweep_run} (run_id) ON DELETE CASCADE,
    CONSTRAINT sweep_run_row_detail_action_check
        CHECK (action IN ('purge', 'soft_delete', 'anonymise'))
);
CREATE INDEX sweep_run_row_detail_run_idx ON {sweep_run_row_detail} (run_id);
CREATE INDEX sweep_run_row_detail_record_idx
    ON {sweep_run_row_detail} (retention_entity_id, record_id);

CREATE TABLE {sweep_row_handler_status} (
    handler_status_id   bigint      GENERATED ALWAYS AS IDENTITY,
    row_detail_id       bigint      NOT NULL,
    run_id              uuid        NOT NULL,
    handler_id          text        NOT NULL,
    priority            integer,
    phase               text        NOT NULL,
    status              text        NOT NULL DEFAULT 'pending',
    attempts            integer     NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    claim_token         uuid,
    claimed_at          timestamptz,
    claim_expires_at    timestamptz,
    captured_payload    jsonb,
    payload_scrubbed_at timestamptz,
    last_error          text,
    created_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT sweep_row_handler_status_pkey PRIMARY KEY (handler_status_id),
    CONSTRAINT sweep_row_handler_status_row_detail_fkey FOREIGN KEY (row_detail_id)
        REFERENCES {sweep_run_row_detail} (row_detail_id) ON DELETE CASCADE,
    CONSTRAINT sweep_row_handler_status_run_fkey FOREIGN KEY (run_id)
        REFERENCES {sweep_run} (run_id) ON DELETE CASCADE,
    CONSTRAINT sweep_row_handler_status_phase_check
        CHECK (phase IN ('immediate', 'after_sweep_settled')),
    CONSTRAINT sweep_row_handler_status_status_check
        CHECK (status IN ('pending', 'in_flight', 'succeeded', 'dead_lettered')),
    CONSTRAINT sweep_row_handler_status_attempts_check CHECK (attempts >= 0),
    CONSTRAINT sweep_row_handler_status_unique UNIQUE (row_detail_id, handler_id)
);
-- The dispatcher's claim query: due pending work, and expired claims.
CREATE INDEX sweep_row_handler_status_due_idx
    ON {sweep_row_handler_status} (next_attempt_at) WHERE status = 'pending';
CREATE INDEX sweep_row_handler_status_claim_idx
    ON {sweep_row_handler_status} (claim_expires_at) WHERE status = 'in_flight';
CREATE INDEX sweep_row_handler_status_run_idx ON {sweep_row_handler_status} (run_id);
CREATE INDEX sweep_row_handler_status_payload_idx
    ON {sweep_row_handler_status} (created_at) WHERE captured_payload IS NOT NULL;

CREATE TABLE {retention_hold} (
    hold_id             uuid        NOT NULL,
    retention_entity_id uuid        NOT NULL,
    record_id           text        NOT NULL,
    tenant_id           text,
    reason              text        NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    expires_at          timestamptz,
    released_at         timestamptz,
    CONSTRAINT retention_hold_pkey PRIMARY KEY (hold_id),
    CONSTRAINT retention_hold_reason_check CHECK (pg_catalog.length(pg_catalog.btrim(reason)) > 0),
    CONSTRAINT retention_hold_expiry_check CHECK (expires_at IS NULL OR expires_at > created_at)
);
-- The NOT EXISTS probe of every mutation: entity + record (+ tenant).
CREATE INDEX retention_hold_record_idx
    ON {retention_hold} (retention_entity_id, record_id, tenant_id);
CREATE INDEX retention_hold_tenant_idx ON {retention_hold} (tenant_id, retention_entity_id);
CREATE INDEX retention_hold_inactive_idx
    ON {retention_hold} (released_at, expires_at);

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 1';
