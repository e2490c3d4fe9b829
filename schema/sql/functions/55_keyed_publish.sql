-- 55_keyed_publish.sql: idempotent publish (version 10).

-- harel_publish_keyed is harel_publish_many with an optional dedup key per
-- message: where p_keys[i] is not NULL and (p_groups[i], p_keys[i]) was
-- published within the last p_window seconds (server clock), or earlier
-- in this batch, nothing is stored for it and the seq it was first
-- published under is returned in its place. Concurrent publishes with one
-- key store it once: the second waits for the first to commit (the key's
-- unique index) and returns its seq; if the first rolls back, the second
-- stores. A key is 1 to 256 bytes (PT006 otherwise). Every message gets
-- its seq first, in array order, so order within a group is array order,
-- as in harel_publish_many, and so are tenants (p_tenants). Each call also deletes up to twice its size
-- (plus 8) of expired keys, so the table stays bounded with no job to run.
CREATE OR REPLACE FUNCTION harel_publish_keyed(
    p_groups     TEXT[],
    p_events     TEXT[],
    p_priorities INT[],
    p_keys       TEXT[],
    p_window     DOUBLE PRECISION,
    p_tenants    TEXT[] DEFAULT NULL)
RETURNS SETOF BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_clock DOUBLE PRECISION := date_part('epoch', clock_timestamp());
    v_seqs  BIGINT[];   -- per input: a fresh seq
    v_out   BIGINT[];   -- per input: the seq returned
    v_new   BOOLEAN[];  -- per input: stored
    v_groups TEXT[];    -- the stored messages' groups
    v_prios  INT[];     -- and priorities
    v_tenants TEXT[];   -- and tenants
BEGIN
    IF cardinality(p_events) IS DISTINCT FROM cardinality(p_groups)
       OR cardinality(p_priorities) IS DISTINCT FROM cardinality(p_groups)
       OR cardinality(p_keys) IS DISTINCT FROM cardinality(p_groups)
       OR (p_tenants IS NOT NULL AND cardinality(p_tenants) IS DISTINCT FROM cardinality(p_groups)) THEN
        PERFORM harel_refuse_lengths('harel_publish_keyed');
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_tenants) AS t WHERE octet_length(t) NOT BETWEEN 1 AND 256) THEN
        PERFORM harel_refuse_tenant('harel_publish_keyed', (SELECT t FROM unnest(p_tenants) AS t WHERE octet_length(t) NOT BETWEEN 1 AND 256 LIMIT 1));
    END IF;
    IF p_window IS NULL OR p_window < 0 THEN
        RAISE EXCEPTION 'harel_publish_keyed: p_window (%) is NULL or negative', p_window USING ERRCODE = 'PT006';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_keys) AS k WHERE octet_length(k) NOT BETWEEN 1 AND 256) THEN
        RAISE EXCEPTION 'harel_publish_keyed: a dedup key is empty or longer than 256 bytes' USING ERRCODE = 'PT006';
    END IF;
    -- A grown cluster's fence ("Growing"), before this call's keys are
    -- written: they would keep a group here that has left.
    PERFORM harel_fence(p_groups);

    SELECT array_agg(x.s ORDER BY x.i) INTO v_seqs
      FROM (SELECT u.i, nextval(pg_get_serial_sequence('transport_messages', 'seq')) AS s
              FROM generate_series(1, cardinality(p_groups)) AS u(i)
             ORDER BY u.i) AS x;

    -- Each key's first naming in the batch takes the key, unless it is
    -- held and unexpired. In (group, key) order, so that two calls wait
    -- for each other's keys in one order: no deadlock between calls, each
    -- in its own transaction. (A caller's transaction holds its keys'
    -- locks until it ends, so two such transactions that publish the same
    -- keys in opposite orders, over several calls, can deadlock, as any
    -- two transactions that write the same rows can.)
    INSERT INTO transport_dedup AS d (group_id, dedup_key, seq, expires_at)
    SELECT f.g, f.k, f.s, v_clock + p_window
      FROM (SELECT DISTINCT ON (u.g, u.k) u.g, u.k, u.s
              FROM unnest(p_groups, p_keys, v_seqs) WITH ORDINALITY AS u(g, k, s, i)
             WHERE u.k IS NOT NULL
             ORDER BY u.g, u.k, u.i) AS f
     ORDER BY f.g, f.k
    ON CONFLICT (group_id, dedup_key) DO UPDATE
        SET seq = EXCLUDED.seq, expires_at = EXCLUDED.expires_at
        WHERE d.expires_at < v_clock;

    -- A keyed message is stored when its key now names its own seq.
    SELECT array_agg(COALESCE(d.seq, u.s) ORDER BY u.i),
           array_agg(u.k IS NULL OR d.seq = u.s ORDER BY u.i)
      INTO v_out, v_new
      FROM unnest(p_groups, p_keys, v_seqs) WITH ORDINALITY AS u(g, k, s, i)
      LEFT JOIN transport_dedup AS d ON d.group_id = u.g AND d.dedup_key = u.k;

    INSERT INTO transport_messages (seq, group_id, event)
    SELECT u.s, u.g, u.e
      FROM unnest(v_seqs, p_groups, p_events, v_new) WITH ORDINALITY AS u(s, g, e, n, i)
     WHERE u.n
     ORDER BY u.i;
    SELECT array_agg(u.g ORDER BY u.i), array_agg(u.p ORDER BY u.i), array_agg(p_tenants[u.i] ORDER BY u.i)
      INTO v_groups, v_prios, v_tenants
      FROM unnest(p_groups, p_priorities, v_new) WITH ORDINALITY AS u(g, p, n, i)
     WHERE u.n;
    IF v_groups IS NOT NULL THEN
        PERFORM harel_ready_groups(v_groups, v_prios, v_tenants);
    END IF;

    -- Expired keys, last, so that this cleanup (which never waits: SKIP
    -- LOCKED) adds no lock to the key order above.
    DELETE FROM transport_dedup AS d
     WHERE (d.group_id, d.dedup_key) IN (
           SELECT x.group_id, x.dedup_key
             FROM transport_dedup AS x
            WHERE x.expires_at < v_clock
            ORDER BY x.expires_at
            LIMIT 2 * cardinality(p_groups) + 8
              FOR UPDATE SKIP LOCKED);

    RETURN QUERY SELECT u.s FROM unnest(v_out) WITH ORDINALITY AS u(s, i) ORDER BY u.i;
END
$$;
