-- Cohort schema version 13: the recent-hold check of a batch cannot be
-- fooled by how a hold was written, and subject holds wait for the
-- batches already past their re-check.
--
-- Version 12 trusted `written_xid` alone, and its stamp trigger was an
-- ordinary one: it does not fire under `session_replication_role =
-- replica` (pg_restore --disable-triggers, logical replication's apply
-- worker) nor after `ALTER TABLE ... DISABLE TRIGGER`, so a hold written
-- that way kept an old stamp and a batch missed it. Version 13 makes the
-- trigger fire always, and the check trusts a stamp only while that
-- trigger has been in force since the batch's snapshot (see the
-- functions' file). The check's arguments change: it takes the batch
-- statement's whole snapshot, so holds its snapshot could see are no
-- longer taken for recent ones because some other transaction was open.
DROP FUNCTION IF EXISTS {retention_hold_recent}(uuid, xid8, bigint);

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 13';
