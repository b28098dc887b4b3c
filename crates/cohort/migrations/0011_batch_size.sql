-- Cohort schema version 11: the batch size each entity of a run used.
-- With `sweep_batch_size = "auto"` batches are sized from the measured
-- time of the ones before; `batch_size` is the largest limit the entity's
-- batches used (the fixed size otherwise). NULL for a dry run, for an
-- entity that ran no batch, and for runs written before version 11.
ALTER TABLE {sweep_run_entity_summary}
    ADD COLUMN batch_size integer,
    ADD CONSTRAINT sweep_run_entity_summary_batch_size_check CHECK (batch_size >= 1);

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 11';
