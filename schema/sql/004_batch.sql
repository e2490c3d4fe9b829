-- 004_batch.sql: many messages per round-trip. harel_claim and harel_ack
-- stay exactly as the design defines them; these are additions.
-- Idempotent.

-- harel_claim_many leases up to p_limit claimable groups (priority >=
-- p_min_priority, served longest ago first) to one token and returns the
-- head of each. Every lease is fenced on its own group row, so one token
-- for the batch is enough: an ack names the group and the token.
CREATE OR REPLACE FUNCTION harel_claim_many(
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT,
    p_limit        INT)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_groups TEXT[];
    v_empty  TEXT[];
    v_gone   TEXT[];
    r        RECORD;
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;
    -- Pick, then lease by primary key: every statement here reaches rows
    -- through an index (= ANY of an array), whatever the plan guesses
    -- about the array's size.
    SELECT array_agg(c.group_id) INTO v_groups
      FROM (SELECT c.group_id
              FROM transport_groups AS c
             WHERE (c.locked_by IS NULL OR c.lock_expiry < p_now)
               AND c.priority >= p_min_priority
             ORDER BY COALESCE(c.lock_expiry, 0), c.group_id
             LIMIT p_limit
               FOR NO KEY UPDATE SKIP LOCKED) AS c;
    UPDATE transport_groups AS g
       SET locked_by = p_token, lock_expiry = p_lease
     WHERE g.group_id = ANY (v_groups);
    IF v_groups IS NULL THEN
        RETURN;
    END IF;

    -- The heads, in a statement of their own: a snapshot taken after the
    -- locks, never a head an earlier holder has just acked.
    FOR r IN
        SELECT u.gid, h.seq, h.event
          FROM unnest(v_groups) AS u(gid)
          LEFT JOIN LATERAL (
                SELECT m.seq, m.event
                  FROM transport_messages AS m
                 WHERE m.group_id = u.gid
                 ORDER BY m.seq
                 LIMIT 1) AS h ON true
    LOOP
        IF r.seq IS NULL THEN
            v_empty := v_empty || r.gid;
        ELSE
            group_id := r.gid; seq := r.seq; event := r.event;
            RETURN NEXT;
        END IF;
    END LOOP;
    IF v_empty IS NULL THEN
        RETURN;
    END IF;

    -- Empty group rows: the same guard as harel_claim. Delete those no
    -- publisher is mid-transaction on (the try-lock), re-checked in a
    -- statement after the lock; free the rest.
    SELECT array_agg(e) INTO v_gone
      FROM unnest(v_empty) AS e
     WHERE pg_try_advisory_xact_lock(('transport_messages'::regclass::oid::bigint & 2147483647)::int, harel_group_lock_key(e));
    WITH deleted AS (
        DELETE FROM transport_groups AS g
         WHERE g.group_id = ANY (v_gone)
           AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = g.group_id)
        RETURNING g.group_id
    )
    SELECT array_agg(d.group_id) INTO v_gone FROM deleted AS d;
    UPDATE transport_groups AS g
       SET locked_by = NULL, lock_expiry = p_now
     WHERE g.group_id = ANY (ARRAY(SELECT unnest(v_empty) EXCEPT SELECT unnest(v_gone)));
END
$$;

