-- 70_operations.sql: operations (version 11), what an operator sees and
-- steers. Reads take no lock and change nothing; pause, resume and purge
-- lock the group row (FOR NO KEY UPDATE, as a claim does), so each waits
-- for a claim or settle in flight on that group and is seen whole by the
-- next.
--
-- A group's state, by the server's clock (harel_group_state), in this
-- order: 'paused' (harel_pause_group; a holder may still be finishing),
-- 'stopped' (locked_by '' until 'Infinity': its head used its attempts
-- under on_exhausted 'stop'), 'parked' (locked_by '' until a time to
-- come: a failed head waits out its backoff), 'leased' (a token holds it
-- until a time to come: a consumer is handling its head, or a nack parked
-- it, which keeps its token), else 'free' (claimable: never claimed,
-- freed, lapsed, or a backoff that has ended).
--
-- Pausing: a paused group is never claimed (every claim path tests NOT
-- paused, the keeps of harel_exchange_leases and harel_ack_claim too), a
-- holder that has it when it is paused settles as usual, and its row is
-- not deleted when it drains (harel_ack, harel_exchange_leases and
-- harel_fail test NOT paused before deleting), so the pause holds until
-- harel_resume_group. Its lock_expiry, its place in the round-robin, is
-- left alone.

-- harel_wake_waiters notifies the queue's channel if an idle consumer
-- registered for a wake-up (transport_waiters) would take a group of
-- p_priority: a group the operator's call made claimable (a resume, a
-- partial purge). The wake-up trigger does the same for new groups.
CREATE OR REPLACE FUNCTION harel_wake_waiters(p_priority INT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM transport_waiters AS w
                WHERE w.until > date_part('epoch', clock_timestamp()) AND w.min_priority <= p_priority) THEN
        PERFORM pg_notify(harel_channel(), '');
    END IF;
END
$$;

-- harel_group_state is a group row's state at p_now (see above). Inlined.
CREATE OR REPLACE FUNCTION harel_group_state(
    p_locked_by   TEXT,
    p_lock_expiry DOUBLE PRECISION,
    p_paused      BOOLEAN,
    p_now         DOUBLE PRECISION)
RETURNS TEXT
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE
                 WHEN p_paused THEN 'paused'
                 WHEN p_locked_by = '' AND p_lock_expiry = 'Infinity' THEN 'stopped'
                 WHEN p_locked_by = '' AND p_lock_expiry >= p_now THEN 'parked'
                 WHEN p_locked_by <> '' AND p_lock_expiry >= p_now THEN 'leased'
                 ELSE 'free'
             END $$;

-- harel_group_rows describes the groups p_groups names, in that order
-- (names with no row are left out, and so are kept rows of drained
-- groups: see "Kept rows" in 30_claim.sql): priority, state, the live token
-- (holder) and when it took the group, when its lease, park or backoff
-- ends (until; NULL for none, or a stop), its head (seq and age in
-- seconds, by the server's clock; NULL if empty, or the age unknown for a
-- message queued before version 10), how many times that head was
-- handed out, and its tenant (since version 28).
CREATE OR REPLACE FUNCTION harel_group_rows(
    p_now    DOUBLE PRECISION,
    p_groups TEXT[])
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT, tenant TEXT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT g.group_id, g.priority, harel_group_state(g.locked_by, g.lock_expiry, g.paused, p_now),
           CASE WHEN g.locked_by <> '' AND g.lock_expiry >= p_now THEN g.locked_by END,
           CASE WHEN g.locked_by <> '' AND g.lock_expiry >= p_now THEN g.leased_at END,
           CASE WHEN g.locked_by IS NOT NULL AND g.lock_expiry >= p_now AND g.lock_expiry < 'Infinity' THEN g.lock_expiry END,
           h.seq, date_part('epoch', clock_timestamp() - h.published_at),
           CASE WHEN h.seq = g.delivered_seq THEN g.attempts ELSE 0 END, g.tenant
      FROM unnest(p_groups) WITH ORDINALITY AS u(gid, i)
      JOIN transport_groups AS g ON g.group_id = u.gid
      LEFT JOIN LATERAL (
            SELECT m.seq, m.published_at
              FROM transport_messages AS m
             WHERE m.group_id = g.group_id
             ORDER BY m.seq
             LIMIT 1) AS h ON true
     WHERE g.drained_at IS NULL OR h.seq IS NOT NULL
     ORDER BY u.i
$$;

-- harel_group describes one group (harel_group_rows' columns); PT007 if
-- p_group has no row. p_now NULL: the server's clock.
CREATE OR REPLACE FUNCTION harel_group(
    p_now   DOUBLE PRECISION,
    p_group TEXT)
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT, tenant TEXT)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY SELECT * FROM harel_group_rows(COALESCE(p_now, date_part('epoch', clock_timestamp())), ARRAY[p_group]);
    IF NOT FOUND THEN
        PERFORM harel_refuse_group('harel_group', p_group);
    END IF;
END
$$;

