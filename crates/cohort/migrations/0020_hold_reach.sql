-- Cohort schema version 20: a hold keeps its reach, and a waiting erasure
-- request resumes by what its attempt could see, not by two clocks.
--
-- 1. What decides which rows a hold keeps (its entity, record, tenant,
--    the subject in every stored form, its kind, expiry, placement time,
--    reason and id) cannot change once it is placed, whoever writes: the
--    trigger `retention_hold_reach` fires ALWAYS (under
--    session_replication_role = replica too) and refuses the change with
--    SQLSTATE CH002. Only a release may change the row: `released_at`,
--    set once, never before the hold was placed, never taken back. An
--    active hold is never deleted (release it first), and the table is
--    never truncated while one is active. Startup refuses a database
--    where the trigger is missing, disabled or not Cohort's, and every
--    batch checks it again before it trusts what it locked.
-- 2. An attempt at an erasure request records the snapshot it started
--    from (`attempt_snapshot`): a release committed after it is one the
--    attempt could not see, so the request resumes, whatever the release's
--    `released_at` says.
ALTER TABLE {erasure_request} ADD COLUMN attempt_snapshot pg_snapshot;

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 20';
