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
-- ALWAYS: it fires under session_replication_role = replica too (restores
-- with triggers disabled by role, logical replication's apply worker,
-- COPY in either). Disabling it is refused at startup, and a batch that
-- finds it disabled, or changed since its snapshot, trusts no stamp.
ALTER TABLE {retention_hold} ENABLE ALWAYS TRIGGER retention_hold_stamp;

-- Whether a hold on the entity's records, or any subject hold, that the
-- calling statement's snapshot `snap` could not see is visible now.
-- VOLATILE: in READ COMMITTED each of its queries takes a new snapshot,
-- so it sees holds committed after the caller's was taken. The caller
-- passes how many rows it locked, which makes it lock them all before
-- calling; none locked, nothing to protect.
--
-- Before it looks, it takes the hold gate shared (the advisory lock a
-- subject hold's creation takes exclusive after locking the subject's
-- rows and before its insert): a subject hold either committed before
-- this look, and is seen, or waits for this batch to commit.
--
-- A hold's stamp is trusted only when the stamp trigger is enabled ALWAYS
-- and neither its catalog row nor its function's was written by a
-- transaction the snapshot could not see (a trigger disabled, or its
-- function replaced, a hold written, then put back, all while the batch
-- ran); otherwise every locked row goes to the batch's second statement,
-- whose new snapshot sees every committed hold.
CREATE OR REPLACE FUNCTION {retention_hold_recent}(entity uuid, snap pg_snapshot, locked bigint)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $recent$
DECLARE
    since xid8 := pg_catalog.pg_snapshot_xmin(snap);
    s bigint := since::text::bigint;
    enabled "char";
    written xid[];
    w xid;
    x bigint;
BEGIN
    IF locked <= 0 THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(1131375665, {retention_hold:regclass}::pg_catalog.oid::int4);
    SELECT t.tgenabled, ARRAY[t.xmin, p.xmin] INTO enabled, written
      FROM pg_catalog.pg_trigger t
      JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
     WHERE t.tgrelid = {retention_hold:regclass}
       AND t.tgname = 'retention_hold_stamp';
    IF enabled IS DISTINCT FROM 'A' THEN
        RETURN true;
    END IF;
    -- Each catalog row's 32-bit xmin, widened with the epoch of `since`
    -- (1 and 2 are the bootstrap and frozen ids: old).
    FOREACH w IN ARRAY written LOOP
        x := w::text::bigint;
        IF x >= 3 THEN
            x := s - (s % 4294967296) + x;
            IF x > s + 2147483648 THEN
                x := x - 4294967296;
            ELSIF x < s - 2147483648 THEN
                x := x + 4294967296;
            END IF;
            IF x >= 3 AND NOT pg_catalog.pg_visible_in_snapshot(x::text::xid8, snap) THEN
                RETURN true;
            END IF;
        END IF;
    END LOOP;
    RETURN EXISTS (
        SELECT 1 FROM {retention_hold} h
        WHERE h.written_xid >= since
          AND NOT pg_catalog.pg_visible_in_snapshot(h.written_xid, snap)
          AND (h.retention_entity_id = entity OR h.retention_entity_id IS NULL));
END
$recent$;

-- An archive batch's verdict: the rows it deleted from the source and the
-- copies the archive table took must be the same rows (as many, with the
-- same keys). A rule or a BEFORE INSERT trigger on the archive table that
-- drops or rewrites a copy makes them differ; the error then rolls the
-- whole batch back, so no row is deleted without its copy. Its SQLSTATE,
-- CH001, is Cohort's own (class CH is PostgreSQL's for no condition).
CREATE OR REPLACE FUNCTION {retention_archive_check}(moved bigint, copied bigint, unmatched bigint)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $check$
BEGIN
    IF moved <> copied OR unmatched <> 0 THEN
        RAISE EXCEPTION 'cohort: the archive table took % copies with % keys unmatched for the % rows this batch deleted; the batch is rolled back and nothing is deleted', copied, unmatched, moved
            USING ERRCODE = 'CH001',
                  HINT = 'an INSERT rule or a BEFORE INSERT trigger on the archive table dropped or changed copies: remove it';
    END IF;
    RETURN true;
END
$check$;
