-- 60_nack_extend.sql: nack and extend.

-- harel_nack gives a lease back: p_delay > 0 parks the group until
-- p_now + p_delay, keeping the token; p_delay = 0 frees the group at once,
-- first in line, its head unchanged. False, changing nothing, if p_token no
-- longer holds p_group. A NULL or negative p_delay is refused (PT004), a
-- park with a NULL p_now too (PT003: it would never end).
CREATE OR REPLACE FUNCTION harel_nack(
    p_group TEXT,
    p_token TEXT,
    p_now   DOUBLE PRECISION,
    p_delay DOUBLE PRECISION)
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
    IF p_delay IS NULL OR p_delay < 0 THEN
        RAISE EXCEPTION 'harel_nack: p_delay (%) is NULL or negative', p_delay USING ERRCODE = 'PT004';
    END IF;
    IF p_delay > 0 AND p_now IS NULL THEN
        RAISE EXCEPTION 'harel_nack: a park (p_delay %) needs p_now', p_delay USING ERRCODE = 'PT003';
    END IF;
    IF harel_clock_skewed(p_now) THEN
        PERFORM harel_refuse_skew('harel_nack', p_now);
    END IF;
    IF p_delay > 0 THEN
        UPDATE transport_groups AS g
           SET lock_expiry = p_now + p_delay, retry_at = p_now + p_delay
         WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> '';
    ELSE
        UPDATE transport_groups AS g
           SET locked_by = NULL, lock_expiry = NULL, retry_at = COALESCE(p_now, date_part('epoch', clock_timestamp()))
         WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> '';
    END IF;
    RETURN FOUND;
END
$$;

-- harel_extend moves the lease's end to p_lease. False, changing nothing, if
-- p_token no longer holds p_group. A NULL p_lease, or one before the
-- server's clock by more than the clock bound, is refused (PT003): the
-- caller's now is unknown here, but it is within the bound of the
-- server's, so such an end is in the past for any caller.
CREATE OR REPLACE FUNCTION harel_extend(
    p_group TEXT,
    p_token TEXT,
    p_lease DOUBLE PRECISION)
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
    IF p_lease IS NULL
       OR (p_lease < date_part('epoch', clock_timestamp()) AND harel_clock_skewed(p_lease)) THEN
        PERFORM harel_refuse_lease_past('harel_extend', p_lease);
    END IF;
    UPDATE transport_groups AS g
       SET lock_expiry = p_lease
     WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> '';
    RETURN FOUND;
END
$$;


-- harel_extend_many moves the end of many leases to p_lease in one
-- round-trip (a worker's heartbeat for all its running handlers): held,
-- one row per input in input order, is false (and nothing changed for
-- it) where p_tokens[i] no longer holds p_groups[i] or p_seqs[i] is not the
-- message the lease was handed (version 10), and for every repeat of a
-- group named earlier. A NULL p_lease, or one in the past beyond the clock
-- bound, is refused (PT003), as harel_extend does.
CREATE OR REPLACE FUNCTION harel_extend_many(
    p_groups TEXT[],
    p_seqs   BIGINT[],
    p_tokens TEXT[],
    p_lease  DOUBLE PRECISION)
RETURNS TABLE (group_id TEXT, held BOOLEAN)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    IF p_lease IS NULL
       OR (p_lease < date_part('epoch', clock_timestamp()) AND harel_clock_skewed(p_lease)) THEN
        PERFORM harel_refuse_lease_past('harel_extend_many', p_lease);
    END IF;
    IF cardinality(p_seqs) IS DISTINCT FROM cardinality(p_groups)
       OR cardinality(p_tokens) IS DISTINCT FROM cardinality(p_groups) THEN
        PERFORM harel_refuse_lengths('harel_extend_many');
    END IF;
    RETURN QUERY
        WITH extended AS (
            UPDATE transport_groups AS g
               SET lock_expiry = p_lease
              FROM (SELECT DISTINCT ON (u.gid) u.gid, u.s, u.tok, u.i
                      FROM unnest(p_groups, p_seqs, p_tokens) WITH ORDINALITY AS u(gid, s, tok, i)
                     ORDER BY u.gid, u.i) AS a
             WHERE g.group_id = a.gid AND g.locked_by = a.tok AND g.locked_by <> ''
               AND (g.delivered_seq IS NULL OR g.delivered_seq = a.s)
            RETURNING a.i
        )
        SELECT u.gid, x.i IS NOT NULL
          FROM unnest(p_groups) WITH ORDINALITY AS u(gid, i)
          LEFT JOIN extended AS x ON x.i = u.i
         ORDER BY u.i;
END
$$;
