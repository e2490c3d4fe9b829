-- 30_claim.sql: the claim (harel_claim, harel_claim_many and what they
-- share: the floors, the hand-out count, dead-lettering a spent head).
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
-- A failed message's retry: harel_fail parks its group for the backoff
-- under no token (locked_by ''). A claim serves such groups whose backoff
-- has ended before the round-robin (the index transport_groups_retry), so
-- the retry comes when the backoff ends rather than after a whole round of
-- the other groups: a poison message holds its group for about its
-- attempts times the backoff, however deep the backlog. A nack's park (the
-- caller's delay, under the caller's token) keeps its place in the
-- round-robin, as before.
--
-- The order inside a claim: lock the group rows (FOR NO KEY UPDATE SKIP
-- LOCKED), read their heads in a statement of its own (a snapshot taken
-- after the locks, so never a head an earlier holder has just acked), then
-- lease them by primary key with the head and the count in the same
-- write. An empty group row is never leased: it is deleted (the
-- lost-publish guard's try-lock, then a re-check) or freed.
--
-- The floor (version 12). A claim or a free rewrites its group row with a
-- new lock_expiry, so an index ordered by it gains an entry per hand-out
-- and per free, and the entries of versions that are gone sit where a
-- claim walks: before the live ones. Vacuum removes them, and a walk marks
-- those it passes so the next skips them, but neither can while some
-- other session holds a snapshot older than them (an hour-long report, a
-- transaction left open). With one round-robin index over every row, a
-- claim then walked every entry written since that snapshot began: a
-- minute into the async benchmark's load, a claim of 64 groups read 24,000
-- to 81,000 buffers and took 120-360 ms; acked leases' entries (at their
-- lease's end) joined the free rows' range once that end passed; and in a
-- queue whose groups come and go, every group row ever created left an
-- entry among the never-served rows. So:
--   - free rows (no holder) and held rows (a lease, or a nack's park,
--     under a token) have an index each (transport_groups_free,
--     transport_groups_held, both partial; the held rows' predicate is
--     locked_by > '', which the fences' locked_by <> '' does not imply, so
--     a fence never walks that index instead of the primary key: with a
--     table's statistics from when nothing was held, a plan took the
--     index for empty and walked all of it); failed and stopped rows
--     (holder '') keep transport_groups_retry. A claim or an ack still
--     writes one entry in one of them, as it wrote one in the single index.
--   - a claim starts each walk at a floor: the free rows' floor is the key
--     of the first free row a claim found (rows before it were all taken:
--     claims take the oldest first); the held rows' floor is where the
--     last walk of ended leases stopped (now, when it found them all).
--     Sequences hold them (transport_claim_floor, transport_claim_held,
--     in epoch milliseconds): a sequence is one value written in place,
--     while a row written this often would itself grow a chain of versions
--     under that snapshot.
-- The walk, for one lease or a batch, after the failed heads whose backoff
-- has ended (see "Claim" above):
--   1. free rows never served (and given back, restarted, nacked with no
--      delay): key 0 (NULL sorts as 0), as the design orders them, and
--      among them by arrival (transport_groups.arrival, numbered by its
--      default; until version 12, by group_id), from the never-served
--      rows' floor (transport_claim_new: the first arrival a claim found;
--      written when it has moved on by 256 or more). A row that goes back
--      to key 0 (a give-back, a nack with no delay, a restart) gets the
--      floor as its arrival: first in line again, before every group that
--      arrived since (ties by group_id);
--   2. free rows from the floor up and held rows whose lease or park has
--      ended from the held floor, merged by key (lock_expiry: when a free
--      row was freed, when a lease or park ended), served longest ago
--      first, as the one index ordered them. A held row the merge does not
--      take stays locked until the claim's transaction ends, then is
--      claimable again; the free walk stops at the held walk's last key
--      when that walk filled the batch;
--   3. only if 1 and 2 found nothing: both walks from the front, so that
--      a claim never comes back empty while anything is claimable.
-- Key order is not the order rows become claimable: a free row's key is
-- its ack's now, but it is seen at the ack's commit (a stream frees rows
-- and then claims in one transaction; AckTx frees at the caller's
-- commit); an arrival is numbered at insert, seen at the publish's commit;
-- a row another claim locked and did not take is skipped (SKIP LOCKED).
-- So each floor is kept a margin behind what a claim found: 0.5 s for free
-- and held rows (and never past now less 0.5 s), 4,096 arrivals for
-- never-served ones. A row still left below a floor (a transaction that
-- committed later than that, or rolled back after locking it; a client
-- clock far behind the others') waits for 3, or for a walk from the front,
-- which one claim that admits every priority does every 30 s
-- (transport_claim_sweep: when the last one began), resetting the floors
-- to what it found; a resume moves a paused group up to its floor. Only
-- claims that admit every priority move a floor (one with a priority
-- floor sees some rows only), and only forward by 50 ms (256 arrivals) or
-- more, so each is written about 20 times a second at most. A floor set
-- too low costs a longer walk; too high, a row below it waits as above. They are read and written inline
-- in harel_claim_one and harel_claim_leases: a helper function would pin
-- its settings and cost every claim more nested calls.

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
           SET locked_by = '', lock_expiry = 'Infinity'
         WHERE g.group_id = ANY (v_groups);
        RETURN QUERY SELECT u.gid, true FROM unnest(v_groups) AS u(gid);
    ELSE
        RETURN QUERY SELECT b, false FROM harel_bury(v_groups, v_heads, NULL) AS b;
    END IF;
END
$$;

-- harel_claim_one leases the claimable group that was served longest ago
-- (never served first) and returns its head with its attempt (1 on the
-- first hand-out) and its age in seconds (server clock; NULL for a message
-- queued before version 10): zero rows when nothing at or above
-- p_min_priority is claimable. harel_claim is this without the last two
-- columns.
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
AS $$
#variable_conflict use_column
DECLARE
    v_group   TEXT;
    v_dseq    BIGINT;  -- what the group's last claim handed out
    v_att     INT;     -- and how many times
    v_seq     BIGINT;
    v_event   TEXT;
    v_pub     TIMESTAMPTZ;
    v_stopped BOOLEAN;
    v_held    TEXT[] := '{}';  -- empty groups a publisher still holds: skip this call
    v_from    DOUBLE PRECISION;  -- the free rows' floor, or 0 (see "The floor" above)
    v_hfrom   DOUBLE PRECISION;  -- the held rows' floor, or 0
    v_afrom   BIGINT;            -- the never-served rows' floor (an arrival), or 0
    v_recent  BOOLEAN;           -- a walk from the front began less than 30 s ago
    v_key     DOUBLE PRECISION;  -- the key of the free row found
    v_arr     BIGINT;            -- the arrival of the never-served row found
    v_hgroup  TEXT;              -- the held row found, its ...
    v_hdseq   BIGINT;
    v_hatt    INT;
    v_hkey    DOUBLE PRECISION;  -- ... and its key
BEGIN
    -- The entry checks (15_checks.sql).
    IF p_token IS NULL OR p_token = '' THEN
        PERFORM harel_refuse_token('harel_claim');
    END IF;
    IF p_lease IS NULL OR p_lease <= p_now THEN
        PERFORM harel_refuse_lease('harel_claim', p_lease, p_now);
    END IF;
    IF harel_clock_skewed(p_now) THEN
        PERFORM harel_refuse_skew('harel_claim', p_now);
    END IF;
    -- Where the walks start (see "The floor" above): the never-served,
    -- free and held rows' floors, or all 0 when a walk from the front is due.
    SELECT n.last_value, f.last_value / 1000.0, h.last_value / 1000.0, p_now * 1000 - s.last_value BETWEEN 0 AND 30000
      INTO v_afrom, v_from, v_hfrom, v_recent
      FROM transport_claim_new AS n, transport_claim_floor AS f, transport_claim_held AS h, transport_claim_sweep AS s;
    IF NOT v_recent AND p_min_priority <= 0 THEN
        PERFORM setval('transport_claim_sweep', GREATEST(floor(p_now * 1000), 0)::BIGINT);
        v_afrom := 0;
        v_from := 0;
        v_hfrom := 0;
    END IF;
    LOOP
        -- FOR NO KEY UPDATE: the key never changes, and no stronger lock is
        -- needed (the lost-publish guard, 10_guard.sql, takes no row lock).
        -- A failed head whose backoff has ended first (see "Claim" above),
        -- then the round-robin.
        v_group := NULL;
        SELECT c.group_id, c.delivered_seq, c.attempts INTO v_group, v_dseq, v_att
          FROM transport_groups AS c
         WHERE c.locked_by = '' AND c.lock_expiry < p_now
           AND c.priority >= p_min_priority AND NOT c.paused
         ORDER BY c.lock_expiry
         LIMIT 1
           FOR NO KEY UPDATE SKIP LOCKED;
        -- Then the round-robin (see "The floor" above): 1, never served,
        -- from their floor; 2, free rows from the floor and held rows
        -- whose lease or park has ended from the held floor, the lower key
        -- first; 3, only if nothing was found, 2 from the front.
        FOR v_pass IN 1..3 LOOP
            EXIT WHEN v_group IS NOT NULL OR (v_pass = 3 AND v_afrom = 0 AND v_from = 0 AND v_hfrom = 0);
            IF v_pass = 1 THEN
                CONTINUE WHEN v_from = 0 AND v_hfrom = 0;  -- a walk from the front: 2 covers never-served rows too
                SELECT c.group_id, c.delivered_seq, c.attempts, COALESCE(c.arrival, 0) INTO v_group, v_dseq, v_att, v_arr
                  FROM transport_groups AS c
                 WHERE c.locked_by IS NULL AND COALESCE(c.lock_expiry, 0) = 0 AND COALESCE(c.arrival, 0) >= v_afrom
                   AND c.priority >= p_min_priority AND NOT c.paused
                   AND c.group_id <> ALL (v_held)
                 ORDER BY COALESCE(c.lock_expiry, 0), COALESCE(c.arrival, 0), c.group_id
                 LIMIT 1
                   FOR NO KEY UPDATE SKIP LOCKED;
                IF p_min_priority <= 0 AND v_arr - 4096 >= v_afrom + 256 THEN
                    PERFORM setval('transport_claim_new', v_arr - 4096);
                END IF;
                CONTINUE;
            END IF;
            SELECT c.group_id, c.delivered_seq, c.attempts, c.lock_expiry INTO v_hgroup, v_hdseq, v_hatt, v_hkey
              FROM transport_groups AS c
             WHERE c.locked_by > '' AND c.lock_expiry >= CASE WHEN v_pass = 2 THEN v_hfrom ELSE 0 END
               AND c.lock_expiry < p_now
               AND c.priority >= p_min_priority AND NOT c.paused
               AND c.group_id <> ALL (v_held)
             ORDER BY c.lock_expiry, c.group_id
             LIMIT 1
               FOR NO KEY UPDATE SKIP LOCKED;
            -- The held floor: where this walk stopped, or now if it found
            -- none, a margin behind (see "The floor" above).
            IF p_min_priority <= 0 AND LEAST(COALESCE(v_hkey, p_now), p_now - 0.5) >= v_hfrom + 0.05 THEN
                PERFORM setval('transport_claim_held', floor(LEAST(COALESCE(v_hkey, p_now), p_now - 0.5) * 1000)::BIGINT);
            END IF;
            -- A free row wins if its key is not above the held row's.
            SELECT c.group_id, c.delivered_seq, c.attempts, COALESCE(c.lock_expiry, 0), COALESCE(c.arrival, 0)
              INTO v_group, v_dseq, v_att, v_key, v_arr
              FROM transport_groups AS c
             WHERE c.locked_by IS NULL
               AND COALESCE(c.lock_expiry, 0) BETWEEN CASE WHEN v_pass = 2 THEN v_from ELSE 0 END AND COALESCE(v_hkey, 'Infinity')
               AND c.priority >= p_min_priority AND NOT c.paused
               AND c.group_id <> ALL (v_held)
             ORDER BY COALESCE(c.lock_expiry, 0), COALESCE(c.arrival, 0), c.group_id
             LIMIT 1
               FOR NO KEY UPDATE SKIP LOCKED;
            IF v_group IS NULL THEN
                v_group := v_hgroup; v_dseq := v_hdseq; v_att := v_hatt;
            ELSIF p_min_priority > 0 OR v_pass = 3 THEN
                NULL;  -- floors move only on what every priority sees, from the floors
            ELSIF v_key > 0 AND (v_key - 0.5 >= v_from + 0.05 OR v_from = 0) THEN
                -- The free rows' floor, a margin behind (a walk from the
                -- front may lower it to a row that was left below).
                PERFORM setval('transport_claim_floor', floor(GREATEST(v_key - 0.5, 0) * 1000)::BIGINT);
            ELSIF v_key = 0 AND v_from = 0 THEN
                PERFORM setval('transport_claim_new', GREATEST(v_arr - 4096, 0));
            END IF;
        END LOOP;
        IF v_group IS NULL THEN
            RETURN;
        END IF;

        v_seq := NULL;
        SELECT m.seq, m.event, m.published_at INTO v_seq, v_event, v_pub
          FROM transport_messages AS m
         WHERE m.group_id = v_group
         ORDER BY m.seq
         LIMIT 1;

        IF v_seq = v_dseq AND EXISTS (SELECT 1 FROM transport_policy AS p
                                       WHERE p.id AND p.max_attempts > 0 AND v_att >= p.max_attempts) THEN
            -- Handed out before, as many times as the policy allows.
            v_stopped := NULL;
            SELECT s.stopped INTO v_stopped FROM harel_spend(ARRAY[v_group], ARRAY[v_seq]) AS s;
            IF v_stopped THEN
                CONTINUE;
            ELSIF v_stopped IS NOT NULL THEN  -- dead-lettered: the next one
                v_seq := NULL;
                SELECT m.seq, m.event, m.published_at INTO v_seq, v_event, v_pub
                  FROM transport_messages AS m
                 WHERE m.group_id = v_group
                 ORDER BY m.seq
                 LIMIT 1;
            END IF;
        END IF;

        IF v_seq IS NULL THEN
            -- An empty group row. Delete it only if no publisher is mid-
            -- transaction on it: a publisher holds the group's lock (shared;
            -- see harel_hold_group) from its message insert until it commits,
            -- and its message is invisible to us until then.
            IF NOT harel_try_guard(v_group) THEN
                UPDATE transport_groups AS g
                   SET locked_by = NULL, lock_expiry = p_now
                 WHERE g.group_id = v_group;
                v_held := v_held || v_group;
                CONTINUE;
            END IF;
            SELECT m.seq, m.event, m.published_at INTO v_seq, v_event, v_pub
              FROM transport_messages AS m
             WHERE m.group_id = v_group
             ORDER BY m.seq
             LIMIT 1;
            IF v_seq IS NULL THEN
                DELETE FROM transport_groups AS g WHERE g.group_id = v_group;
                CONTINUE;
            END IF;
            -- a publisher committed meanwhile: lease its message
        END IF;

        attempt := CASE WHEN v_seq = v_dseq THEN v_att + 1 ELSE 1 END;
        UPDATE transport_groups AS g
           SET locked_by = p_token, lock_expiry = p_lease, delivered_seq = v_seq, attempts = attempt,
               leased_at = p_now
         WHERE g.group_id = v_group;
        group_id := v_group; seq := v_seq; event := v_event;
        age := date_part('epoch', clock_timestamp() - v_pub);
        RETURN NEXT;
        RETURN;
    END LOOP;
