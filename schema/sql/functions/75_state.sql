-- 75_state.sql: exactly-once, the per-group state (version 12).
--
-- A consumer whose effects are rows in this same database applies them
-- exactly once by committing them with the ack, in one transaction of its
-- own: BEGIN; its writes; harel_ack (or harel_ack_state); COMMIT. The ack is
-- fenced by the lease's token, so a holder whose lease was lost gets false
-- (or PT001) before it commits, rolls back, and nothing of its attempt is
-- applied; the message's next holder applies it. Either the writes and
-- the ack both commit or neither does, so when the COMMIT's reply is lost
-- the message is acked if and only if the writes committed.
--
-- A group's state is a small value (at most 256 KiB) kept with its group
-- row (transport_groups.state) and written only by harel_ack_state, in the
-- ack's transaction and fenced as the ack is: a stale holder can never
-- overwrite it. It is what an event-sourced consumer folds its events
-- into: read S(n-1) with harel_state, apply event n, save S(n) with the
-- ack of n. When the group drains its row is deleted; with the queue's
-- state_retention > 0 (transport_policy) the trigger below keeps the
-- state in transport_kept_states for that long, where harel_state finds
-- it until the group's next state write replaces it. A group row with no
-- state costs nothing here: the trigger fires only for rows that carry
-- one.

-- harel_keep_state is the trigger that keeps a drained group's state:
-- after the delete of a group row that carries one, when the queue's
-- state_retention is above 0, the state is kept until now + retention
-- (server clock), replacing what was kept for the group; and up to 8
-- expired kept states are deleted, so the table is cleaned at the rate
-- it is written. Whatever deletes the row (an ack that drains it, a
-- claim that finds it empty, a dead letter, a purge), the state is kept.
CREATE OR REPLACE FUNCTION harel_keep_state()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_now       DOUBLE PRECISION := date_part('epoch', clock_timestamp());
    v_retention DOUBLE PRECISION;
BEGIN
    SELECT p.state_retention INTO v_retention FROM transport_policy AS p;
    IF v_retention > 0 THEN
        INSERT INTO transport_kept_states AS k (group_id, state, keep_until)
        VALUES (OLD.group_id, OLD.state, v_now + v_retention)
        ON CONFLICT (group_id) DO UPDATE
            SET state = EXCLUDED.state, keep_until = EXCLUDED.keep_until;
        DELETE FROM transport_kept_states AS k
         WHERE k.group_id IN (SELECT x.group_id FROM transport_kept_states AS x
                               WHERE x.keep_until < v_now
                               ORDER BY x.keep_until
                               LIMIT 8
                               FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS transport_groups_keep_state ON transport_groups;
CREATE TRIGGER transport_groups_keep_state
    AFTER DELETE ON transport_groups
    FOR EACH ROW WHEN (OLD.state IS NOT NULL)
    EXECUTE FUNCTION harel_keep_state();

-- harel_ack_state is harel_ack that also sets the group's state to p_state
-- (NULL clears it), in the same transaction: when the ack holds (true),
-- the state is p_state, and the caller's writes, the state and the ack
-- commit or roll back together. When it does not (false, or PT001 as
-- harel_ack raises), the state is unchanged, and the caller must roll back
-- its own writes. A p_state over 262,144 bytes is refused with PT008 and
-- nothing is written. A state kept after the group drained
-- (transport_kept_states) is deleted by the write: the group row's state
-- is now the group's. The state write is fenced as harel_ack is (p_token
-- holds p_group and p_seq is the message it was handed) and locks the
-- group row until the caller's commit: call it last, just before COMMIT.
-- A state equal to the stored one is not written again.
CREATE OR REPLACE FUNCTION harel_ack_state(
    p_group TEXT,
    p_seq   BIGINT,
    p_token TEXT,
    p_now   DOUBLE PRECISION,
    p_state BYTEA)
RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    IF octet_length(p_state) > 262144 THEN
        RAISE EXCEPTION 'harel_ack_state: the state is % bytes, the limit is 262144', octet_length(p_state)
            USING ERRCODE = 'PT008';
    END IF;
    UPDATE transport_groups AS g
       SET state = p_state
     WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> ''
       AND (g.delivered_seq IS NULL OR g.delivered_seq = p_seq)
       AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group)
       AND g.state IS DISTINCT FROM p_state;
    IF FOUND THEN
        DELETE FROM transport_kept_states AS k WHERE k.group_id = p_group;
    ELSIF EXISTS (SELECT 1 FROM transport_kept_states AS k WHERE k.group_id = p_group) THEN
        -- The row's state already is p_state, but a kept one would still
        -- be read in place of a NULL: delete it, under the fence (the
        -- row's lock, so it holds until commit).
        PERFORM 1 FROM transport_groups AS g
          WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> ''
            AND (g.delivered_seq IS NULL OR g.delivered_seq = p_seq)
            AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group)
          FOR NO KEY UPDATE;
        IF FOUND THEN
            DELETE FROM transport_kept_states AS k WHERE k.group_id = p_group;
        END IF;
    END IF;
    RETURN harel_ack(p_group, p_seq, p_token, p_now);
END
$$;

-- harel_state is p_group's state: its row's, else one kept after it
-- drained whose retention has not ended (server clock), else NULL.
-- Reading is not fenced (any caller may read any group's state): a
-- consumer reads it inside the transaction in which it holds the lease
-- and writes the next one with harel_ack_state, whose fence is what
-- makes the pair exactly once.
CREATE OR REPLACE FUNCTION harel_state(p_group TEXT)
RETURNS BYTEA
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
    SELECT COALESCE(
        (SELECT g.state FROM transport_groups AS g WHERE g.group_id = p_group),
        (SELECT k.state FROM transport_kept_states AS k
          WHERE k.group_id = p_group AND k.keep_until > date_part('epoch', clock_timestamp())))
$$;
