-- Cohort schema version 12: every hold records the transaction that last
-- wrote it, so a sweep batch can re-check holds in one statement.
--
-- A batch locks its rows and changes them in one statement. Holds the
-- statement's snapshot could not see were all written by a transaction
-- at or after that snapshot's xmin; `written_xid` finds them through one
-- index range (usually empty) instead of probing every locked row again.
-- A trigger stamps it on every insert and update, whoever writes the hold.
ALTER TABLE {retention_hold}
    ADD COLUMN written_xid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id();

CREATE INDEX retention_hold_written_idx ON {retention_hold} (written_xid);

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 12';