-- harel_groups lists a page of groups (harel_group_rows' columns): those
-- in state p_state (NULL: any) and of tenant p_tenant (NULL: any; since
-- version 28), in the order p_order names, skipping p_offset, at most
-- p_limit. Orders:
--   'group' (or NULL): by group id.
--   'oldest_head': by head seq, oldest first: the walk reads messages in
--     seq order, the first of each group being its head, and looks at
--     100,000 messages at most per call (a page can come back short when
--     a few groups hold more than that many of the oldest messages; they
--     are the oldest heads, and are listed).
--   'held_longest': groups a live token holds, by when it took them.
--   'most_attempts': groups whose head was handed out more than once,
--     most first.
-- An unknown p_state or p_order, or a negative p_offset or p_limit, is
-- refused with SQLSTATE 22023; a tenant that is empty or over 256 bytes
-- with PT011. The listing reads whole tables where its
-- filter must (a state, a tenant, most_attempts, held_longest: one pass
-- over the group rows), so it may plan sequential scans; oldest_head with
-- a tenant walks the oldest 100,000 messages of every tenant, so a small
-- tenant's page may come back short.
CREATE OR REPLACE FUNCTION harel_groups(
    p_now    DOUBLE PRECISION,
    p_state  TEXT,
    p_order  TEXT,
    p_offset INT,
    p_limit  INT,
    p_tenant TEXT DEFAULT NULL)
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT, tenant TEXT)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now    DOUBLE PRECISION := COALESCE(p_now, date_part('epoch', clock_timestamp()));
    v_order  TEXT := COALESCE(p_order, 'group');
    v_offset INT := COALESCE(p_offset, 0);
    v_groups TEXT[];
    v_skip   INT;
    r        RECORD;
BEGIN
    IF p_state IS NOT NULL AND p_state NOT IN ('free', 'leased', 'parked', 'stopped', 'paused') THEN
        RAISE EXCEPTION 'harel_groups: unknown state %', p_state USING ERRCODE = '22023';
    END IF;
    IF v_order NOT IN ('group', 'oldest_head', 'held_longest', 'most_attempts') THEN
        RAISE EXCEPTION 'harel_groups: unknown order %', p_order USING ERRCODE = '22023';
    END IF;
    IF v_offset < 0 OR p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'harel_groups: negative or NULL offset or limit (%, %)', p_offset, p_limit USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_tenant) NOT BETWEEN 1 AND 256 THEN
        PERFORM harel_refuse_tenant('harel_groups', p_tenant);
    END IF;
    IF p_limit = 0 THEN
        RETURN;
    END IF;
    -- An operator's listing, not a queue operation: a filter over every
    -- group row is a sequential scan's job (this setting goes back to the
    -- pinned one when the function returns). Not for oldest_head, whose
    -- walk stops early and must reach group rows one by one.
    IF v_order <> 'oldest_head' THEN
        PERFORM set_config('enable_seqscan', 'on', true);
    END IF;
    IF v_order = 'group' AND p_state = 'paused' THEN
        -- The partial index of paused groups.
        SELECT array_agg(x.group_id ORDER BY x.group_id) INTO v_groups
          FROM (SELECT g.group_id FROM transport_groups AS g
                 WHERE g.paused AND (p_tenant IS NULL OR g.tenant = p_tenant)
                 ORDER BY g.group_id
                OFFSET v_offset LIMIT p_limit) AS x;
    ELSIF v_order = 'group' THEN
        SELECT array_agg(x.group_id ORDER BY x.group_id) INTO v_groups
          FROM (SELECT g.group_id FROM transport_groups AS g
                 WHERE (g.drained_at IS NULL OR EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = g.group_id))
                   AND (p_state IS NULL OR harel_group_state(g.locked_by, g.lock_expiry, g.paused, v_now) = p_state)
                   AND (p_tenant IS NULL OR g.tenant = p_tenant)
                 ORDER BY g.group_id
                OFFSET v_offset LIMIT p_limit) AS x;
    ELSIF v_order = 'held_longest' THEN
        SELECT array_agg(x.group_id ORDER BY x.n) INTO v_groups
          FROM (SELECT g.group_id, row_number() OVER (ORDER BY g.leased_at NULLS FIRST, g.group_id) AS n
                  FROM transport_groups AS g
                 WHERE g.locked_by > '' AND g.lock_expiry >= v_now
                   AND (p_state IS NULL OR harel_group_state(g.locked_by, g.lock_expiry, g.paused, v_now) = p_state)
                   AND (p_tenant IS NULL OR g.tenant = p_tenant)
                 ORDER BY g.leased_at NULLS FIRST, g.group_id
                OFFSET v_offset LIMIT p_limit) AS x;
    ELSIF v_order = 'most_attempts' THEN
        SELECT array_agg(x.group_id ORDER BY x.n) INTO v_groups
          FROM (SELECT g.group_id, row_number() OVER (ORDER BY g.attempts DESC, g.group_id) AS n
                  FROM transport_groups AS g
                 WHERE g.attempts > 1
                   AND g.delivered_seq = (SELECT m.seq FROM transport_messages AS m
                                           WHERE m.group_id = g.group_id ORDER BY m.seq LIMIT 1)
                   AND (p_state IS NULL OR harel_group_state(g.locked_by, g.lock_expiry, g.paused, v_now) = p_state)
                   AND (p_tenant IS NULL OR g.tenant = p_tenant)
                 ORDER BY g.attempts DESC, g.group_id
                OFFSET v_offset LIMIT p_limit) AS x;
    ELSE
        -- oldest_head: messages in seq order; a message no earlier one of
        -- its group precedes is its group's head.
        v_groups := '{}';
        v_skip := v_offset;
        FOR r IN
            SELECT w.group_id
              FROM (SELECT m.seq, m.group_id FROM transport_messages AS m ORDER BY m.seq LIMIT 100000) AS w
              JOIN LATERAL (SELECT g.locked_by, g.lock_expiry, g.paused, g.tenant FROM transport_groups AS g
                             WHERE g.group_id = w.group_id OFFSET 0) AS g ON true  -- by key, row by row (OFFSET 0: not a join)
             WHERE NOT EXISTS (SELECT 1 FROM transport_messages AS e WHERE e.group_id = w.group_id AND e.seq < w.seq)
               AND (p_state IS NULL OR harel_group_state(g.locked_by, g.lock_expiry, g.paused, v_now) = p_state)
               AND (p_tenant IS NULL OR g.tenant = p_tenant)
             ORDER BY w.seq
        LOOP
            IF v_skip > 0 THEN
                v_skip := v_skip - 1;
                CONTINUE;
            END IF;
            v_groups := v_groups || r.group_id;
            EXIT WHEN cardinality(v_groups) >= p_limit;
        END LOOP;
    END IF;
    IF v_groups IS NULL THEN
        RETURN;
    END IF;
    PERFORM set_config('enable_seqscan', 'off', true);
    RETURN QUERY SELECT * FROM harel_group_rows(v_now, v_groups);
