-- 40_ack.sql: the ack (harel_ack, the batch round-trip harel_exchange,
-- harel_ack_claim, harel_ack_many). An ack writes its group row once, in
-- columns no index holds (HOT).
--
-- An ack first reads the group's next message, before any lock: while its
-- token holds the group nothing else deletes that message (only a holder
-- deletes messages), so it is the head after the ack. Then the fence is the
-- one write: an UPDATE that checks the token, frees the row (or extends it,
-- when kept), and marks it drained (drained_at) where no message is left:
-- the row is kept for the group's next publish ("Kept rows" in
-- 30_claim.sql). Two kinds of drained row are deleted instead, after the
-- lost-publish guard's try-lock and a re-check (freed when a publisher
-- holds the guard): one with a state, so that the state is kept or dropped
-- as the policy says (75_state.sql), and a moving group's on a partition of
-- a growing cluster, whose next publish goes to its new home
-- (90_growing.sql).
--
-- A keep yields. p_keep asks, per lease, to keep its group for its next
-- message: true keeps it; NULL keeps it only while no other group waits in
-- the ready log at or above the caller's floor (harel_ready_waits), and
-- else frees it, its new entry behind the waiting ones; false frees it.
-- The Go client asks NULL past Config.KeepWhileWaiting messages in a row
-- (default 4) and false at Config.MaxKeep, so a group that becomes
-- claimable waits for the groups before it in the log, each taking at most
-- KeepWhileWaiting messages; with NULL from the first, at most one more
-- message of each lease then held (TestKeepYieldsToWaitingGroups). In
-- harel_exchange_leases the retry of a keep whose answer was lost keeps,
-- waiting groups or not (harel_ack_claim has no such retry).

-- harel_ack settles a lease: false, changing nothing, unless p_token still
-- holds p_group and message p_seq is still there; then it deletes the
-- message and frees the group (lock_expiry = p_now), marked drained when
-- no message is left. The design's call, with two differences: an ack of
-- a message already gone (a kept lease's earlier one) reports the lease
-- lost, where the design's freed the group from under the next message's
-- holder; and an ack of a message other than the one the lease was handed
-- (delivered_seq; a lease taken before version 10 has none and is not
-- checked) is refused with SQLSTATE PT001 (the batch calls answer held =
-- false). No token matches a stopped
-- group (locked_by '').
CREATE OR REPLACE FUNCTION harel_ack(
    p_group TEXT,
    p_seq   BIGINT,
    p_token TEXT,
    p_now   DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_drained BOOLEAN;
BEGIN
    IF harel_clock_skewed(p_now) THEN
        PERFORM harel_refuse_skew('harel_ack', p_now);
    END IF;
    -- Drained after this ack, as far as committed data shows?
    v_drained := NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group AND m.seq <> p_seq);
    -- A drained row with a state or of a moving group, with no publisher
    -- mid-transaction on it (harel_hold_group): the fence deletes it, in a
    -- statement after the try-lock, which sees every message committed
    -- before the lock.
    IF v_drained AND EXISTS (SELECT 1 FROM transport_groups AS g
                              WHERE g.group_id = p_group AND NOT g.paused
                                AND (g.state IS NOT NULL
                                     OR EXISTS (SELECT 1 FROM transport_partition AS p
                                                 WHERE p.parts IS NOT NULL AND hashtext(g.group_id) & (p.parts - 1) <> p.part)))
       AND harel_try_guard(p_group) THEN
        DELETE FROM transport_groups AS g
         WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> '' AND NOT g.paused
           AND (g.delivered_seq IS NULL OR g.delivered_seq = p_seq)
           AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group)
           AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group AND m.seq <> p_seq);
    END IF;
    IF NOT FOUND THEN
        -- The fence and the free, marked when drained (not a paused row,
        -- nor one with a state, whose delete was put off). The message
        -- must still be there: a kept token also holds for an earlier
        -- message, whose second ack would free the group from under the
        -- next message's holder.
        UPDATE transport_groups AS g
           SET locked_by = NULL, lock_expiry = p_now, retry_at = NULL,
               drained_at = CASE WHEN v_drained AND NOT g.paused AND g.state IS NULL THEN p_now END
         WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> ''
           AND (g.delivered_seq IS NULL OR g.delivered_seq = p_seq)
           AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group);
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM transport_groups AS g
                        WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> ''
                          AND g.delivered_seq <> p_seq
                          AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group)) THEN
                RAISE EXCEPTION 'harel_ack: message % is not the one the lease on group % was handed', p_seq, p_group
                    USING ERRCODE = 'PT001';
            END IF;
            RETURN false;
        END IF;
    END IF;
    DELETE FROM transport_messages AS m
     WHERE m.seq = p_seq AND m.group_id = p_group;
    RETURN true;
