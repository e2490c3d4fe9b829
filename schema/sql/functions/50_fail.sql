-- 50_fail.sql: fail, release, and what happens to a message that keeps
-- failing (version 10): the retry, a stopped group's restart, and the dead
-- letters.

-- harel_bury moves messages (p_seqs[i] of p_groups[i]) to
-- transport_dead_letters with their group's priority and attempts and
-- p_error as the last error (or the message's own, where p_error is
-- NULL), and returns their groups. The caller holds the group rows.
CREATE OR REPLACE FUNCTION harel_bury(
    p_groups TEXT[],
    p_seqs   BIGINT[],
    p_error  TEXT)
RETURNS SETOF TEXT
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
    WITH gone AS (
        DELETE FROM transport_messages AS m
         USING unnest(p_groups, p_seqs) AS u(gid, s)
         WHERE m.seq = u.s AND m.group_id = u.gid
        RETURNING m.seq, m.group_id, m.event, m.published_at, m.last_error
    ), moved AS (
        INSERT INTO transport_dead_letters AS d
               (seq, group_id, event, priority, attempts, last_error, published_at)
        SELECT x.seq, x.group_id, x.event, COALESCE(g.priority, 0), COALESCE(g.attempts, 0),
               COALESCE(p_error, x.last_error), x.published_at
          FROM gone AS x
          LEFT JOIN transport_groups AS g ON g.group_id = x.group_id
        RETURNING d.group_id
    )
    SELECT m.group_id FROM moved AS m
$$;

-- harel_spend applies the queue's policy to heads about to be handed out
-- again (p_heads[i], the head of p_groups[i], held by the caller): those
-- whose group has handed them out max_attempts times already are
-- dead-lettered (stopped false) or their groups stopped (stopped true:
-- locked_by '', which no token matches, lock_expiry 'Infinity', which no
-- claim reaches, until harel_restart_group). locked_by '' with a finite
-- lock_expiry is a failed message's backoff (harel_fail): a park no
-- token holds. A claim refuses an empty token (PT002), so '' is never a
-- lease's. Returns those groups only; nothing when
-- max_attempts is 0.
CREATE OR REPLACE FUNCTION harel_spend(
    p_groups TEXT[],
    p_heads  BIGINT[])
RETURNS TABLE (group_id TEXT, stopped BOOLEAN)
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
    v_max    INT;
    v_stop   BOOLEAN;
    v_groups TEXT[];
    v_heads  BIGINT[];
BEGIN
    SELECT p.max_attempts, p.on_exhausted = 'stop' INTO v_max, v_stop
      FROM transport_policy AS p WHERE p.id;
    IF COALESCE(v_max, 0) = 0 THEN
        RETURN;
    END IF;
    SELECT array_agg(g.group_id), array_agg(u.s) INTO v_groups, v_heads
      FROM unnest(p_groups, p_heads) AS u(gid, s)
      JOIN transport_groups AS g ON g.group_id = u.gid
     WHERE g.delivered_seq = u.s AND g.attempts >= v_max;
    IF v_groups IS NULL THEN
        RETURN;
    END IF;
    IF v_stop THEN
        UPDATE transport_groups AS g
           SET locked_by = '', lock_expiry = 'Infinity', retry_at = NULL
         WHERE g.group_id = ANY (v_groups);
        RETURN QUERY SELECT u.gid, true FROM unnest(v_groups) AS u(gid);
    ELSE
        RETURN QUERY SELECT b, false FROM harel_bury(v_groups, v_heads, NULL) AS b;
    END IF;
END
$$;

-- harel_fenced_attempts is the fence of a settle that names its message
-- (harel_fail, harel_dead_letter, harel_snooze): the attempts of p_group's
-- head if p_token holds p_group and p_seq is the message it was handed,
-- the group row locked until commit; NULL, locking nothing, if not.
CREATE OR REPLACE FUNCTION harel_fenced_attempts(
    p_group TEXT,
    p_seq   BIGINT,
    p_token TEXT)
