
-- The trigger that stamps `written_xid`, and the function a batch calls
-- to find holds its snapshot could not see. Also run by `cohort migrate
-- --move-from`, which recreates both in the schema the tables move to.
CREATE OR REPLACE FUNCTION {retention_hold_stamp}() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $stamp$
BEGIN
    NEW.written_xid := pg_catalog.pg_current_xact_id();
    RETURN NEW;
END
$stamp$;

DROP TRIGGER IF EXISTS retention_hold_stamp ON {retention_hold};
CREATE TRIGGER retention_hold_stamp
    BEFORE INSERT OR UPDATE ON {retention_hold}
    FOR EACH ROW EXECUTE FUNCTION {retention_hold_stamp}();

-- Whether a hold on the entity's records, or any subject hold, was written
-- by a transaction at or after `since` (the calling statement's snapshot
-- xmin) and is visible now. VOLATILE: in READ COMMITTED its query takes a
-- new snapshot, so it sees holds committed after the caller's snapshot was
-- taken. The caller passes how many rows it locked, which makes it lock
-- them all before calling; none locked, nothing to protect.
CREATE OR REPLACE FUNCTION {retention_hold_recent}(entity uuid, since xid8, locked bigint)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $recent$
BEGIN
    RETURN locked > 0 AND EXISTS (
        SELECT 1 FROM {retention_hold} h
        WHERE h.written_xid >= since
          AND (h.retention_entity_id = entity OR h.retention_entity_id IS NULL));
END
$recent$;