END
$$;

-- harel_exchange_leases is a worker's whole round-trip in one
-- transaction: settle a batch of leases as harel_ack_many describes, then
-- lease up to p_limit groups less the leases it kept. Rows: kind 'a' per
-- input, in input order (held, and the next head if kept, attempt 1),
-- then kind 'c' per new lease. With p_rest (a stream's) its claim sweeps
-- on a budget and not while the sweeps rest, so it may lease nothing
-- while a group is claimable ("Going round" in 30_claim.sql); without, it
-- leases something when anything is claimable. harel_ack_many calls this;
-- harel_exchange is it without attempt, age and p_rest.
CREATE OR REPLACE FUNCTION harel_exchange_leases(
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT,
    p_limit        INT,
    p_groups       TEXT[],
    p_seqs         BIGINT[],
    p_tokens       TEXT[],
    p_keep         BOOLEAN[],
    p_rest         BOOLEAN DEFAULT false)
RETURNS TABLE (kind "char", group_id TEXT, held BOOLEAN, seq BIGINT, event TEXT, attempt INT, age DOUBLE PRECISION)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_first   BOOLEAN[]; -- per input: the first naming of its group
    v_next    BIGINT[];  -- per input: the group's next message, if any
    v_events  TEXT[];
    v_pubs    TIMESTAMPTZ[];
    v_drained BOOLEAN;   -- some group looks drained
    v_locked  BOOLEAN[]; -- per input: it looks drained and is try-locked
    v_at      BIGINT[];  -- input places of the held leases
    v_kept    BOOLEAN[]; -- and whether each was kept
    v_groups  TEXT[];    -- and their groups and acked messages
    v_seqs    BIGINT[];
    v_nkept   INT := 0;  -- leases kept: each takes a slot of p_limit
    v_keep    BOOLEAN[]; -- per input: kept if held
    v_front   BIGINT := harel_ready_front();  -- before the acks take an id (25_ready.sql)
    v_yield   BOOLEAN;   -- a group waits: keeps yield (the top of this file)
BEGIN
    v_yield := array_position(p_keep, NULL) IS NOT NULL AND harel_ready_waits(v_front, p_min_priority, p_now, p_groups);
    -- The entry checks (15_checks.sql): the token only where a claim uses
    -- it, the lease end only where a claim or a keep does.
    IF p_limit > 0 AND (p_token IS NULL OR p_token = '') THEN
        PERFORM harel_refuse_token('harel_exchange');
    END IF;
    IF (p_limit > 0 OR true = ANY (p_keep) OR array_position(p_keep, NULL) IS NOT NULL) AND (p_lease IS NULL OR p_lease <= p_now) THEN
        PERFORM harel_refuse_lease('harel_exchange', p_lease, p_now);
    END IF;
    IF harel_clock_skewed(p_now) THEN
        PERFORM harel_refuse_skew('harel_exchange', p_now);
    END IF;
    IF cardinality(p_groups) > 0 THEN
        IF cardinality(p_seqs) IS DISTINCT FROM cardinality(p_groups)
           OR cardinality(p_tokens) IS DISTINCT FROM cardinality(p_groups)
           OR cardinality(p_keep) IS DISTINCT FROM cardinality(p_groups) THEN
            PERFORM harel_refuse_lengths('harel_exchange');
        END IF;

        -- Each lease's next message, before any lock (the top of this file),
        -- and whether it is kept: asked to be, with a next message, and no
        -- group waiting but for the retry of a keep, whose message is gone.
        SELECT array_agg(x.first ORDER BY x.i), array_agg(x.seq ORDER BY x.i), array_agg(x.event ORDER BY x.i),
               array_agg(x.published_at ORDER BY x.i), array_agg(x.keep ORDER BY x.i),
               count(*) FILTER (WHERE x.first AND x.seq IS NULL) > 0
          INTO v_first, v_next, v_events, v_pubs, v_keep, v_drained
          FROM (SELECT u.i, h.seq, h.event, h.published_at,
                       row_number() OVER (PARTITION BY u.gid ORDER BY u.i) = 1 AS first,
                       CASE WHEN u.k IS NOT false AND h.seq IS NOT NULL
                            THEN COALESCE(u.k OR NOT v_yield OR NOT EXISTS (SELECT 1 FROM transport_messages AS m
                                                                             WHERE m.seq = u.s AND m.group_id = u.gid OFFSET 0), false)
                            ELSE false END AS keep
                  FROM unnest(p_groups, p_seqs, p_keep) WITH ORDINALITY AS u(gid, s, k, i)
                  LEFT JOIN LATERAL (
                        SELECT m.seq, m.event, m.published_at
                          FROM transport_messages AS m
                         WHERE m.group_id = u.gid AND m.seq <> u.s
                         ORDER BY m.seq
                         LIMIT 1) AS h ON true) AS x;

        -- Those that look drained and carry a state or are moving: the
        -- guard's try-lock, then the fence that deletes the row if still
        -- no other message. Every statement here reaches its rows by
        -- primary key, one input at a time, so a batch stays linear.
        IF v_drained THEN
            SELECT array_agg(x.locked ORDER BY x.i) INTO v_locked
              FROM (SELECT u.i, CASE WHEN u.first AND u.nxt IS NULL
                                      AND EXISTS (SELECT 1 FROM transport_groups AS g
                                                   WHERE g.group_id = u.gid AND NOT g.paused
                                                     AND (g.state IS NOT NULL
                                                          OR EXISTS (SELECT 1 FROM transport_partition AS p
                                                                      WHERE p.parts IS NOT NULL
                                                                        AND hashtext(g.group_id) & (p.parts - 1) <> p.part)))
                                THEN harel_try_guard(u.gid)
                                ELSE false END AS locked
                      FROM unnest(p_groups, v_next, v_first) WITH ORDINALITY AS u(gid, nxt, first, i)) AS x;
        END IF;
        IF true = ANY (v_locked) THEN  -- a delete that deletes nothing would still run its statement trigger
            WITH gone AS (
                DELETE FROM transport_groups AS g
                 USING unnest(p_groups, p_seqs, p_tokens, v_locked) WITH ORDINALITY AS a(gid, s, tok, locked, i)
                 WHERE a.locked AND g.group_id = ANY (ARRAY[a.gid]) AND g.locked_by = a.tok AND g.locked_by <> '' AND NOT g.paused
                   AND (g.delivered_seq IS NULL OR g.delivered_seq = a.s)
                   AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = a.s AND m.group_id = a.gid OFFSET 0)
                   AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = a.gid AND m.seq <> a.s OFFSET 0)
                RETURNING a.i, g.group_id, a.s
            )
            SELECT array_agg(x.i), array_agg(false), array_agg(x.group_id), array_agg(x.s)
              INTO v_at, v_kept, v_groups, v_seqs
              FROM gone AS x;
        END IF;

        -- The rest: the fence that frees the row, or keeps it, handing
        -- the lease its next message (delivered_seq moves on, attempt 1),
        -- and marks it where drained (not a paused row, nor one with a
        -- state). A lease to be freed must still have its message, as in
        -- harel_ack; one to be kept need not: that is the retry of a keep
        -- whose answer was lost (delivered_seq already names the next
        -- message), and it gets the same next message.
        WITH fenced AS (
            UPDATE transport_groups AS g
               SET locked_by     = CASE WHEN a.keep AND NOT g.paused THEN g.locked_by END,
                   lock_expiry   = CASE WHEN a.keep AND NOT g.paused THEN p_lease ELSE p_now END,
                   delivered_seq = CASE WHEN a.keep AND NOT g.paused THEN a.nxt ELSE g.delivered_seq END,
                   attempts      = CASE WHEN a.keep AND NOT g.paused THEN 1 ELSE g.attempts END,
                   handed        = CASE WHEN a.keep AND NOT g.paused AND g.delivered_seq IS DISTINCT FROM a.nxt
                                        THEN g.handed + 1 ELSE g.handed END,  -- a keep's retry hands out nothing new
                   leased_at     = CASE WHEN a.keep AND NOT g.paused THEN p_now ELSE g.leased_at END,
                   retry_at      = CASE WHEN a.keep AND NOT g.paused THEN g.retry_at END,
                   drained_at    = CASE WHEN a.nxt IS NULL AND NOT g.paused AND g.state IS NULL THEN p_now END
              FROM unnest(p_groups, p_seqs, p_tokens, v_keep, v_next, v_first) WITH ORDINALITY AS a(gid, s, tok, keep, nxt, first, i)
             WHERE a.first AND g.group_id = ANY (ARRAY[a.gid]) AND g.locked_by = a.tok AND g.locked_by <> ''
               AND (((g.delivered_seq IS NULL OR g.delivered_seq = a.s)
                     AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = a.s AND m.group_id = a.gid OFFSET 0))
                    OR (a.keep AND (g.delivered_seq IS NULL OR g.delivered_seq = a.nxt)
                        AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = a.s AND m.group_id = a.gid OFFSET 0)))
            RETURNING a.i, g.locked_by IS NOT NULL AS kept, g.group_id, a.s
        )
        SELECT COALESCE(v_at, '{}') || array_agg(f.i), COALESCE(v_kept, '{}') || array_agg(f.kept),
               COALESCE(v_groups, '{}') || array_agg(f.group_id), COALESCE(v_seqs, '{}') || array_agg(f.s),
               count(*) FILTER (WHERE f.kept)
          INTO v_at, v_kept, v_groups, v_seqs, v_nkept
          FROM fenced AS f;

        -- The held leases' messages, each found by a probe of its own
        -- (a LATERAL subquery with OFFSET 0 runs once a lease) and deleted
        -- by its row address; see "Plans that probe" in 10_guard.sql.
        DELETE FROM transport_messages AS m
         WHERE m.ctid = ANY (ARRAY(SELECT x.ctid
                                     FROM unnest(v_seqs, v_groups) AS u(s, gid),
                                          LATERAL (SELECT n.ctid FROM transport_messages AS n
                                                    WHERE n.seq = u.s AND n.group_id = u.gid OFFSET 0) AS x));

        RETURN QUERY
            SELECT 'a'::"char", a.gid, h.i IS NOT NULL,
                   CASE WHEN h.kept THEN a.nxt END, CASE WHEN h.kept THEN a.event END,
                   CASE WHEN h.kept THEN 1 END, CASE WHEN h.kept THEN date_part('epoch', clock_timestamp() - a.pub) END
              FROM unnest(p_groups, v_next, v_events, v_pubs) WITH ORDINALITY AS a(gid, nxt, event, pub, i)
              LEFT JOIN unnest(v_at, v_kept) AS h(i, kept) ON h.i = a.i
             ORDER BY a.i;
    END IF;
    IF p_limit - v_nkept > 0 THEN
        RETURN QUERY
            SELECT 'c'::"char", c.group_id, true, c.seq, c.event, c.attempt, c.age
              FROM harel_sweep(p_now, p_lease, p_token, p_min_priority, p_limit - v_nkept, 'harel_claim_many', p_rest) AS c;
    END IF;
