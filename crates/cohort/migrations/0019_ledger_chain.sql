-- Cohort schema version 19: the ledger's hash chain. Every settled run
-- and every hold placed or released gets a link, in one order: a SHA-256
-- over a canonical encoding of the record (`digest`) and over the link
-- before it (`link`), so that `cohort verify` finds a record changed,
-- deleted or inserted after the fact, and links reordered.
--
-- `link_id` counts from 1 without gaps (a writer appends under an
-- advisory lock). `record` is the canonical JSON the digest covers, kept
-- so that `verify` names the field that differs; it holds no subject and
-- no hold reason (those are digests salted with the hold's id). `link` is
-- the hex SHA-256 of
--     prev || '\n' || link_id || '\n' || kind || '\n' || subject_id || '\n' || digest
-- with an absent subject as the empty string. A `checkpoint` link, written
-- by the history pruner in the transaction that deletes old runs or
-- holds, lists in `covers` (and in its record, with their digests) the
-- links whose records it removed.
CREATE TABLE {ledger_link} (
    link_id    bigint      NOT NULL,
    kind       text        NOT NULL,
    subject_id uuid,
    record     text        NOT NULL,
    digest     text        NOT NULL,
    prev       text        NOT NULL,
    link       text        NOT NULL,
    covers     bigint[]    NOT NULL DEFAULT '{}',
    linked_at  timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    CONSTRAINT ledger_link_pkey PRIMARY KEY (link_id),
    CONSTRAINT ledger_link_id_check CHECK (link_id > 0),
    CONSTRAINT ledger_link_kind_check
        CHECK (kind IN ('start', 'run', 'hold_placed', 'hold_released', 'checkpoint'))
);

-- The links of one run or hold (the pruner's checkpoint, `verify`).
CREATE INDEX ledger_link_subject_idx ON {ledger_link} (subject_id) WHERE subject_id IS NOT NULL;

-- The chain starts here: runs settled before this link are outside it
-- (the start's record counts them).
INSERT INTO {ledger_link} (link_id, kind, subject_id, record, digest, prev, link, linked_at)
SELECT 1, 'start', NULL, s.record, s.digest, pg_catalog.repeat('0', 64),
       pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
           pg_catalog.repeat('0', 64) || E'\n1\nstart\n\n' || s.digest, 'UTF8')), 'hex'),
       s.at
  FROM (SELECT r.record, r.at,
               pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(r.record, 'UTF8')), 'hex') AS digest
          FROM (SELECT pg_catalog.now() AS at,
                       '{"chain":"cohort ledger","runs_before":'
                       || (SELECT pg_catalog.count(*) FROM {sweep_run} WHERE settled_at IS NOT NULL)::text
                       || ',"started_at":'
                       || pg_catalog.floor(EXTRACT(EPOCH FROM pg_catalog.now()) * 1000000)::bigint::text
                       || '}' AS record) r) s;

COMMENT ON TABLE {sweep_run} IS 'cohort schema version 19';
