-- 002_publish_nack_extend.sql: publish, nack and extend as server-side
-- functions, one round-trip each. Idempotent.

-- harel_publish is the design's publish in one round-trip: append p_event
-- to p_group, then ready the group (a new group row gets p_priority; an
-- existing one keeps its lease and priority). The insert's trigger guards it
-- against a concurrent drain. Returns the message's seq.
CREATE OR REPLACE FUNCTION harel_publish(
    p_group    TEXT,
    p_event    TEXT,
    p_priority INT DEFAULT 0)
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_seq BIGINT;
BEGIN
    INSERT INTO transport_messages (group_id, event)
    VALUES (p_group, p_event)
    RETURNING seq INTO v_seq;
    INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
    VALUES (p_group, NULL, NULL, p_priority)
    ON CONFLICT (group_id) DO NOTHING;
    RETURN v_seq;
END
$$;

-- harel_nack gives a lease back: p_delay > 0 parks the group until
-- p_now + p_delay, keeping the token; otherwise the group is free at once,
-- first in line, its head unchanged. False, changing nothing, if p_token no
-- longer holds p_group.
CREATE OR REPLACE FUNCTION harel_nack(
    p_group TEXT,
    p_token TEXT,
    p_now   DOUBLE PRECISION,
    p_delay DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF p_delay > 0 THEN
        UPDATE transport_groups AS g
           SET lock_expiry = p_now + p_delay
         WHERE g.group_id = p_group AND g.locked_by = p_token;
    ELSE
        UPDATE transport_groups AS g
           SET locked_by = NULL, lock_expiry = NULL
         WHERE g.group_id = p_group AND g.locked_by = p_token;
    END IF;
    RETURN FOUND;
END
$$;

-- harel_extend moves the lease's end to p_lease. False, changing nothing, if
-- p_token no longer holds p_group.
CREATE OR REPLACE FUNCTION harel_extend(
    p_group TEXT,
    p_token TEXT,
    p_lease DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    UPDATE transport_groups AS g
       SET lock_expiry = p_lease
     WHERE g.group_id = p_group AND g.locked_by = p_token;
    RETURN FOUND;
END
$$;