END
$$;

-- harel_peek returns p_group's messages after seq p_after (NULL: from the
-- head), in seq order, at most p_limit, without leasing them: their seq,
-- event, when they were published and the cause of their last failure.
-- PT007 if p_group has neither a row nor a message.
CREATE OR REPLACE FUNCTION harel_peek(
    p_group TEXT,
    p_after BIGINT,
    p_limit INT)
RETURNS TABLE (seq BIGINT, event TEXT, published_at TIMESTAMPTZ, last_error TEXT)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'harel_peek: limit % is NULL or negative', p_limit USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
        SELECT m.seq, m.event, m.published_at, m.last_error
          FROM transport_messages AS m
         WHERE m.group_id = p_group AND m.seq > COALESCE(p_after, 0)
         ORDER BY m.seq
         LIMIT p_limit;
    IF NOT FOUND AND NOT EXISTS (SELECT 1 FROM transport_groups AS g WHERE g.group_id = p_group AND g.drained_at IS NULL)
                 AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group) THEN
        PERFORM harel_refuse_group('harel_peek', p_group);
    END IF;
END
$$;

-- harel_pause_group pauses p_group: no claim hands it out until
-- harel_resume_group; a holder that has it now settles as usual; its
-- messages, its place in the round-robin and its row (even once drained)
-- stay. True if it changed, false if it was paused already; PT007 if
-- p_group has no row (a drained group's kept row is none).
CREATE OR REPLACE FUNCTION harel_pause_group(p_group TEXT)
RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_paused BOOLEAN;
BEGIN
    SELECT g.paused INTO v_paused FROM transport_groups AS g
     WHERE g.group_id = p_group
       AND (g.drained_at IS NULL OR EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group))
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM harel_refuse_group('harel_pause_group', p_group);
    END IF;
    IF v_paused THEN
        RETURN false;
    END IF;
    UPDATE transport_groups AS g SET paused = true WHERE g.group_id = p_group;
    RETURN true;
END
$$;

-- harel_resume_group puts a paused group back in the round-robin at its
-- place, and wakes idle consumers that would take it; a group that
-- drained while paused (its row was kept) has its row deleted instead,
-- through the lost-publish guard (a publisher mid-transaction keeps it).
-- True if it changed, false if it was not paused; PT007 if p_group has no
-- row.
CREATE OR REPLACE FUNCTION harel_resume_group(p_group TEXT)
RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_paused   BOOLEAN;
    v_priority INT;
BEGIN
    SELECT g.paused, g.priority INTO v_paused, v_priority
      FROM transport_groups AS g WHERE g.group_id = p_group FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM harel_refuse_group('harel_resume_group', p_group);
    END IF;
    IF NOT v_paused THEN
        RETURN false;
    END IF;
    -- Back at its slot: the sweep reaches it when the cursor comes round
    -- (see "The sweep" in 30_claim.sql).
    UPDATE transport_groups AS g
       SET paused = false, drained_at = NULL  -- claimable with a message: its entry (25_ready.sql)
     WHERE g.group_id = p_group;
    -- Drained while paused: the row goes now (as an ack's would have),
    -- through the lost-publish guard.
    IF NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group)
       AND harel_try_guard(p_group) THEN
        DELETE FROM transport_groups AS g
         WHERE g.group_id = p_group
           AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group);
        IF FOUND THEN
            RETURN true;
        END IF;
    END IF;
    PERFORM harel_wake_waiters(v_priority);
    RETURN true;
END
$$;

