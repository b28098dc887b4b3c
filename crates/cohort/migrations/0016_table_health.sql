-- Cohort schema version 16: what a sweep left in the table. Each entity
-- summary of a run that changed rows records the table's dead tuples and
-- size (every partition's, for a partitioned table) before its batches
-- and after them, as the statistics system reports them, and whether
-- `vacuum_after` then ran ANALYZE or VACUUM on it. NULL for dry runs,
-- strategies that change nothing, and runs written before version 16.
-- A paced sweep (`max_rows_per_second`) records how long it waited
-- between batches to stay under the rate (`throttled_ms`).
ALTER TABLE {sweep_run_entity_summary}
    ADD COLUMN dead_tuples_before bigint,
    ADD COLUMN dead_tuples_after bigint,
    ADD COLUMN table_bytes_before bigint,
    ADD COLUMN table_bytes_after bigint,
    ADD COLUMN vacuumed text,
    ADD COLUMN throttled_ms bigint,
    ADD CONSTRAINT sweep_run_entity_summary_vacuumed_check
        CHECK (vacuumed IN ('analyze', 'vacuum'));

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 16';
