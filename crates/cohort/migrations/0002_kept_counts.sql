-- Cohort schema version 2: what an entity summary kept and why, besides
-- holds. Rows kept because a legal minimum has not passed (erasure), and
-- rows kept because the resolved strategy is exempt. Existing summaries
-- read 0 for both, which is what those runs reported.
ALTER TABLE {sweep_run_entity_summary}
    ADD COLUMN kept_by_legal_min_count bigint NOT NULL DEFAULT 0,
    ADD COLUMN kept_by_policy_count bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT sweep_run_entity_summary_kept_check
        CHECK (kept_by_legal_min_count >= 0 AND kept_by_policy_count >= 0);

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 2';