-- harel_purge_group deletes p_group's oldest p_limit messages (NULL: all)
-- and returns how many. Fenced against a holder: whatever held the group
-- (a lease, a nack's or a fail's park, a stop) is over, so a late ack,
-- nack, fail or extend under its token changes nothing; the group is freed
-- with a fresh count of attempts, behind the others in the round-robin
-- (idle consumers are woken if it has messages left), or its row deleted
-- if drained (with the lost-publish guard: a message a
-- publisher is committing meanwhile is kept, and so is its group row; a
-- paused group's row is kept). A p_limit of 0 or less is refused (22023);
-- PT007 if p_group has no row (a drained group's kept row is none). Messages a concurrent publish commits
-- after this call's statement starts are not deleted.
CREATE OR REPLACE FUNCTION harel_purge_group(
    p_group TEXT,
    p_now   DOUBLE PRECISION,
    p_limit INT)
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_now  DOUBLE PRECISION := COALESCE(p_now, date_part('epoch', clock_timestamp()));
    v_n    BIGINT;
    v_gone BOOLEAN := false;
BEGIN
    IF p_limit <= 0 THEN
        RAISE EXCEPTION 'harel_purge_group: limit % is not positive (NULL: all)', p_limit USING ERRCODE = '22023';
    END IF;
    IF harel_clock_skewed(v_now) THEN
        PERFORM harel_refuse_skew('harel_purge_group', p_now);
    END IF;
    PERFORM 1 FROM transport_groups AS g
      WHERE g.group_id = p_group
        AND (g.drained_at IS NULL OR EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group))
        FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM harel_refuse_group('harel_purge_group', p_group);
    END IF;
    DELETE FROM transport_messages AS m
     WHERE m.group_id = p_group
       AND m.seq IN (SELECT x.seq FROM transport_messages AS x
                      WHERE x.group_id = p_group ORDER BY x.seq LIMIT p_limit);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group)
       AND harel_try_guard(p_group) THEN
        DELETE FROM transport_groups AS g
         WHERE g.group_id = p_group AND NOT g.paused
           AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group);
        v_gone := FOUND;
    END IF;
    IF NOT v_gone THEN
        UPDATE transport_groups AS g
           SET locked_by = NULL, lock_expiry = v_now, delivered_seq = NULL, attempts = 0, leased_at = NULL, retry_at = NULL,
               drained_at = NULL
         WHERE g.group_id = p_group;
        -- Claimable now if it has messages and is not paused: wake idle
        -- consumers that would take it.
        IF EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group) THEN
            PERFORM harel_wake_waiters(g.priority) FROM transport_groups AS g
              WHERE g.group_id = p_group AND NOT g.paused;
        END IF;
    END IF;
    RETURN v_n;
END
$$;

-- harel_sample_pct is the percentage of p_table's pages to sample for
-- counts by priority: 100 (every row: exact) when the table has p_rows <=
-- p_cap rows, else that of about 200 pages (TABLESAMPLE SYSTEM's
-- argument).
CREATE OR REPLACE FUNCTION harel_sample_pct(
    p_rows  BIGINT,
    p_cap   BIGINT,
    p_table REGCLASS)
RETURNS DOUBLE PRECISION
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT CASE WHEN p_rows <= p_cap THEN 100
                ELSE least(100, 100 * 200 / greatest(1, pg_relation_size(p_table) / current_setting('block_size')::float8)) END
$$;

-- harel_scale_sample turns counts (by priority) of a sample of p_pct
-- percent of p_table's pages into estimates for the whole table: the
-- table's rows as the planner estimates them (its last ANALYZE's rows per
-- page times its pages now), split as the sample is; with no statistics
-- yet, the sample's counts times 100 / p_pct (which varies more: the
-- number of pages a sample takes varies). p_pct 100: the counts are exact.
CREATE OR REPLACE FUNCTION harel_scale_sample(
    p_counts BIGINT[],
    p_table  REGCLASS,
    p_pct    DOUBLE PRECISION)
RETURNS BIGINT[]
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT CASE WHEN p_pct >= 100 OR t.sampled = 0 THEN p_counts
                ELSE ARRAY(SELECT round(u.n * t.total / t.sampled)::bigint
                             FROM unnest(p_counts) WITH ORDINALITY AS u(n, i) ORDER BY u.i) END
      FROM (SELECT s.sampled,
                   COALESCE((SELECT c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::float8)
                               FROM pg_class AS c
                              WHERE c.oid = p_table AND c.reltuples >= 0 AND c.relpages > 0),
                            s.sampled * 100 / p_pct) AS total
              FROM (SELECT sum(x)::float8 AS sampled FROM unnest(p_counts) AS x) AS s) AS t
$$;