END
$$;

-- harel_claim is the design's claim: harel_claim_one's lease, its result
-- as the design gives it.
CREATE OR REPLACE FUNCTION harel_claim(
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT DEFAULT 0)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT)
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT c.group_id, c.seq, c.event FROM harel_claim_one(p_now, p_lease, p_token, p_min_priority) AS c $$;

-- harel_claim_leases leases up to p_limit claimable groups (priority >=
-- p_min_priority, served longest ago first) to one token and returns the
-- head of each (in no particular order) with its attempt and age as
-- harel_claim_one does. Every lease is fenced on its own group row, so one token for the
-- batch is enough: an ack names the group and the token. It may return
-- fewer than p_limit rows while more groups are claimable: the empty group
-- rows it picked are deleted or freed, not replaced.
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
    v_from    DOUBLE PRECISION;  -- the free rows' floor, or 0 (see "The floor" above)
    v_hfrom   DOUBLE PRECISION;  -- the held rows' floor, or 0
    v_afrom   BIGINT;            -- the never-served rows' floor (an arrival), or 0
    v_recent  BOOLEAN;           -- a walk from the front began less than 30 s ago
    v_n       INT;               -- groups picked so far
    v_arr     BIGINT;            -- the lowest arrival of the never-served rows found
    v_hgroups TEXT[];            -- the held rows found, in key order, their ...
    v_hdseqs  BIGINT[];
    v_hatts   INT[];
    v_hkeys   DOUBLE PRECISION[];  -- ... keys,
    v_found   INT;               -- and how many
    v_hkey    DOUBLE PRECISION;  -- the held floor to be
    v_fgroups TEXT[];            -- the free rows found, their ...
    v_fdseqs  BIGINT[];
    v_fatts   INT[];
    v_fkeys   DOUBLE PRECISION[];  -- ... keys,
    v_key     DOUBLE PRECISION;  -- and the lowest above 0
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;
    -- The entry checks (15_checks.sql).
    IF p_token IS NULL OR p_token = '' THEN
        PERFORM harel_refuse_token('harel_claim_many');
    END IF;
    IF p_lease IS NULL OR p_lease <= p_now THEN
        PERFORM harel_refuse_lease('harel_claim_many', p_lease, p_now);
    END IF;
    IF harel_clock_skewed(p_now) THEN
        PERFORM harel_refuse_skew('harel_claim_many', p_now);
    END IF;
    -- Where the walks start (see "The floor" above): the never-served,
    -- free and held rows' floors, or all 0 when a walk from the front is due.
    SELECT n.last_value, f.last_value / 1000.0, h.last_value / 1000.0, p_now * 1000 - s.last_value BETWEEN 0 AND 30000
      INTO v_afrom, v_from, v_hfrom, v_recent
      FROM transport_claim_new AS n, transport_claim_floor AS f, transport_claim_held AS h, transport_claim_sweep AS s;
    IF NOT v_recent AND p_min_priority <= 0 THEN
        PERFORM setval('transport_claim_sweep', GREATEST(floor(p_now * 1000), 0)::BIGINT);
        v_afrom := 0;
        v_from := 0;
        v_hfrom := 0;
    END IF;
    -- Pick and lock: failed heads whose backoff has ended first (see
    -- "Claim" above), then the round-robin for the rest; every later
    -- statement reaches rows by primary key (= ANY of an array, or a join
    -- on unnest), whatever the plan guesses about the array's size.
    SELECT array_agg(c.group_id), array_agg(c.delivered_seq), array_agg(c.attempts) INTO v_groups, v_dseqs, v_atts
      FROM (SELECT c.group_id, c.delivered_seq, c.attempts
              FROM transport_groups AS c
             WHERE c.locked_by = '' AND c.lock_expiry < p_now
               AND c.priority >= p_min_priority AND NOT c.paused
             ORDER BY c.lock_expiry
             LIMIT p_limit
               FOR NO KEY UPDATE SKIP LOCKED) AS c;
    -- Then harel_claim_one's round-robin (see "The floor" above): never
    -- served, from their floor; free rows from the floor and held rows
    -- whose lease or park has ended from the held floor, merged by key;
    -- only if nothing was found, the latter from the front.
    FOR v_pass IN 1..3 LOOP
        v_n := COALESCE(cardinality(v_groups), 0);
        EXIT WHEN v_n >= p_limit OR (v_pass = 3 AND (v_n > 0 OR (v_afrom = 0 AND v_from = 0 AND v_hfrom = 0)));
        IF v_pass = 1 THEN
            CONTINUE WHEN v_from = 0 AND v_hfrom = 0;  -- a walk from the front: 2 covers never-served rows too
            SELECT COALESCE(v_groups, '{}') || array_agg(c.group_id), COALESCE(v_dseqs, '{}') || array_agg(c.delivered_seq),
                   COALESCE(v_atts, '{}') || array_agg(c.attempts), min(c.a)
              INTO v_groups, v_dseqs, v_atts, v_arr
              FROM (SELECT c.group_id, c.delivered_seq, c.attempts, COALESCE(c.arrival, 0) AS a
                      FROM transport_groups AS c
                     WHERE c.locked_by IS NULL AND COALESCE(c.lock_expiry, 0) = 0 AND COALESCE(c.arrival, 0) >= v_afrom
                       AND c.priority >= p_min_priority AND NOT c.paused
                       AND (v_groups IS NULL OR c.group_id <> ALL (v_groups))
                     ORDER BY COALESCE(c.lock_expiry, 0), COALESCE(c.arrival, 0), c.group_id
                     LIMIT p_limit - v_n
                       FOR NO KEY UPDATE SKIP LOCKED) AS c;
            IF p_min_priority <= 0 AND v_arr - 4096 >= v_afrom + 256 THEN
                PERFORM setval('transport_claim_new', v_arr - 4096);
            END IF;
            CONTINUE;
        END IF;
        SELECT array_agg(c.group_id ORDER BY c.lock_expiry, c.group_id), array_agg(c.delivered_seq ORDER BY c.lock_expiry, c.group_id),
               array_agg(c.attempts ORDER BY c.lock_expiry, c.group_id), array_agg(c.lock_expiry ORDER BY c.lock_expiry, c.group_id), count(*)
          INTO v_hgroups, v_hdseqs, v_hatts, v_hkeys, v_found
          FROM (SELECT c.group_id, c.delivered_seq, c.attempts, c.lock_expiry
                  FROM transport_groups AS c
                 WHERE c.locked_by > '' AND c.lock_expiry >= CASE WHEN v_pass = 2 THEN v_hfrom ELSE 0 END
                   AND c.lock_expiry < p_now
                   AND c.priority >= p_min_priority AND NOT c.paused
                   AND (v_groups IS NULL OR c.group_id <> ALL (v_groups))
                 ORDER BY c.lock_expiry, c.group_id
                 LIMIT p_limit - v_n
                   FOR NO KEY UPDATE SKIP LOCKED) AS c;
        -- Free rows, up to the last held row's key when the held walk
        -- filled the batch (one with a higher key would lose to it).
        SELECT array_agg(c.group_id), array_agg(c.delivered_seq), array_agg(c.attempts), array_agg(c.k),
               min(c.k) FILTER (WHERE c.k > 0), min(c.a) FILTER (WHERE c.k = 0)
          INTO v_fgroups, v_fdseqs, v_fatts, v_fkeys, v_key, v_arr
          FROM (SELECT c.group_id, c.delivered_seq, c.attempts, COALESCE(c.lock_expiry, 0) AS k, COALESCE(c.arrival, 0) AS a
                  FROM transport_groups AS c
                 WHERE c.locked_by IS NULL
                   AND COALESCE(c.lock_expiry, 0) BETWEEN CASE WHEN v_pass = 2 THEN v_from ELSE 0 END
                                                      AND CASE WHEN v_found < p_limit - v_n THEN 'Infinity' ELSE v_hkeys[v_found] END
                   AND c.priority >= p_min_priority AND NOT c.paused
                   AND (v_groups IS NULL OR c.group_id <> ALL (v_groups))
                 ORDER BY COALESCE(c.lock_expiry, 0), COALESCE(c.arrival, 0), c.group_id
                 LIMIT p_limit - v_n
                   FOR NO KEY UPDATE SKIP LOCKED) AS c;
        -- The lowest keys of both (a free row first on a tie); rows not
        -- taken stay locked until this transaction ends, then claimable.
        SELECT COALESCE(v_groups, '{}') || array_agg(u.g), COALESCE(v_dseqs, '{}') || array_agg(u.d),
               COALESCE(v_atts, '{}') || array_agg(u.a)
          INTO v_groups, v_dseqs, v_atts
          FROM (SELECT x.g, x.d, x.a
                  FROM (SELECT h.g, h.d, h.a, h.k, 1 AS src FROM unnest(v_hgroups, v_hdseqs, v_hatts, v_hkeys) AS h(g, d, a, k)
                        UNION ALL
                        SELECT f.g, f.d, f.a, f.k, 0 FROM unnest(v_fgroups, v_fdseqs, v_fatts, v_fkeys) AS f(g, d, a, k)) AS x
                 ORDER BY x.k, x.src, x.g
                 LIMIT p_limit - v_n) AS u;
        IF p_min_priority <= 0 AND v_pass = 2 THEN
            -- The floors, a margin behind (see "The floor" above). Held:
            -- the lowest held row found and not taken, else now if the walk
            -- found every such row, else where it stopped. Free: the lowest
            -- key found (a walk from the front may lower it, or the
            -- never-served rows' floor, to a row that was left below).
            SELECT LEAST(COALESCE(min(h.k), CASE WHEN v_found < p_limit - v_n THEN p_now ELSE v_hkeys[v_found] END), p_now - 0.5)
              INTO v_hkey
              FROM unnest(v_hgroups, v_hkeys) AS h(g, k)
             WHERE h.g <> ALL (v_groups);
            IF v_hkey >= v_hfrom + 0.05 THEN
                PERFORM setval('transport_claim_held', floor(v_hkey * 1000)::BIGINT);
            END IF;
            IF v_key - 0.5 >= v_from + 0.05 OR (v_from = 0 AND v_key > 0) THEN
                PERFORM setval('transport_claim_floor', floor(GREATEST(v_key - 0.5, 0) * 1000)::BIGINT);
            END IF;
            IF v_from = 0 AND v_arr IS NOT NULL THEN
                PERFORM setval('transport_claim_new', GREATEST(v_arr - 4096, 0));
            END IF;
        END IF;
    END LOOP;
    IF cardinality(v_groups) IS NULL OR cardinality(v_groups) = 0 THEN
        RETURN;
    END IF;

    -- The heads, in a statement after the locks (every array aggregated
    -- from one row stream, so they stay aligned). A second pass only when
    -- some head was handed out before as many times as the policy allows,
    -- and harel_spend dead-lettered it or stopped its group.
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
        -- A redelivery (a lapsed lease, a nack, a fail's backoff ended):
        -- any head at the limit?
        SELECT COALESCE(bool_or(u.s = u.d AND u.a >= p.max_attempts), false) INTO v_again
          FROM unnest(v_heads, v_dseqs, v_atts) AS u(s, d, a), transport_policy AS p
         WHERE p.id AND p.max_attempts > 0;
        EXIT WHEN NOT v_again;
        SELECT array_agg(s.group_id) FILTER (WHERE s.stopped)
          INTO v_stopped
          FROM harel_spend(v_groups, v_heads) AS s;
        IF v_stopped IS NOT NULL THEN
            SELECT array_agg(u.gid), array_agg(u.d), array_agg(u.a) INTO v_groups, v_dseqs, v_atts
              FROM unnest(v_groups, v_dseqs, v_atts) AS u(gid, d, a)
             WHERE u.gid <> ALL (v_stopped);
            IF v_groups IS NULL THEN
                RETURN;
            END IF;
        END IF;
    END LOOP;

    -- Lease the groups that have a head, counting the attempt in the same
    -- write, and return them.
    RETURN QUERY
        UPDATE transport_groups AS g
           SET locked_by = p_token, lock_expiry = p_lease, delivered_seq = u.s,
               attempts = CASE WHEN g.delivered_seq = u.s THEN g.attempts + 1 ELSE 1 END,
               leased_at = p_now
          FROM unnest(v_groups, v_heads, v_events, v_pubs) AS u(gid, s, e, p)
         WHERE u.s IS NOT NULL AND g.group_id = u.gid
        RETURNING u.gid, u.s, u.e, g.attempts, date_part('epoch', clock_timestamp() - u.p);

    IF v_empty IS NULL THEN
        RETURN;
    END IF;
    -- Empty group rows: the same guard as harel_claim_one. Delete those no
    -- publisher is mid-transaction on (the try-lock), re-checked in a
    -- statement after the lock; free the rest.
    SELECT array_agg(e) INTO v_gone
      FROM unnest(v_empty) AS e
     WHERE harel_try_guard(e);
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

-- harel_claim_many is harel_claim_leases without the attempt and age
-- columns (its result since version 4).
CREATE OR REPLACE FUNCTION harel_claim_many(
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT,
    p_limit        INT)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT)
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT c.group_id, c.seq, c.event FROM harel_claim_leases(p_now, p_lease, p_token, p_min_priority, p_limit) AS c $$;
