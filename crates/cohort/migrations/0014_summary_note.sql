-- Cohort schema version 14: why an entity's rows were left, when they will
-- not go by themselves. A purge or archive skips a row that a NO ACTION /
-- RESTRICT foreign key still references; when the referencing table is one
-- whose rows Cohort never deletes (not retained, exempt, or never purged),
-- that row is skipped on every run, and the summary's note says so and
-- names the table. NULL otherwise, and for runs written before version 14.
ALTER TABLE {sweep_run_entity_summary}
    ADD COLUMN note text;

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 14';