-- harel_stats is the queue at a glance, in one call: a row per priority
-- (0 to 4, in order) and then the total (priority NULL). Per row: its
-- groups by state (see above) at p_now (NULL: the server's clock), its
-- messages, the age in seconds of its oldest head (by seq: the oldest
-- message of a group is its head), its dead letters, and the idle
-- consumers registered for a wake-up that would take it (waiters; the
-- total counts them all); at is the server's clock.
--
-- Cost, and what is exact. Paused groups are counted exactly, through
-- the partial index of paused groups. Kept rows of drained groups (see
-- "Kept rows" in 30_claim.sql) are not groups. All groups (and among them the
-- leased, parked and stopped ones, which no index holds), messages and
-- dead letters are counted exactly up to
-- 100,000 rows each; past that they are estimated from a random sample of
-- about 200 of the table's pages (TABLESAMPLE SYSTEM), scaled by
-- harel_scale_sample (the planner's row estimate when the table was ever
-- analyzed, else the sample's), and groups_exact, messages_exact and
-- dead_letters_exact say false (free groups are then the estimated rest,
-- never below the exact states). The oldest heads
-- come from a walk of the oldest 100,000 messages in seq order, which
-- stops once every priority with groups has been seen: the total's is
-- always exact, and so is a priority's that the walk meets or that has at
-- most 10,000 groups (their heads are then read one by one); otherwise
-- it is an upper bound, the age of the last message walked, and
-- oldest_head_exact says false (and with the groups sampled, a priority
-- the sample missed, and the walk did not meet, has NULL and false). NULL:
-- no message (or only messages queued before version 10, whose publish
-- time is unknown).
CREATE OR REPLACE FUNCTION harel_stats(p_now DOUBLE PRECISION DEFAULT NULL)
RETURNS TABLE (priority INT, groups BIGINT, free BIGINT, leased BIGINT, parked BIGINT, stopped BIGINT, paused BIGINT,
               messages BIGINT, messages_exact BOOLEAN, oldest_head_age DOUBLE PRECISION, oldest_head_exact BOOLEAN,
               dead_letters BIGINT, dead_letters_exact BOOLEAN, waiters BIGINT, at TIMESTAMPTZ, groups_exact BOOLEAN)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    c_exact  CONSTANT INT := 100000;  -- rows counted exactly, at most
    c_walk   CONSTANT INT := 100000;  -- messages walked for the oldest heads, at most
    c_heads  CONSTANT INT := 10000;   -- groups whose heads are read one by one, at most
    v_at     TIMESTAMPTZ := clock_timestamp();
    v_now    DOUBLE PRECISION := COALESCE(p_now, date_part('epoch', v_at));
    v_groups BIGINT[]; v_free BIGINT[]; v_leased BIGINT[]; v_parked BIGINT[]; v_stopped BIGINT[]; v_paused BIGINT[];
    v_msgs   BIGINT[];
    v_gexact BOOLEAN;
    v_mexact BOOLEAN;
    v_dead   BIGINT[];
    v_dexact BOOLEAN;
    v_waits  BIGINT[];
    v_age    DOUBLE PRECISION[] := '{NULL,NULL,NULL,NULL,NULL}';
    v_aexact BOOLEAN[] := '{true,true,true,true,true}';
    v_seen   BOOLEAN[] := '{false,false,false,false,false}';
    v_need   INT;
    v_found  INT := 0;
    v_walked INT := 0;
    v_oldest DOUBLE PRECISION;
    v_last   TIMESTAMPTZ;
    v_n      BIGINT;
    v_pct    DOUBLE PRECISION;
    v_pub    TIMESTAMPTZ;
    v_scale  BIGINT[];
    v_factor DOUBLE PRECISION;
    r        RECORD;
BEGIN

    -- Paused groups, exact, through their partial index.
    SELECT array_agg(COALESCE(x.n, 0) ORDER BY p.p) INTO v_paused
      FROM generate_series(0, 4) AS p(p)
      LEFT JOIN (SELECT g.priority, count(*) AS n FROM transport_groups AS g WHERE g.paused GROUP BY 1) AS x
        ON x.priority = p.p;
    -- All groups and those leased, parked or stopped, by priority: exact
    -- while few, else sampled (no index holds a lease: see "The sweep" in
    -- 30_claim.sql), all four scaled alike; free ones are the rest.
    -- Counting a table is a sequential scan's job (this setting goes back
    -- to the pinned one when the function returns).
    PERFORM set_config('enable_seqscan', 'on', true);
    SELECT count(*) INTO v_n FROM (SELECT 1 FROM transport_groups AS g LIMIT c_exact + 1) AS x;
    v_pct := harel_sample_pct(v_n, c_exact, 'transport_groups');
    v_gexact := v_pct >= 100;
    -- The kept rows are counted too, as a sixth priority, so that the
    -- scaling splits the table's rows between them and the groups.
    SELECT array_agg(COALESCE(x.n, 0) ORDER BY p.p), array_agg(COALESCE(x.leased, 0) ORDER BY p.p),
           array_agg(COALESCE(x.parked, 0) ORDER BY p.p), array_agg(COALESCE(x.stopped, 0) ORDER BY p.p)
      INTO v_groups, v_leased, v_parked, v_stopped
      FROM generate_series(0, 5) AS p(p)
      LEFT JOIN (SELECT CASE WHEN s.kept THEN 5 ELSE s.priority END AS priority, count(*) AS n,
                        count(*) FILTER (WHERE s.st = 'leased' AND NOT s.kept) AS leased,
                        count(*) FILTER (WHERE s.st = 'parked' AND NOT s.kept) AS parked,
                        count(*) FILTER (WHERE s.st = 'stopped' AND NOT s.kept) AS stopped
                   FROM (SELECT g.priority, harel_group_state(g.locked_by, g.lock_expiry, g.paused, v_now) AS st,
                                g.drained_at IS NOT NULL
                                AND (SELECT m.seq FROM transport_messages AS m WHERE m.group_id = g.group_id
                                      ORDER BY m.seq DESC LIMIT 1) IS NULL AS kept  -- marked, and no message since (version 24)
                           FROM transport_groups AS g TABLESAMPLE SYSTEM (v_pct)) AS s
                  GROUP BY 1) AS x ON x.priority = p.p;
    IF NOT v_gexact THEN
        v_scale := harel_scale_sample(v_groups, 'transport_groups', v_pct);
        v_factor := (SELECT sum(x) FROM unnest(v_scale) AS x)::float8
                    / GREATEST((SELECT sum(x) FROM unnest(v_groups) AS x), 1);
        v_groups := v_scale;
        v_leased := ARRAY(SELECT round(x * v_factor)::bigint FROM unnest(v_leased) WITH ORDINALITY AS u(x, i) ORDER BY i);
        v_parked := ARRAY(SELECT round(x * v_factor)::bigint FROM unnest(v_parked) WITH ORDINALITY AS u(x, i) ORDER BY i);
        v_stopped := ARRAY(SELECT round(x * v_factor)::bigint FROM unnest(v_stopped) WITH ORDINALITY AS u(x, i) ORDER BY i);
    END IF;
    v_groups := v_groups[1:5]; v_leased := v_leased[1:5]; v_parked := v_parked[1:5]; v_stopped := v_stopped[1:5];
    FOR i IN 1..5 LOOP
        -- An estimate is never below the exact part of it.
        v_groups[i] := greatest(v_groups[i], v_leased[i] + v_parked[i] + v_stopped[i] + v_paused[i]);
    END LOOP;
    SELECT array_agg(u.n - u.l - u.pk - u.s - u.pa ORDER BY u.i) INTO v_free
      FROM unnest(v_groups, v_leased, v_parked, v_stopped, v_paused) WITH ORDINALITY AS u(n, l, pk, s, pa, i);
    SELECT count(*) INTO v_need FROM unnest(v_groups) AS n WHERE n > 0;

    -- Messages by their group's priority: exact while few, else sampled.
    SELECT count(*) INTO v_n FROM (SELECT 1 FROM transport_messages AS m LIMIT c_exact + 1) AS x;
    v_pct := harel_sample_pct(v_n, c_exact, 'transport_messages');
    v_mexact := v_pct >= 100;
    SELECT array_agg(COALESCE(x.n, 0) ORDER BY p.p) INTO v_msgs
      FROM generate_series(0, 4) AS p(p)
      LEFT JOIN (SELECT COALESCE((SELECT g.priority FROM transport_groups AS g WHERE g.group_id = m.group_id), 0) AS priority,
                        count(*) AS n
                   FROM transport_messages AS m TABLESAMPLE SYSTEM (v_pct)
                  GROUP BY 1) AS x ON x.priority = p.p;
    v_msgs := harel_scale_sample(v_msgs, 'transport_messages', v_pct);

    -- Dead letters by priority: the same.
    SELECT count(*) INTO v_n FROM (SELECT 1 FROM transport_dead_letters AS d LIMIT c_exact + 1) AS x;
    v_pct := harel_sample_pct(v_n, c_exact, 'transport_dead_letters');
    v_dexact := v_pct >= 100;
    SELECT array_agg(COALESCE(x.n, 0) ORDER BY p.p) INTO v_dead
      FROM generate_series(0, 4) AS p(p)
      LEFT JOIN (SELECT d.priority, count(*) AS n
                   FROM transport_dead_letters AS d TABLESAMPLE SYSTEM (v_pct)
                  GROUP BY 1) AS x ON x.priority = p.p;
    v_dead := harel_scale_sample(v_dead, 'transport_dead_letters', v_pct);

    -- The oldest heads: the oldest messages in seq order, until each
    -- priority with groups has been met.
    PERFORM set_config('enable_seqscan', 'off', true);
    FOR r IN
        -- The priority by a lookup per row, not a join: a join is planned
        -- as a hash of every group row, while the walk mostly stops after a
        -- few messages.
        SELECT w.published_at, COALESCE((SELECT g.priority FROM transport_groups AS g WHERE g.group_id = w.group_id), 0) AS p
          FROM (SELECT m.seq, m.group_id, m.published_at FROM transport_messages AS m ORDER BY m.seq LIMIT c_walk) AS w
         ORDER BY w.seq
    LOOP
        v_walked := v_walked + 1;
        v_last := r.published_at;
        IF v_walked = 1 THEN
            v_oldest := date_part('epoch', v_at - r.published_at);
        END IF;
        IF NOT v_seen[r.p + 1] THEN
            v_seen[r.p + 1] := true;
            v_age[r.p + 1] := date_part('epoch', v_at - r.published_at);
            v_found := v_found + 1;
            EXIT WHEN v_found >= v_need;
        END IF;
    END LOOP;
    IF NOT v_gexact AND v_walked < c_walk AND v_found >= v_need THEN
        -- The walk stopped once it had met every priority the sample
        -- found; one the sample missed (a few groups) may have messages.
        FOR i IN 1..5 LOOP
            IF NOT v_seen[i] THEN
                v_aexact[i] := false;
            END IF;
        END LOOP;
    END IF;
    IF v_walked >= c_walk AND v_found < v_need THEN
        -- The walk stopped short: priorities it did not meet.
        FOR i IN 1..5 LOOP
            CONTINUE WHEN v_seen[i] OR v_groups[i] = 0;
            IF v_groups[i] <= c_heads THEN
                PERFORM set_config('enable_seqscan', 'on', true);
                v_pub := NULL;
                SELECT h.published_at INTO v_pub
                  FROM transport_groups AS g
                 CROSS JOIN LATERAL (SELECT m.seq, m.published_at FROM transport_messages AS m
                                      WHERE m.group_id = g.group_id ORDER BY m.seq LIMIT 1) AS h
                 WHERE g.priority = i - 1
                 ORDER BY h.seq
                 LIMIT 1;
                v_age[i] := date_part('epoch', v_at - v_pub);
            ELSE
                v_age[i] := date_part('epoch', v_at - v_last);
                v_aexact[i] := false;
            END IF;
        END LOOP;
    END IF;

    -- Idle consumers registered for a wake-up, by the priorities they take.
    SELECT array_agg((SELECT count(*) FROM transport_waiters AS w
                       WHERE w.until > date_part('epoch', v_at) AND w.min_priority <= p.p) ORDER BY p.p)
      INTO v_waits
      FROM generate_series(0, 4) AS p(p);

    FOR i IN 1..5 LOOP
        priority := i - 1; groups := v_groups[i]; free := v_free[i]; leased := v_leased[i]; parked := v_parked[i];
        stopped := v_stopped[i]; paused := v_paused[i]; messages := v_msgs[i]; messages_exact := v_mexact;
        oldest_head_age := v_age[i]; oldest_head_exact := v_aexact[i];
        dead_letters := v_dead[i]; dead_letters_exact := v_dexact; waiters := v_waits[i]; at := v_at;
        groups_exact := v_gexact;
        RETURN NEXT;
    END LOOP;
    priority := NULL;
    SELECT sum(x) INTO groups FROM unnest(v_groups) AS x;
    SELECT sum(x) INTO free FROM unnest(v_free) AS x;
    SELECT sum(x) INTO leased FROM unnest(v_leased) AS x;
    SELECT sum(x) INTO parked FROM unnest(v_parked) AS x;
    SELECT sum(x) INTO stopped FROM unnest(v_stopped) AS x;
    SELECT sum(x) INTO paused FROM unnest(v_paused) AS x;
    SELECT sum(x) INTO messages FROM unnest(v_msgs) AS x;
    messages_exact := v_mexact;
    oldest_head_age := v_oldest; oldest_head_exact := true;
    SELECT sum(x) INTO dead_letters FROM unnest(v_dead) AS x;
    dead_letters_exact := v_dexact;
    SELECT count(*) INTO waiters FROM transport_waiters AS w WHERE w.until > date_part('epoch', v_at);
    groups_exact := v_gexact;
    RETURN NEXT;
END
$$;

-- harel_set_tenant_weight sets p_tenant's weight (functions/25_ready.sql,
-- "Shares"), 1 to 1,000: under contention each tenant with ready groups
-- is handed out in proportion to its weight. A tenant never set weighs 1;
-- setting 1 keeps its row (and its charge). A tenant that is empty or
-- longer than 256 bytes is refused (PT011), a weight NULL or outside 1 to
-- 1,000 too (PT012), before anything is written. The entries already in
-- the log keep their places: the weight places the tenant's next ones.
CREATE OR REPLACE FUNCTION harel_set_tenant_weight(p_tenant TEXT, p_weight INT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF p_tenant IS NULL OR octet_length(p_tenant) NOT BETWEEN 1 AND 256 THEN
        PERFORM harel_refuse_tenant('harel_set_tenant_weight', COALESCE(p_tenant, ''));
    END IF;
    IF p_weight IS NULL OR p_weight NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'harel_set_tenant_weight: a weight is 1 to 1000, not %', p_weight USING ERRCODE = 'PT012';
    END IF;
    INSERT INTO transport_tenants AS t (tenant, weight) VALUES (p_tenant, p_weight)
    ON CONFLICT (tenant) DO UPDATE SET weight = EXCLUDED.weight;
END
$$;

-- harel_tenants lists the tenants (functions/25_ready.sql, "Shares"), in
-- tenant order: each that has group rows, a row of its own or deliveries
-- counted, with its weight, its groups (kept rows of drained groups
-- aside), those leased at p_now (NULL: the server's clock), its entries
-- in the ready log (the groups waiting their turn), its share: its
-- weight over the weights of the tenants with entries, what it is handed
-- out under contention (0 with none), and (since version 28) delivered:
-- the messages handed out from its groups so far (transport_groups.handed
-- and transport_tenant_counts), from which two readings give deliveries
-- per second and the share measured. It reads every group row: an
-- operator's call.
CREATE OR REPLACE FUNCTION harel_tenants(p_now DOUBLE PRECISION DEFAULT NULL)
RETURNS TABLE (tenant TEXT, weight INT, groups BIGINT, leased BIGINT, ready BIGINT, share DOUBLE PRECISION,
               delivered BIGINT)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now   DOUBLE PRECISION := COALESCE(p_now, date_part('epoch', clock_timestamp()));
    v_front BIGINT := (SELECT f.last_value FROM transport_ready_front AS f);
BEGIN
    PERFORM set_config('enable_seqscan', 'on', true);
    RETURN QUERY
        WITH g AS (
            SELECT g.tenant,
                   count(*) FILTER (WHERE g.drained_at IS NULL
                                       OR EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = g.group_id OFFSET 0)) AS groups,
                   count(*) FILTER (WHERE g.locked_by <> '' AND g.lock_expiry >= v_now) AS leased,
                   sum(g.handed) AS handed
              FROM transport_groups AS g
             GROUP BY g.tenant
        ), c AS (
            SELECT c.tenant, sum(c.delivered) AS delivered FROM transport_tenant_counts AS c GROUP BY c.tenant
        ), r AS (
            SELECT r.tenant, count(*) AS ready FROM transport_ready AS r WHERE r.vt >= v_front GROUP BY r.tenant
        ), a AS (
            SELECT k.tenant, COALESCE(t.weight, 1) AS weight,
                   COALESCE(g.groups, 0) AS groups, COALESCE(g.leased, 0) AS leased, COALESCE(r.ready, 0) AS ready,
                   (COALESCE(g.handed, 0) + COALESCE(c.delivered, 0))::BIGINT AS delivered
              FROM (SELECT g.tenant FROM g UNION SELECT t.tenant FROM transport_tenants AS t UNION SELECT c.tenant FROM c) AS k
              LEFT JOIN g ON g.tenant = k.tenant
              LEFT JOIN transport_tenants AS t ON t.tenant = k.tenant
              LEFT JOIN c ON c.tenant = k.tenant
              LEFT JOIN r ON r.tenant = k.tenant
        )
        SELECT a.tenant, a.weight, a.groups, a.leased, a.ready,
               CASE WHEN a.ready > 0 THEN a.weight::float8 / sum(a.weight) FILTER (WHERE a.ready > 0) OVER () ELSE 0 END,
               a.delivered
          FROM a
         ORDER BY a.tenant;
END
$$;

-- Deliveries per tenant (docs/design.md, "Deliveries per tenant"): what
-- a group row handed out (transport_groups.handed) goes to its tenant's
-- count (transport_tenant_counts) when the row is deleted or truncated,
-- and when a kept row is revived for another tenant, so that what a
-- tenant was handed stays counted. Each statement adds rows of its own
-- (an insert, which waits for no one); harel_fold_counts, once a lap of
-- the reap, folds them into one row a tenant. Only the fold updates or
-- deletes a count, and one fold runs at a time, so no statement ever
-- waits on the counts, nor holds one that another waits for.

-- harel_count_add adds p_counts to p_tenants' counts, a row each (p_tenants
-- without duplicates). In PL/pgSQL, whose plan the session keeps: a SQL
-- function called from a trigger is planned on every call.
CREATE OR REPLACE FUNCTION harel_count_add(p_tenants TEXT[], p_counts BIGINT[])
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    INSERT INTO transport_tenant_counts (tenant, delivered)
    SELECT u.t, u.n
      FROM unnest(p_tenants, p_counts) AS u(t, n)
     WHERE u.n > 0;
