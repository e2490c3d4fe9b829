-- 016_sweep.sql: a group row that claims and acks rewrite in place.
--
-- Until now every claim and every ack wrote an indexed column of its group
-- row (lock_expiry and locked_by were the keys and predicates of the
-- round-robin indexes), so no update was HOT: each wrote a new entry in
-- every index of the table, the table and its indexes grew with every
-- message until vacuum ran, and under a long-held snapshot each group's
-- lookups walked its dead versions. Now no index of transport_groups
-- holds a column that a claim, an ack, an extend or a kept lease writes:
-- those updates are HOT, and a page's dead versions are pruned in place
-- without vacuum. The claim finds groups with a sweep instead
-- (functions/30_claim.sql, "The sweep"):
--   - slot: a group row's place in the sweep, numbered by its default when
--     the row is created (the design's two-INSERT publish names none) from
--     a sequence that cycles through 2^20 values, and never written again;
--   - transport_claim_cursor: the slot the next claim starts from, a
--     sequence (one value written in place, not a row that grows
--     versions under an old snapshot), and transport_claim_wrap, when a
--     claim that went round from the first slot last found nothing;
--   - retry_at: when a group held by no one is due before the sweep (a
--     failed message's backoff, a nack's or a snooze's delay, a give-back
--     or restart at once), in a partial index of the due groups. Those
--     settles write it, and the next settle of the group clears it: two
--     non-HOT writes per retry, none on the path of a message that
--     succeeds.
-- Gone: the free, held and retry indexes, the claim's four floor
-- sequences and the arrival column with its sequence, which only the
-- claim read.
--
-- Rows already there get slots in the order the old round-robin would
-- have served them, and groups waiting out a backoff or a park get their
-- retry_at (a nack's park from before the upgrade is found by the sweep
-- when it ends). Adding a column with a default that is not a constant
-- rewrites the table, under its ACCESS EXCLUSIVE lock, inside the
-- upgrade's transaction (one row per group with messages): claims and
-- acks wait for it; publishes of existing groups too.

CREATE SEQUENCE IF NOT EXISTS transport_groups_slot AS INT MINVALUE 0 MAXVALUE 1048575 START 0 CYCLE;
CREATE SEQUENCE IF NOT EXISTS transport_claim_cursor AS INT MINVALUE 0 MAXVALUE 1048576 START 0;
CREATE SEQUENCE IF NOT EXISTS transport_claim_wrap AS BIGINT MINVALUE 0 START 0;
ALTER TABLE transport_groups ADD COLUMN IF NOT EXISTS slot INT;
ALTER TABLE transport_groups ADD COLUMN IF NOT EXISTS retry_at DOUBLE PRECISION;
UPDATE transport_groups AS g
   SET slot = o.slot,
       retry_at = CASE WHEN g.locked_by = '' AND g.lock_expiry < 'Infinity' THEN g.lock_expiry END
  FROM (SELECT x.group_id, (nextval('transport_groups_slot')) AS slot
          FROM (SELECT g.group_id FROM transport_groups AS g
                 ORDER BY COALESCE(g.lock_expiry, 0), COALESCE(g.arrival, 0), g.group_id) AS x) AS o
 WHERE g.group_id = o.group_id;
ALTER TABLE transport_groups ALTER COLUMN slot SET DEFAULT nextval('transport_groups_slot');
ALTER TABLE transport_groups ALTER COLUMN slot SET NOT NULL;
CREATE INDEX IF NOT EXISTS transport_groups_sweep ON transport_groups (slot);
CREATE INDEX IF NOT EXISTS transport_groups_due ON transport_groups (retry_at) WHERE retry_at IS NOT NULL;

DROP INDEX IF EXISTS transport_groups_free;
DROP INDEX IF EXISTS transport_groups_held;
DROP INDEX IF EXISTS transport_groups_retry;
ALTER TABLE transport_groups DROP COLUMN IF EXISTS arrival;
DROP SEQUENCE IF EXISTS transport_groups_arrival;
DROP SEQUENCE IF EXISTS transport_claim_new;
DROP SEQUENCE IF EXISTS transport_claim_floor;
DROP SEQUENCE IF EXISTS transport_claim_held;
DROP SEQUENCE IF EXISTS transport_claim_sweep;


-- Room in each page for every row in it to be rewritten once in one
-- transaction: a claim takes groups in slot order, and the rows of
-- consecutive slots share a page, so a batch claim rewrites most of a
-- page's rows at once, and a HOT update needs room in its own page (the
-- old versions stay until the transaction ends). Applies to pages
-- written from now on.
ALTER TABLE transport_groups SET (fillfactor = 30);
