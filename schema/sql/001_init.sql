-- 001_init.sql: the design's tables and its two server-side functions.
--
-- Runs with search_path set to the target schema followed by pg_temp; every
-- function pins that path (SET search_path FROM CURRENT), so nothing planted
-- on a caller's search_path can stand in for these tables.
-- Idempotent: safe to run again on a database that has it.

CREATE TABLE IF NOT EXISTS transport_messages (
    seq      BIGSERIAL PRIMARY KEY,  -- FIFO order and the lease handle
    group_id TEXT NOT NULL,          -- the exclusivity group
    event    TEXT NOT NULL           -- the payload
);
-- Head-of-group lookup.
CREATE INDEX IF NOT EXISTS transport_messages_group
    ON transport_messages (group_id, seq);

CREATE TABLE IF NOT EXISTS transport_groups (
    group_id    TEXT PRIMARY KEY,  -- one row per group that has messages
    locked_by   TEXT,              -- lease token while in flight or parked, else NULL
    lock_expiry DOUBLE PRECISION,  -- epoch seconds the lease or park ends; NULL = never claimed
    priority    INT NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 4)
);
-- The claim's ORDER BY, as an index: the claim walks it from the front and
-- stops at the first claimable unlocked row instead of sorting the table.
-- (The design's plain index on lock_expiry would serve no query and cost a
-- write on every claim and ack, so it is left out.)
CREATE INDEX IF NOT EXISTS transport_groups_round_robin
    ON transport_groups ((COALESCE(lock_expiry, 0)), group_id);

-- The lost-publish guard. A publish that lands in a group while an ack
-- drains it must not end with its message and no group row: the ack cannot
-- see the uncommitted message. So every message insert first takes a
-- shared transaction-scoped advisory lock on its group's bucket, and a
-- drainer deletes a group row only when it gets that lock exclusively
-- without waiting; otherwise it frees the row. The key is (the messages
-- table's oid, group hash mod 1024): one lock space per schema, and a batch
-- holds at most 1024 locks. Drainers never wait, so no deadlock is possible.
-- Advisory locks, not row locks: a row lock upgraded from FOR NO KEY UPDATE
-- to FOR UPDATE can be granted alongside a concurrent FOR KEY SHARE (seen on
-- PostgreSQL 15), which lets exactly this race through.

-- harel_group_lock_key is a group's advisory-lock bucket.
CREATE OR REPLACE FUNCTION harel_group_lock_key(p_group TEXT)
RETURNS INT
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT hashtext(p_group) & 1023 $$;

-- A row trigger, BEFORE the insert: it also guards the design's plain
-- two-statement publish from other languages. Taken before the row exists,
-- so a drainer that holds the bucket delays the insert itself. (pgbench, 16
-- clients publishing: this trigger costs about 4% of throughput; a
-- statement trigger with a transition table cost 21%.)
CREATE OR REPLACE FUNCTION harel_hold_group()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared((TG_RELID::bigint & 2147483647)::int, harel_group_lock_key(NEW.group_id));
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS transport_messages_hold_group ON transport_messages;
CREATE TRIGGER transport_messages_hold_group
    BEFORE INSERT ON transport_messages
    FOR EACH ROW EXECUTE FUNCTION harel_hold_group();

-- harel_claim leases the claimable group that was served longest ago (never
-- served first) and returns its head: zero rows when nothing at or above
-- p_min_priority is claimable.
CREATE OR REPLACE FUNCTION harel_claim(
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT DEFAULT 0)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_group TEXT;
    v_held  TEXT[] := '{}';  -- empty groups a publisher still holds: skip this call
BEGIN
    LOOP
        -- FOR NO KEY UPDATE: the key never changes, and no stronger lock is
        -- needed (the lost-publish guard above does not use row locks).
        UPDATE transport_groups AS g
           SET locked_by = p_token, lock_expiry = p_lease
         WHERE g.group_id = (
                 SELECT c.group_id
                   FROM transport_groups AS c
                  WHERE (c.locked_by IS NULL OR c.lock_expiry < p_now)
                    AND c.priority >= p_min_priority
                    AND c.group_id <> ALL (v_held)
                  ORDER BY COALESCE(c.lock_expiry, 0), c.group_id
                  LIMIT 1
                    FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING g.group_id INTO v_group;
        IF v_group IS NULL THEN
            RETURN;
        END IF;

        -- A statement of its own, so a snapshot taken after the lock: the head
        -- as it is now, never one that an earlier holder has just acked.
        RETURN QUERY
            SELECT m.group_id, m.seq, m.event
              FROM transport_messages AS m
             WHERE m.group_id = v_group
             ORDER BY m.seq
             LIMIT 1;
        IF FOUND THEN
            RETURN;
        END IF;

        -- An empty group row. Delete it only if no publisher is mid-
        -- transaction on it: a publisher holds the group's lock (shared;
        -- see harel_hold_group) from its message insert until it commits,
        -- and its message is invisible to us until then.
        IF pg_try_advisory_xact_lock(('transport_messages'::regclass::oid::bigint & 2147483647)::int, harel_group_lock_key(v_group)) THEN
            RETURN QUERY
                SELECT m.group_id, m.seq, m.event
                  FROM transport_messages AS m
                 WHERE m.group_id = v_group
                 ORDER BY m.seq
                 LIMIT 1;
            IF FOUND THEN
                RETURN;  -- a publisher committed meanwhile
            END IF;
            DELETE FROM transport_groups AS g WHERE g.group_id = v_group;
        ELSE
            UPDATE transport_groups AS g
               SET locked_by = NULL, lock_expiry = p_now
             WHERE g.group_id = v_group;
            v_held := v_held || v_group;
        END IF;
    END LOOP;
END
$$;

-- harel_ack settles a lease: false, changing nothing, unless p_token still
-- holds p_group. Otherwise it deletes message p_seq and frees the group with
-- lock_expiry = p_now (so it queues behind groups served less recently), or
-- deletes the group row when it has no message left.
CREATE OR REPLACE FUNCTION harel_ack(
    p_group TEXT,
    p_seq   BIGINT,
    p_token TEXT,
    p_now   DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    -- The fence, and a lock that keeps it ours until commit.
    PERFORM 1 FROM transport_groups AS g
      WHERE g.group_id = p_group AND g.locked_by = p_token
        FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;

    DELETE FROM transport_messages AS m
     WHERE m.seq = p_seq AND m.group_id = p_group;

    -- Drained, as far as committed data shows? A publisher that has inserted
    -- but not committed holds the group's lock (shared): then the row must
    -- stay, or its message would be left without a group. A publisher that
    -- has not taken the lock yet waits for our commit, finds no row, and
    -- inserts one. Each check is its own statement, so the second sees
    -- whatever committed before we took the lock.
    IF NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group) THEN
        IF pg_try_advisory_xact_lock(('transport_messages'::regclass::oid::bigint & 2147483647)::int, harel_group_lock_key(p_group)) THEN
            IF NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group) THEN
                DELETE FROM transport_groups AS g WHERE g.group_id = p_group;
                RETURN true;
            END IF;
        END IF;
    END IF;

    UPDATE transport_groups AS g
       SET locked_by = NULL, lock_expiry = p_now
     WHERE g.group_id = p_group;
    RETURN true;
END
$$;
