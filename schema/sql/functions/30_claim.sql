-- 30_claim.sql: the claim (harel_claim, harel_claim_many and what they
-- share: the sweep, the hand-out count, dead-lettering a spent head).
--
-- The ready log (version 20). A claim takes, after the due groups
-- (below), the groups of the ready log's entries from the frontier on, in
-- entry order (25_ready.sql): the groups that became claimable at once, in
-- the order they did. So groups are served longest-ready first: a group
-- that becomes claimable waits for the groups that became claimable
-- before it, each handed out once, so at most as many hand-outs as there
-- are claimable groups, kept leases aside
-- (TestClaimsServeGroupsInTheOrderTheyBecameClaimable). A claim reads the
-- entries it takes, and the dead ones between the frontier and them, not
-- the rows it cannot take, and under a held snapshot it does not pass
-- the versions of rows it never looks at. It locks an entry (FOR UPDATE
-- SKIP LOCKED) and then its group row, checked as the sweep checks it;
-- deletes the entries of the groups it took and of groups gone, held or
-- paused (what frees them writes a new one); and leaves those whose row
-- another transaction holds. A claim with a floor passes the entries
-- below it.
--
-- The sweep (version 16). What becomes claimable with no entry (a lease or
-- a park under a token that lapses; a message under a wrong drained mark,
-- "Kept rows" below; a group of a queue upgraded mid-claim) the sweep
-- finds. Every group row has a slot, numbered when the row
-- is created (transport_groups_slot, which cycles through 2^20
-- values) and not written otherwise, and the sweep goes round the slots in
-- order: it
-- starts at the cursor (transport_claim_cursor, the slot after the last
-- one a sweep took), takes the claimable groups it meets up to the claim's
-- limit, on to the last slot and then from the first, and moves the cursor past
-- the last slot it took. Claimable: not paused, at or above the claim's
-- priority floor, and free or with a lease, park or backoff that has
-- ended. No column a claim or an ack writes is in an index (the slot
-- index, transport_groups_sweep, holds the slot only), so their updates
-- are HOT: the table and its indexes do not grow per message, and a
-- page's dead versions are pruned in place without vacuum. The price: a
-- sweep passes the rows it cannot take (leased, parked, paused, below its
-- floor) on the heap, and, under a held snapshot, every version of them
-- since; so the claims sweep only where the log and the due groups left
-- room, and then rarely (see "Going round").
-- Only a claim that admits every priority moves the cursor (one with a
-- floor would move it past groups it cannot see), and a round (from the
-- first slot) moves it back only when it leased something; concurrent
-- sweeps start from the same cursor and skip each other's rows (SKIP
-- LOCKED).
--
-- Going round. A claim sweeps (from the cursor to the last slot and on
-- from the first) when the due groups and the log left room, unless it has
-- found something and a sweep that leased nothing (it found no row, or
-- only rows found empty) was in the last second (transport_claim_wrap, the p_now
-- of that claim, epoch ms), or, where that sweep took 5 ms or more, it
-- found something or is a stream's exchange (harel_exchange_leases with
-- p_rest: a stream that finds nothing waits for a wake-up or its IdleSweep
-- and asks again) and the sweeps rest: 9 times what it took, 1 s at least
-- and 2 s at most (version 24; until then no floor)
-- (transport_claim_rest, epoch ms of the server's clock;
-- harel_rest_rounds). Any other claim that has found nothing sweeps a
-- whole lap if it must, so harel_claim and harel_claim_leases lease
-- something when anything is claimable. A sweep by a claim that found
-- something, or by a stream's exchange, has a budget: it walks 512 slots at
-- a time and stops after the piece that takes its sweeps past 10 ms, the
-- cursor where it got to, so that no exchange holds the groups it settled
-- (and, for a stream, the next exchange) for a whole lap; the next sweep
-- goes on from there, and a sweep stopped so is not a lap that found
-- nothing (it rests the sweeps by its cost, and leaves the second alone).
-- The cursor is where the last sweep got to: past the last slot it took,
-- where it stopped, or where it began after a whole lap. A lapsed lease waits for the next sweep: at most about a
-- second under load (the first claim after the second sweeps, and the
-- claims go on sweeping while the sweeps lease), at most 2 s more while
-- costly sweeps rest, at once where a claim finds the log empty
-- (TestSweepFindsWhatTheLogMisses, TestCostlySweepRests). A sweep passes
-- the index entries of every slot a row has left since vacuum last ran
-- and, while a snapshot holds vacuum back, every version since: under a
-- 5-minute snapshot at 1,000 msgs/s a lap took 50-370 ms, which is why the
-- log, not the sweep, hands out the groups that are ready, and why a
-- budgeted sweep stops early. A rest more
-- than 2 s ahead (the server's clock stepped back) is none. (Until version
-- 20 the sweep was the claim, and the round rested only for claims that
-- had found something ahead of the cursor; versions 18 and 19 gave
-- revived rows new slots, at the end of the round.)
--
-- Kept rows (version 17). The ack that drains a group frees its row in
-- place and marks it (drained_at = lock_expiry = the ack's now), and the
-- group's next publish readies it (harel_revive, called by
-- harel_ready_groups and the trigger harel_ready_group, 20_publish.sql):
-- a group that drains and comes back, as a stream's kept leases make most
-- groups do, costs no row insert and delete. Since version 24 the publish
-- does not write the row (unless its priority changes): it writes the
-- group's entry in the ready log, and the claim that takes it leases the
-- row and clears the mark in its one write, so a group that drains and
-- comes back writes two versions of its row per message (the lease, the
-- ack), not three; each version is one more for every lookup of the row
-- to pass while a snapshot holds vacuum back. So a marked row may have
-- messages, and every claim path reads a marked row's messages before it
-- takes it. The mark is written without the lost-publish guard (so that
-- no publisher waits for a drainer), and the publish reads the row
-- without waiting for its lock, so either can be wrong: a publish whose
-- group insert or read came just before the ack's mark, its message still
-- uncommitted when the ack looked, wrote no entry and leaves its message
-- under a marked row. So the sweep looks for a message under every marked
-- row it meets (an index probe of transport_messages, before the lock) and
-- takes the row, and hands its head out, when it finds one. The probes of
-- the claim paths read the group's newest message first (a backward
-- scan): a marked row with a message is one published since its drain,
-- and its newest message is that publish's, so the probe reads one entry,
-- where a forward scan first passes every message the group has had
-- acked since vacuum last ran (under a held snapshot, all of them). It never
-- locks an empty kept row: a publisher readying one waits for no claim
-- (until version 22 the sweep took a marked row to read its head, passed
-- it for 2 s once found empty and then took it again, and a stream's
-- exchange could hold hundreds of them locked while their publishers
-- waited; TestSweepLocksNoEmptyKeptRow). harel_reap deletes the kept rows
-- still empty 2 s after their drain. So a group that comes back within
-- 2 s keeps its row for good, and one that does not (a job of one
-- message, say) costs a reap's delete where an ack used to delete it.

