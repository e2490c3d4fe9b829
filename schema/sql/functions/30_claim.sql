-- 30_claim.sql: the claim (harel_claim, harel_claim_many and what they
-- share: harel_sweep, its rests and reaps, the hand-out count).
-- This file says what the claim does now; docs/design.md says how each
-- part came to be, and what was measured ("Poison messages", and "The
-- sweep" to "Two versions of a group row a message").
--
-- A claim picks from three places, each only where the one before left
-- room under its limit: the due groups, the ready log, the sweep.
--
-- Due groups. A group held by no one whose retry_at has come (a failed
-- head's backoff or a snooze's delay that has ended, a give-back, a nack
-- at once or when its park ends, a restart) is taken first, the earliest
-- due first, from the partial index transport_groups_due: a retry comes
-- when its backoff ends, however deep the backlog, so a poison message
-- holds its group for about its attempts times the backoff. The settle
-- that follows clears retry_at (HOT while it stays NULL), so a group that
-- never fails or parks never enters that index.
--
-- The ready log. Then the groups of the log's entries from the frontier on
-- (transport_ready, 25_ready.sql), in (vt, number) order: a tenant's
-- groups in the order they became claimable, tenants interleaved by
-- weight ("Shares" in 25_ready.sql). So with one tenant groups are served
-- longest-ready first: a group that becomes claimable waits for those
-- that became claimable before it, each handed out once, so at most as
-- many hand-outs as there are claimable groups, due groups and kept
-- leases aside (TestClaimsServeGroupsInTheOrderTheyBecameClaimable); with
-- several, for about one turn of each other tenant a step
-- (TestSharesInterleaveTenants). A claim reads the
-- entries it takes, the dead ones before them and the rows they name:
-- not the rows no entry names, nor their versions under a held snapshot. It
-- locks an entry (FOR UPDATE SKIP LOCKED), then its group row, checked as
-- the sweep checks it; deletes the entries of the groups it took and of
-- groups gone, held, paused or drained and empty (what makes them
-- claimable again writes a new entry); and leaves those whose row another
-- transaction holds. A claim with a floor passes the entries below it.
--
-- The sweep. What becomes claimable with no entry (a lease or a park
-- under a token that lapses; a message under a wrong drained mark, "Kept
-- rows" below) the sweep finds. Every group row has a slot, numbered when
-- the row is created (transport_groups_slot, cycling through 2^20 values)
-- and never written again. The sweep walks the slot index from the cursor
-- (transport_claim_cursor) to the highest slot a row has and on from the
-- first, takes the claimable rows it meets up to the claim's limit, and
-- leaves the cursor where it got to: past the last slot it took, where
-- its budget stopped it, or where it began after a whole lap. Claimable:
-- not paused, at or above the claim's floor, and free or with a lease,
-- park or backoff that has ended. No column a claim or an ack changes is
-- in an index (transport_groups_sweep holds the slot only) but retry_at,
-- which they leave NULL unless a group fails or parks, so their updates
-- are HOT: the table and its indexes do not grow per message, and
-- a page's dead versions are pruned in place without vacuum. The price:
-- the sweep filters the rows it cannot take on the heap and, under a held
-- snapshot, every version of them (a lap took 50-370 ms under a 5-minute
-- snapshot at 1,000 msgs/s), so claims sweep only where the due groups and
-- the log left room, and rarely. Only a claim with no floor moves the
-- cursor (one with a floor would move it past groups it cannot see);
-- concurrent sweeps skip each other's rows (SKIP LOCKED).
--
-- Going round. A claim that has found something does not sweep within a
-- second of a sweep that leased nothing (transport_claim_wrap, that
-- claim's p_now in epoch ms). A sweep that took 5 ms or more and leased
-- nothing rests the sweeps for 9 times what it took, 1 s at least and 2 s
-- at most (transport_claim_rest, epoch ms of the server's clock;
-- harel_rest_rounds), and while they rest neither a claim that has found
-- something nor a stream's exchange sweeps (p_rest: a stream that finds
-- nothing waits for a wake-up or its IdleSweep and asks again). Any other
-- claim that has found nothing sweeps a whole lap if it must, so
-- harel_claim and harel_claim_leases lease something when anything is
-- claimable. The sweep of a claim that found something, or of a stream's
-- exchange, has a budget: it walks 512 slots at a time and stops after
-- the piece that takes it past 10 ms, so that no exchange holds the groups
-- it settled (and, for a stream, its next exchange) for a lap; a sweep
-- stopped so that leased nothing rests the sweeps by its cost but leaves
-- transport_claim_wrap alone (it is not a lap). So a lapsed lease waits
-- for the next sweep: at most about a second under load (the first claim
-- after the second sweeps), 2 s more while costly sweeps rest, none where
-- a claim other than a stream's exchange finds nothing before it sweeps
-- (TestSweepFindsWhatTheLogMisses, TestCostlySweepRests). A rest more
-- than 2 s ahead (the server's clock stepped back) is none.
--
-- Kept rows. The ack that drains a group frees its row in place and marks
-- it (drained_at = lock_expiry = the ack's now); the group's next publish
-- writes the group's ready-log entry without writing the row (harel_revive,
-- 20_publish.sql, unless the priority changes), and the claim that takes
-- it clears the mark in its lease. So a group that drains and comes back
-- costs no row insert or delete, and writes two versions of its row a
-- message (the lease, the ack), each one more for every lookup of the row
-- to pass while a snapshot holds vacuum back. The mark is written without
-- the lost-publish guard, so that no publisher waits for a drainer, and
-- the publish reads the row without waiting for its lock: a publish that
-- read the row before the ack's mark committed, its message still
-- uncommitted when the ack looked, wrote no entry and leaves its message
-- under a marked row. So a marked row may have messages (every revived
-- one has), and every claim path reads a marked row's newest message
-- before it locks the row (a backward index scan: a message there is the
-- newest, so the probe reads one entry, where a forward scan passes every
-- message the group had acked since vacuum last ran), takes the row when
-- there is one, and never locks an empty kept row, so a publisher
-- reviving one waits for no claim (TestSweepLocksNoEmptyKeptRow).
-- harel_reap deletes the kept rows still empty 2 s after their drain: a
-- group that comes back within 2 s keeps its row, a job of one message
-- costs a reap's delete. A stream's exchange deletes no empty row but one
-- with a state, which no reap takes.
--
-- Delivery attempts. A claim's one write of the group row also records
-- the message it hands out (delivered_seq) and how many times it has
-- handed it out (attempts): only a group's head is ever delivered, so the
-- group row can count for it, in the claim's one write. Every hand-out
-- counts, whatever ends the lease (an ack, a nack, a fail, or a lapse: a
-- worker that crashes on a message uses an attempt each time);
-- harel_release (a give-back of an unused lease) and harel_snooze take
-- their attempt back. A head about to be handed out again when it has
-- used the queue's max_attempts (transport_policy) gets the queue's
-- choice first (harel_spend, 50_fail.sql): it moves to the dead
-- letters and the claim hands out the group's next message, or the group
-- is stopped and the claim moves on.
--
-- The order inside a claim: lock the group rows (FOR NO KEY UPDATE SKIP
-- LOCKED), read their heads in a statement of its own (a snapshot taken
-- after the locks, so never a head an earlier holder has just acked), then
-- lease them by primary key with the head and the count in the same
-- write. An empty group row is never leased: it is deleted (the
-- lost-publish guard's try-lock, then a re-check) or freed and marked, and
-- the claim goes on while it has leased nothing and something else may be
-- claimable.

-- harel_rest_rounds records a sweep that leased nothing ("Going round"), by
-- a claim whose clock says p_now (NULL: a sweep its budget stopped, not a
-- lap), its walk having taken p_ms milliseconds: transport_claim_wrap
-- becomes p_now in epoch ms (left as it is for NULL) and, from 5 ms on,
-- transport_claim_rest 9 times p_ms past the server's now, 1 to 2 s, never
-- earlier than p_rest, the rest the claim read (unless that is more than
-- 2 s ahead). Returns the two.
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
SET enable_bitmapscan = off
SET enable_mergejoin = off
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

-- harel_reap deletes the kept rows drained 2 s ago or more and still
-- empty among the next p_slots slots from its cursor
-- (transport_claim_reap_cursor, round and round like the sweep's): it
-- locks only rows it found empty, and deletes them after the guard's
-- try-lock and a re-check, so the caller holds their guard buckets (one
-- of 1,024 each, and their publishers wait) until it commits: few at a
-- time. A claim whose limit was reached before it swept reaps its limit,
-- so that under a backlog of one-message groups, where claims never
-- sweep, the rows their acks leave go as fast as they come; a claim that
-- leased nothing reaps its limit, 64 at least, so that an idle queue's
-- kept rows go too, but for a stream's exchange, whose stream reaps in
-- its harel_wait, a transaction of its own.
CREATE OR REPLACE FUNCTION harel_reap(
    p_now   DOUBLE PRECISION,
    p_slots INT)
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
    v_lo   INT := (SELECT c.last_value FROM transport_claim_reap_cursor AS c);
    v_top  INT := COALESCE((SELECT max(g.slot) FROM transport_groups AS g), -1) + 1;
    v_gone TEXT[];
BEGIN
    IF v_lo >= v_top THEN
        v_lo := 0;
        PERFORM harel_fold_counts();  -- once a lap
    END IF;
    PERFORM setval('transport_claim_reap_cursor', LEAST(v_lo + p_slots, 1048576));
    SELECT array_agg(c.group_id) INTO v_gone
      FROM (SELECT c.group_id
              FROM transport_groups AS c
             WHERE c.slot >= v_lo AND c.slot < v_lo + p_slots
               AND c.locked_by IS NULL AND NOT c.paused AND c.state IS NULL
               AND c.drained_at < p_now - 2
               AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = c.group_id OFFSET 0)
               FOR NO KEY UPDATE SKIP LOCKED) AS c
     WHERE harel_try_guard(c.group_id);
    IF v_gone IS NOT NULL THEN
        DELETE FROM transport_groups AS g
         WHERE g.group_id = ANY (v_gone)
           AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = g.group_id OFFSET 0);
    END IF;
END
$$;

-- harel_sweep is the claim (named for the sweep, which was once all of it): it
-- leases up to p_limit claimable groups (priority >= p_min_priority) to
-- p_token, due groups first, then the ready log's, then the sweep's, and
-- returns the head of each, in no particular order, with its attempt (1
-- on the first hand-out) and its age in seconds (server clock; NULL for a
-- message queued before version 10). p_caller names the function called
-- in a refusal. p_rest, a stream's exchange: no sweep while the sweeps
-- rest even when it has found nothing, and a budget ("Going round"). Its
-- walks are ordered scans of the slot index that stop at the limit, never
-- bitmap scans, which read and sort every slot of the range.
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
SET enable_mergejoin = off
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
    v_rvt     BIGINT := -1;  -- where this call reads the log on from: past (v_rvt, v_rrs)
    v_rrs     BIGINT := 0;
    v_rtids   TID[];     -- the entries it picked (locked: no other deletes them)
    v_rgroups TEXT[];    -- and their groups
    v_due     TEXT[];    -- the due groups picked
    v_charge  TEXT[];    -- the groups handed out outside the log
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
    -- slots once at most, and the loop ends with a lease or when a walk
    -- finds nothing.
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
        -- read before ("The ready log").
        v_due := v_groups;
        v_n := COALESCE(cardinality(v_groups), 0);
        IF v_n < p_limit THEN
            SELECT array_agg(r.ctid), array_agg(r.group_id),
                   COALESCE((array_agg(r.vt ORDER BY r.vt DESC, r.rseq DESC))[1], v_rvt),
                   COALESCE((array_agg(r.rseq ORDER BY r.vt DESC, r.rseq DESC))[1], v_rrs)
              INTO v_rtids, v_rgroups, v_rvt, v_rrs  -- and on past the last entry read
              FROM (SELECT r.ctid, r.rseq, r.group_id, r.vt
                      FROM transport_ready AS r
                     WHERE r.vt >= v_front AND (r.vt, r.rseq) > (v_rvt, v_rrs) AND r.priority >= p_min_priority
                     ORDER BY r.vt, r.rseq
                     LIMIT p_limit - v_n
                       FOR UPDATE SKIP LOCKED) AS r;
            IF v_rtids IS NOT NULL THEN
                -- The virtual time moves to the last entry read, by the
                -- claim that holds the frontier's lock (harel_ready_front;
                -- tried, never waited for, then held to its end), so that
                -- it only grows. One statement: each costs microseconds.
                PERFORM setval('transport_ready_vnow', v_rvt)
                  FROM transport_ready_vnow AS v
                 WHERE v_rvt > v.last_value
                   AND pg_try_advisory_xact_lock(('transport_ready'::regclass::oid::bigint & 2147483647)::int, 0);
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
                 WHERE r.ctid = ANY (v_rtids)
                   AND (r.group_id = ANY (COALESCE(v_groups, '{}'))
                        OR NOT EXISTS (SELECT 1 FROM transport_groups AS g
                                        WHERE g.group_id = r.group_id AND NOT g.paused
                                          AND (g.locked_by IS NULL OR g.lock_expiry < p_now)
                                          AND (g.drained_at IS NULL
                                               OR (SELECT m.seq FROM transport_messages AS m WHERE m.group_id = g.group_id ORDER BY m.seq DESC LIMIT 1) IS NOT NULL)));
            END IF;
        END IF;

        v_swept := NULL;
        v_pos := NULL;
        FOR v_pass IN 1..2 LOOP
            v_n := COALESCE(cardinality(v_groups), 0);
            v_filled := v_pass = 1 AND v_n >= p_limit AND v_t0 IS NULL;
            EXIT WHEN v_n >= p_limit OR v_stop;
            -- The sweep, where the due groups and the log left room, and
            -- not when "Going round" says no.
            EXIT WHEN v_pass = 1 AND v_n > 0 AND p_now * 1000 - v_wrap BETWEEN 0 AND 1000;
            EXIT WHEN v_pass = 1 AND (v_n > 0 OR p_rest)
                  AND v_rest - date_part('epoch', clock_timestamp()) * 1000 BETWEEN 0 AND 2000;
            IF v_pass = 1 THEN
                v_n0 := v_n;
                v_swept := '{}';
                IF v_t0 IS NULL THEN
                    -- The call's first sweep: its budget's start, and the
                    -- highest slot a row has (where the walk turns).
                    v_t0 := clock_timestamp();
                    v_top := COALESCE((SELECT max(c.slot) FROM transport_groups AS c), -1) + 1;
                END IF;
            END IF;
            -- 512 slots at a time where the sweep has a budget.
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

        -- The hand-outs outside the log (due groups, the sweep's) are
        -- charged to their tenants ("Shares" in 25_ready.sql).
        IF v_due IS NOT NULL OR cardinality(v_swept) > 0 THEN
            v_charge := ARRAY(SELECT u.gid FROM unnest(v_groups, v_heads) AS u(gid, s)
                               WHERE u.s IS NOT NULL AND u.gid = ANY (COALESCE(v_due, '{}') || COALESCE(v_swept, '{}')));
            IF cardinality(v_charge) > 0 THEN
                PERFORM harel_ready_charge(v_charge);
            END IF;
        END IF;

        -- Lease the groups that have a head, counting the attempt in the
        -- same write, and return them.
        v_leased := 0;
        IF v_groups IS NOT NULL THEN
            RETURN QUERY
                UPDATE transport_groups AS g
                   SET locked_by = p_token, lock_expiry = p_lease, delivered_seq = u.s,
                       attempts = CASE WHEN g.delivered_seq = u.s THEN g.attempts + 1 ELSE 1 END,
                       leased_at = p_now, drained_at = NULL, handed = g.handed + 1
                  FROM unnest(v_groups, v_heads, v_events, v_pubs) AS u(gid, s, e, p)
                 WHERE u.s IS NOT NULL AND g.group_id = ANY (ARRAY[u.gid])
                RETURNING u.gid, u.s, u.e, g.attempts, date_part('epoch', clock_timestamp() - u.p);
            GET DIAGNOSTICS v_leased = ROW_COUNT;
        END IF;

        IF v_empty IS NOT NULL THEN
            -- Group rows found empty (the message the pick saw was gone
            -- by the head's read, or a row never marked): delete those
            -- drained 2 s ago or more, or never marked, that no publisher
            -- is mid-transaction on (harel_hold_group), re-checked after
            -- the try-lock; free and mark the rest ("Kept rows"). A
            -- stream's exchange, whose commit may be slow under a held
            -- snapshot while the deleted rows' publishers wait, leaves
            -- them to the reap, but for a row with a state, which no reap
            -- takes.
            v_skip := v_skip || v_empty;
            SELECT array_agg(e) INTO v_gone
              FROM unnest(v_empty) AS e
             WHERE CASE WHEN EXISTS (SELECT 1 FROM transport_groups AS g
                                      WHERE g.group_id = e AND (g.drained_at >= p_now - 2 OR (p_rest AND g.state IS NULL)))
                        THEN false  -- kept: found empty, not deleted (a stream's exchange deletes only a row with a state)
                        ELSE harel_try_guard(e) END;  -- a CASE, so that the lock is not taken for a kept row
            IF v_gone IS NOT NULL THEN  -- a delete that deletes nothing would still run its statement trigger
                WITH deleted AS (
                    DELETE FROM transport_groups AS g
                     WHERE g.group_id = ANY (v_gone)
                       AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = g.group_id OFFSET 0)
                    RETURNING g.group_id
                )
                SELECT array_agg(d.group_id) INTO v_gone FROM deleted AS d;
            END IF;
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
        -- A stream's exchange stops after 256 rows picked and not leased,
        -- returning what it has (each stays locked, its publishers
        -- waiting, until the claim commits; the next exchange passes
        -- them); other claims go on, to lease something when anything is
        -- claimable.
        EXIT WHEN v_leased > 0 OR (v_empty IS NULL AND v_stopped IS NULL)
               OR (p_rest AND cardinality(v_skip) >= 256);
    END LOOP;
    -- The reap (harel_reap): not in a stream's exchange that leased
    -- nothing; its stream reaps when it goes idle (harel_wait).
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
SET enable_bitmapscan = off
SET enable_mergejoin = off
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
SET enable_bitmapscan = off
SET enable_mergejoin = off
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
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$ BEGIN RETURN QUERY SELECT * FROM harel_sweep(p_now, p_lease, p_token, p_min_priority, p_limit, 'harel_claim_many'); END $$;

-- harel_claim_many is harel_claim_leases without the attempt and age
-- columns.
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
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$ BEGIN RETURN QUERY SELECT c.group_id, c.seq, c.event FROM harel_sweep(p_now, p_lease, p_token, p_min_priority, p_limit, 'harel_claim_many') AS c; END $$;
