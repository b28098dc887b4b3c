-- Cohort schema version 3: a run's entity failures stored structurally,
-- one JSON object per failed entity ({"entity_id", "entity", "error"}), so
-- reading a run back never depends on splitting text. The `error` text of
-- every run, old and new, is kept as written. Runs settled before version 3
-- have no structured failures (NULL) and are read from `error` as before.
ALTER TABLE {sweep_run}
    ADD COLUMN failures jsonb,
    ADD CONSTRAINT sweep_run_failures_is_array
        CHECK (failures IS NULL OR pg_catalog.jsonb_typeof(failures) = 'array');

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 3';
