-- Cohort schema version 9: the archive strategy, and retention in stages.
--
-- A run that archives records its summaries with the strategy 'archive'
-- and, with per-row audit, one row detail per moved row with the action
-- 'archive'. A category in stages records one summary per stage, each
-- with its position (1 for the first); a category without stages leaves
-- it NULL. Every existing row keeps its strategy and action.
ALTER TABLE {sweep_run_entity_summary}
    DROP CONSTRAINT sweep_run_entity_summary_strategy_check,
    ADD CONSTRAINT sweep_run_entity_summary_strategy_check
        CHECK (strategy IN ('purge', 'soft_delete', 'anonymise', 'exempt', 'archive'));

ALTER TABLE {sweep_run_row_detail}
    DROP CONSTRAINT sweep_run_row_detail_action_check,
    ADD CONSTRAINT sweep_run_row_detail_action_check
        CHECK (action IN ('purge', 'soft_delete', 'anonymise', 'skipped', 'archive'));

ALTER TABLE {sweep_run_entity_summary}
    ADD COLUMN stage smallint,
    ADD CONSTRAINT sweep_run_entity_summary_stage_check CHECK (stage >= 1);

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 9';
