-- Cohort schema version 17: running beside production. The live pacing of
-- sweeps, read by every replica before each batch, so that one
-- `cohort pause ENTITY` or `cohort settings set max_rows_per_second …`
-- reaches all of them without a restart. One row per entity type that has
-- a live value, and the row '*' for every entity. A NULL limit is "not
-- set here": the configuration's value (or another row's) applies; where
-- several are set, the strictest wins.
CREATE TABLE {retention_pacing} (
    entity_type         text        NOT NULL,
    paused              boolean     NOT NULL DEFAULT false,
    max_rows_per_second integer,
    max_replica_lag     interval,
    updated_at          timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    updated_by          text        NOT NULL DEFAULT pg_catalog."session_user"(),
    CONSTRAINT retention_pacing_pkey PRIMARY KEY (entity_type),
    CONSTRAINT retention_pacing_rate_check CHECK (max_rows_per_second > 0),
    CONSTRAINT retention_pacing_lag_check CHECK (max_replica_lag > interval '0'),
    CONSTRAINT retention_pacing_pause_check CHECK (NOT paused OR entity_type <> '*')
);

-- A run in which an entity was paused (and none failed) settles `paused`,
-- never `succeeded`; the entity's summary says which were.
ALTER TABLE {sweep_run} DROP CONSTRAINT sweep_run_status_check;
ALTER TABLE {sweep_run} ADD CONSTRAINT sweep_run_status_check
    CHECK (status IN ('started', 'succeeded', 'partially_failed', 'failed', 'cancelled', 'paused'));

-- Per entity: whether a pause stopped it, and how long it waited for a
-- standby's replay (`max_replica_lag`; 0 when it was set and nothing was
-- waited for, NULL when it was not set).
ALTER TABLE {sweep_run_entity_summary}
    ADD COLUMN paused boolean NOT NULL DEFAULT false,
    ADD COLUMN lag_waited_ms bigint;

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 17';