-- Due groups first: a group held by no one that is due before the sweep
-- (retry_at: a failed message's backoff or a snooze's delay that has
-- ended, a give-back, a nack with no delay or a restart at once) is taken
-- first, the earliest due first, from the partial index
-- transport_groups_due, so a
-- retry comes when its backoff ends rather than when the cursor reaches
-- it: a poison message holds its group for about its attempts times the
-- backoff, however deep the backlog. A nack's park, under its token, is
-- taken so too once it ends (until version 20 it kept its place in the
-- sweep, and was in the index only so that idle consumers learn when it
-- ends, harel_wait). The settle that follows
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

-- harel_rest_rounds records a sweep that leased nothing, by a claim whose
-- clock says p_now, its walk having taken p_ms milliseconds (see "Going
-- round"): transport_claim_wrap becomes p_now in epoch ms (unless p_now is
-- NULL: a sweep that stopped at its budget, not a whole lap), and, where
-- the walk took 5 ms or more, transport_claim_rest 9
-- times that past the server's now, 1 s at least and 2 s at most (the
-- floor since version 24: under a held snapshot a stream's budgeted
-- sweeps, 10 ms each and resting 90 ms, took a tenth of a core and found
-- nothing; never earlier than
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
    IF p_now IS NULL THEN
        wrap := (SELECT w.last_value FROM transport_claim_wrap AS w);
    ELSE
        wrap := setval('transport_claim_wrap', GREATEST(floor(p_now * 1000), 0)::BIGINT);
    END IF;
    rest := p_rest;
    IF p_ms >= 5 THEN
        rest := setval('transport_claim_rest',
                       GREATEST(CASE WHEN p_rest <= v_at + 2000 THEN p_rest ELSE 0 END,
                                v_at + floor(LEAST(GREATEST(9 * p_ms, 1000), 2000))::BIGINT));
    END IF;
