-- Cohort schema version 7: the subject kind an erasure was asked for
-- (`user`, `email`, ...), stored on its run, as .NET Cohort 0.9 stores
-- ErasureSubjectKind. Only an erasure has one; NULL for every sweep, for
-- erasures of subject columns that declare no kind, and for runs written
-- before version 7.
ALTER TABLE {sweep_run}
    ADD COLUMN erasure_subject_kind text,
    ADD CONSTRAINT sweep_run_erasure_subject_kind_check
        CHECK (erasure_subject_kind IS NULL
               OR (kind = 'erasure' AND pg_catalog.length(pg_catalog.btrim(erasure_subject_kind)) > 0));

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 7';
