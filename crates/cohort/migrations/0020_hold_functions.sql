-- The reach triggers and the batch's recent-hold check of version 20.
-- Also run by `cohort migrate --move-from`, after version 13's file.
CREATE OR REPLACE FUNCTION {retention_hold_reach}() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $reach$
DECLARE
    active boolean;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        EXECUTE pg_catalog.format(
            'SELECT EXISTS (SELECT 1 FROM %s h WHERE h.released_at IS NULL'
            ' AND (h.expires_at IS NULL OR h.expires_at > pg_catalog.now()))',
            TG_RELID::regclass) INTO active;
        IF active THEN
            RAISE EXCEPTION 'cohort: % holds active holds and cannot be truncated', TG_TABLE_NAME
                USING ERRCODE = 'CH002',
                      HINT = 'release the holds first (cohort holds release)';
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        IF OLD.released_at IS NULL
           AND (OLD.expires_at IS NULL OR OLD.expires_at > pg_catalog.now()) THEN
            RAISE EXCEPTION 'cohort: hold % is active and cannot be deleted', OLD.hold_id
                USING ERRCODE = 'CH002',
                      HINT = 'release it first (cohort holds release); the pruner deletes released holds';
        END IF;
        RETURN OLD;
    END IF;
    IF ROW(NEW.hold_id, NEW.retention_entity_id, NEW.record_id, NEW.tenant_id, NEW.reason,
           NEW.created_at, NEW.expires_at, NEW.subject_kind, NEW.subject_text,
           NEW.subject_citext, NEW.subject_uuid, NEW.subject_int, NEW.journal_entry,
           NEW.journal_hash)
       IS DISTINCT FROM
       ROW(OLD.hold_id, OLD.retention_entity_id, OLD.record_id, OLD.tenant_id, OLD.reason,
           OLD.created_at, OLD.expires_at, OLD.subject_kind, OLD.subject_text,
           OLD.subject_citext, OLD.subject_uuid, OLD.subject_int, OLD.journal_entry,
           OLD.journal_hash) THEN
        RAISE EXCEPTION 'cohort: hold % cannot change what it keeps once placed', OLD.hold_id
            USING ERRCODE = 'CH002',
                  HINT = 'place a new hold, and release this one if it is no longer wanted';
    END IF;
    IF NEW.released_at IS DISTINCT FROM OLD.released_at THEN
        IF OLD.released_at IS NOT NULL AND OLD.released_at <= pg_catalog.now() THEN
            RAISE EXCEPTION 'cohort: hold % was released at %; a release is not changed', OLD.hold_id, OLD.released_at
                USING ERRCODE = 'CH002';
        END IF;
        IF NEW.released_at IS NULL OR NEW.released_at < OLD.created_at THEN
            RAISE EXCEPTION 'cohort: hold % cannot be released at % (placed at %)', OLD.hold_id, NEW.released_at, OLD.created_at
                USING ERRCODE = 'CH002';
        END IF;
    END IF;
    RETURN NEW;
END
$reach$;

DROP TRIGGER IF EXISTS retention_hold_reach ON {retention_hold};
CREATE TRIGGER retention_hold_reach
    BEFORE UPDATE OR DELETE ON {retention_hold}
    FOR EACH ROW EXECUTE FUNCTION {retention_hold_reach}();
ALTER TABLE {retention_hold} ENABLE ALWAYS TRIGGER retention_hold_reach;
DROP TRIGGER IF EXISTS retention_hold_reach_truncate ON {retention_hold};
CREATE TRIGGER retention_hold_reach_truncate
    BEFORE TRUNCATE ON {retention_hold}
    FOR EACH STATEMENT EXECUTE FUNCTION {retention_hold_reach}();
ALTER TABLE {retention_hold} ENABLE ALWAYS TRIGGER retention_hold_reach_truncate;

-- The batch's recent-hold check, as version 13 made it, and also: the
-- stamp trigger's function must be the one Cohort installed (a function
-- replaced by one that does not stamp, after a worker's startup check,
-- is not trusted), and the reach triggers must be in force with Cohort's
-- function, or the batch fails (CH002) before it changes a row: a hold
-- whose reach can be narrowed while the batch runs keeps nothing.
CREATE OR REPLACE FUNCTION {retention_hold_recent}(entity uuid, snap pg_snapshot, locked bigint)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $recent$
DECLARE
    since xid8 := pg_catalog.pg_snapshot_xmin(snap);
    s bigint := since::text::bigint;
    enabled "char";
    stamp_source text;
    reach int;
    written xid[];
    w xid;
    x bigint;
BEGIN
    IF locked <= 0 THEN
        RETURN false;
    END IF;
    SELECT pg_catalog.count(*) INTO reach
      FROM pg_catalog.pg_trigger t
      JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
     WHERE t.tgrelid = {retention_hold:regclass}
       AND t.tgname IN ('retention_hold_reach', 'retention_hold_reach_truncate')
       AND t.tgenabled = 'A'
       AND p.prolang = (SELECT l.oid FROM pg_catalog.pg_language l WHERE l.lanname = 'plpgsql')
       AND pg_catalog.md5(p.prosrc) = '06582cdbefab0531a22a204e35d4efd8';
    IF reach IS DISTINCT FROM 2 THEN
        RAISE EXCEPTION 'cohort: the triggers retention_hold_reach on % are missing, disabled or changed: a hold''s reach could be narrowed, so no batch runs', {retention_hold:regclass}
            USING ERRCODE = 'CH002',
                  HINT = 'run cohort validate: it names the fix';
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(1131375665, {retention_hold:regclass}::pg_catalog.oid::int4);
    SELECT t.tgenabled, ARRAY[t.xmin, p.xmin], p.prosrc INTO enabled, written, stamp_source
      FROM pg_catalog.pg_trigger t
      JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
     WHERE t.tgrelid = {retention_hold:regclass}
       AND t.tgname = 'retention_hold_stamp';
    IF enabled IS DISTINCT FROM 'A'
       OR pg_catalog.md5(stamp_source) IS DISTINCT FROM '3ac3866cb22a4ca839099f5fde8081de' THEN
        RETURN true;
    END IF;
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

