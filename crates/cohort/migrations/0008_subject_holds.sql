-- Cohort schema version 8: holds on a person (subject holds).
--
-- A hold names either one record (entity + record id, as before) or a
-- subject: a person's identifier, with its kind when subject columns
-- declare kinds. A subject hold protects every row whose subject column
-- (of that kind, or of none) equals the subject, in its tenant when it
-- names one. The subject is stored once per way a column can hold it, in
-- that way's own type (text as given, citext folded, uuid, bigint), so a
-- sweep compares rows in their column's type without converting them.
ALTER TABLE {retention_hold}
    ALTER COLUMN retention_entity_id DROP NOT NULL,
    ALTER COLUMN record_id DROP NOT NULL,
    ADD COLUMN subject_kind   text,
    ADD COLUMN subject_text   text,
    ADD COLUMN subject_citext text,
    ADD COLUMN subject_uuid   uuid,
    ADD COLUMN subject_int    bigint,
    ADD CONSTRAINT retention_hold_target_check CHECK (
        (retention_entity_id IS NOT NULL AND record_id IS NOT NULL
         AND subject_kind IS NULL
         AND pg_catalog.num_nonnulls(subject_text, subject_citext, subject_uuid, subject_int) = 0)
        OR
        (retention_entity_id IS NULL AND record_id IS NULL AND subject_text IS NOT NULL
         AND (subject_kind IS NULL OR pg_catalog.length(pg_catalog.btrim(subject_kind)) > 0))
    ),
    -- The citext form is folded, as citext compares.
    ADD CONSTRAINT retention_hold_subject_citext_check CHECK (
        subject_citext IS NULL OR subject_citext = pg_catalog.lower(subject_citext)
    );

-- Every mutation of an entity with subject columns reads the live holds
-- of each form once (a hashed list) or probes them per row: each index
-- answers both without visiting the table.
CREATE INDEX retention_hold_subject_text_idx ON {retention_hold} (subject_text)
    INCLUDE (subject_kind, tenant_id, released_at, expires_at) WHERE subject_text IS NOT NULL;
CREATE INDEX retention_hold_subject_citext_idx ON {retention_hold} (subject_citext)
    INCLUDE (subject_kind, tenant_id, released_at, expires_at) WHERE subject_citext IS NOT NULL;
CREATE INDEX retention_hold_subject_uuid_idx ON {retention_hold} (subject_uuid)
    INCLUDE (subject_kind, tenant_id, released_at, expires_at) WHERE subject_uuid IS NOT NULL;
CREATE INDEX retention_hold_subject_int_idx ON {retention_hold} (subject_int)
    INCLUDE (subject_kind, tenant_id, released_at, expires_at) WHERE subject_int IS NOT NULL;

-- Held rows by reason: how many of `held_count` a subject hold protects
-- (a row under both kinds of hold counts in both).
ALTER TABLE {sweep_run_entity_summary}
    ADD COLUMN held_by_subject_count bigint NOT NULL DEFAULT 0;

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 8';
