-- 30_claim.sql: the claim (harel_claim, harel_claim_many and what they
-- share: the sweep, the hand-out count, dead-lettering a spent head).
--
-- The sweep (version 16). Every group row has a slot, numbered when the row
-- is created or revived (transport_groups_slot, which cycles through 2^20
-- values) and not written otherwise, and the claims go round the slots in
-- order: a claim
-- starts at the cursor (transport_claim_cursor, the slot after the last
-- one a claim took), takes the claimable groups it meets up to its limit,
-- on to the last slot and then from the first, and moves the cursor past
-- the last slot it took. Claimable: not paused, at or above the claim's
-- priority floor, and free or with a lease, park or backoff that has
-- ended. No column a claim or an ack writes is in an index (the slot
-- index, transport_groups_sweep, holds the slot only), so their updates
-- are HOT: the table and its indexes do not grow per message, and a
-- page's dead versions are pruned in place without vacuum. The price: a
-- claim passes the rows it cannot take (leased, parked, paused, below its
-- floor) on the heap, about 1/f rows per group taken where f is the
-- claimable share of the rows it walks.
--
-- Order. A group that stays claimable is handed out within one round of
-- the cursor: before it comes round again, every other group claimable
-- throughout is handed out at most once, so it waits at most as many
-- hand-outs as there are claimable groups (TestSweepServesEachGroupOncePerRound),
-- and at most 50 ms more, or 2 s where rounds cost 5 ms or more (see
-- "Going round" below).
-- New groups, and drained groups that come back while rounds are costly
-- (version 18, "Kept rows"), have the highest slots, in the order they arrived, so they come after the groups
-- already waiting and before those served since: round-robin by arrival.
-- Only a claim that admits every priority moves the cursor (one with a
-- floor would move it past groups it cannot see), and a round (below)
-- moves it back only when it leased something (version 18: a round that
-- met only empty rows used to set it back among them, and the claims
-- after it walked again what it had); concurrent claims start from the
-- same cursor and skip each other's rows (SKIP LOCKED), and a cursor one
-- of them set back costs the next claim a walk past rows just leased,
-- nothing else.
--
-- Going round. A claim that reaches the last slot with room left goes on
-- from the first slot to the cursor (a round), unless it has found
-- something and a round that leased nothing (it found no row, or only
-- empty ones) was in the last 50 ms (transport_claim_wrap, the p_now of
-- that claim, epoch ms) or, where that round's walk took 5 ms or more,
-- rests the rounds: 9 times what it took, at most 2 s (transport_claim_rest, epoch
-- ms of the server's clock; harel_rest_rounds). A round passes the index
-- entries of every slot a row has left since vacuum last ran (a row
-- reaped, or revived to a new slot) and, while a snapshot holds vacuum
-- back, every version since, so in a queue whose consumers keep up with
-- new groups (each claim finding the newest and going round for more)
-- every claim paid it; under a 5-minute snapshot at 1,000 msgs/s a round
-- took 50-370 ms. The rest caps what rounds cost the claims that find
-- something, and a stream's exchange (harel_exchange_leases with p_rest:
-- a stream that finds nothing waits for a wake-up or its IdleSweep and
-- asks again). Any other claim that has found nothing goes
-- round, so harel_claim and harel_claim_leases lease something when
-- anything is claimable. A group that becomes claimable behind the cursor
-- (a lapsed lease, a group freed with messages left, a message under a
-- wrong mark) waits for the next such claim: with streams alone, rests
-- of at most 2 s each (more than one where the rounds before it meet only
-- empty rows, which they empty or reap) and a round. A rest more than 2 s
-- ahead (the server's clock stepped back) is none. Where the slots have
-- come round past the cursor (new rows behind it) nothing rests.
--
-- Kept rows (version 17). The ack that drains a group frees its row in
-- place and marks it (drained_at = lock_expiry = the ack's now), and the
-- group's next publish revives it (harel_ready_groups and the trigger
-- harel_ready_group, 20_publish.sql): a group that drains and comes back,
-- as a stream's kept leases make most groups do, costs no row insert and
-- delete. Where rounds are costly (see "Going round"), the revival of a
-- row behind the cursor gives it a new slot (version 18), the end of the
-- round as for a new group, so claims that keep up with arrivals find it
-- ahead of the cursor rather than on a round. The mark is written without the
-- lost-publish guard (so that no publisher waits for a drainer), so it
-- can be wrong: a publish whose group insert came just before the mark,
-- its message still uncommitted when the ack looked, revived nothing and
-- leaves its message under a marked row. So the sweep takes a freshly
-- marked row like any free one and reads its head: a message is handed
-- out; none, and the row is freed again, lock_expiry moving past
-- drained_at (at least 1 ms past, whatever the claim's clock): found
-- empty. The sweep passes a row found empty on the heap
-- until 2 s after its drain, as it passes a leased one, and takes it
-- again after that, deleting it if it is still empty (the guard's
-- try-lock, then a re-check) or, where a publisher holds the guard,
-- freeing it again. So a group that comes back within 2 s keeps its row
-- for good, and one that does not (a job of one message, say) costs two
-- claim visits (one to find it empty, one to delete it) where an ack used
-- to delete it.

-- Due groups first: a group held by no one that is due before the sweep
-- (retry_at: a failed message's backoff or a snooze's delay that has
-- ended, a give-back, a nack with no delay or a restart at once) is taken
-- first, the earliest due first, from the partial index
-- transport_groups_due, so a
-- retry comes when its backoff ends rather than when the cursor reaches
-- it: a poison message holds its group for about its attempts times the
-- backoff, however deep the backlog. A nack's park, under its token,
-- keeps its place in the sweep; it is in the index only so that idle
-- consumers learn when it ends (harel_wait). The settle that follows
-- clears retry_at (acks, fails, nacks and frees write it, HOT while it
-- stays NULL), so a group that never fails or parks never enters that
-- index.
--
-- Delivery attempts (version 10). A claim's one write of the group row
-- also records the message it hands out (delivered_seq) and how many times
-- it has handed it out (attempts): only a group's head is ever delivered,
-- so the group row can count for it, and counting costs no write of its
-- own. Every hand-out counts, whatever ends the lease (an ack, a nack, a
-- fail, or a lapse: a worker that crashes on a message uses an attempt
-- each time); harel_release, a give-back of an unused lease, takes its
-- attempt back. When a claim finds that the head it is about to hand out
-- again has used the queue's max_attempts (transport_policy), it applies
-- the queue's choice first (harel_spend): the head moves to
-- transport_dead_letters and the claim hands out the group's next
-- message, or the group is stopped and the claim moves on.
--
-- The order inside a claim: lock the group rows (FOR NO KEY UPDATE SKIP
-- LOCKED), read their heads in a statement of its own (a snapshot taken
-- after the locks, so never a head an earlier holder has just acked), then
-- lease them by primary key with the head and the count in the same
-- write. An empty group row is never leased: it is deleted (the
-- lost-publish guard's try-lock, then a re-check) or freed and marked
-- (see "Kept rows"), and the claim goes on while it has leased nothing and
-- something else may be claimable.

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

-- harel_rest_rounds records a round from the first slot that leased
-- nothing, by a claim whose clock says p_now, its walk having taken p_ms
-- milliseconds (see "Going round"): transport_claim_wrap becomes p_now in
-- epoch ms, and, where the walk took 5 ms or more, transport_claim_rest 9
-- times that past the server's now, at most 2 s (never earlier than
-- p_rest, the rest the claim read, unless that is more than 2 s ahead: a
-- server clock stepped back). Returns the two.
CREATE OR REPLACE FUNCTION harel_rest_rounds(
    p_now  DOUBLE PRECISION,
    p_ms   DOUBLE PRECISION,
    p_rest BIGINT,
    OUT wrap BIGINT,
    OUT rest BIGINT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_at BIGINT := floor(date_part('epoch', clock_timestamp()) * 1000)::BIGINT;
BEGIN
    wrap := setval('transport_claim_wrap', GREATEST(floor(p_now * 1000), 0)::BIGINT);
    rest := p_rest;
    IF p_ms >= 5 THEN
        rest := setval('transport_claim_rest',
                       GREATEST(CASE WHEN p_rest <= v_at + 2000 THEN p_rest ELSE 0 END,
                                v_at + floor(LEAST(9 * p_ms, 2000))::BIGINT));
    END IF;
END
$$;

-- harel_sweep is the claim: it leases up to p_limit claimable groups
-- (priority >= p_min_priority) to p_token, due groups first and then the
-- sweep from the cursor (see "The sweep" above), and returns the head of
-- each, in no particular order, with its attempt (1 on the first
-- hand-out) and its age in seconds (server clock; NULL for a message
-- queued before version 10). p_caller names the function called in a
-- refusal. p_rest: the claim may skip a round while the rounds rest even
-- when it has found nothing (a stream's exchange; see "Going round"). harel_claim_one and
-- harel_claim_leases are its limits of one and of many. Its walks are
-- ordered scans of the slot index that stop at the limit: no bitmap scans,
-- which read every slot of the range and sort them (version 19).
CREATE OR REPLACE FUNCTION harel_sweep(
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT,
    p_limit        INT,
    p_caller       TEXT,
    p_rest         BOOLEAN DEFAULT false)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT, attempt INT, age DOUBLE PRECISION)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_groups  TEXT[];
    v_dseqs   BIGINT[];  -- per group: what its last claim handed out
    v_atts    INT[];     -- and how many times
    v_heads   BIGINT[];
    v_events  TEXT[];
    v_pubs    TIMESTAMPTZ[];
    v_again   BOOLEAN;   -- some head was handed out before
    v_stopped TEXT[];
    v_empty   TEXT[];
    v_gone    TEXT[];
    v_skip    TEXT[] := '{}';  -- picked by this call and not leased: not again
    v_cursor  INT;
    v_at      INT;       -- where this call's walk from the cursor goes on from
    v_from    INT := 0;  -- and its round, each past the rows it took before
    v_upto    INT;       -- where the round ends: the cursor this call began at
    v_wrap    BIGINT;    -- when a round last leased nothing (epoch ms, that claim's clock)
    v_last    INT;       -- the last slot the walk from the cursor took
    v_rlast   INT;       -- the last slot the round took
    v_max     INT;
    v_rest    BIGINT;    -- until when no claim goes round (epoch ms, server clock)
    v_newest  INT;       -- the slot the newest group row took
    v_round   TEXT[];    -- what this walk's round from the first slot picked
    v_t0      TIMESTAMPTZ;  -- when it began
    v_ms      DOUBLE PRECISION;  -- how long its walk took (ms)
    v_n       INT;
    v_leased  INT;
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;
    -- The entry checks (15_checks.sql).
    IF p_token IS NULL OR p_token = '' THEN
        PERFORM harel_refuse_token(p_caller);
    END IF;
    IF p_lease IS NULL OR p_lease <= p_now THEN
        PERFORM harel_refuse_lease(p_caller, p_lease, p_now);
    END IF;
    IF harel_clock_skewed(p_now) THEN
        PERFORM harel_refuse_skew(p_caller, p_now);
    END IF;
    SELECT c.last_value, w.last_value, r.last_value, n.last_value INTO v_cursor, v_wrap, v_rest, v_newest
      FROM transport_claim_cursor AS c, transport_claim_wrap AS w, transport_claim_rest AS r, transport_groups_slot AS n;
    v_at := v_cursor;
    v_upto := v_cursor;
    -- Again only while nothing was leased and the groups picked were
    -- empty or stopped: a claim leases something when anything is
    -- claimable. Each time, the walk and the round go on from the slot
    -- after the last one they took (v_at, v_from), so one call walks the
    -- slots once at most and the loop ends: with a lease, or when a walk
    -- finds nothing. (Until version 17 it gave up after 8 rounds; with
    -- kept rows a claim of 1 could meet more empty rows than that in a
    -- row, and return nothing while a group waited. Until version 19 each
    -- time walked again from the cursor and the first slot past what it
    -- had picked: under a held snapshot, a round that met thousands of
    -- kept rows drained long ago, 62 at a time, held one call for seconds.)
    LOOP
        -- Pick and lock: due groups first, then the sweep from the cursor
        -- to the last slot and on from the first (see "The sweep" above).
        SELECT array_agg(c.group_id), array_agg(c.delivered_seq), array_agg(c.attempts)
          INTO v_groups, v_dseqs, v_atts
          FROM (SELECT c.group_id, c.delivered_seq, c.attempts
                  FROM transport_groups AS c
                 WHERE c.retry_at <= p_now AND (c.locked_by IS NULL OR (c.locked_by = '' AND c.lock_expiry < p_now))
                   AND c.priority >= p_min_priority AND NOT c.paused
                   AND c.group_id <> ALL (v_skip)
                 ORDER BY c.retry_at
                 LIMIT p_limit
                   FOR NO KEY UPDATE SKIP LOCKED) AS c;
        v_last := NULL;
        v_rlast := NULL;
        v_round := NULL;
        FOR v_pass IN 1..2 LOOP
            v_n := COALESCE(cardinality(v_groups), 0);
            EXIT WHEN v_n >= p_limit;
            -- Round from the first slot unless something was found and a
            -- round that leased nothing was in the last 50 ms, or took 5 ms
            -- or more and rests the rounds, while no slot has come round
            -- behind the cursor (see "Going round").
            EXIT WHEN v_pass = 2 AND v_n > 0 AND p_now * 1000 - v_wrap BETWEEN 0 AND 50;
            EXIT WHEN v_pass = 2 AND (v_n > 0 OR p_rest) AND v_newest + 1 >= v_cursor
                  AND v_rest - date_part('epoch', clock_timestamp()) * 1000 BETWEEN 0 AND 2000;
            IF v_pass = 2 THEN
                v_t0 := clock_timestamp();
            END IF;
            SELECT COALESCE(v_groups, '{}') || array_agg(c.group_id), COALESCE(v_dseqs, '{}') || array_agg(c.delivered_seq),
                   COALESCE(v_atts, '{}') || array_agg(c.attempts), max(c.slot)
              INTO v_groups, v_dseqs, v_atts, v_max
              FROM (SELECT c.group_id, c.delivered_seq, c.attempts, c.slot
                      FROM transport_groups AS c
                     WHERE c.slot >= CASE WHEN v_pass = 1 THEN v_at ELSE v_from END
                       AND c.slot < CASE WHEN v_pass = 1 THEN 1048576 ELSE v_upto END
                       AND (c.locked_by IS NULL OR c.lock_expiry < p_now)
                       AND (c.drained_at IS NULL OR c.drained_at < p_now - 2 OR c.lock_expiry <= c.drained_at)
                       AND c.priority >= p_min_priority AND NOT c.paused
                       AND c.group_id <> ALL (v_skip)
                       AND (v_groups IS NULL OR c.group_id <> ALL (v_groups))
                     ORDER BY c.slot
                     LIMIT p_limit - v_n
                       FOR NO KEY UPDATE SKIP LOCKED) AS c;
            IF v_pass = 1 THEN
                v_last := v_max;
                v_at := COALESCE(v_max + 1, 1048576);
            ELSE
                v_round := COALESCE(v_groups[v_n + 1:], '{}');
                v_rlast := v_max;
                v_from := COALESCE(v_max + 1, v_upto);
                v_ms := date_part('epoch', clock_timestamp() - v_t0) * 1000;
            END IF;
        END LOOP;
        IF v_last IS NOT NULL AND p_min_priority <= 0 THEN
            -- Past the last slot taken; not back behind a concurrent
            -- claim's. (Back to a round's, below, only if it leased.)
            IF v_last >= (SELECT c.last_value FROM transport_claim_cursor AS c) THEN
                PERFORM setval('transport_claim_cursor', v_last + 1);
            END IF;
            v_cursor := v_last + 1;
        END IF;

        -- The heads, in a statement after the locks (every array
        -- aggregated from one row stream, so they stay aligned). A second
        -- pass only when some head was handed out before as many times as
        -- the policy allows, and harel_spend dead-lettered it or stopped
        -- its group.
        v_stopped := NULL;
        FOR pass IN 1..2 LOOP
            SELECT array_agg(u.gid), array_agg(u.d), array_agg(u.a), array_agg(h.seq), array_agg(h.event), array_agg(h.published_at),
                   COALESCE(bool_or(h.seq = u.d), false), array_agg(u.gid) FILTER (WHERE h.seq IS NULL)
              INTO v_groups, v_dseqs, v_atts, v_heads, v_events, v_pubs, v_again, v_empty
              FROM unnest(v_groups, v_dseqs, v_atts) AS u(gid, d, a)
              LEFT JOIN LATERAL (
                    SELECT m.seq, m.event, m.published_at
                      FROM transport_messages AS m
                     WHERE m.group_id = u.gid
                     ORDER BY m.seq
                     LIMIT 1) AS h ON true;
            EXIT WHEN NOT v_again OR pass = 2;
            -- A redelivery (a lapsed lease, a nack, a fail's backoff
            -- ended): any head at the limit?
            SELECT COALESCE(bool_or(u.s = u.d AND u.a >= p.max_attempts), false) INTO v_again
              FROM unnest(v_heads, v_dseqs, v_atts) AS u(s, d, a), transport_policy AS p
             WHERE p.id AND p.max_attempts > 0;
            EXIT WHEN NOT v_again;
            SELECT array_agg(s.group_id) FILTER (WHERE s.stopped)
              INTO v_stopped
              FROM harel_spend(v_groups, v_heads) AS s;
            IF v_stopped IS NOT NULL THEN
                v_skip := v_skip || v_stopped;
                SELECT array_agg(u.gid), array_agg(u.d), array_agg(u.a) INTO v_groups, v_dseqs, v_atts
                  FROM unnest(v_groups, v_dseqs, v_atts) AS u(gid, d, a)
                 WHERE u.gid <> ALL (v_stopped);
                EXIT WHEN v_groups IS NULL;
            END IF;
        END LOOP;

        -- Lease the groups that have a head, counting the attempt in the
        -- same write, and return them.
        v_leased := 0;
        IF v_groups IS NOT NULL THEN
            RETURN QUERY
                UPDATE transport_groups AS g
                   SET locked_by = p_token, lock_expiry = p_lease, delivered_seq = u.s,
                       attempts = CASE WHEN g.delivered_seq = u.s THEN g.attempts + 1 ELSE 1 END,
                       leased_at = p_now, drained_at = NULL
                  FROM unnest(v_groups, v_heads, v_events, v_pubs) AS u(gid, s, e, p)
                 WHERE u.s IS NOT NULL AND g.group_id = u.gid
                RETURNING u.gid, u.s, u.e, g.attempts, date_part('epoch', clock_timestamp() - u.p);
            GET DIAGNOSTICS v_leased = ROW_COUNT;
        END IF;

        IF v_empty IS NOT NULL THEN
            -- Empty group rows: delete those drained 2 s ago or more (or
            -- never marked) that no publisher is mid-transaction on (a
            -- publisher holds the group's lock, shared, from its message
            -- insert until it commits; see harel_hold_group), re-checked
            -- in a statement after the try-lock; free the rest, found
            -- empty (see "Kept rows").
            v_skip := v_skip || v_empty;
            SELECT array_agg(e) INTO v_gone
              FROM unnest(v_empty) AS e
             WHERE CASE WHEN EXISTS (SELECT 1 FROM transport_groups AS g
                                      WHERE g.group_id = e AND g.drained_at >= p_now - 2)
                        THEN false  -- kept: found empty, not deleted
                        ELSE harel_try_guard(e) END;  -- a CASE, so that the lock is not taken for a kept row
            WITH deleted AS (
                DELETE FROM transport_groups AS g
                 WHERE g.group_id = ANY (v_gone)
                   AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = g.group_id)
                RETURNING g.group_id
            )
            SELECT array_agg(d.group_id) INTO v_gone FROM deleted AS d;
            UPDATE transport_groups AS g
               SET locked_by = NULL, lock_expiry = GREATEST(p_now, g.drained_at + 0.001), retry_at = NULL,
                   drained_at = CASE WHEN NOT g.paused AND g.state IS NULL THEN COALESCE(g.drained_at, p_now) END
             WHERE g.group_id = ANY (ARRAY(SELECT unnest(v_empty) EXCEPT SELECT unnest(v_gone)));
        END IF;
        IF v_round IS NOT NULL AND p_min_priority <= 0 THEN
            IF EXISTS (SELECT 1 FROM unnest(v_round) AS r
                        WHERE r <> ALL (COALESCE(v_empty, '{}')) AND r <> ALL (COALESCE(v_stopped, '{}'))) THEN
                -- The round leased: the cursor goes past its last slot. One
                -- that leased nothing leaves the cursor where it was (with
                -- arrivals ahead of it, not the rows the round passed) and
                -- may rest the rounds.
                PERFORM setval('transport_claim_cursor', v_rlast + 1);
                v_cursor := v_rlast + 1;
            ELSE
                SELECT r.wrap, r.rest INTO v_wrap, v_rest FROM harel_rest_rounds(p_now, v_ms, v_rest) AS r;
            END IF;
        END IF;
        -- A stream's exchange (p_rest) stops after 256 rows picked and not
        -- leased, returning what it has: each row stays locked until the
        -- claim commits, publishers of those groups wait for it, and the
        -- next exchange passes them (the cursor has moved past them, or, for
        -- a claim with a floor, they are gone or passed as found empty). Under a
        -- held snapshot at 2,000 msgs/s one exchange met 5,000 kept rows in
        -- a row. Other claims go on: they lease something when anything is
        -- claimable.
        EXIT WHEN v_leased > 0 OR (v_empty IS NULL AND v_stopped IS NULL)
               OR (p_rest AND cardinality(v_skip) >= 256);
    END LOOP;
END
$$;

-- The wrappers below are PL/pgSQL, not SQL: a SQL function with SET
-- clauses is never inlined, and its statement is planned again at every
-- call (about 100 µs a claim on this machine), while PL/pgSQL keeps its
-- plan for the connection.

-- harel_claim_one leases one claimable group (see "The sweep" above) and
-- returns its head with its attempt and age: zero rows when nothing at
-- or above p_min_priority is claimable. harel_claim is this without the
-- last two columns.
CREATE OR REPLACE FUNCTION harel_claim_one(
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT DEFAULT 0)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT, attempt INT, age DOUBLE PRECISION)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ BEGIN RETURN QUERY SELECT * FROM harel_sweep(p_now, p_lease, p_token, p_min_priority, 1, 'harel_claim'); END $$;

-- harel_claim is the design's claim: harel_claim_one's lease, its result
-- as the design gives it.
CREATE OR REPLACE FUNCTION harel_claim(
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT DEFAULT 0)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ BEGIN RETURN QUERY SELECT c.group_id, c.seq, c.event FROM harel_sweep(p_now, p_lease, p_token, p_min_priority, 1, 'harel_claim') AS c; END $$;

-- harel_claim_leases leases up to p_limit claimable groups to one token
-- and returns the head of each (in no particular order) with its attempt
-- and age, as harel_claim_one does. Every lease is fenced on its own
-- group row, so one token for the batch is enough: an ack names the
-- group and the token. It may return fewer than p_limit rows while more
-- groups are claimable (the empty group rows it picked are deleted or
-- freed, not replaced), but not none.
CREATE OR REPLACE FUNCTION harel_claim_leases(
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT,
    p_limit        INT)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT, attempt INT, age DOUBLE PRECISION)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ BEGIN RETURN QUERY SELECT * FROM harel_sweep(p_now, p_lease, p_token, p_min_priority, p_limit, 'harel_claim_many'); END $$;

-- harel_claim_many is harel_claim_leases without the attempt and age
-- columns (its result since version 4).
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
SET enable_seqscan = off
SET jit = off
AS $$ BEGIN RETURN QUERY SELECT c.group_id, c.seq, c.event FROM harel_sweep(p_now, p_lease, p_token, p_min_priority, p_limit, 'harel_claim_many') AS c; END $$;
