-- Cohort schema version 10: worker replicas share the passes of one
-- scheduled occurrence.
--
-- 1. One row per occurrence of the schedule, kind (dry or real) and policy,
--    written by the first replica to reach it together with its passes.
--    `completed_at` is set when every pass is done. The history pruner
--    deletes old occurrences with their passes, as it deletes old runs.
CREATE TABLE {sweep_occurrence} (
    occurrence_id      uuid        NOT NULL,
    occurrence         timestamptz NOT NULL,
    dry_run            boolean     NOT NULL,
    policy_fingerprint text        NOT NULL,
    passes             integer     NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    created_by         text        NOT NULL,
    completed_at       timestamptz,
    CONSTRAINT sweep_occurrence_pkey PRIMARY KEY (occurrence_id),
    CONSTRAINT sweep_occurrence_once UNIQUE (occurrence, dry_run, policy_fingerprint),
    CONSTRAINT sweep_occurrence_passes_check CHECK (passes >= 0)
);

-- 2. The passes of an occurrence, in order: a tenant (with
--    its jurisdiction and tags), the tenantless entities, or a row of the
--    tenant source that cannot be a tenant (`spec` says which). A replica
--    claims a pending pass with FOR UPDATE SKIP LOCKED and holds a session
--    advisory lock on it while it runs: a claimed pass whose lock is free
--    lost its replica and is taken over, swept again whole. A done pass
--    names the replica that ran it and its run.
CREATE TABLE {sweep_occurrence_pass} (
    occurrence_id uuid        NOT NULL,
    pass          integer     NOT NULL,
    spec          jsonb       NOT NULL,
    tenant_id     text,
    status        text        NOT NULL DEFAULT 'pending',
    attempts      integer     NOT NULL DEFAULT 0,
    claim_token   uuid,
    claimed_by    text,
    claimed_at    timestamptz,
    run_id        uuid,
    CONSTRAINT sweep_occurrence_pass_pkey PRIMARY KEY (occurrence_id, pass),
    CONSTRAINT sweep_occurrence_pass_occurrence_fkey FOREIGN KEY (occurrence_id)
        REFERENCES {sweep_occurrence} (occurrence_id) ON DELETE CASCADE,
    CONSTRAINT sweep_occurrence_pass_pass_check CHECK (pass >= 1),
    CONSTRAINT sweep_occurrence_pass_status_check CHECK (status IN ('pending', 'claimed', 'done')),
    CONSTRAINT sweep_occurrence_pass_spec_check CHECK (pg_catalog.jsonb_typeof(spec) = 'object')
);

-- The passes not done yet, by occurrence, in order: a claim takes the
-- first pending one without reading the done ones before it.
CREATE INDEX sweep_occurrence_pass_open
    ON {sweep_occurrence_pass} (occurrence_id, status, pass)
    WHERE status <> 'done';

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 10';