END
$$;

-- harel_reap deletes the kept rows drained 2 s ago or more, still empty,
-- among the next p_slots slots from the reap's cursor
-- (transport_claim_reap_cursor, round and round like the sweep's): it
-- locks only rows it found empty, and deletes them after the guard's
-- try-lock and a re-check in a statement after it, so the caller's
-- transaction holds those rows' buckets until it ends. A claim whose limit
-- the due groups and the log reached before it swept calls it with its
-- limit, so that under a backlog of one-message groups, where claims
-- never sweep, the rows their acks leave are reaped as fast as they come
-- (a new group takes the next slot): bounded work for each claim. A claim
-- that leased nothing calls it with its limit, 64 at least, so that an
-- idle queue's kept rows go too (version 22; until then the sweep deleted
-- those it met), but for a stream's exchange, which leaves it to the
-- stream's harel_wait, a transaction of its own (version 24). Each row it deletes holds its guard bucket (one of 1,024)
-- until the claim commits, and publishers of that bucket's groups wait:
-- so few at a time (version 23; version 22 took 512 slots).
CREATE OR REPLACE FUNCTION harel_reap(
    p_now   DOUBLE PRECISION,
    p_slots INT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_lo   INT := (SELECT c.last_value FROM transport_claim_reap_cursor AS c);
    v_top  INT := COALESCE((SELECT max(g.slot) FROM transport_groups AS g), -1) + 1;
    v_gone TEXT[];
BEGIN
    IF v_lo >= v_top THEN
        v_lo := 0;
    END IF;
    PERFORM setval('transport_claim_reap_cursor', LEAST(v_lo + p_slots, 1048576));
    SELECT array_agg(c.group_id) INTO v_gone
      FROM (SELECT c.group_id
              FROM transport_groups AS c
             WHERE c.slot >= v_lo AND c.slot < v_lo + p_slots
               AND c.locked_by IS NULL AND NOT c.paused AND c.state IS NULL
               AND c.drained_at < p_now - 2
               AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = c.group_id)
               FOR NO KEY UPDATE SKIP LOCKED) AS c
     WHERE harel_try_guard(c.group_id);
    IF v_gone IS NOT NULL THEN
        DELETE FROM transport_groups AS g
         WHERE g.group_id = ANY (v_gone)
           AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = g.group_id);
    END IF;
END
$$;

