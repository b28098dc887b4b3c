-- Cohort schema version 5: replicas that know of each other, and handlers
-- that wait for the earlier ones.
--
-- 1. Every process that sweeps (the worker's services) records itself with
--    a heartbeat: which handlers it has per entity, and a fingerprint of its
--    policy. A sweep refuses an entity for which a live peer has a handler
--    this process lacks (its rows would go without that handler's work).
CREATE TABLE {retention_peer} (
    peer_id            uuid        NOT NULL,
    host               text        NOT NULL,
    pid                integer     NOT NULL,
    started_at         timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    heartbeat_at       timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    policy_fingerprint text        NOT NULL,
    handlers           jsonb       NOT NULL,
    CONSTRAINT retention_peer_pkey PRIMARY KEY (peer_id),
    CONSTRAINT retention_peer_handlers_check CHECK (pg_catalog.jsonb_typeof(handlers) = 'object')
);

-- 2. The policy a scheduled run was swept under: an occurrence is done only
--    for the policy that ran it, so a replica with another policy (other
--    entities) still sweeps it. NULL for manual runs and older runs.
ALTER TABLE {sweep_run}
    ADD COLUMN policy_fingerprint text;

-- 3. Work that runs only after every earlier handler of its row succeeded
--    (an earlier dead letter holds it).
ALTER TABLE {sweep_row_handler_status}
    ADD COLUMN requires_earlier boolean NOT NULL DEFAULT false;

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 5';
