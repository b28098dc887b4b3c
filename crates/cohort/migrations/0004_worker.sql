-- Cohort schema version 4: what the scheduled worker and the history
-- pruner need.
--
-- 1. Live settings that reach every replica at once: the effective value
--    of each is the configuration's OR this table's.
CREATE TABLE {retention_setting} (
    name        text        NOT NULL,
    enabled     boolean     NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    updated_by  text        NOT NULL DEFAULT pg_catalog."session_user"(),
    CONSTRAINT retention_setting_pkey PRIMARY KEY (name),
    CONSTRAINT retention_setting_name_check CHECK (name IN ('kill_switch', 'dry_run'))
);

-- 2. The cron occurrence a scheduled run belongs to, and which of the
--    occurrence's passes it is (1-based, of how many), so each occurrence
--    runs once and whole across replicas whatever their clocks say. NULL for
--    manual runs and for runs written before version 4.
ALTER TABLE {sweep_run}
    ADD COLUMN occurrence timestamptz,
    ADD COLUMN occurrence_pass integer,
    ADD COLUMN occurrence_passes integer,
    ADD CONSTRAINT sweep_run_occurrence_check
        CHECK (occurrence IS NULL OR trigger = 'scheduled'),
    ADD CONSTRAINT sweep_run_occurrence_pass_check
        CHECK ((occurrence IS NULL AND occurrence_pass IS NULL AND occurrence_passes IS NULL)
            OR (occurrence IS NOT NULL AND occurrence_pass BETWEEN 1 AND occurrence_passes));
CREATE INDEX sweep_run_occurrence_idx
    ON {sweep_run} (dry_run, occurrence) WHERE occurrence IS NOT NULL;

-- 3. Queued handler work can never be deleted by deleting its run or its
--    row detail (the default NO ACTION: the history pruner deletes terminal work itself
--    first, and deleting a run that still has work is an error).
ALTER TABLE {sweep_row_handler_status}
    DROP CONSTRAINT sweep_row_handler_status_run_fkey,
    ADD CONSTRAINT sweep_row_handler_status_run_fkey FOREIGN KEY (run_id)
        REFERENCES {sweep_run} (run_id) ON DELETE NO ACTION,
    DROP CONSTRAINT sweep_row_handler_status_row_detail_fkey,
    ADD CONSTRAINT sweep_row_handler_status_row_detail_fkey FOREIGN KEY (row_detail_id)
        REFERENCES {sweep_run_row_detail} (row_detail_id) ON DELETE NO ACTION;

-- 4. The pruner's selection: settled runs by settle time.
CREATE INDEX sweep_run_settled_at_idx ON {sweep_run} (settled_at) WHERE settled_at IS NOT NULL;

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 4';
