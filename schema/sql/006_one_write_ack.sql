-- 006_one_write_ack.sql: an ack writes its group row once.
--
-- harel_ack (001) locked the group row (a lock record in the WAL), then
-- rewrote it to free it; harel_ack_many (004) extended every held row as if
-- kept, then rewrote those it did not keep. Every rewrite of a group row is
-- a new row version plus an entry in each of its two indexes (lock_expiry
-- is indexed, so none is HOT). Now the fence is the write: one UPDATE checks
-- the token, locks the row until commit, and frees it (or, when kept,
-- extends it). Only a kept lease whose group turns out drained is written a
-- second time. Same signatures, same results, same guard for drained groups.
-- Idempotent.

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
    -- The fence, the lock that keeps it ours until commit, and the free.
    UPDATE transport_groups AS g
       SET locked_by = NULL, lock_expiry = p_now
     WHERE g.group_id = p_group AND g.locked_by = p_token;
    IF NOT FOUND THEN
        RETURN false;
    END IF;

    DELETE FROM transport_messages AS m
     WHERE m.seq = p_seq AND m.group_id = p_group;

    -- Drained, as far as committed data shows (a statement after the lock)?
    -- Then delete the row, unless a publisher is mid-transaction on the
    -- group (it holds the group's lock, shared; see harel_hold_group): the
    -- deleting statement runs after the try-lock, so it sees every message
    -- committed before it.
    IF NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group)
       AND pg_try_advisory_xact_lock(('transport_messages'::regclass::oid::bigint & 2147483647)::int, harel_group_lock_key(p_group)) THEN
        DELETE FROM transport_groups AS g
         WHERE g.group_id = p_group
           AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group);
    END IF;
    RETURN true;
END
$$;

-- harel_ack_many settles many leases in one round-trip, each fenced on its
-- own token: held is false (and nothing changed for it) where p_tokens[i]
-- no longer holds p_groups[i], and for every repeat of a group already
-- named earlier in the batch. A held lease's message is deleted. Then,
-- where p_keep[i] and the group has another message, the lease is kept
-- (same token, lock_expiry = p_lease) and that next head is returned in
-- next_seq/next_event; otherwise the group is freed with lock_expiry =
-- p_now, or its row deleted when drained (with harel_ack's guard). One row
-- per input, in input order.
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
    v_held    TEXT[];    -- groups whose token held
    v_seqs    BIGINT[];  -- their acked messages
    v_at      BIGINT[];  -- their places in the input
    v_keep    BOOLEAN[]; -- whether they were extended rather than freed
    v_drained TEXT[];
    v_unkept  TEXT[];    -- extended, but drained: to free unless deleted
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

    -- The fences, the locks that keep them ours until commit, and the
    -- frees (or extensions, where keeping is asked) in one write per row.
    -- A group named twice counts once, at its first place. Joins, not
    -- per-row searches of the arrays: a batch of thousands stays linear.
    WITH fenced AS (
        UPDATE transport_groups AS g
           SET locked_by   = CASE WHEN a.keep THEN g.locked_by END,
               lock_expiry = CASE WHEN a.keep THEN p_lease ELSE p_now END
          FROM (SELECT DISTINCT ON (u.gid) u.gid, u.s, u.tok, u.keep, u.i
                  FROM unnest(p_groups, p_seqs, p_tokens, p_keep) WITH ORDINALITY AS u(gid, s, tok, keep, i)
                 ORDER BY u.gid, u.i) AS a
         WHERE g.group_id = ANY (p_groups)
           AND g.group_id = a.gid AND g.locked_by = a.tok
        RETURNING g.group_id, a.s, a.i, a.keep
    )
    SELECT array_agg(f.group_id), array_agg(f.s), array_agg(f.i), array_agg(f.keep)
      INTO v_held, v_seqs, v_at, v_keep
      FROM fenced AS f;

    -- The held acks' messages, by primary key, each with its own group.
    DELETE FROM transport_messages AS m
     WHERE m.seq = ANY (v_seqs)
       AND (m.seq, m.group_id) IN (SELECT * FROM unnest(v_seqs, v_held));

    -- Next heads, in a statement after the deletes and the locks.
    FOR r IN
        SELECT a.gid, COALESCE(v.keep, false) AS keep, (v.i IS NOT NULL) AS ok, h.seq, h.event
          FROM unnest(p_groups) WITH ORDINALITY AS a(gid, i)
          LEFT JOIN unnest(v_at, v_keep) AS v(i, keep) ON v.i = a.i
          LEFT JOIN LATERAL (
                SELECT m.seq, m.event
                  FROM transport_messages AS m
                 WHERE m.group_id = a.gid AND v.i IS NOT NULL
                 ORDER BY m.seq
                 LIMIT 1) AS h ON true
         ORDER BY a.i
    LOOP
        group_id := r.gid; held := r.ok; next_seq := NULL; next_event := NULL;
        IF r.ok AND r.seq IS NULL THEN
            v_drained := v_drained || r.gid;
            IF r.keep THEN
                v_unkept := v_unkept || r.gid;
            END IF;
        ELSIF r.ok AND r.keep THEN
            next_seq := r.seq; next_event := r.event;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF v_drained IS NULL THEN
        RETURN;
    END IF;

    -- Drained, as far as committed data shows: delete the row only where
    -- no publisher is mid-transaction on the group (harel_ack's guard),
    -- re-checked in a statement after the try-lock; free the extended ones
    -- left.
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
    IF v_unkept IS NOT NULL THEN
        UPDATE transport_groups AS g
           SET locked_by = NULL, lock_expiry = p_now
         WHERE g.group_id = ANY (ARRAY(SELECT unnest(v_unkept) EXCEPT SELECT unnest(v_gone)));
    END IF;
END
$$;