-- harel_sweep is the claim: it leases up to p_limit claimable groups
-- (priority >= p_min_priority) to p_token, due groups first, then the
-- ready log's, then the sweep's (see "The ready log", "The sweep" and
-- "Going round" above), and returns the head of
-- each, in no particular order, with its attempt (1 on the first
-- hand-out) and its age in seconds (server clock; NULL for a message
-- queued before version 10). p_caller names the function called in a
-- refusal. p_rest: the claim skips the sweep while the sweeps rest even
-- when it has found nothing, and its sweep has a budget (a stream's
-- exchange; see "Going round"). (The name is the sweep's, which was the
-- whole claim until version 20.) harel_claim_one and
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
    v_max     INT;       -- the last slot a piece of the sweep took
    v_lo      INT;       -- the piece's slots
    v_hi      INT;
    v_pos     INT;       -- where the sweep got to
    v_stop    BOOLEAN := false;  -- it used its budget
    v_top     INT;       -- past the highest slot a row has
    v_filled  BOOLEAN := false;  -- the limit was reached before any sweep
    v_rest    BIGINT;    -- until when sweeps rest (epoch ms, server clock)
    v_swept   TEXT[];    -- what the sweep picked, both walks
    v_n0      INT;       -- how many were picked before the sweep
    v_front   BIGINT;    -- the ready log's frontier
    v_rnext   BIGINT := 0;  -- where this call reads the log on from
    v_rseqs   BIGINT[];  -- the entries it picked
    v_rgroups TEXT[];    -- and their groups
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
    v_front := harel_ready_front();
    SELECT c.last_value, w.last_value, r.last_value INTO v_cursor, v_wrap, v_rest
      FROM transport_claim_cursor AS c, transport_claim_wrap AS w, transport_claim_rest AS r;
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
                 WHERE c.retry_at <= p_now AND (c.locked_by IS NULL OR c.lock_expiry < p_now)
                   AND c.priority >= p_min_priority AND NOT c.paused
                   AND c.group_id <> ALL (v_skip)
                 ORDER BY c.retry_at
                 LIMIT p_limit
                   FOR NO KEY UPDATE SKIP LOCKED) AS c;
        -- Then the ready log, from the frontier and past what this call
        -- read before (see "The ready log"): the groups of the entries it
        -- picks that are claimable, as the sweep's are. It deletes the
        -- entries of the groups it took, and those of groups gone, held,
        -- paused or drained and still empty (what makes them
        -- claimable again writes a new entry); it leaves those whose row
        -- another transaction holds.
        v_n := COALESCE(cardinality(v_groups), 0);
        IF v_n < p_limit THEN
            SELECT array_agg(r.rseq), array_agg(r.group_id), max(r.rseq) + 1 INTO v_rseqs, v_rgroups, v_rnext
              FROM (SELECT r.rseq, r.group_id
                      FROM transport_ready AS r
                     WHERE r.rseq >= GREATEST(v_front, v_rnext) AND r.priority >= p_min_priority
                     ORDER BY r.rseq
                     LIMIT p_limit - v_n
                       FOR UPDATE SKIP LOCKED) AS r;
            IF v_rseqs IS NOT NULL THEN
                SELECT COALESCE(v_groups, '{}') || array_agg(c.group_id), COALESCE(v_dseqs, '{}') || array_agg(c.delivered_seq),
                       COALESCE(v_atts, '{}') || array_agg(c.attempts)
                  INTO v_groups, v_dseqs, v_atts
                  FROM (SELECT c.group_id, c.delivered_seq, c.attempts
                          FROM transport_groups AS c
                         WHERE c.group_id = ANY (v_rgroups)
                           AND (c.locked_by IS NULL OR c.lock_expiry < p_now)
                           AND (c.drained_at IS NULL OR (SELECT m.seq FROM transport_messages AS m WHERE m.group_id = c.group_id ORDER BY m.seq DESC LIMIT 1) IS NOT NULL)
                           AND c.priority >= p_min_priority AND NOT c.paused
                           AND c.group_id <> ALL (v_skip)
                           AND (v_groups IS NULL OR c.group_id <> ALL (v_groups))
                           FOR NO KEY UPDATE SKIP LOCKED) AS c;
                DELETE FROM transport_ready AS r
                 WHERE r.rseq = ANY (v_rseqs)
                   AND (r.group_id = ANY (COALESCE(v_groups, '{}'))
                        OR NOT EXISTS (SELECT 1 FROM transport_groups AS g
                                        WHERE g.group_id = r.group_id AND NOT g.paused
                                          AND (g.locked_by IS NULL OR g.lock_expiry < p_now)
                                          AND (g.drained_at IS NULL
                                               OR (SELECT m.seq FROM transport_messages AS m WHERE m.group_id = g.group_id ORDER BY m.seq DESC LIMIT 1) IS NOT NULL)));
            ELSE
                v_rnext := GREATEST(v_front, v_rnext);
            END IF;
        END IF;

        v_swept := NULL;
        v_pos := NULL;
        FOR v_pass IN 1..2 LOOP
            v_n := COALESCE(cardinality(v_groups), 0);
            v_filled := v_pass = 1 AND v_n >= p_limit AND v_t0 IS NULL;
            EXIT WHEN v_n >= p_limit OR v_stop;
            -- The sweep, where the due groups and the log left room: not
            -- when something was found and a sweep that leased nothing
            -- was in the last second, nor, for a claim that found
            -- something or a stream's exchange, while sweeps rest (see
            -- "Going round").
            EXIT WHEN v_pass = 1 AND v_n > 0 AND p_now * 1000 - v_wrap BETWEEN 0 AND 1000;
            EXIT WHEN v_pass = 1 AND (v_n > 0 OR p_rest)
                  AND v_rest - date_part('epoch', clock_timestamp()) * 1000 BETWEEN 0 AND 2000;
            IF v_pass = 1 THEN
                v_n0 := v_n;
                v_swept := '{}';
                IF v_t0 IS NULL THEN
                    -- The call's first sweep: its budget's start, and the
                    -- highest slot a row has (the walk from the cursor
                    -- ends there rather than at the last of 2^20).
                    v_t0 := clock_timestamp();
                    v_top := COALESCE((SELECT max(c.slot) FROM transport_groups AS c), -1) + 1;
                END IF;
            END IF;
            -- A pass walks its slots 512 at a time where the sweep has a
            -- budget (a claim that found something, a stream's
            -- exchange): the call stops sweeping after the piece that
            -- takes its sweeps past 10 ms, and the next sweep goes on from
            -- there.
            LOOP
                v_lo := CASE WHEN v_pass = 1 THEN v_at ELSE v_from END;
                v_hi := CASE WHEN v_pass = 1 THEN GREATEST(v_top, v_lo) ELSE v_upto END;
                IF v_n0 > 0 OR p_rest THEN
                    v_hi := LEAST(v_hi, v_lo + 512);
                END IF;
                SELECT COALESCE(v_groups, '{}') || array_agg(c.group_id), COALESCE(v_dseqs, '{}') || array_agg(c.delivered_seq),
                       COALESCE(v_atts, '{}') || array_agg(c.attempts), max(c.slot)
                  INTO v_groups, v_dseqs, v_atts, v_max
                  FROM (SELECT c.group_id, c.delivered_seq, c.attempts, c.slot
                          FROM transport_groups AS c
                         WHERE c.slot >= v_lo AND c.slot < v_hi
                           AND (c.locked_by IS NULL OR c.lock_expiry < p_now)
                           AND (c.drained_at IS NULL OR (SELECT m.seq FROM transport_messages AS m WHERE m.group_id = c.group_id ORDER BY m.seq DESC LIMIT 1) IS NOT NULL)
                           AND c.priority >= p_min_priority AND NOT c.paused
                           AND c.group_id <> ALL (v_skip)
                           AND (v_groups IS NULL OR c.group_id <> ALL (v_groups))
                         ORDER BY c.slot
                         LIMIT p_limit - v_n
                           FOR NO KEY UPDATE SKIP LOCKED) AS c;
                v_n := COALESCE(cardinality(v_groups), 0);
                -- On past the last slot taken when the limit is reached,
                -- past the piece's end when not.
                v_pos := CASE WHEN v_n >= p_limit THEN v_max + 1 ELSE v_hi END;
                IF v_pass = 1 THEN
                    v_at := v_pos;
                ELSE
                    v_from := v_pos;
                END IF;
                v_ms := date_part('epoch', clock_timestamp() - v_t0) * 1000;
                v_stop := (v_n0 > 0 OR p_rest) AND v_ms >= 10;
                EXIT WHEN v_n >= p_limit OR v_stop
                       OR v_pos >= CASE WHEN v_pass = 1 THEN v_top ELSE v_upto END;
            END LOOP;
            v_swept := COALESCE(v_groups[v_n0 + 1:], '{}');
        END LOOP;
        IF v_pos IS NOT NULL AND p_min_priority <= 0 THEN
            -- The next sweep goes on from where this one got to (back at
            -- the slot it began at after a whole lap).
            PERFORM setval('transport_claim_cursor', LEAST(v_pos, 1048576));
            v_cursor := v_pos;
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
            -- Group rows found empty (their message seen by the pick was
            -- gone by the head's read, or a row never marked): delete those
            -- drained 2 s ago or more (or never marked) that no publisher
            -- is mid-transaction on (a publisher holds the group's lock,
            -- shared, from its message insert until it commits; see
            -- harel_hold_group), re-checked in a statement after the
            -- try-lock; free and mark the rest (see "Kept rows"). A
            -- stream's exchange (p_rest) leaves them to the reap, but for
            -- a row with a state, which no reap takes (its ack's delete
            -- met a publisher): a deleted row's bucket is held until the
            -- claim commits, and under a held snapshot an exchange ran
            -- 100 ms and more while a publisher waited on it (version 24).
            v_skip := v_skip || v_empty;
            SELECT array_agg(e) INTO v_gone
              FROM unnest(v_empty) AS e
             WHERE CASE WHEN EXISTS (SELECT 1 FROM transport_groups AS g
                                      WHERE g.group_id = e AND (g.drained_at >= p_now - 2 OR (p_rest AND g.state IS NULL)))
                        THEN false  -- kept: found empty, not deleted (a stream's exchange deletes only a row with a state)
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
        IF v_swept IS NOT NULL AND p_min_priority <= 0 THEN
            IF NOT EXISTS (SELECT 1 FROM unnest(v_swept) AS r
                            WHERE r <> ALL (COALESCE(v_empty, '{}')) AND r <> ALL (COALESCE(v_stopped, '{}'))) THEN
                -- A sweep that leased nothing: recorded, and it may rest
                -- the sweeps.
                SELECT r.wrap, r.rest INTO v_wrap, v_rest FROM harel_rest_rounds(CASE WHEN NOT v_stop THEN p_now END, v_ms, v_rest) AS r;
            END IF;
        END IF;
        -- A stream's exchange (p_rest) stops after 256 rows picked and not
        -- leased (found empty or stopped), returning what it has: each row
        -- stays locked until the claim commits, publishers of those groups
        -- wait for it, and the next exchange passes them (the cursor has
        -- moved past them, or, for a claim with a floor, they are gone or
        -- marked). Under a held snapshot at 2,000 msgs/s one version-21
        -- exchange met 5,000 kept rows in a row (since version 22 a claim
        -- picks a kept row only with a message under it). Other claims go
        -- on: they lease something when anything is claimable.
        EXIT WHEN v_leased > 0 OR (v_empty IS NULL AND v_stopped IS NULL)
               OR (p_rest AND cardinality(v_skip) >= 256);
    END LOOP;
    -- The reap (harel_reap): not in a stream's exchange that leased
    -- nothing, which may run for long under a held snapshot while the
    -- buckets of the rows it reaped make their publishers wait; such a
    -- stream reaps when it goes idle (harel_wait, version 24).
    IF p_min_priority <= 0 AND (v_filled OR (v_leased = 0 AND NOT p_rest)) THEN
        PERFORM harel_reap(p_now, CASE WHEN v_filled THEN p_limit ELSE GREATEST(p_limit, 64) END);
    END IF;
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
