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
-- 3. The ledger's chain can be keyed, and 4. the database records the
--    journal (below).
ALTER TABLE {erasure_request} ADD COLUMN attempt_snapshot pg_snapshot;

-- 4. The database records the journal (see `cohort restore-check`): a
--    hold or request journaled before it was written keeps the place and
--    hash of the entry that recorded it. A journal that no longer holds
--    that entry, or holds another there, was cut short, rolled back or
--    rewritten. A hold's are fixed like its reach.
ALTER TABLE {retention_hold}
    ADD COLUMN journal_entry bigint,
    ADD COLUMN journal_hash text;
ALTER TABLE {erasure_request}
    ADD COLUMN journal_entry bigint,
    ADD COLUMN journal_hash text;

-- 3. The chain can be keyed: from a `key` link on, every link carries
--    `mac`, an HMAC-SHA256 of its hash under COHORT_LEDGER_KEY, a key the
--    database never holds, and its hash covers its own `linked_at`. The
--    library computes both; a writer without the key cannot append a link
--    that `cohort verify` accepts. Every line of an erasure request's
--    history is linked too (`request`), with the request's dates after it.
ALTER TABLE {ledger_link} ADD COLUMN mac text;
ALTER TABLE {ledger_link} DROP CONSTRAINT ledger_link_kind_check;
ALTER TABLE {ledger_link} ADD CONSTRAINT ledger_link_kind_check
    CHECK (kind IN ('start', 'run', 'hold_placed', 'hold_released', 'checkpoint', 'key',
                    'request'));

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 20';
