-- Cohort schema version 8: holds on a person (subject holds).
--
-- A hold names either one record (entity + record id, as before) or a
-- subject: a person's identifier, with its kind when subject columns
-- declare kinds. A subject hold protects every row whose subject column
-- (of that kind, or of none) equals the subject, in its tenant when it
-- names one. The subject is stored once per way a column can hold it,
-- each the canonical text that column's type gives (`t.col::text`,
-- lower case for citext), so a sweep compares it through a btree index
-- without parsing anything per row.
ALTER TABLE {retention_hold}
    ALTER COLUMN retention_entity_id DROP NOT NULL,
    ALTER COLUMN record_id DROP NOT NULL,
    ADD COLUMN subject_kind   text,
    ADD COLUMN subject_text   text,
    ADD COLUMN subject_citext text,
    ADD COLUMN subject_uuid   text,
    ADD COLUMN subject_int    text,
    ADD CONSTRAINT retention_hold_target_check CHECK (
        (retention_entity_id IS NOT NULL AND record_id IS NOT NULL
         AND subject_kind IS NULL
         AND pg_catalog.num_nonnulls(subject_text, subject_citext, subject_uuid, subject_int) = 0)
        OR
        (retention_entity_id IS NULL AND record_id IS NULL AND subject_text IS NOT NULL
         AND (subject_kind IS NULL OR pg_catalog.length(pg_catalog.btrim(subject_kind)) > 0))
    );

-- The probes of every mutation of an entity with subject columns.
CREATE INDEX retention_hold_subject_text_idx
    ON {retention_hold} (subject_text) WHERE subject_text IS NOT NULL;
CREATE INDEX retention_hold_subject_citext_idx
    ON {retention_hold} (subject_citext) WHERE subject_citext IS NOT NULL;
CREATE INDEX retention_hold_subject_uuid_idx
    ON {retention_hold} (subject_uuid) WHERE subject_uuid IS NOT NULL;
CREATE INDEX retention_hold_subject_int_idx
    ON {retention_hold} (subject_int) WHERE subject_int IS NOT NULL;

-- Held rows by reason: how many of `held_count` a subject hold protects
-- (a row under both kinds of hold counts in both).
ALTER TABLE {sweep_run_entity_summary}
    ADD COLUMN held_by_subject_count bigint NOT NULL DEFAULT 0;

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 8';