RETURNS INT
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
    SELECT g.attempts
      FROM transport_groups AS g
     WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> ''
       AND (g.delivered_seq = p_seq
            OR (g.delivered_seq IS NULL  -- a lease from before version 10: its head only
                AND p_seq = (SELECT m.seq FROM transport_messages AS m
                              WHERE m.group_id = p_group ORDER BY m.seq LIMIT 1)))
       AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group)
       FOR NO KEY UPDATE
$$;

-- harel_drop_head moves p_group's message p_seq, which the caller fenced
-- (harel_fenced_attempts), to the dead letters with p_error, and the group
-- goes on: freed with lock_expiry = p_now, or its row deleted when drained
-- (with the lost-publish guard; only acks keep a drained row).
CREATE OR REPLACE FUNCTION harel_drop_head(
    p_group TEXT,
    p_seq   BIGINT,
    p_now   DOUBLE PRECISION,
    p_error TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_gone BOOLEAN := false;
BEGIN
    PERFORM harel_bury(ARRAY[p_group], ARRAY[p_seq], p_error);
    IF NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group)
       AND harel_try_guard(p_group) THEN
        DELETE FROM transport_groups AS g
         WHERE g.group_id = p_group AND NOT g.paused
           AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group);
        v_gone := FOUND;
    END IF;
    IF NOT v_gone THEN
        UPDATE transport_groups AS g
           SET locked_by = NULL, lock_expiry = p_now, retry_at = NULL
         WHERE g.group_id = p_group;
    END IF;
END
$$;