-- harel_ack_many settles many leases in one statement, each fenced on its
-- own token: held is false (and nothing changed for it) where p_tokens[i]
-- no longer holds p_groups[i]. A held lease's message is deleted. Then,
-- where p_keep[i] and the group has another message, the lease is kept
-- (same token, lock_expiry = p_lease) and that next head is returned in
-- next_seq/next_event; otherwise the group is freed with lock_expiry =
-- p_now, or its row deleted when drained (with harel_ack's guard).
CREATE OR REPLACE FUNCTION harel_ack_many(
    p_groups TEXT[],
    p_seqs   BIGINT[],
    p_tokens TEXT[],
    p_keep   BOOLEAN[],
    p_now    DOUBLE PRECISION,
    p_lease  DOUBLE PRECISION)
RETURNS TABLE (group_id TEXT, held BOOLEAN, next_seq BIGINT, next_event TEXT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_held    TEXT[];  -- groups whose token held, with v_tok their tokens
    v_tok     TEXT[];
    v_seqs    BIGINT[];
    v_kept    TEXT[];
    v_drained TEXT[];
    v_gone    TEXT[];
    r         RECORD;
BEGIN
    IF p_groups IS NULL OR cardinality(p_groups) = 0 THEN
        RETURN;
    END IF;
    IF cardinality(p_seqs) <> cardinality(p_groups) OR cardinality(p_tokens) <> cardinality(p_groups)
       OR cardinality(p_keep) <> cardinality(p_groups) THEN
        RAISE EXCEPTION 'harel_ack_many: arrays of different lengths' USING ERRCODE = '22023';
    END IF;

    -- The fences, and the locks that keep them ours until commit, in one
    -- write: every held lease is extended to p_lease as if kept, so a kept
    -- group is written once; the others are freed or deleted below. Joins,
    -- not per-row searches of the arrays: a batch of thousands stays
    -- linear.
    WITH fenced AS (
        UPDATE transport_groups AS g
           SET lock_expiry = p_lease
         WHERE g.group_id = ANY (p_groups)
           AND (g.group_id, g.locked_by) IN (SELECT a.gid, a.tok FROM unnest(p_groups, p_tokens) AS a(gid, tok))
        RETURNING g.group_id, g.locked_by
    )
    SELECT array_agg(f.group_id), array_agg(f.locked_by) INTO v_held, v_tok FROM fenced AS f;

    -- The held acks' messages, by primary key.
    SELECT array_agg(a.s) INTO v_seqs
      FROM unnest(p_groups, p_seqs, p_tokens) AS a(gid, s, tok)
      JOIN unnest(v_held, v_tok) AS h(gid, tok) ON h.gid = a.gid AND h.tok = a.tok;
    DELETE FROM transport_messages AS m
     WHERE m.seq = ANY (v_seqs) AND m.group_id = ANY (v_held);

    -- Next heads, in a statement after the deletes and the locks.
    FOR r IN
        SELECT a.gid, a.keep, (v.gid IS NOT NULL) AS ok, h.seq, h.event
          FROM unnest(p_groups, p_tokens, p_keep) WITH ORDINALITY AS a(gid, tok, keep, i)
          LEFT JOIN unnest(v_held, v_tok) AS v(gid, tok) ON v.gid = a.gid AND v.tok = a.tok
          LEFT JOIN LATERAL (
                SELECT m.seq, m.event
                  FROM transport_messages AS m
                 WHERE m.group_id = a.gid AND v.gid IS NOT NULL
                 ORDER BY m.seq
                 LIMIT 1) AS h ON true
         ORDER BY a.i
    LOOP
        group_id := r.gid; held := r.ok; next_seq := NULL; next_event := NULL;
        IF r.ok AND r.seq IS NULL THEN
            v_drained := v_drained || r.gid;
        ELSIF r.ok AND r.keep THEN
            v_kept := v_kept || r.gid;
            next_seq := r.seq; next_event := r.event;
        END IF;
        RETURN NEXT;
    END LOOP;

    -- Drained, as far as committed data shows: delete the row only where
    -- no publisher is mid-transaction on the group (harel_ack's guard),
    -- re-checked after the lock; free every other held group.
    IF v_drained IS NOT NULL THEN
        SELECT array_agg(d) INTO v_gone
          FROM unnest(v_drained) AS d
         WHERE pg_try_advisory_xact_lock(('transport_messages'::regclass::oid::bigint & 2147483647)::int, harel_group_lock_key(d));
        WITH deleted AS (
            DELETE FROM transport_groups AS g
             WHERE g.group_id = ANY (COALESCE(v_gone, '{}'))
               AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = g.group_id)
            RETURNING g.group_id
        )
        SELECT array_agg(x.group_id) INTO v_gone FROM deleted AS x;
    END IF;
    -- Free every held group neither kept nor deleted (EXCEPT: hashed, so
    -- linear in the batch).
    UPDATE transport_groups AS g
       SET locked_by = NULL, lock_expiry = p_now
     WHERE g.group_id = ANY (ARRAY(
             SELECT unnest(v_held)
             EXCEPT SELECT unnest(v_kept)
             EXCEPT SELECT unnest(v_gone)));
END
$$;

-- harel_exchange is a worker's whole round-trip: settle a batch of leases
-- (harel_ack_many) and lease up to p_limit more groups minus those kept
-- (harel_claim_many), in one transaction. Rows: kind 'a' per settled lease
-- (held, and the next head if kept), then kind 'c' per new lease.
CREATE OR REPLACE FUNCTION harel_exchange(
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT,
    p_limit        INT,
    p_groups       TEXT[],
    p_seqs         BIGINT[],
    p_tokens       TEXT[],
    p_keep         BOOLEAN[])
RETURNS TABLE (kind "char", group_id TEXT, held BOOLEAN, seq BIGINT, event TEXT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_kept INT := 0;
    r      RECORD;
BEGIN
    FOR r IN SELECT * FROM harel_ack_many(p_groups, p_seqs, p_tokens, p_keep, p_now, p_lease) LOOP
        kind := 'a'; group_id := r.group_id; held := r.held; seq := r.next_seq; event := r.next_event;
        IF r.next_seq IS NOT NULL THEN
            v_kept := v_kept + 1;
        END IF;
        RETURN NEXT;
    END LOOP;
    RETURN QUERY
        SELECT 'c'::"char", c.group_id, true, c.seq, c.event
          FROM harel_claim_many(p_now, p_lease, p_token, p_min_priority, p_limit - v_kept) AS c;
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
AS $$
BEGIN
    IF cardinality(p_events) <> cardinality(p_groups) OR cardinality(p_priorities) <> cardinality(p_groups) THEN
        RAISE EXCEPTION 'harel_publish_many: arrays of different lengths' USING ERRCODE = '22023';
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