END
$$;

-- harel_count_deleted is the statement trigger
-- transport_groups_count_deleted: after a delete of group rows (by any
-- statement: the queue's acks, reaps, purges, or plain SQL).
CREATE OR REPLACE FUNCTION harel_count_deleted()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    PERFORM harel_count_add(array_agg(o.tenant), array_agg(o.n))
       FROM (SELECT o.tenant, sum(o.handed)::BIGINT AS n FROM harel_deleted_groups AS o GROUP BY o.tenant) AS o;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS transport_groups_count_deleted ON transport_groups;
CREATE TRIGGER transport_groups_count_deleted
    AFTER DELETE ON transport_groups
    REFERENCING OLD TABLE AS harel_deleted_groups
    FOR EACH STATEMENT EXECUTE FUNCTION harel_count_deleted();

-- harel_count_moved is the row trigger transport_groups_count_moved:
-- before an update that gives a row another tenant (a kept row revived by
-- another tenant's publish, harel_revive), what it handed out stays its
-- old tenant's. Claims and acks never set the tenant: it does not run for
-- them.
CREATE OR REPLACE FUNCTION harel_count_moved()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    PERFORM harel_count_add(ARRAY[OLD.tenant], ARRAY[OLD.handed]);
    NEW.handed := 0;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS transport_groups_count_moved ON transport_groups;
CREATE TRIGGER transport_groups_count_moved
    BEFORE UPDATE OF tenant ON transport_groups
    FOR EACH ROW
    WHEN (OLD.tenant IS DISTINCT FROM NEW.tenant AND OLD.handed > 0)
    EXECUTE FUNCTION harel_count_moved();

-- harel_count_truncated is the statement trigger
-- transport_groups_count_truncated: before a TRUNCATE of the group rows
-- (a test's or an operator's reset), what they handed out.
CREATE OR REPLACE FUNCTION harel_count_truncated()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    PERFORM set_config('enable_seqscan', 'on', true);
    PERFORM harel_count_add(array_agg(g.tenant), array_agg(g.n))
       FROM (SELECT g.tenant, sum(g.handed)::BIGINT AS n FROM transport_groups AS g GROUP BY g.tenant) AS g;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS transport_groups_count_truncated ON transport_groups;
CREATE TRIGGER transport_groups_count_truncated
    BEFORE TRUNCATE ON transport_groups
    FOR EACH STATEMENT EXECUTE FUNCTION harel_count_truncated();

-- harel_fold_counts folds the added rows into one row a tenant (folded),
-- unless another fold's transaction is open (a transaction-level advisory
-- lock, tried, never waited for): so the folded rows are written by one
-- transaction at a time, and the added ones deleted by one; no one else
-- updates or deletes a count. The table keeps a row a tenant, and the
-- rows added since the last fold.
CREATE OR REPLACE FUNCTION harel_fold_counts()
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(('transport_tenant_counts'::regclass::oid::bigint & 2147483647)::int, 0) THEN
        RETURN;
    END IF;
    PERFORM set_config('enable_seqscan', 'on', true);  -- a small table, read whole
    WITH f AS (
        DELETE FROM transport_tenant_counts AS c
         WHERE NOT c.folded
        RETURNING c.tenant, c.delivered
    )
    INSERT INTO transport_tenant_counts AS c (tenant, folded, delivered)
    SELECT f.tenant, true, sum(f.delivered)
      FROM f
     GROUP BY f.tenant
     ORDER BY f.tenant
    ON CONFLICT (tenant) WHERE folded DO UPDATE SET delivered = c.delivered + excluded.delivered;
END
$$;
