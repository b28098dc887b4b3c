-- Cohort schema version 18: erasure requests. An erasure opened with a
-- reference (`cohort erase … --reference REF`) is a request with a due
-- date, a state and a history, so that it is finished, not just started.
--
-- 1. One row per request. The subject's identifier is kept while the
--    request is not completed (its parts resume, and need it); on
--    completion it is cleared and only `subject_hash`, an HMAC-SHA256 of
--    the identifier under the configured hash key, remains: the ledger
--    proves which request was served without keeping the person.
--    `waiting` lists the parts a hold or a legal minimum kept, each with
--    its reason and, for a legal minimum, the earliest time it could go;
--    `resume_at` is the earliest of those times.
CREATE TABLE {erasure_request} (
    request_id        uuid        NOT NULL,
    reference         text        NOT NULL,
    tenant_id         text,
    subject_kind      text,
    subject_text      text,
    subject_hash      text        NOT NULL,
    allow_soft_delete boolean     NOT NULL DEFAULT false,
    stage             integer,
    note              text,
    state             text        NOT NULL,
    received_at       timestamptz NOT NULL,
    due_at            timestamptz NOT NULL,
    due_reason        text,
    attempted_at      timestamptz,
    resume_at         timestamptz,
    completed_at      timestamptz,
    last_run_id       uuid,
    waiting           jsonb       NOT NULL DEFAULT '[]',
    error             text,
    updated_at        timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    CONSTRAINT erasure_request_pkey PRIMARY KEY (request_id),
    CONSTRAINT erasure_request_reference_key UNIQUE (reference),
    CONSTRAINT erasure_request_reference_check CHECK (reference <> ''),
    CONSTRAINT erasure_request_state_check
        CHECK (state IN ('open', 'in_progress', 'waiting', 'completed', 'failed')),
    CONSTRAINT erasure_request_due_check CHECK (due_at >= received_at),
    CONSTRAINT erasure_request_subject_check
        CHECK ((state = 'completed') = (subject_text IS NULL)),
    CONSTRAINT erasure_request_completed_check
        CHECK ((state = 'completed') = (completed_at IS NOT NULL)),
    CONSTRAINT erasure_request_waiting_check CHECK (pg_catalog.jsonb_typeof(waiting) = 'array')
);

-- The requests the maintenance service looks at, and the overdue gauge.
CREATE INDEX erasure_request_state_idx ON {erasure_request} (state, due_at);

-- 2. Every state change of a request, in order: the ledger's account of
--    it (opened, started, waiting with its parts, completed, failed, its
--    due date moved and why). Written in the transaction that changes the
--    request's state.
CREATE TABLE {erasure_request_event} (
    event_id    bigint      GENERATED ALWAYS AS IDENTITY,
    request_id  uuid        NOT NULL,
    state       text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    run_id      uuid,
    detail      text        NOT NULL,
    recorded_by text        NOT NULL DEFAULT pg_catalog."session_user"(),
    CONSTRAINT erasure_request_event_pkey PRIMARY KEY (event_id),
    CONSTRAINT erasure_request_event_request_fkey FOREIGN KEY (request_id)
        REFERENCES {erasure_request} (request_id),
    CONSTRAINT erasure_request_event_state_check
        CHECK (state IN ('open', 'in_progress', 'waiting', 'completed', 'failed'))
);

CREATE INDEX erasure_request_event_request_idx ON {erasure_request_event} (request_id, event_id);

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 18';
