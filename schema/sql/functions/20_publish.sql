-- 20_publish.sql: publish (harel_publish, harel_publish_many).

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
SET enable_seqscan = off
SET jit = off
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

-- harel_publish_many appends p_events[i] to p_groups[i], in array order
-- (so in order within each group), and readies new groups with the
-- priority of their first message in the batch. Returns the seqs in array
-- order. One statement per table: a batch of any size is one round-trip.
CREATE OR REPLACE FUNCTION harel_publish_many(
    p_groups     TEXT[],
    p_events     TEXT[],
    p_priorities INT[])
RETURNS SETOF BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF cardinality(p_events) <> cardinality(p_groups) OR cardinality(p_priorities) <> cardinality(p_groups) THEN
        PERFORM harel_refuse_lengths('harel_publish_many');
    END IF;
    RETURN QUERY
        WITH ins AS (
            INSERT INTO transport_messages (group_id, event)
            SELECT u.g, u.e
              FROM unnest(p_groups, p_events) WITH ORDINALITY AS u(g, e, i)
             ORDER BY u.i
            RETURNING transport_messages.seq
        )
        SELECT ins.seq FROM ins ORDER BY ins.seq;
    INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
    SELECT DISTINCT ON (u.g) u.g, NULL, NULL, u.p
      FROM unnest(p_groups, p_priorities) WITH ORDINALITY AS u(g, p, i)
     ORDER BY u.g, u.i
    ON CONFLICT (group_id) DO NOTHING;
END
$$;
