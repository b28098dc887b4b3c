-- Cohort schema version 6: rows a run left because a handler's on_before
-- failed for them.
--
-- Such a row is not mutated. The run records it as a row detail with the
-- action 'skipped', and the failing handler's work hangs from that detail,
-- dead-lettered once with the sanitised reason and no payload (it can
-- never be retried: the row was not changed, and the next run tries it
-- again). Every existing row keeps its action.
ALTER TABLE {sweep_run_row_detail}
    DROP CONSTRAINT sweep_run_row_detail_action_check,
    ADD CONSTRAINT sweep_run_row_detail_action_check
        CHECK (action IN ('purge', 'soft_delete', 'anonymise', 'skipped'));

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 6';