-- harel_fail settles a lease whose handling failed, fenced like harel_ack
-- (p_token holds p_group and p_seq is the message it was handed). NULL,
-- changing nothing, if not. Otherwise, by the queue's policy
-- (transport_policy) and the attempt the lease was (the group row's
-- attempts):
--   'retry': attempts left. p_error (cut to 2,048 characters) is recorded
--     on the message (last_error) and the group is parked for
--     backoff_min * 2^(attempt-1) seconds, at most backoff_max, with
--     equal jitter (between half that and all of it, never below
--     backoff_min): always between backoff_min and backoff_max. The lease is over:
--     the park is held by no token (locked_by ''), so a late ack, nack
--     or extend under p_token changes nothing (a nack with a delay, by
--     contrast, parks under its own token).
--   'dead': max_attempts used. The message moves to
--     transport_dead_letters with p_error, and the group goes on: freed
--     with lock_expiry = p_now, or its row deleted when drained (with
--     the lost-publish guard; only acks keep a drained row).
--   'stopped': max_attempts used and the policy is 'stop': p_error is
--     recorded, the message stays at the head, and the group is stopped
--     until harel_restart_group.
-- A NULL p_now is refused (PT003: the park's end), as is one far from the
-- server's clock (PT005).
CREATE OR REPLACE FUNCTION harel_fail(
    p_group TEXT,
    p_seq   BIGINT,
    p_token TEXT,
    p_now   DOUBLE PRECISION,
    p_error TEXT)
RETURNS TEXT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_error TEXT := left(p_error, 2048);
    v_att   INT;
    v_max   INT;
    v_stop  BOOLEAN;
    v_min   DOUBLE PRECISION;
    v_cap   DOUBLE PRECISION;
    v_delay DOUBLE PRECISION;
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'harel_fail: p_now is NULL' USING ERRCODE = 'PT003';
    END IF;
    IF harel_clock_skewed(p_now) THEN
        PERFORM harel_refuse_skew('harel_fail', p_now);
    END IF;
    v_att := harel_fenced_attempts(p_group, p_seq, p_token);
    IF v_att IS NULL THEN
        RETURN NULL;
    END IF;
    v_att := GREATEST(v_att, 1);  -- a lease taken before version 10 counted nothing
    SELECT p.max_attempts, p.on_exhausted = 'stop', p.backoff_min, p.backoff_max
      INTO v_max, v_stop, v_min, v_cap
      FROM transport_policy AS p WHERE p.id;
    IF NOT FOUND THEN
        -- The policy row was deleted: retry for ever, with the table's
        -- default backoff, rather than park for no known time.
        v_max := 0; v_stop := false; v_min := 1; v_cap := 60;
    END IF;

    IF v_max > 0 AND v_att >= v_max AND NOT v_stop THEN
        PERFORM harel_drop_head(p_group, p_seq, p_now, v_error);
        RETURN 'dead';
    END IF;

    -- The message keeps the cause (a message with a group id from before
    -- version 9's rule cannot be rewritten, so it does not).
    UPDATE transport_messages AS m
       SET last_error = v_error
     WHERE m.seq = p_seq AND m.group_id = p_group
       AND octet_length(m.group_id) BETWEEN 1 AND 1024;
    IF v_max > 0 AND v_att >= v_max THEN
        UPDATE transport_groups AS g
           SET locked_by = '', lock_expiry = 'Infinity', retry_at = NULL
         WHERE g.group_id = p_group;
        RETURN 'stopped';
    END IF;
    v_delay := LEAST(v_cap, v_min * power(2::float8, LEAST(v_att - 1, 60)));
    v_delay := GREATEST(v_min, v_delay / 2 + random() * v_delay / 2);
    UPDATE transport_groups AS g
       SET locked_by = '', lock_expiry = p_now + v_delay, retry_at = p_now + v_delay
     WHERE g.group_id = p_group;
    RETURN 'retry';
END
$$;

-- harel_dead_letter moves the lease's message to the dead letters now,
-- with p_error (cut to 2,048 characters), whatever attempts it has left
-- and whatever the policy's on_exhausted: its handler found that it can
-- never succeed (Go: a handler's pgtransport.DeadLetterNow). Fenced as
-- harel_fail; the group goes on as after harel_fail's 'dead'. False,
-- changing nothing, if the lease no longer holds. p_now as harel_fail's.
CREATE OR REPLACE FUNCTION harel_dead_letter(
    p_group TEXT,
    p_seq   BIGINT,
    p_token TEXT,
    p_now   DOUBLE PRECISION,
    p_error TEXT)
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
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'harel_dead_letter: p_now is NULL' USING ERRCODE = 'PT003';
    END IF;
    IF harel_clock_skewed(p_now) THEN
        PERFORM harel_refuse_skew('harel_dead_letter', p_now);
    END IF;
    IF harel_fenced_attempts(p_group, p_seq, p_token) IS NULL THEN
        RETURN false;
    END IF;
    PERFORM harel_drop_head(p_group, p_seq, p_now, left(p_error, 2048));
    RETURN true;
END
$$;

-- harel_snooze ends the lease without counting its attempt: the group is
-- parked until p_now + p_delay (held by no token, as harel_fail's retry
-- park, so a late ack, nack or extend under p_token changes nothing), its
-- head unchanged and handed out again after the park with the attempt
-- number it had (Go: a handler's pgtransport.Snooze). A p_delay of 0 frees
-- the group at once, first in line, as harel_release. Fenced as
-- harel_fail: false, changing nothing, if the lease no longer holds. A
-- NULL or negative p_delay is refused (PT004), a NULL p_now too (PT003).
CREATE OR REPLACE FUNCTION harel_snooze(
    p_group TEXT,
    p_seq   BIGINT,
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
        RAISE EXCEPTION 'harel_snooze: p_delay (%) is NULL or negative', p_delay USING ERRCODE = 'PT004';
    END IF;
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'harel_snooze: p_now is NULL' USING ERRCODE = 'PT003';
    END IF;
    IF harel_clock_skewed(p_now) THEN
        PERFORM harel_refuse_skew('harel_snooze', p_now);
    END IF;
    IF harel_fenced_attempts(p_group, p_seq, p_token) IS NULL THEN
        RETURN false;
    END IF;
    IF p_delay > 0 THEN
        UPDATE transport_groups AS g
           SET locked_by = '', lock_expiry = p_now + p_delay, retry_at = p_now + p_delay,
               attempts = GREATEST(g.attempts - 1, 0)
         WHERE g.group_id = p_group;
    ELSE
        UPDATE transport_groups AS g
           SET locked_by = NULL, lock_expiry = NULL, retry_at = p_now, attempts = GREATEST(g.attempts - 1, 0)
         WHERE g.group_id = p_group;
    END IF;
    RETURN true;
END
$$;

-- harel_release gives back a lease that was never used (a consumer that
-- claimed more than it could start, or is shutting down): the group is
-- freed first in line, its head unchanged, as harel_nack with no delay
-- does, and the hand-out is not counted as an attempt. False, changing
-- nothing, if p_token no longer holds p_group.
CREATE OR REPLACE FUNCTION harel_release(
    p_group TEXT,
    p_token TEXT)
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
    UPDATE transport_groups AS g
       SET locked_by = NULL, lock_expiry = NULL, retry_at = date_part('epoch', clock_timestamp()),
           attempts = GREATEST(g.attempts - 1, 0), handed = GREATEST(g.handed - 1, 0)
     WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> '';
    RETURN FOUND;
END
$$;

-- harel_restart_group puts a stopped group back in the round-robin, first
-- in line, with a fresh set of attempts for its head; with p_skip_head,
-- the message that stopped it (its head, unless a redrive put older ones
-- before it) is dead-lettered first (the group goes on with the next
-- message; an empty group row is deleted by the next claim that reaches
-- it). False, changing nothing, if p_group is not stopped.
CREATE OR REPLACE FUNCTION harel_restart_group(
    p_group     TEXT,
    p_skip_head BOOLEAN)
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
    PERFORM 1 FROM transport_groups AS g
     WHERE g.group_id = p_group AND g.locked_by = '' AND g.lock_expiry = 'Infinity'
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_skip_head THEN
        -- The message that used its attempts (delivered_seq), or, if it
        -- is gone, the head.
        PERFORM harel_bury(ARRAY[p_group],
                           ARRAY[COALESCE(
                               (SELECT m.seq FROM transport_messages AS m, transport_groups AS g
                                 WHERE g.group_id = p_group AND m.seq = g.delivered_seq AND m.group_id = p_group),
                               (SELECT m.seq FROM transport_messages AS m
                                 WHERE m.group_id = p_group ORDER BY m.seq LIMIT 1))],
                           NULL);
    END IF;
    UPDATE transport_groups AS g
       SET locked_by = NULL, lock_expiry = NULL, retry_at = date_part('epoch', clock_timestamp()), attempts = 0
     WHERE g.group_id = p_group;
    RETURN true;
END
$$;


-- Dead letters.

-- harel_dead_letters lists dead letters in seq order: those of p_group
-- (NULL: every group) with seq > p_after (NULL: from the first), at most
-- p_limit.
CREATE OR REPLACE FUNCTION harel_dead_letters(
    p_group TEXT,
    p_after BIGINT,
    p_limit INT)
RETURNS TABLE (seq BIGINT, group_id TEXT, event TEXT, priority INT, attempts INT,
               last_error TEXT, published_at TIMESTAMPTZ, died_at TIMESTAMPTZ)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
    SELECT d.seq, d.group_id, d.event, d.priority, d.attempts, d.last_error, d.published_at, d.died_at
      FROM transport_dead_letters AS d
     WHERE (p_group IS NULL OR d.group_id = p_group)
       AND d.seq > COALESCE(p_after, 0)
     ORDER BY d.seq
     LIMIT p_limit
$$;

-- harel_redrive puts dead letters back (those of p_group, NULL: every
-- group; those in p_seqs, NULL: all of them) and returns how many. Each
-- goes back under its own seq, so at the head of its group in its original
-- order (its seq is older than anything published since), with a fresh set
-- of attempts; a drained group gets its row back, with the message's
-- priority. The messages are inserted before the group rows are, through
-- the lost-publish guard's trigger, as a publish is: safe against a
-- concurrent drain.
CREATE OR REPLACE FUNCTION harel_redrive(
    p_group TEXT,
    p_seqs  BIGINT[])
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_seqs   BIGINT[];
    v_groups TEXT[];
    v_events TEXT[];
    v_prios  INT[];
    v_pubs   TIMESTAMPTZ[];
    v_parts  INT;
    v_part   INT;
    v_sel    BIGINT[];
BEGIN
    -- In a grown cluster (90_growing.sql), a group whose home is another
    -- partition and that has only its dead letters here is redriven here
    -- (it drains in place): decided while they still keep it here
    -- (harel_stays, which also takes the guard), its row is written
    -- before they go, so the messages' fence finds it.
    SELECT m.parts, m.part INTO v_parts, v_part FROM harel_armed() AS m;
    IF v_parts IS NOT NULL THEN
        -- The dead letters redriven, locked once: what is decided on them
        -- is what is deleted below.
        v_sel := ARRAY(SELECT d.seq FROM transport_dead_letters AS d
                        WHERE (p_group IS NULL OR d.group_id = p_group) AND (p_seqs IS NULL OR d.seq = ANY (p_seqs))
                        ORDER BY d.seq FOR UPDATE);
        INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
        SELECT DISTINCT ON (d.group_id) d.group_id, NULL, NULL, d.priority
          FROM transport_dead_letters AS d
         WHERE d.seq = ANY (v_sel) AND hashtext(d.group_id) & (v_parts - 1) <> v_part
           AND d.group_id IN (SELECT x.g FROM (SELECT DISTINCT e.group_id AS g FROM transport_dead_letters AS e
                                                WHERE e.seq = ANY (v_sel) ORDER BY 1) AS x
                               WHERE harel_stays(x.g, v_parts, v_part))
         ORDER BY d.group_id, d.seq
        ON CONFLICT (group_id) DO NOTHING;
    END IF;
    WITH moved AS (
        DELETE FROM transport_dead_letters AS d
         WHERE (v_parts IS NULL OR d.seq = ANY (v_sel))
           AND (p_group IS NULL OR d.group_id = p_group)
           AND (p_seqs IS NULL OR d.seq = ANY (p_seqs))
        RETURNING d.seq, d.group_id, d.event, d.priority, d.published_at
    )
    SELECT array_agg(x.seq ORDER BY x.seq), array_agg(x.group_id ORDER BY x.seq), array_agg(x.event ORDER BY x.seq),
           array_agg(x.priority ORDER BY x.seq), array_agg(x.published_at ORDER BY x.seq)
      INTO v_seqs, v_groups, v_events, v_prios, v_pubs
      FROM moved AS x;
    IF v_seqs IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO transport_messages (seq, group_id, event, published_at)
    SELECT u.s, u.g, u.e, u.p
      FROM unnest(v_seqs, v_groups, v_events, v_pubs) WITH ORDINALITY AS u(s, g, e, p, i)
     ORDER BY u.i;
    INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
    SELECT DISTINCT ON (u.g) u.g, NULL, NULL, u.p
      FROM unnest(v_groups, v_prios, v_seqs) AS u(g, p, s)
     ORDER BY u.g, u.s
    ON CONFLICT (group_id) DO NOTHING;
    -- A group that still names a redriven message as handed out (it died
    -- by harel_fail and nothing was handed out since) starts it afresh.
    UPDATE transport_groups AS g
       SET attempts = 0
      FROM unnest(v_groups, v_seqs) AS u(g, s)
     WHERE g.group_id = u.g AND g.delivered_seq = u.s;
    RETURN cardinality(v_seqs);
END
$$;

-- harel_purge_dead_letters deletes dead letters (the same filter as
-- harel_redrive) and returns how many.
CREATE OR REPLACE FUNCTION harel_purge_dead_letters(
    p_group TEXT,
    p_seqs  BIGINT[])
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_n BIGINT;
BEGIN
    DELETE FROM transport_dead_letters AS d
     WHERE (p_group IS NULL OR d.group_id = p_group)
       AND (p_seqs IS NULL OR d.seq = ANY (p_seqs));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