END
$$;

-- harel_exchange is harel_exchange_leases without the attempt and age
-- columns.
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
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
    SELECT e.kind, e.group_id, e.held, e.seq, e.event
      FROM harel_exchange_leases(p_now, p_lease, p_token, p_min_priority, p_limit,
                                 p_groups, p_seqs, p_tokens, p_keep) WITH ORDINALITY AS e(kind, group_id, held, seq, event, attempt, age, n)
     ORDER BY e.n
$$;

-- harel_ack_claim is a blocking worker's step between two messages (one
-- transaction, one row): settle the lease p_token holds on p_group
-- (message p_seq) and take the worker's next one. With p_keep (NULL: and
-- no group waiting, "A keep yields") and another message in the group,
-- the lease keeps the group (as harel_ack_many's keep): kept, and that
-- message with attempt 1 and its age. Otherwise harel_ack settles it
-- (held, or PT001) and a claim of one leases a group to p_new_token: its
-- head in group_id..age, or NULLs. Cheaper for one
-- lease than harel_exchange, which is built for batches.
CREATE OR REPLACE FUNCTION harel_ack_claim(
    p_group        TEXT,
    p_seq          BIGINT,
    p_token        TEXT,
    p_keep         BOOLEAN,
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_new_token    TEXT,
    p_min_priority INT)
RETURNS TABLE (held BOOLEAN, kept BOOLEAN, group_id TEXT, seq BIGINT, event TEXT, attempt INT, age DOUBLE PRECISION)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_seq   BIGINT;
    v_event TEXT;
    v_pub   TIMESTAMPTZ;
    v_front BIGINT;
BEGIN
    v_front := harel_ready_front();  -- before the ack writes (as harel_exchange_leases)
    kept := false;
    IF p_keep OR (p_keep IS NULL AND NOT harel_ready_waits(v_front, p_min_priority, p_now, ARRAY[p_group])) THEN
        -- The keep, as harel_exchange_leases keeps (no group waits): the
        -- next message, read before any lock, then the fence that keeps it.
        SELECT m.seq, m.event, m.published_at INTO v_seq, v_event, v_pub
          FROM transport_messages AS m
         WHERE m.group_id = p_group AND m.seq <> p_seq
         ORDER BY m.seq
         LIMIT 1;
        IF v_seq IS NOT NULL THEN
            UPDATE transport_groups AS g
               SET lock_expiry = p_lease, delivered_seq = v_seq, attempts = 1, leased_at = p_now, handed = g.handed + 1
             WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> '' AND NOT g.paused
               AND (g.delivered_seq IS NULL OR g.delivered_seq = p_seq)
               AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group);
            IF FOUND THEN
                DELETE FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group;
                held := true; kept := true;
                group_id := p_group; seq := v_seq; event := v_event; attempt := 1;
                age := date_part('epoch', clock_timestamp() - v_pub);
                RETURN NEXT;
                RETURN;
            END IF;
            -- Not held, or not this seq: harel_ack answers it (false, or PT001).
        END IF;
    END IF;
    held := harel_ack(p_group, p_seq, p_token, p_now);
    SELECT c.group_id, c.seq, c.event, c.attempt, c.age INTO group_id, seq, event, attempt, age
      FROM harel_sweep(p_now, p_lease, p_new_token, p_min_priority, 1, 'harel_claim') AS c;
    RETURN NEXT;
END
$$;

-- harel_ack_many settles many leases in one round-trip, each fenced on its
-- own token, one row per input in input order: held is false (nothing
-- changed) where p_tokens[i] no longer holds p_groups[i], and for a group
-- named again. A held lease's message is deleted; where p_keep[i] (NULL:
-- and no group waiting, "A keep yields") and the group has another message
-- the lease is kept (same token, lock_expiry =
-- p_lease) and that head returned, else the group is freed as harel_ack
-- frees it. It is harel_exchange without the claim.
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
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        SELECT e.group_id, e.held, e.seq, e.event
          FROM harel_exchange_leases(p_now, p_lease, NULL, 0, 0, p_groups, p_seqs, p_tokens, p_keep)
               WITH ORDINALITY AS e(kind, group_id, held, seq, event, attempt, age, n)
         ORDER BY e.n;
END
$$;
