-- functions.sql: the live definition of every function and trigger, each
-- once, as it runs.
--
-- Why one file beside the numbered ones: the numbered files (NNN_*.sql) are
-- forward-only upgrade steps and hold only what must run once in a
-- database's life (tables, columns, indexes, storage settings). Until
-- version 8 they defined the functions too, later steps redefining earlier
-- ones, so the code that ran had to be pieced together from several files.
-- This file is instead re-applied whole, after the missing numbered steps
-- and in the same transaction, whenever a database's recorded version is
-- below the library's: what you read here is what runs. Everything is
-- CREATE OR REPLACE (a trigger: DROP TRIGGER IF EXISTS, then CREATE
-- TRIGGER), so it is idempotent. A change here ships with a new numbered
-- step (a comment-only one will do) and a new testdata/schema/vN.sql, so
-- that databases at the previous version pick it up; the schema tests prove
-- that a database upgraded from every shipped version ends with exactly the
-- catalog of a fresh install.
--
-- The harel_ prefix is the protocol's name, as the design names its two
-- server-side functions (harel_claim, harel_ack). Clients in other languages
-- call these functions by those names, so every function here carries the
-- prefix, and the names, arguments and results of the design's functions
-- never change.
--
-- Settings, the invariant. Every function that reads or writes the queue's
-- tables (transport_messages, transport_groups, transport_waiters), every
-- trigger function and every function a client calls pins these four
-- settings in its own definition (SET clauses here, never a later ALTER
-- FUNCTION). Today that is every function but the inlined helpers and one
-- exception, harel_hold_group (see there).
--   search_path FROM CURRENT: Apply runs this file with search_path set to
--     the target schema followed by pg_temp, so nothing planted on a
--     caller's search_path (a look-alike table, a temporary one) can stand
--     in for these tables.
--   plan_cache_mode = force_generic_plan: each statement is planned once
--     per connection, not again for each call's arguments.
--   enable_seqscan = off: those generic plans are made from the statistics
--     of that moment, and a queue's tables are often never analyzed while
--     they grow from empty (autovacuum off, or not yet run): planned as
--     tiny, "WHERE group_id = ANY (array)" became a sequential scan testing
--     every row against every element. Leasing 1,000 groups out of 20,000
--     took 200 ms (auto_explain, BenchmarkAckMany freed/batch=1000). Every
--     statement here is meant to reach its rows by an index (the primary
--     keys, the round-robin indexes, the group index); with sequential scans
--     off for the function's duration the planner stays on those paths.
--   jit = off: a plan priced with a disabled scan in it (the waiters check
--     of the wake-up trigger has no other way) costs more than
--     jit_above_cost, and compiling it took 85 ms a publish. The wake-up
--     trigger pins it too: it also fires for the design's plain two-INSERT
--     publish, which runs under the client's settings.
-- The inlined helpers pin none and are LANGUAGE sql, one expression each:
-- the planner then inlines them into the calling statement, where they run
-- under their caller's settings at no per-call cost; a SET clause, or any
-- other language, would stop that and cost microseconds per row inside
-- batches of hundreds. TestPinnedSettings checks these rules from the
-- catalog; TestGuardInlined checks that the helpers are inlined.
--
-- History, for the version numbers: the design's harel_claim and harel_ack
-- came with version 1 (they keep its names, arguments and results; see
-- harel_ack for its one changed result), publish, nack and extend with 2,
-- the wake-ups with 3, the batch functions with 4, the one-write ack with
-- 6, the pinned plan settings with 7, this file and the guard helpers
-- with 8, the entry checks (see there) with 9, delivery attempts, fail,
-- dead letters and keyed publish (see "Claim", "Fail" and "Idempotent
-- publish") with 10, the operator's stats, listings, pause, resume and
-- purge (see "Operations") with 11, the per-group state and its ack
-- (see "Exactly-once: per-group state") with 12, the partitions' calls
-- (see "Partitions") with 13, growing a cluster (see "Growing") with 14.


-- The lost-publish guard. A publish that lands in a group while an ack
-- drains it must not end with its message and no group row: the ack cannot
-- see the uncommitted message. So every message insert first takes a
-- shared transaction-scoped advisory lock on its group's bucket
-- (harel_share_guard, from the trigger below), and a drainer deletes a
-- group row only when it gets that lock exclusively without waiting
-- (harel_try_guard); otherwise it frees the row. The key is (the messages
-- table's oid, group hash mod 1024): one lock space per schema, and a batch
-- holds at most 1024 locks. Drainers never wait, so no deadlock is possible.
-- Advisory locks, not row locks: a row lock upgraded from FOR NO KEY UPDATE
-- to FOR UPDATE can be granted alongside a concurrent FOR KEY SHARE (seen on
-- PostgreSQL 15), which lets exactly this race through.
--
-- The key's values never change: a drainer still running the previous
-- version's functions during an upgrade and a publisher running these must
-- meet on the same lock. The 'transport_messages'::regclass literal is
-- resolved when the calling statement is planned, with the caller's pinned
-- search_path: the table in the caller's schema (the same oid as the
-- trigger's TG_RELID, which earlier versions used).

-- harel_group_lock_key is a group's advisory-lock bucket: the key's second
-- part.
CREATE OR REPLACE FUNCTION harel_group_lock_key(p_group TEXT)
RETURNS INT
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT hashtext(p_group) & 1023 $$;

-- harel_guard_class is the key's first part: the messages table's oid,
-- folded into a positive int.
CREATE OR REPLACE FUNCTION harel_guard_class()
RETURNS INT
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT ('transport_messages'::regclass::oid::bigint & 2147483647)::int $$;

-- harel_try_guard is a drainer's side: p_group's bucket, exclusively, if no
-- publisher holds it; never waits.
CREATE OR REPLACE FUNCTION harel_try_guard(p_group TEXT)
RETURNS BOOLEAN
LANGUAGE sql
AS $$ SELECT pg_try_advisory_xact_lock(harel_guard_class(), harel_group_lock_key(p_group)) $$;

-- harel_share_guard is a publisher's side: p_group's bucket, shared, until
-- the transaction ends; waits for a drainer that holds it.
CREATE OR REPLACE FUNCTION harel_share_guard(p_group TEXT)
RETURNS VOID
LANGUAGE sql
AS $$ SELECT pg_advisory_xact_lock_shared(harel_guard_class(), harel_group_lock_key(p_group)) $$;

-- A row trigger, BEFORE the insert: it also guards the design's plain
-- two-statement publish from other languages. Taken before the row exists,
-- so a drainer that holds the bucket delays the insert itself. (pgbench, 16
-- clients publishing: this trigger costs about 4% of throughput; a
-- statement trigger with a transition table cost 21%.)
--
-- The one exception to the settings invariant: it pins search_path only.
-- It runs once per message inserted, and every SET clause is paid on every
-- call (three more cost about 1 ms per 1,000-message harel_publish_many,
-- some 6% of it), while they could change nothing here: its one statement
-- reads no table (nothing to scan) and is a plain expression that
-- PL/pgSQL evaluates without the executor (nothing to compile). Give it a
-- query on a table and it must pin all four; TestPinnedSettings checks that
-- its body names no queue table.
CREATE OR REPLACE FUNCTION harel_hold_group()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM harel_share_guard(NEW.group_id);
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS transport_messages_hold_group ON transport_messages;
CREATE TRIGGER transport_messages_hold_group
    BEFORE INSERT ON transport_messages
    FOR EACH ROW EXECUTE FUNCTION harel_hold_group();


-- Entry checks (version 9). Each function refuses, with an error of
-- SQLSTATE class PT, arguments that would break a guarantee, before it
-- changes a row; the calls the design describes, with sane arguments,
-- behave as before. Each check is an expression on the arguments and the
-- server's clock, with no table access of its own.
--   PT001 not the message handed out (version 10): harel_ack of a seq
--     other than the one the claim handed to the lease (the group row's
--     delivered_seq) under a valid token. Until version 10 the server did
--     not record what a claim handed out; the batch calls answer such an
--     entry held = false.
--   PT002 invalid token: a claim with a NULL or empty p_token (a lease no
--     ack could fence, or none at all).
--   PT003 invalid lease end: p_lease NULL or not after p_now (a claim, an
--     ack that keeps its group); an extend to a NULL end, or to one before
--     the server's now by more than the clock bound; a park (a nack with a
--     delay) with a NULL p_now. Each would leave the group held for good,
--     or lapsed at once.
--   PT004 invalid delay: a nack with a NULL or negative p_delay (a
--     negative one freed the group at once, first in line).
--   PT005 clock skew: p_now farther from the server's clock than the
--     bound. A caller an hour fast took every held lease; an hour slow,
--     kept leases that had lapsed.
--   PT006 invalid dedup key or window (version 10): a key that is empty
--     or longer than 256 bytes, a NULL or negative window.
--   PT007 unknown group (version 11): an operator's call (harel_group,
--     harel_peek, harel_pause_group, harel_resume_group,
--     harel_purge_group) names a group that has no row: never published
--     to, or drained.
--   PT008 state too large (version 12): harel_ack_state of a state
--     longer than 262,144 bytes.
-- The bound is the setting pgtransport.max_clock_skew, read at each call
-- (SET for a session, ALTER ROLE or ALTER DATABASE ... SET for many): a
-- number of seconds or any interval ('2.5', '1 min'); unset or empty,
-- 10 s; 'off', none. Ten seconds is far beyond what
-- NTP keeps hosts to (milliseconds) and leaves room for what may pass
-- between a client reading its clock and the call running (a pooler's
-- queue, a pause), while a fast clock can take a lease no more than 10 s
-- before its end. The Go client passes the server's own clock (no skew at
-- all); with Config.Clock (tests) it turns the bound off for its own
-- statements' transactions. A NULL p_now is never checked: it means what
-- it meant before. The bound catches wrong clocks, not hostile callers,
-- who can turn it off as they can write the tables.

-- harel_clock_skewed is true when p_now is farther from the server's clock
-- than the bound. Inlined (see the settings invariant above): it runs
-- inside its caller's expression at no call's cost. date_part, not
-- extract: it is float8 arithmetic, where extract computes in numeric.
CREATE OR REPLACE FUNCTION harel_clock_skewed(p_now DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE sql
AS $$ SELECT abs(p_now - date_part('epoch', clock_timestamp())) >
             CASE COALESCE(current_setting('pgtransport.max_clock_skew', true), '')
                 WHEN '' THEN 10::float8
                 WHEN 'off' THEN 'Infinity'::float8
                 ELSE extract(epoch FROM current_setting('pgtransport.max_clock_skew', true)::interval)::float8
             END $$;


-- Publish.

-- harel_publish is the design's publish in one round-trip: append p_event
-- to p_group, then ready the group (a new group row gets p_priority; an
-- existing one keeps its lease and priority). The insert's trigger guards it
-- against a concurrent drain. Returns the message's seq.
CREATE OR REPLACE FUNCTION harel_publish(
    p_group    TEXT,
    p_event    TEXT,
    p_priority INT DEFAULT 0)
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_seq BIGINT;
BEGIN
    INSERT INTO transport_messages (group_id, event)
    VALUES (p_group, p_event)
    RETURNING seq INTO v_seq;
    INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
    VALUES (p_group, NULL, NULL, p_priority)
    ON CONFLICT (group_id) DO NOTHING;
    RETURN v_seq;
END
$$;

-- harel_publish_many appends p_events[i] to p_groups[i], in array order
-- (so in order within each group), and readies new groups with the
-- priority of their first message in the batch. Returns the seqs in array
-- order. One statement per table: a batch of any size is one round-trip.
CREATE OR REPLACE FUNCTION harel_publish_many(
    p_groups     TEXT[],
    p_events     TEXT[],
    p_priorities INT[])
RETURNS SETOF BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF cardinality(p_events) <> cardinality(p_groups) OR cardinality(p_priorities) <> cardinality(p_groups) THEN
        RAISE EXCEPTION 'harel_publish_many: arrays of different lengths' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
        WITH ins AS (
            INSERT INTO transport_messages (group_id, event)
            SELECT u.g, u.e
              FROM unnest(p_groups, p_events) WITH ORDINALITY AS u(g, e, i)
             ORDER BY u.i
            RETURNING transport_messages.seq
        )
        SELECT ins.seq FROM ins ORDER BY ins.seq;
    INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
    SELECT DISTINCT ON (u.g) u.g, NULL, NULL, u.p
      FROM unnest(p_groups, p_priorities) WITH ORDINALITY AS u(g, p, i)
     ORDER BY u.g, u.i
    ON CONFLICT (group_id) DO NOTHING;
END
$$;


-- Claim.
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
    -- The entry checks (see "Entry checks" above).
    IF p_token IS NULL OR p_token = '' THEN
        RAISE EXCEPTION 'harel_claim: p_token is NULL or empty' USING ERRCODE = 'PT002';
    END IF;
    IF p_lease IS NULL OR p_lease <= p_now THEN
        RAISE EXCEPTION 'harel_claim: the lease end p_lease (%) is not after p_now (%)', p_lease, p_now USING ERRCODE = 'PT003';
    END IF;
    IF harel_clock_skewed(p_now) THEN
        RAISE EXCEPTION 'harel_claim: p_now (%) is farther from the server''s clock than pgtransport.max_clock_skew allows', p_now
            USING ERRCODE = 'PT005', HINT = 'Pass the server''s clock, extract(epoch FROM clock_timestamp()), or fix the client''s clock.';
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
        -- needed (the lost-publish guard above does not use row locks).
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
    -- The entry checks (see "Entry checks" above).
    IF p_token IS NULL OR p_token = '' THEN
        RAISE EXCEPTION 'harel_claim_many: p_token is NULL or empty' USING ERRCODE = 'PT002';
    END IF;
    IF p_lease IS NULL OR p_lease <= p_now THEN
        RAISE EXCEPTION 'harel_claim_many: the lease end p_lease (%) is not after p_now (%)', p_lease, p_now USING ERRCODE = 'PT003';
    END IF;
    IF harel_clock_skewed(p_now) THEN
        RAISE EXCEPTION 'harel_claim_many: p_now (%) is farther from the server''s clock than pgtransport.max_clock_skew allows', p_now
            USING ERRCODE = 'PT005', HINT = 'Pass the server''s clock, extract(epoch FROM clock_timestamp()), or fix the client''s clock.';
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


-- Ack: an ack writes its group row once.
--
-- Every rewrite of a group row is a new row version plus an entry in each
-- of its two indexes (lock_expiry is indexed, so none is HOT). So an ack
-- first looks at the group's next message, before any lock: if the ack's
-- token still holds the group, nothing but this ack can remove that message
-- (only a holder deletes messages), so what it sees is the head after the
-- ack. Then the fence is the one write: where the group looks drained, a
-- DELETE that checks the token and, after the guard's try-lock, that no
-- other message is there; otherwise an UPDATE that checks the token and
-- frees the row (or extends it, when kept). A message published meanwhile
-- is seen by the DELETE's re-check: the row is then freed instead. (Until
-- version 6, harel_ack locked the group row, a lock record in the WAL, then
-- rewrote or deleted it; harel_ack_many extended every held row as if kept,
-- then rewrote or deleted those it did not keep.)

-- harel_ack settles a lease: false, changing nothing, unless p_token still
-- holds p_group and message p_seq is still there. Otherwise it deletes
-- message p_seq and frees the group with
-- lock_expiry = p_now (so it queues behind groups served less recently), or
-- deletes the group row when it has no message left. The design's
-- signature and results, but for one case: an ack whose message is already
-- gone (a kept lease's earlier message, acked again: a kept lease reuses
-- its token) changes nothing and reports the lease lost; the design's
-- freed the group from under the holder of the next message.
--
-- Since version 10 the fence also checks that p_seq is the message the
-- lease was handed (the group row's delivered_seq; NULL for a lease
-- taken before the upgrade, which is not checked): an ack under a valid
-- token of any other message of the group is refused with SQLSTATE PT001
-- and changes nothing. (Two publishes that overlap can make a claim hand
-- out a higher seq while a lower one is uncommitted; that ack names the
-- seq it was handed, so it passes.) The batch calls answer such an entry
-- held = false instead. No token matches a stopped group (locked_by '').
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
SET jit = off
AS $$
BEGIN
    IF harel_clock_skewed(p_now) THEN
        RAISE EXCEPTION 'harel_ack: p_now (%) is farther from the server''s clock than pgtransport.max_clock_skew allows', p_now
            USING ERRCODE = 'PT005', HINT = 'Pass the server''s clock, extract(epoch FROM clock_timestamp()), or fix the client''s clock.';
    END IF;
    -- Drained after this ack, as far as committed data shows, and no
    -- publisher mid-transaction on the group (it holds the group's lock,
    -- shared; see harel_hold_group)? Then the fence deletes the row: the
    -- DELETE runs after the try-lock, so it sees every message committed
    -- before it.
    IF NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group AND m.seq <> p_seq)
       AND harel_try_guard(p_group) THEN
        DELETE FROM transport_groups AS g
         WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> '' AND NOT g.paused
           AND (g.delivered_seq IS NULL OR g.delivered_seq = p_seq)
           AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group)
           AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group AND m.seq <> p_seq);
    END IF;
    IF NOT FOUND THEN
        -- The fence, the lock that keeps it ours until commit, and the
        -- free. The message must still be there: a token kept across a
        -- group's messages (harel_ack_many's keep) also holds for an
        -- earlier message already acked, whose ack again would free the
        -- group from under the holder of the next.
        UPDATE transport_groups AS g
           SET locked_by = NULL, lock_expiry = p_now
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

-- harel_exchange_leases is a worker's whole round-trip: settle a batch of
-- leases as harel_ack_many describes, then lease up to p_limit more groups
-- minus those kept (harel_claim_leases), in one transaction. Rows: kind 'a'
-- per settled lease, in input order (held, and the next head if kept, with
-- attempt 1 and its age), then kind 'c' per new lease (with its attempt and
-- age). The settling lives here, and harel_ack_many calls this, so that a
-- stream's round-trip runs one function less. harel_exchange is this
-- without the last two columns.
CREATE OR REPLACE FUNCTION harel_exchange_leases(
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT,
    p_limit        INT,
    p_groups       TEXT[],
    p_seqs         BIGINT[],
    p_tokens       TEXT[],
    p_keep         BOOLEAN[])
RETURNS TABLE (kind "char", group_id TEXT, held BOOLEAN, seq BIGINT, event TEXT, attempt INT, age DOUBLE PRECISION)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
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
BEGIN
    -- The entry checks (see "Entry checks" above): a token and a lease end
    -- only where they are used, by a claim or a kept lease.
    IF p_limit > 0 AND (p_token IS NULL OR p_token = '') THEN
        RAISE EXCEPTION 'harel_exchange: p_token is NULL or empty' USING ERRCODE = 'PT002';
    END IF;
    IF (p_limit > 0 OR true = ANY (p_keep)) AND (p_lease IS NULL OR p_lease <= p_now) THEN
        RAISE EXCEPTION 'harel_exchange: the lease end p_lease (%) is not after p_now (%)', p_lease, p_now USING ERRCODE = 'PT003';
    END IF;
    IF harel_clock_skewed(p_now) THEN
        RAISE EXCEPTION 'harel_exchange: p_now (%) is farther from the server''s clock than pgtransport.max_clock_skew allows', p_now
            USING ERRCODE = 'PT005', HINT = 'Pass the server''s clock, extract(epoch FROM clock_timestamp()), or fix the client''s clock.';
    END IF;
    IF cardinality(p_groups) > 0 THEN
        IF cardinality(p_seqs) IS DISTINCT FROM cardinality(p_groups)
           OR cardinality(p_tokens) IS DISTINCT FROM cardinality(p_groups)
           OR cardinality(p_keep) IS DISTINCT FROM cardinality(p_groups) THEN
            RAISE EXCEPTION 'harel_exchange: arrays of different lengths' USING ERRCODE = '22023';
        END IF;

        -- Each lease's next message, before any lock (see "Ack" above).
        SELECT array_agg(x.first ORDER BY x.i), array_agg(x.seq ORDER BY x.i), array_agg(x.event ORDER BY x.i),
               array_agg(x.published_at ORDER BY x.i),
               count(*) FILTER (WHERE x.first AND x.seq IS NULL) > 0
          INTO v_first, v_next, v_events, v_pubs, v_drained
          FROM (SELECT u.i, h.seq, h.event, h.published_at,
                       row_number() OVER (PARTITION BY u.gid ORDER BY u.i) = 1 AS first
                  FROM unnest(p_groups, p_seqs) WITH ORDINALITY AS u(gid, s, i)
                  LEFT JOIN LATERAL (
                        SELECT m.seq, m.event, m.published_at
                          FROM transport_messages AS m
                         WHERE m.group_id = u.gid AND m.seq <> u.s
                         ORDER BY m.seq
                         LIMIT 1) AS h ON true) AS x;

        -- Those that look drained: the guard's try-lock, then, in a statement
        -- after it, the fence that deletes the row if still no other message.
        -- Every statement here reaches the rows it changes by primary key, one
        -- input at a time: no search of an array per row, so a batch of
        -- thousands stays linear.
        IF v_drained THEN
            SELECT array_agg(x.locked ORDER BY x.i) INTO v_locked
              FROM (SELECT u.i, CASE WHEN u.first AND u.nxt IS NULL
                                THEN harel_try_guard(u.gid)
                                ELSE false END AS locked
                      FROM unnest(p_groups, v_next, v_first) WITH ORDINALITY AS u(gid, nxt, first, i)) AS x;
            WITH gone AS (
                DELETE FROM transport_groups AS g
                 USING unnest(p_groups, p_seqs, p_tokens, v_locked) WITH ORDINALITY AS a(gid, s, tok, locked, i)
                 WHERE a.locked AND g.group_id = a.gid AND g.locked_by = a.tok AND g.locked_by <> '' AND NOT g.paused
                   AND (g.delivered_seq IS NULL OR g.delivered_seq = a.s)
                   AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = a.s AND m.group_id = a.gid)
                   AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = a.gid AND m.seq <> a.s)
                RETURNING a.i, g.group_id, a.s
            )
            SELECT array_agg(x.i), array_agg(false), array_agg(x.group_id), array_agg(x.s)
              INTO v_at, v_kept, v_groups, v_seqs
              FROM gone AS x;
        END IF;

        -- The rest: the fence that frees the row, or extends it where kept. A
        -- group that looked drained but was not deleted is freed. A lease
        -- to be freed must still have its message, as in harel_ack; one to
        -- be kept need not: that is a retry of an ack that kept the group
        -- and whose answer was lost (the group then already names the next
        -- message as handed out), and it gets the same next message. A
        -- kept lease is handed its next message: delivered_seq moves on
        -- and the attempt is its first.
        WITH fenced AS (
            UPDATE transport_groups AS g
               SET locked_by     = CASE WHEN a.keep AND a.nxt IS NOT NULL AND NOT g.paused THEN g.locked_by END,
                   lock_expiry   = CASE WHEN a.keep AND a.nxt IS NOT NULL AND NOT g.paused THEN p_lease ELSE p_now END,
                   delivered_seq = CASE WHEN a.keep AND a.nxt IS NOT NULL AND NOT g.paused THEN a.nxt ELSE g.delivered_seq END,
                   attempts      = CASE WHEN a.keep AND a.nxt IS NOT NULL AND NOT g.paused THEN 1 ELSE g.attempts END,
                   leased_at     = CASE WHEN a.keep AND a.nxt IS NOT NULL AND NOT g.paused THEN p_now ELSE g.leased_at END
              FROM unnest(p_groups, p_seqs, p_tokens, p_keep, v_next, v_first) WITH ORDINALITY AS a(gid, s, tok, keep, nxt, first, i)
             WHERE a.first AND g.group_id = a.gid AND g.locked_by = a.tok AND g.locked_by <> ''
               AND (((g.delivered_seq IS NULL OR g.delivered_seq = a.s)
                     AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = a.s AND m.group_id = a.gid))
                    OR (a.keep AND a.nxt IS NOT NULL AND (g.delivered_seq IS NULL OR g.delivered_seq = a.nxt)
                        AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = a.s AND m.group_id = a.gid)))
            RETURNING a.i, a.keep AND a.nxt IS NOT NULL AND NOT g.paused AS kept, g.group_id, a.s
        )
        SELECT COALESCE(v_at, '{}') || array_agg(f.i), COALESCE(v_kept, '{}') || array_agg(f.kept),
               COALESCE(v_groups, '{}') || array_agg(f.group_id), COALESCE(v_seqs, '{}') || array_agg(f.s),
               count(*) FILTER (WHERE f.kept)
          INTO v_at, v_kept, v_groups, v_seqs, v_nkept
          FROM fenced AS f;

        -- The held leases' messages, by primary key, each with its own group.
        DELETE FROM transport_messages AS m
         WHERE m.seq = ANY (v_seqs)
           AND (m.seq, m.group_id) IN (SELECT * FROM unnest(v_seqs, v_groups));

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
              FROM harel_claim_leases(p_now, p_lease, p_token, p_min_priority, p_limit - v_nkept) AS c;
    END IF;
END
$$;

-- harel_exchange is harel_exchange_leases without the attempt and age
-- columns (its result since version 4).
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
SET jit = off
AS $$
    SELECT e.kind, e.group_id, e.held, e.seq, e.event
      FROM harel_exchange_leases(p_now, p_lease, p_token, p_min_priority, p_limit,
                                 p_groups, p_seqs, p_tokens, p_keep) WITH ORDINALITY AS e(kind, group_id, held, seq, event, attempt, age, n)
     ORDER BY e.n
$$;

-- harel_ack_claim is a blocking worker's step between two messages, in
-- one transaction (version 10): settle the lease p_token holds on p_group
-- (message p_seq) and take the worker's next one. With p_keep and another
-- message in the group, the lease keeps the group for that message (as
-- harel_ack_many's keep: same token, lock_expiry = p_lease): kept, and
-- that message with attempt 1 and its age. Otherwise harel_ack settles it
-- (held as harel_ack answers; PT001 as harel_ack refuses) and
-- harel_claim_one leases the group served longest ago to p_new_token:
-- its head in group_id..age, or NULLs when nothing is claimable. One row.
-- Cheaper for one lease than harel_exchange, which is built for batches.
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
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_seq   BIGINT;
    v_event TEXT;
    v_pub   TIMESTAMPTZ;
BEGIN
    kept := false;
    IF p_keep THEN
        -- The keep, for one lease, as harel_exchange_leases keeps (see
        -- "Ack" above): the next message, read before any lock, then the
        -- fence that keeps the row in its one write.
        SELECT m.seq, m.event, m.published_at INTO v_seq, v_event, v_pub
          FROM transport_messages AS m
         WHERE m.group_id = p_group AND m.seq <> p_seq
         ORDER BY m.seq
         LIMIT 1;
        IF v_seq IS NOT NULL THEN
            UPDATE transport_groups AS g
               SET lock_expiry = p_lease, delivered_seq = v_seq, attempts = 1, leased_at = p_now
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
      FROM harel_claim_one(p_now, p_lease, p_new_token, p_min_priority) AS c;
    RETURN NEXT;
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
-- per input, in input order. It is harel_exchange without the claim.
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


-- Fail, release, and what happens to a message that keeps failing
-- (version 10).

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
--     harel_ack's guard), as an ack would leave it.
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
    v_gone  BOOLEAN := false;
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'harel_fail: p_now is NULL' USING ERRCODE = 'PT003';
    END IF;
    IF harel_clock_skewed(p_now) THEN
        RAISE EXCEPTION 'harel_fail: p_now (%) is farther from the server''s clock than pgtransport.max_clock_skew allows', p_now
            USING ERRCODE = 'PT005', HINT = 'Pass the server''s clock, extract(epoch FROM clock_timestamp()), or fix the client''s clock.';
    END IF;
    -- The fence, and the lock that keeps it ours until commit.
    SELECT g.attempts INTO v_att
      FROM transport_groups AS g
     WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> ''
       AND (g.delivered_seq = p_seq
            OR (g.delivered_seq IS NULL  -- a lease from before version 10: its head only
                AND p_seq = (SELECT m.seq FROM transport_messages AS m
                              WHERE m.group_id = p_group ORDER BY m.seq LIMIT 1)))
       AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group)
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
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
        PERFORM harel_bury(ARRAY[p_group], ARRAY[p_seq], v_error);
        IF NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group)
           AND harel_try_guard(p_group) THEN
            DELETE FROM transport_groups AS g
             WHERE g.group_id = p_group AND NOT g.paused
               AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group);
            v_gone := FOUND;
        END IF;
        IF NOT v_gone THEN
            UPDATE transport_groups AS g
               SET locked_by = NULL, lock_expiry = p_now
             WHERE g.group_id = p_group;
        END IF;
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
           SET locked_by = '', lock_expiry = 'Infinity'
         WHERE g.group_id = p_group;
        RETURN 'stopped';
    END IF;
    v_delay := LEAST(v_cap, v_min * power(2::float8, LEAST(v_att - 1, 60)));
    v_delay := GREATEST(v_min, v_delay / 2 + random() * v_delay / 2);
    UPDATE transport_groups AS g
       SET locked_by = '', lock_expiry = p_now + v_delay
     WHERE g.group_id = p_group;
    RETURN 'retry';
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
SET jit = off
AS $$
BEGIN
    UPDATE transport_groups AS g
       SET locked_by = NULL, lock_expiry = NULL, arrival = (SELECT a.last_value FROM transport_claim_new AS a), attempts = GREATEST(g.attempts - 1, 0)
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
       SET locked_by = NULL, lock_expiry = NULL, arrival = (SELECT a.last_value FROM transport_claim_new AS a), attempts = 0
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
    -- In a grown cluster ("Growing"), a group whose home is another
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


-- Idempotent publish (version 10).

-- harel_publish_keyed is harel_publish_many with an optional dedup key per
-- message: where p_keys[i] is not NULL and (p_groups[i], p_keys[i]) was
-- published within the last p_window seconds (server clock), or earlier
-- in this batch, nothing is stored for it and the seq it was first
-- published under is returned in its place. Concurrent publishes with one
-- key store it once: the second waits for the first to commit (the key's
-- unique index) and returns its seq; if the first rolls back, the second
-- stores. A key is 1 to 256 bytes (PT006 otherwise). Every message gets
-- its seq first, in array order, so order within a group is array order,
-- as in harel_publish_many. Each call also deletes up to twice its size
-- (plus 8) of expired keys, so the table stays bounded with no job to run.
CREATE OR REPLACE FUNCTION harel_publish_keyed(
    p_groups     TEXT[],
    p_events     TEXT[],
    p_priorities INT[],
    p_keys       TEXT[],
    p_window     DOUBLE PRECISION)
RETURNS SETOF BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_clock DOUBLE PRECISION := date_part('epoch', clock_timestamp());
    v_seqs  BIGINT[];   -- per input: a fresh seq
    v_out   BIGINT[];   -- per input: the seq returned
    v_new   BOOLEAN[];  -- per input: stored
BEGIN
    IF cardinality(p_events) IS DISTINCT FROM cardinality(p_groups)
       OR cardinality(p_priorities) IS DISTINCT FROM cardinality(p_groups)
       OR cardinality(p_keys) IS DISTINCT FROM cardinality(p_groups) THEN
        RAISE EXCEPTION 'harel_publish_keyed: arrays of different lengths' USING ERRCODE = '22023';
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
    INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
    SELECT DISTINCT ON (u.g) u.g, NULL, NULL, u.p
      FROM unnest(p_groups, p_priorities, v_new) WITH ORDINALITY AS u(g, p, n, i)
     WHERE u.n
     ORDER BY u.g, u.i
    ON CONFLICT (group_id) DO NOTHING;

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


-- Nack and extend.

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
        RAISE EXCEPTION 'harel_nack: p_now (%) is farther from the server''s clock than pgtransport.max_clock_skew allows', p_now
            USING ERRCODE = 'PT005', HINT = 'Pass the server''s clock, extract(epoch FROM clock_timestamp()), or fix the client''s clock.';
    END IF;
    IF p_delay > 0 THEN
        UPDATE transport_groups AS g
           SET lock_expiry = p_now + p_delay
         WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> '';
    ELSE
        UPDATE transport_groups AS g
           SET locked_by = NULL, lock_expiry = NULL, arrival = (SELECT a.last_value FROM transport_claim_new AS a)
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
SET jit = off
AS $$
BEGIN
    IF p_lease IS NULL
       OR (p_lease < date_part('epoch', clock_timestamp()) AND harel_clock_skewed(p_lease)) THEN
        RAISE EXCEPTION 'harel_extend: the lease end p_lease (%) is NULL or in the past', p_lease USING ERRCODE = 'PT003';
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
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    IF p_lease IS NULL
       OR (p_lease < date_part('epoch', clock_timestamp()) AND harel_clock_skewed(p_lease)) THEN
        RAISE EXCEPTION 'harel_extend_many: the lease end p_lease (%) is NULL or in the past', p_lease USING ERRCODE = 'PT003';
    END IF;
    IF cardinality(p_seqs) IS DISTINCT FROM cardinality(p_groups)
       OR cardinality(p_tokens) IS DISTINCT FROM cardinality(p_groups) THEN
        RAISE EXCEPTION 'harel_extend_many: arrays of different lengths' USING ERRCODE = '22023';
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


-- Operations (version 11): what an operator sees and steers. Reads take no
-- lock and change nothing; pause, resume and purge lock the group row
-- (FOR NO KEY UPDATE, as a claim does), so each waits for a claim or
-- settle in flight on that group and is seen whole by the next.
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
-- (names with no row are left out): priority, state, the live token
-- (holder) and when it took the group, when its lease, park or backoff
-- ends (until; NULL for none, or a stop), its head (seq and age in
-- seconds, by the server's clock; NULL if empty, or the age unknown for a
-- message queued before version 10) and how many times that head was
-- handed out.
CREATE OR REPLACE FUNCTION harel_group_rows(
    p_now    DOUBLE PRECISION,
    p_groups TEXT[])
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT)
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
           CASE WHEN h.seq = g.delivered_seq THEN g.attempts ELSE 0 END
      FROM unnest(p_groups) WITH ORDINALITY AS u(gid, i)
      JOIN transport_groups AS g ON g.group_id = u.gid
      LEFT JOIN LATERAL (
            SELECT m.seq, m.published_at
              FROM transport_messages AS m
             WHERE m.group_id = g.group_id
             ORDER BY m.seq
             LIMIT 1) AS h ON true
     ORDER BY u.i
$$;

-- harel_group describes one group (harel_group_rows' columns); PT007 if
-- p_group has no row. p_now NULL: the server's clock.
CREATE OR REPLACE FUNCTION harel_group(
    p_now   DOUBLE PRECISION,
    p_group TEXT)
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY SELECT * FROM harel_group_rows(COALESCE(p_now, date_part('epoch', clock_timestamp())), ARRAY[p_group]);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'harel_group: group % has no row (never published to, or drained)', p_group USING ERRCODE = 'PT007';
    END IF;
END
$$;

-- harel_groups lists a page of groups (harel_group_rows' columns): those
-- in state p_state (NULL: any), in the order p_order names, skipping
-- p_offset, at most p_limit. Orders:
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
-- refused with SQLSTATE 22023. The listing reads whole tables where its
-- filter must (a state, most_attempts, held_longest: one pass over the
-- group rows), so it may plan sequential scans.
CREATE OR REPLACE FUNCTION harel_groups(
    p_now    DOUBLE PRECISION,
    p_state  TEXT,
    p_order  TEXT,
    p_offset INT,
    p_limit  INT)
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT)
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
    IF v_order = 'group' AND p_state IN ('leased', 'parked', 'stopped') THEN
        -- They have a holder (a token, or '' when failed or stopped) and
        -- their lock_expiry is at or after now: the held rows' index and
        -- the retry index from now on (few rows, in a working queue), not
        -- a scan.
        SELECT array_agg(x.group_id ORDER BY x.group_id) INTO v_groups
          FROM (SELECT g.group_id FROM transport_groups AS g
                 WHERE ((g.locked_by > '' AND g.lock_expiry >= v_now) OR (g.locked_by = '' AND g.lock_expiry >= v_now))
                   AND harel_group_state(g.locked_by, g.lock_expiry, g.paused, v_now) = p_state
                 ORDER BY g.group_id
                OFFSET v_offset LIMIT p_limit) AS x;
    ELSIF v_order = 'group' AND p_state = 'paused' THEN
        -- The partial index of paused groups.
        SELECT array_agg(x.group_id ORDER BY x.group_id) INTO v_groups
          FROM (SELECT g.group_id FROM transport_groups AS g
                 WHERE g.paused
                 ORDER BY g.group_id
                OFFSET v_offset LIMIT p_limit) AS x;
    ELSIF v_order = 'group' THEN
        SELECT array_agg(x.group_id ORDER BY x.group_id) INTO v_groups
          FROM (SELECT g.group_id FROM transport_groups AS g
                 WHERE p_state IS NULL OR harel_group_state(g.locked_by, g.lock_expiry, g.paused, v_now) = p_state
                 ORDER BY g.group_id
                OFFSET v_offset LIMIT p_limit) AS x;
    ELSIF v_order = 'held_longest' THEN
        SELECT array_agg(x.group_id ORDER BY x.n) INTO v_groups
          FROM (SELECT g.group_id, row_number() OVER (ORDER BY g.leased_at NULLS FIRST, g.group_id) AS n
                  FROM transport_groups AS g
                 WHERE g.locked_by > '' AND g.lock_expiry >= v_now  -- the held rows' index, from now on
                   AND (p_state IS NULL OR harel_group_state(g.locked_by, g.lock_expiry, g.paused, v_now) = p_state)
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
              JOIN LATERAL (SELECT g.locked_by, g.lock_expiry, g.paused FROM transport_groups AS g
                             WHERE g.group_id = w.group_id OFFSET 0) AS g ON true  -- by key, row by row (OFFSET 0: not a join)
             WHERE NOT EXISTS (SELECT 1 FROM transport_messages AS e WHERE e.group_id = w.group_id AND e.seq < w.seq)
               AND (p_state IS NULL OR harel_group_state(g.locked_by, g.lock_expiry, g.paused, v_now) = p_state)
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
    IF NOT FOUND AND NOT EXISTS (SELECT 1 FROM transport_groups AS g WHERE g.group_id = p_group)
                 AND NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group) THEN
        RAISE EXCEPTION 'harel_peek: group % has no row (never published to, or drained)', p_group USING ERRCODE = 'PT007';
    END IF;
END
$$;

-- harel_pause_group pauses p_group: no claim hands it out until
-- harel_resume_group; a holder that has it now settles as usual; its
-- messages, its place in the round-robin and its row (even once drained)
-- stay. True if it changed, false if it was paused already; PT007 if
-- p_group has no row.
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
    SELECT g.paused INTO v_paused FROM transport_groups AS g WHERE g.group_id = p_group FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'harel_pause_group: group % has no row (never published to, or drained)', p_group USING ERRCODE = 'PT007';
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
        RAISE EXCEPTION 'harel_resume_group: group % has no row (never published to, or drained)', p_group USING ERRCODE = 'PT007';
    END IF;
    IF NOT v_paused THEN
        RETURN false;
    END IF;
    -- Back at its place, or at the floor if claims walked past it while
    -- it was paused (see "The floor" above): first among the live rows.
    UPDATE transport_groups AS g
       SET paused = false,
           lock_expiry = CASE WHEN g.locked_by IS NULL AND g.lock_expiry > 0
                                   THEN GREATEST(g.lock_expiry, (SELECT f.last_value / 1000.0 FROM transport_claim_floor AS f))
                              WHEN g.locked_by <> ''
                                   THEN GREATEST(g.lock_expiry, (SELECT h.last_value / 1000.0 FROM transport_claim_held AS h))
                              ELSE g.lock_expiry END,
           arrival = CASE WHEN g.locked_by IS NULL AND g.lock_expiry IS NULL
                               THEN GREATEST(COALESCE(g.arrival, 0), (SELECT a.last_value FROM transport_claim_new AS a))
                          ELSE g.arrival END
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
-- PT007 if p_group has no row. Messages a concurrent publish commits
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
        RAISE EXCEPTION 'harel_purge_group: p_now (%) is farther from the server''s clock than pgtransport.max_clock_skew allows', p_now
            USING ERRCODE = 'PT005', HINT = 'Pass the server''s clock, extract(epoch FROM clock_timestamp()), or fix the client''s clock.';
    END IF;
    PERFORM 1 FROM transport_groups AS g WHERE g.group_id = p_group FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'harel_purge_group: group % has no row (never published to, or drained)', p_group USING ERRCODE = 'PT007';
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
           SET locked_by = NULL, lock_expiry = v_now, delivered_seq = NULL, attempts = 0, leased_at = NULL
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
-- Cost, and what is exact. Leased, parked, stopped and paused groups
-- are counted exactly, through indexes (the held rows' index and the
-- retry index from now on, and the partial index of paused groups): a
-- working queue has few.
-- All groups, messages and dead letters are counted exactly up to
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
    r        RECORD;
BEGIN

    -- Groups in every state but free, exact, through indexes: a leased,
    -- parked or stopped group has a holder and its lock_expiry is at or
    -- after now (the held rows' index and the retry index, from now on), a
    -- paused group is in the partial index transport_groups_paused. Few,
    -- in a working queue.
    SELECT array_agg(COALESCE(x.leased, 0) ORDER BY p.p), array_agg(COALESCE(x.parked, 0) ORDER BY p.p),
           array_agg(COALESCE(x.stopped, 0) ORDER BY p.p)
      INTO v_leased, v_parked, v_stopped
      FROM generate_series(0, 4) AS p(p)
      LEFT JOIN (SELECT s.priority,
                        count(*) FILTER (WHERE s.st = 'leased') AS leased,
                        count(*) FILTER (WHERE s.st = 'parked') AS parked,
                        count(*) FILTER (WHERE s.st = 'stopped') AS stopped
                   FROM (SELECT g.priority, harel_group_state(g.locked_by, g.lock_expiry, g.paused, v_now) AS st
                           FROM transport_groups AS g
                          WHERE (g.locked_by > '' AND g.lock_expiry >= v_now) OR (g.locked_by = '' AND g.lock_expiry >= v_now)) AS s
                  GROUP BY s.priority) AS x ON x.priority = p.p;
    SELECT array_agg(COALESCE(x.n, 0) ORDER BY p.p) INTO v_paused
      FROM generate_series(0, 4) AS p(p)
      LEFT JOIN (SELECT g.priority, count(*) AS n FROM transport_groups AS g WHERE g.paused GROUP BY 1) AS x
        ON x.priority = p.p;
    -- All groups, by priority: exact while few, else sampled; free ones
    -- are the rest. Counting a table is a sequential scan's job (this
    -- setting goes back to the pinned one when the function returns).
    PERFORM set_config('enable_seqscan', 'on', true);
    SELECT count(*) INTO v_n FROM (SELECT 1 FROM transport_groups AS g LIMIT c_exact + 1) AS x;
    v_pct := harel_sample_pct(v_n, c_exact, 'transport_groups');
    v_gexact := v_pct >= 100;
    SELECT array_agg(COALESCE(x.n, 0) ORDER BY p.p) INTO v_groups
      FROM generate_series(0, 4) AS p(p)
      LEFT JOIN (SELECT g.priority, count(*) AS n
                   FROM transport_groups AS g TABLESAMPLE SYSTEM (v_pct)
                  GROUP BY 1) AS x ON x.priority = p.p;
    v_groups := harel_scale_sample(v_groups, 'transport_groups', v_pct);
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


-- Exactly-once: per-group state (version 12).
--
-- A consumer whose effects are rows in this same database applies them
-- exactly once by committing them with the ack, in one transaction of its
-- own: BEGIN; its writes; harel_ack (or harel_ack_state); COMMIT. The ack is
-- fenced by the lease's token, so a holder whose lease was lost gets false
-- (or PT001) before it commits, rolls back, and nothing of its attempt is
-- applied; the message's next holder applies it. Either the writes and
-- the ack both commit or neither does, so when the COMMIT's reply is lost
-- the message is acked if and only if the writes committed.
--
-- A group's state is a small value (at most 256 KiB) kept with its group
-- row (transport_groups.state) and written only by harel_ack_state, in the
-- ack's transaction and fenced as the ack is: a stale holder can never
-- overwrite it. It is what an event-sourced consumer folds its events
-- into: read S(n-1) with harel_state, apply event n, save S(n) with the
-- ack of n. When the group drains its row is deleted; with the queue's
-- state_retention > 0 (transport_policy) the trigger below keeps the
-- state in transport_kept_states for that long, where harel_state finds
-- it until the group's next state write replaces it. A group row with no
-- state costs nothing here: the trigger fires only for rows that carry
-- one.

-- harel_keep_state is the trigger that keeps a drained group's state:
-- after the delete of a group row that carries one, when the queue's
-- state_retention is above 0, the state is kept until now + retention
-- (server clock), replacing what was kept for the group; and up to 8
-- expired kept states are deleted, so the table is cleaned at the rate
-- it is written. Whatever deletes the row (an ack that drains it, a
-- claim that finds it empty, a dead letter, a purge), the state is kept.
CREATE OR REPLACE FUNCTION harel_keep_state()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_now       DOUBLE PRECISION := date_part('epoch', clock_timestamp());
    v_retention DOUBLE PRECISION;
BEGIN
    SELECT p.state_retention INTO v_retention FROM transport_policy AS p;
    IF v_retention > 0 THEN
        INSERT INTO transport_kept_states AS k (group_id, state, keep_until)
        VALUES (OLD.group_id, OLD.state, v_now + v_retention)
        ON CONFLICT (group_id) DO UPDATE
            SET state = EXCLUDED.state, keep_until = EXCLUDED.keep_until;
        DELETE FROM transport_kept_states AS k
         WHERE k.group_id IN (SELECT x.group_id FROM transport_kept_states AS x
                               WHERE x.keep_until < v_now
                               ORDER BY x.keep_until
                               LIMIT 8
                               FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS transport_groups_keep_state ON transport_groups;
CREATE TRIGGER transport_groups_keep_state
    AFTER DELETE ON transport_groups
    FOR EACH ROW WHEN (OLD.state IS NOT NULL)
    EXECUTE FUNCTION harel_keep_state();

-- harel_ack_state is harel_ack that also sets the group's state to p_state
-- (NULL clears it), in the same transaction: when the ack holds (true),
-- the state is p_state, and the caller's writes, the state and the ack
-- commit or roll back together. When it does not (false, or PT001 as
-- harel_ack raises), the state is unchanged, and the caller must roll back
-- its own writes. A p_state over 262,144 bytes is refused with PT008 and
-- nothing is written. A state kept after the group drained
-- (transport_kept_states) is deleted by the write: the group row's state
-- is now the group's. The state write is fenced as harel_ack is (p_token
-- holds p_group and p_seq is the message it was handed) and locks the
-- group row until the caller's commit: call it last, just before COMMIT.
-- A state equal to the stored one is not written again.
CREATE OR REPLACE FUNCTION harel_ack_state(
    p_group TEXT,
    p_seq   BIGINT,
    p_token TEXT,
    p_now   DOUBLE PRECISION,
    p_state BYTEA)
RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF octet_length(p_state) > 262144 THEN
        RAISE EXCEPTION 'harel_ack_state: the state is % bytes, the limit is 262144', octet_length(p_state)
            USING ERRCODE = 'PT008';
    END IF;
    UPDATE transport_groups AS g
       SET state = p_state
     WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> ''
       AND (g.delivered_seq IS NULL OR g.delivered_seq = p_seq)
       AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group)
       AND g.state IS DISTINCT FROM p_state;
    IF FOUND THEN
        DELETE FROM transport_kept_states AS k WHERE k.group_id = p_group;
    ELSIF EXISTS (SELECT 1 FROM transport_kept_states AS k WHERE k.group_id = p_group) THEN
        -- The row's state already is p_state, but a kept one would still
        -- be read in place of a NULL: delete it, under the fence (the
        -- row's lock, so it holds until commit).
        PERFORM 1 FROM transport_groups AS g
          WHERE g.group_id = p_group AND g.locked_by = p_token AND g.locked_by <> ''
            AND (g.delivered_seq IS NULL OR g.delivered_seq = p_seq)
            AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group)
          FOR NO KEY UPDATE;
        IF FOUND THEN
            DELETE FROM transport_kept_states AS k WHERE k.group_id = p_group;
        END IF;
    END IF;
    RETURN harel_ack(p_group, p_seq, p_token, p_now);
END
$$;

-- harel_state is p_group's state: its row's, else one kept after it
-- drained whose retention has not ended (server clock), else NULL.
-- Reading is not fenced (any caller may read any group's state): a
-- consumer reads it inside the transaction in which it holds the lease
-- and writes the next one with harel_ack_state, whose fence is what
-- makes the pair exactly once.
CREATE OR REPLACE FUNCTION harel_state(p_group TEXT)
RETURNS BYTEA
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT COALESCE(
        (SELECT g.state FROM transport_groups AS g WHERE g.group_id = p_group),
        (SELECT k.state FROM transport_kept_states AS k
          WHERE k.group_id = p_group AND k.keep_until > date_part('epoch', clock_timestamp())))
$$;


-- Wake idle consumers with LISTEN/NOTIFY, and only them.
--
-- A transaction that runs NOTIFY takes a database-wide lock at commit, so
-- notifying commits queue behind each other and lose group commit. So a
-- write notifies only when it makes a group ready that was not there (a new
-- group row) and some consumer has said it is idle and waiting (a row in
-- transport_waiters). A busy system sends no notification at all.
-- PostgreSQL folds identical notifications in one transaction into one, so
-- a transaction that creates many groups notifies once.
--
-- The lost-wakeup race: a publisher whose trigger ran before a consumer's
-- waiter row committed, and which commits after that consumer's last empty
-- claim, wakes no one. The consumer's timed sweep (Config.IdleSweep) bounds
-- how long such a message waits.
--
-- Groups that become claimable without a new row (an ack or nack that frees
-- a group with messages left, a lease or park that runs out) send nothing:
-- consumers in the same process are woken in-process, consumers elsewhere
-- wake at the earliest lock_expiry they saw when they went idle, or at their
-- sweep.

-- harel_channel is the NOTIFY channel of this schema's queue: named after
-- the groups table's oid, so two queues in one database never wake each
-- other, and always a valid identifier.
CREATE OR REPLACE FUNCTION harel_channel()
RETURNS TEXT
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT 'harel_ready_' || 'transport_groups'::regclass::oid::bigint $$;

-- The trigger that wakes: after a statement that created group rows, if any
-- consumer waits for one of their priorities. A statement trigger, so a
-- batch that creates a thousand groups checks once (a row trigger cost
-- 13 ms per 1,000 new groups, half of a batch publish). Each statement in
-- it takes a fresh snapshot (read committed), so it sees waiters that
-- committed while the insert ran. enable_seqscan = off costs nothing here:
-- the waiters check has no path but a scan of that small table.
CREATE OR REPLACE FUNCTION harel_wake()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM transport_waiters AS w
                WHERE w.until > extract(epoch FROM clock_timestamp())
                  AND w.min_priority <= (SELECT max(n.priority) FROM harel_new_groups AS n)) THEN
        PERFORM pg_notify(harel_channel(), '');
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS transport_groups_wake ON transport_groups;
CREATE TRIGGER transport_groups_wake
    AFTER INSERT ON transport_groups
    REFERENCING NEW TABLE AS harel_new_groups
    FOR EACH STATEMENT EXECUTE FUNCTION harel_wake();

-- harel_wait records p_waiter (unless NULL) as idle for p_ttl seconds
-- (server clock) and returns the earliest lock_expiry after p_now of a leased, parked or failed group
-- at or above p_min_priority (NULL if none): when the consumer must look
-- again even if no notification comes. It also clears rows of consumers
-- that stopped refreshing a minute ago.
CREATE OR REPLACE FUNCTION harel_wait(
    p_waiter       TEXT,
    p_min_priority INT,
    p_ttl          DOUBLE PRECISION,
    p_now          DOUBLE PRECISION)
RETURNS DOUBLE PRECISION
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_clock DOUBLE PRECISION := extract(epoch FROM clock_timestamp());
    v_next  DOUBLE PRECISION;
BEGIN
    IF p_waiter IS NOT NULL THEN
        DELETE FROM transport_waiters AS w WHERE w.until < v_clock - 60;
        INSERT INTO transport_waiters AS w (waiter, min_priority, until)
        VALUES (p_waiter, p_min_priority, v_clock + p_ttl)
        ON CONFLICT (waiter) DO UPDATE
            SET min_priority = EXCLUDED.min_priority, until = EXCLUDED.until;
    END IF;
    -- The first end after now of a lease or a nack's park (the held rows'
    -- index) or of a failed head's backoff (the retry index; a stopped
    -- group, at 'Infinity', never runs out), each walked from now.
    SELECT LEAST(
             (SELECT g.lock_expiry FROM transport_groups AS g
               WHERE g.locked_by > '' AND g.lock_expiry > p_now
                 AND g.priority >= p_min_priority AND NOT g.paused
               ORDER BY g.lock_expiry, g.group_id
               LIMIT 1),
             (SELECT g.lock_expiry FROM transport_groups AS g
               WHERE g.locked_by = '' AND g.lock_expiry > p_now AND g.lock_expiry < 'Infinity'
                 AND g.priority >= p_min_priority AND NOT g.paused
               ORDER BY g.lock_expiry
               LIMIT 1))
      INTO v_next;
    RETURN v_next;
END
$$;

-- harel_unwait: p_waiter is busy again and wants no notification.
CREATE OR REPLACE FUNCTION harel_unwait(p_waiter TEXT)
RETURNS VOID
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ DELETE FROM transport_waiters WHERE waiter = p_waiter $$;

-- Partitions (version 13, issue 18). A queue may be spread over N
-- databases (N a power of two, at most 1,024), each holding this whole
-- schema, behind a proxy database whose functions (schema/sql/proxy.sql)
-- are PL/Proxy functions of the same names: a group lives in one
-- partition, hashtext(group_id) & (N - 1), so its order, its one holder
-- and its fences stay inside one database. Nothing here changes how a
-- single database works; these are what a proxy needs of its partitions.
--
-- Seqs. Each partition's seqs are its own, so across partitions they would
-- collide, and a seq alone (a dead letter's page, a redrive by seq) could
-- not name a message. harel_partition makes them disjoint: the message
-- sequence steps by 1,024 from a value whose remainder is the partition's
-- number, so seq & 1023 is where a message lives, whatever N is (a group
-- that stays behind when the cluster grows keeps its seqs, and its
-- partition keeps its number). Within a partition seqs still rise in
-- publish order, which is all the protocol asks of them.

-- transport_partition is this database's number in its cluster, one row,
-- written by harel_partition; no row in a database that is not a partition.
-- harel_partition numbers this database p_index (0 to 1,023) and makes its
-- seqs disjoint from the other partitions' (above). Run by the schema's
-- owner (it alters the message sequence), once per partition before it
-- takes messages through a proxy; again with the same number it changes
-- nothing. A different number than the one recorded is refused (22023):
-- messages it holds would be looked for in the wrong partition; so is a
-- database that holds messages or dead letters from before (their groups
-- and seqs could be another partition's).
CREATE OR REPLACE FUNCTION harel_partition(p_index INT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_part INT;
    v_last BIGINT;
BEGIN
    IF p_index IS NULL OR p_index NOT BETWEEN 0 AND 1023 THEN
        RAISE EXCEPTION 'harel_partition: p_index % is not 0 to 1023', p_index USING ERRCODE = '22023';
    END IF;
    LOCK TABLE transport_partition IN EXCLUSIVE MODE;
    SELECT p.part INTO v_part FROM transport_partition AS p;
    IF v_part = p_index THEN
        RETURN;
    ELSIF v_part IS NOT NULL THEN
        RAISE EXCEPTION 'harel_partition: this database is partition %, not %', v_part, p_index USING ERRCODE = '22023';
    END IF;
    -- Messages from before could be another partition's groups, and their
    -- seqs another partition's: an unnumbered database must be empty.
    -- Publishes wait until it is numbered.
    LOCK TABLE transport_messages, transport_dead_letters IN SHARE MODE;
    IF EXISTS (SELECT 1 FROM transport_messages) OR EXISTS (SELECT 1 FROM transport_dead_letters) THEN
        RAISE EXCEPTION 'harel_partition: this database holds messages or dead letters from before it was numbered; drain and purge them first'
            USING ERRCODE = '22023';
    END IF;
    -- The next seq: above any handed out so far, and = p_index mod 1024.
    SELECT s.last_value INTO v_last FROM transport_messages_seq_seq AS s;
    EXECUTE format('ALTER SEQUENCE transport_messages_seq_seq INCREMENT BY 1024 RESTART WITH %s',
                   (v_last / 1024 + 1) * 1024 + p_index);
    INSERT INTO transport_partition (part) VALUES (p_index);
END
$$;

-- harel_counters is what a sampler takes rates from: how many messages
-- were ever published (the message sequence's last value over its step:
-- seqs are taken once each, a partition's step is 1,024) and ever deleted
-- from the queue (acked, purged or dead-lettered: PostgreSQL's statistics
-- counter, flushed about once a second; -1 where the statistics are off).
-- One row; through a proxy, one per partition (add them up). Version 13.
CREATE OR REPLACE FUNCTION harel_counters()
RETURNS TABLE (published BIGINT, deleted BIGINT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT COALESCE((SELECT pg_sequence_last_value(q.seqrelid) / q.seqincrement FROM pg_sequence AS q
                        WHERE q.seqrelid = 'transport_messages_seq_seq'::regclass), 0),
             COALESCE((SELECT t.n_tup_del FROM pg_stat_user_tables AS t
                        WHERE t.relid = 'transport_messages'::regclass), -1) $$;

-- harel_px_partition is what the proxy checks of a partition before it
-- routes to it: the number harel_partition gave this database (NULL: none)
-- and the schema's version. p_part is the proxy's routing only.
CREATE OR REPLACE FUNCTION harel_px_partition(p_part INT)
RETURNS TABLE (part INT, version INT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT (SELECT p.part FROM transport_partition AS p),
             (SELECT max(v.version) FROM transport_schema_version AS v) $$;

-- The proxy's calls. A proxy function that must do more than pass its
-- arguments on (rotate a claim over partitions, put a batch's results
-- back in input order, merge lists) is written in plpgsql on the proxy
-- and reaches each partition through a PL/Proxy function, which calls the
-- function of its own name and schema here. These are those: the
-- protocol's functions under a harel_px_ name, with p_part (the partition
-- the proxy chose, for its routing only) or p_ords (each input's place in
-- the proxy's batch, returned beside its result) added. They change
-- nothing a single database does, and are not part of the protocol.

-- harel_px_claim is harel_claim_one (p_limit NULL) or harel_claim_leases.
CREATE OR REPLACE FUNCTION harel_px_claim(
    p_part         INT,
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
BEGIN
    IF p_limit IS NULL THEN
        RETURN QUERY SELECT * FROM harel_claim_one(p_now, p_lease, p_token, p_min_priority);
    ELSE
        RETURN QUERY SELECT * FROM harel_claim_leases(p_now, p_lease, p_token, p_min_priority, p_limit);
    END IF;
END
$$;

-- harel_px_publish_many is harel_publish_many (p_window NULL) or
-- harel_publish_keyed, each seq beside its input's place, and, while the
-- cluster grows, a publish if here: the messages of a group whose home is
-- another partition and that has nothing left here (harel_stays, asked in
-- group order) are not published and come back with a NULL seq, for the
-- router to publish in the group's new home; the others are published.
CREATE OR REPLACE FUNCTION harel_px_publish_many(
    p_ords       INT[],
    p_groups     TEXT[],
    p_events     TEXT[],
    p_priorities INT[],
    p_keys       TEXT[],
    p_window     DOUBLE PRECISION)
RETURNS TABLE (ord INT, seq BIGINT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_gone TEXT[];
BEGIN
    v_gone := ARRAY(SELECT harel_left(p_groups));
    IF cardinality(v_gone) > 0 THEN
        BEGIN
            RETURN QUERY SELECT p_ords[u.n]::INT, NULL::BIGINT
                           FROM unnest(p_groups) WITH ORDINALITY AS u(g, n) WHERE u.g = ANY (v_gone);
            SELECT array_agg(p_ords[n] ORDER BY n), array_agg(p_groups[n] ORDER BY n), array_agg(p_events[n] ORDER BY n),
                   array_agg(p_priorities[n] ORDER BY n), array_agg(p_keys[n] ORDER BY n)
              INTO p_ords, p_groups, p_events, p_priorities, p_keys
              FROM generate_subscripts(p_groups, 1) AS n
             WHERE p_groups[n] IS NULL OR p_groups[n] <> ALL (v_gone);
            IF p_groups IS NULL THEN
                RETURN;
            END IF;
        END;
    END IF;
    RETURN QUERY SELECT * FROM harel_px_publish_home(p_ords, p_groups, p_events, p_priorities, p_keys, p_window);
END
$$;

-- harel_px_publish_here is harel_publish, or (not p_strict) NULL with
-- nothing written for a group whose home is another partition and that
-- has nothing left here (harel_stays): the proxy then publishes it, strict,
-- in its new home, where the fence refuses (PT010) what lives elsewhere.
CREATE OR REPLACE FUNCTION harel_px_publish_here(p_part INT, p_group TEXT, p_event TEXT, p_priority INT, p_strict BOOLEAN)
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF NOT p_strict AND EXISTS (SELECT 1 FROM harel_left(ARRAY[p_group])) THEN
        RETURN NULL;
    END IF;
    RETURN harel_publish(p_group, p_event, p_priority);
END
$$;

-- harel_px_publish_home is harel_publish_many (p_window NULL) or
-- harel_publish_keyed, each seq beside its input's place, with nothing
-- handed back: the proxy's second try, in each group's home, where the
-- fence refuses (PT010) a group that lives elsewhere (a proxy whose map is
-- older than the partitions'), and harel_px_publish_many's last step.
CREATE OR REPLACE FUNCTION harel_px_publish_home(
    p_ords       INT[],
    p_groups     TEXT[],
    p_events     TEXT[],
    p_priorities INT[],
    p_keys       TEXT[],
    p_window     DOUBLE PRECISION)
RETURNS TABLE (ord INT, seq BIGINT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF p_window IS NULL THEN
        RETURN QUERY SELECT p_ords[r.n]::INT, r.s
                       FROM harel_publish_many(p_groups, p_events, p_priorities) WITH ORDINALITY AS r(s, n);
    ELSE
        RETURN QUERY SELECT p_ords[r.n]::INT, r.s
                       FROM harel_publish_keyed(p_groups, p_events, p_priorities, p_keys, p_window) WITH ORDINALITY AS r(s, n);
    END IF;
END
$$;

-- harel_px_ack_many is harel_ack_many, each row beside its input's place.
CREATE OR REPLACE FUNCTION harel_px_ack_many(
    p_ords   INT[],
    p_groups TEXT[],
    p_seqs   BIGINT[],
    p_tokens TEXT[],
    p_keep   BOOLEAN[],
    p_now    DOUBLE PRECISION,
    p_lease  DOUBLE PRECISION)
RETURNS TABLE (ord INT, group_id TEXT, held BOOLEAN, next_seq BIGINT, next_event TEXT)
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT p_ords[r.n]::INT, r.group_id, r.held, r.next_seq, r.next_event
        FROM harel_ack_many(p_groups, p_seqs, p_tokens, p_keep, p_now, p_lease)
             WITH ORDINALITY AS r(group_id, held, next_seq, next_event, n) $$;

-- harel_px_extend_many is harel_extend_many, each row beside its input's
-- place.
CREATE OR REPLACE FUNCTION harel_px_extend_many(
    p_ords   INT[],
    p_groups TEXT[],
    p_seqs   BIGINT[],
    p_tokens TEXT[],
    p_lease  DOUBLE PRECISION)
RETURNS TABLE (ord INT, group_id TEXT, held BOOLEAN)
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT p_ords[r.n]::INT, r.group_id, r.held
        FROM harel_extend_many(p_groups, p_seqs, p_tokens, p_lease)
             WITH ORDINALITY AS r(group_id, held, n) $$;

-- harel_px_dead_letters is harel_dead_letters.
CREATE OR REPLACE FUNCTION harel_px_dead_letters(
    p_group TEXT,
    p_after BIGINT,
    p_limit INT)
RETURNS TABLE (seq BIGINT, group_id TEXT, event TEXT, priority INT, attempts INT,
               last_error TEXT, published_at TIMESTAMPTZ, died_at TIMESTAMPTZ)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT * FROM harel_dead_letters(p_group, p_after, p_limit) $$;

-- harel_px_redrive is harel_redrive (p_purge false) or
-- harel_purge_dead_letters.
CREATE OR REPLACE FUNCTION harel_px_redrive(
    p_group TEXT,
    p_seqs  BIGINT[],
    p_purge BOOLEAN)
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF p_purge THEN
        RETURN harel_purge_dead_letters(p_group, p_seqs);
    END IF;
    RETURN harel_redrive(p_group, p_seqs);
END
$$;

-- harel_px_stats is harel_stats.
CREATE OR REPLACE FUNCTION harel_px_stats(p_now DOUBLE PRECISION)
RETURNS TABLE (priority INT, groups BIGINT, free BIGINT, leased BIGINT, parked BIGINT,
               stopped BIGINT, paused BIGINT, messages BIGINT, messages_exact BOOLEAN,
               oldest_head_age DOUBLE PRECISION, oldest_head_exact BOOLEAN,
               dead_letters BIGINT, dead_letters_exact BOOLEAN, waiters BIGINT,
               at TIMESTAMPTZ, groups_exact BOOLEAN)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT * FROM harel_stats(p_now) $$;

-- harel_px_groups is harel_groups.
CREATE OR REPLACE FUNCTION harel_px_groups(
    p_now    DOUBLE PRECISION,
    p_state  TEXT,
    p_order  TEXT,
    p_offset INT,
    p_limit  INT)
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT * FROM harel_groups(p_now, p_state, p_order, p_offset, p_limit) $$;

-- Growing (version 14, issue 18). A cluster of N partitions grows to 2N:
-- partition i keeps its groups whose hashtext & (2N - 1) is i, and new
-- partition i + N is the home of those whose is i + N. Nothing is copied
-- between databases. A moving group stays where it is while it has
-- anything there (harel_holds: its row, so its messages and any lease; a
-- dead letter; a kept state; a dedup key in its window) and lives in its
-- new home from the first publish after it has nothing left: it drains in
-- place, so at every moment its order, its one holder, its state and its
-- keys are in one database.
--
-- The fence is here, in the old partition, not in the routers: harel_grow
-- arms each partition with the new count, and from then on a message for a
-- group whose home is another partition is refused (PT010) unless the
-- group still has something here (harel_stays). A group that had nothing
-- here at a refusal never has anything here again (only an accepted
-- message gives it a row), so a router that was refused publishes in the
-- new home, and a router with the old map (a client not yet reopened) is
-- refused rather than creating the group in the old place. Routers ask
-- the old home first: the proxy does (proxy.sql, "Growing"), the Go
-- Cluster does, and so must a client that speaks to the partitions itself.
-- Seqs keep naming their partition (seq & 1023), so lease calls need no
-- change. harel_grown ends the growth once no partition holds anything of
-- a group whose home is elsewhere (harel_strays).

-- harel_holds is whether p_group has anything here: a row, a message, a
-- dead letter, a kept state or a dedup key that has not expired. Routers
-- read it (harel_here) to find a moving group; it decides nothing.
CREATE OR REPLACE FUNCTION harel_holds(p_group TEXT)
RETURNS BOOLEAN
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT EXISTS (SELECT 1 FROM transport_groups AS g WHERE g.group_id = p_group)
          OR EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = p_group)
          OR EXISTS (SELECT 1 FROM transport_dead_letters AS d WHERE d.group_id = p_group)
          OR EXISTS (SELECT 1 FROM transport_kept_states AS k
                      WHERE k.group_id = p_group AND k.keep_until > date_part('epoch', clock_timestamp()))
          OR EXISTS (SELECT 1 FROM transport_dedup AS k
                      WHERE k.group_id = p_group AND k.expires_at > date_part('epoch', clock_timestamp())) $$;

-- harel_here is those of p_groups that have anything here (harel_holds).
CREATE OR REPLACE FUNCTION harel_here(p_groups TEXT[])
RETURNS SETOF TEXT
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT DISTINCT g FROM unnest(p_groups) AS g WHERE harel_holds(g) $$;

-- harel_stays decides whether a message of p_group may be stored in this
-- partition, partition p_part of p_parts: yes for its own groups (and for
-- a NULL or invalid id, which the insert then refuses as always); for
-- another's, only if the group still has something here, decided so that
-- two publishers can never decide differently:
--   the group's row, seen after taking the lost-publish guard (so no
--   drain deletes it before this transaction ends); under a snapshot
--   older than the statement (REPEATABLE READ and up) the row is also
--   locked, so one deleted since is a serialization failure;
--   with no row, the group's publishers decide one at a time (an
--   advisory lock on the group's hash, held to commit: only they create
--   a moving group's row), because what else keeps a group here goes
--   without the guard (a dead letter purged, a kept state or key
--   expiring): the row is looked for again (under READ COMMITTED, a
--   fresh look sees one a publisher committed meanwhile), then dead
--   letters, a kept state or a key in its window keep the group here,
--   each locked so that it stays until commit.
-- Under a snapshot older than the statement, a "no" cannot be trusted
-- (what keeps the group here may have come after the snapshot), so it is
-- a serialization failure (40001) instead: retry the transaction. Once it
-- says no for a group it says no for it forever: nothing but an accepted
-- message gives a group something here.
CREATE OR REPLACE FUNCTION harel_stays(p_group TEXT, p_parts INT, p_part INT)
RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_now   DOUBLE PRECISION := date_part('epoch', clock_timestamp());
    v_fresh BOOLEAN := current_setting('transaction_isolation') = 'read committed';
BEGIN
    IF p_parts IS NULL OR p_group IS NULL OR octet_length(p_group) NOT BETWEEN 1 AND 1024
       OR hashtext(p_group) & (p_parts - 1) = p_part THEN
        RETURN true;
    END IF;
    PERFORM harel_share_guard(p_group);
    IF v_fresh THEN
        PERFORM 1 FROM transport_groups AS g WHERE g.group_id = p_group;
    ELSE
        PERFORM 1 FROM transport_groups AS g WHERE g.group_id = p_group FOR KEY SHARE;
    END IF;
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock(-1 - harel_guard_class(), hashtext(p_group));
    IF v_fresh THEN
        PERFORM 1 FROM transport_groups AS g WHERE g.group_id = p_group;
        IF FOUND THEN
            RETURN true;
        END IF;
    END IF;
    PERFORM 1 FROM transport_dead_letters AS d WHERE d.group_id = p_group LIMIT 1 FOR KEY SHARE;
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM 1 FROM transport_kept_states AS k WHERE k.group_id = p_group AND k.keep_until > v_now FOR KEY SHARE;
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM 1 FROM transport_dedup AS k WHERE k.group_id = p_group AND k.expires_at > v_now LIMIT 1 FOR KEY SHARE;
    IF FOUND THEN
        RETURN true;
    ELSIF NOT v_fresh THEN
        RAISE EXCEPTION 'pgtransport: group % may have left this partition; a snapshot older than this statement cannot tell', p_group
            USING ERRCODE = '40001', HINT = 'Retry the transaction (or publish under READ COMMITTED).';
    END IF;
    RETURN false;
END
$$;

-- harel_moved raises the fence's refusal (PT010) of a message of p_group
-- in partition p_part of p_parts.
CREATE OR REPLACE FUNCTION harel_moved(p_group TEXT, p_parts INT, p_part INT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RAISE EXCEPTION 'pgtransport: group % lives in partition % now: the cluster grew to % partitions and the group has nothing left in partition %',
          p_group, hashtext(p_group) & (p_parts - 1), p_parts, p_part
        USING ERRCODE = 'PT010',
              HINT = 'Publish it in its new partition: reopen the client with the grown cluster''s map (a proxy routes by itself).';
END
$$;

-- harel_armed is this partition's count and number once nothing can arm
-- it or end its growth under the caller: it takes the messages table's
-- ROW EXCLUSIVE lock first (as any insert does), which harel_grow's
-- trigger and harel_grown's count wait for, so a decision made on what it
-- reads holds until the caller's transaction ends. parts is NULL on a
-- partition never armed.
CREATE OR REPLACE FUNCTION harel_armed(OUT parts INT, OUT part INT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    LOCK TABLE transport_messages IN ROW EXCLUSIVE MODE;
    SELECT p.parts, p.part INTO parts, part FROM transport_partition AS p;
END
$$;

-- harel_left is those of p_groups whose home is another partition and
-- that have nothing left here, decided as the fence decides (harel_stays,
-- in group order): a router may publish them in their new home from then
-- on. Nothing on a partition never armed.
CREATE OR REPLACE FUNCTION harel_left(p_groups TEXT[])
RETURNS SETOF TEXT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    m RECORD;
BEGIN
    SELECT * INTO m FROM harel_armed();
    IF m.parts IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT d.g
                   FROM (SELECT DISTINCT g FROM unnest(p_groups) AS g
                          WHERE g IS NOT NULL AND hashtext(g) & (m.parts - 1) <> m.part ORDER BY g) AS d
                  WHERE NOT harel_stays(d.g, m.parts, m.part);
END
$$;

-- harel_fence refuses (harel_moved) a publish of p_groups in which a
-- group whose home is another partition has nothing left here, deciding
-- each such group in group order; nothing when this partition is not
-- armed. harel_publish_keyed calls it before it writes its keys (they
-- would keep the group here).
CREATE OR REPLACE FUNCTION harel_fence(p_groups TEXT[])
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_gone TEXT;
    m      RECORD;
BEGIN
    SELECT l INTO v_gone FROM harel_left(p_groups) AS l LIMIT 1;
    IF v_gone IS NOT NULL THEN
        SELECT * INTO m FROM harel_armed();
        PERFORM harel_moved(v_gone, m.parts, m.part);
    END IF;
END
$$;

-- harel_home is the fence, a row trigger BEFORE each message insert (after
-- the guard's, which its name sorts after) that harel_grow creates with
-- this partition's count and number as arguments: a message of a group
-- whose home is another partition is refused with PT010 unless
-- harel_stays keeps it here. Its own groups cost one hash. Pins
-- search_path alone, as harel_hold_group (its body reads no table).
CREATE OR REPLACE FUNCTION harel_home()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.group_id IS NULL OR hashtext(NEW.group_id) & (TG_ARGV[0]::INT - 1) = TG_ARGV[1]::INT THEN
        RETURN NEW;  -- its own group: one hash, no call
    END IF;
    IF NOT harel_stays(NEW.group_id, TG_ARGV[0]::INT, TG_ARGV[1]::INT) THEN
        PERFORM harel_moved(NEW.group_id, TG_ARGV[0]::INT, TG_ARGV[1]::INT);
    END IF;
    RETURN NEW;
END
$$;

-- harel_grow arms this partition for a cluster grown from p_from
-- partitions to p_to = 2 * p_from: it records both and creates the fence
-- (the trigger above). Creating the trigger waits for every transaction
-- that is inserting messages here to end, so none can create a moving
-- group's row unfenced once this commits. A new partition (its number
-- p_from or more) must be empty. Run on every partition, new ones too,
-- before any router sends a moving group to its new home (the proxy's
-- harel_px_grow does it in that order); again with the same counts it
-- changes nothing. Refused (22023): counts that are not a power of two and
-- its double, an unnumbered partition, one the new count does not
-- include, and a partition still growing from another count (finish that
-- growth first: harel_grown). Needs the schema's owner (a trigger).
CREATE OR REPLACE FUNCTION harel_grow(p_from INT, p_to INT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    r RECORD;
BEGIN
    IF p_from IS NULL OR p_from < 1 OR p_from & (p_from - 1) <> 0 OR p_to IS DISTINCT FROM p_from * 2 OR p_to > 1024 THEN
        RAISE EXCEPTION 'harel_grow: a cluster grows from a power of two to its double, at most 1024 (% to %)', p_from, p_to
            USING ERRCODE = '22023';
    END IF;
    LOCK TABLE transport_partition IN EXCLUSIVE MODE;
    SELECT p.part, p.parts, p.grown_from INTO r FROM transport_partition AS p;
    IF r.part IS NULL THEN
        RAISE EXCEPTION 'harel_grow: this database is not numbered (harel_partition)' USING ERRCODE = '22023';
    ELSIF r.part >= p_to THEN
        RAISE EXCEPTION 'harel_grow: this is partition %, outside a cluster of %', r.part, p_to USING ERRCODE = '22023';
    ELSIF r.parts = p_to AND r.grown_from IS NOT DISTINCT FROM p_from THEN
        NULL;  -- armed already: the trigger is made again below, alike
    ELSIF r.grown_from IS NOT NULL THEN
        RAISE EXCEPTION 'harel_grow: this partition is still growing from % to % partitions; finish that first (harel_grown)', r.grown_from, r.parts
            USING ERRCODE = '22023';
    ELSIF r.part < p_from AND r.parts IS DISTINCT FROM p_from AND r.parts IS NOT NULL THEN
        RAISE EXCEPTION 'harel_grow: this partition is one of %, not of %', r.parts, p_from USING ERRCODE = '22023';
    ELSIF r.part >= p_from AND (EXISTS (SELECT 1 FROM transport_messages) OR EXISTS (SELECT 1 FROM transport_dead_letters)
                                OR EXISTS (SELECT 1 FROM transport_groups) OR EXISTS (SELECT 1 FROM transport_kept_states)
                                OR EXISTS (SELECT 1 FROM transport_dedup)) THEN
        RAISE EXCEPTION 'harel_grow: partition % is new in a cluster of % and must be empty', r.part, p_to USING ERRCODE = '22023';
    END IF;
    UPDATE transport_partition SET parts = p_to, grown_from = p_from;
    -- Making the trigger waits for the inserts in flight, and every later
    -- insert waits for it: at most 5 s, then run it again.
    PERFORM set_config('lock_timeout', '5s', true);
    -- A trigger made for another count is replaced, which takes an
    -- exclusive lock on the messages table (claims wait for every open
    -- transaction on it to end); the first is only created.
    IF EXISTS (SELECT 1 FROM pg_trigger AS t
                WHERE t.tgrelid = 'transport_messages'::regclass AND t.tgname = 'transport_messages_home') THEN
        IF r.parts = p_to THEN
            RETURN;  -- armed for this count already
        END IF;
        DROP TRIGGER transport_messages_home ON transport_messages;
    END IF;
    EXECUTE format('CREATE TRIGGER transport_messages_home BEFORE INSERT ON transport_messages '
                   'FOR EACH ROW EXECUTE FUNCTION harel_home(%L, %L)', p_to, r.part);
END
$$;

-- harel_strays counts, in this partition, what groups whose home is
-- another partition still hold here (what keeps them here, harel_holds):
-- all zero when the partition is not armed or has let them all go.
CREATE OR REPLACE FUNCTION harel_strays()
RETURNS TABLE (groups BIGINT, dead_letters BIGINT, kept_states BIGINT, dedup_keys BIGINT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
    WITH p AS (SELECT p.part, p.parts FROM transport_partition AS p WHERE p.parts IS NOT NULL),
         now AS (SELECT date_part('epoch', clock_timestamp()) AS t)
    SELECT (SELECT count(*) FROM transport_groups AS g, p WHERE hashtext(g.group_id) & (p.parts - 1) <> p.part),
           (SELECT count(*) FROM transport_dead_letters AS d, p WHERE hashtext(d.group_id) & (p.parts - 1) <> p.part),
           (SELECT count(*) FROM transport_kept_states AS k, p, now
             WHERE k.keep_until > now.t AND hashtext(k.group_id) & (p.parts - 1) <> p.part),
           (SELECT count(*) FROM transport_dedup AS k, p, now
             WHERE k.expires_at > now.t AND hashtext(k.group_id) & (p.parts - 1) <> p.part)
$$;

-- harel_grown ends this partition's growth: refused (55000) while it holds
-- anything of another partition's group (harel_strays), else the count it
-- grew from is forgotten. The fence stays: it refuses other partitions'
-- groups for good. Without a growth under way it changes nothing.
CREATE OR REPLACE FUNCTION harel_grown()
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    s RECORD;
BEGIN
    -- Publishes in flight, accepted by what has expired since, end first
    -- (every later insert waits meanwhile: at most 5 s, then try again).
    PERFORM set_config('lock_timeout', '5s', true);
    LOCK TABLE transport_messages IN SHARE MODE;
    SELECT * INTO s FROM harel_strays();
    IF s.groups + s.dead_letters + s.kept_states + s.dedup_keys > 0 THEN
        RAISE EXCEPTION 'harel_grown: moving groups still have % group rows, % dead letters, % kept states and % dedup keys here',
              s.groups, s.dead_letters, s.kept_states, s.dedup_keys
            USING ERRCODE = '55000',
                  HINT = 'Rows drain as their messages are handled; kept states and keys expire; dead letters wait for a redrive (which drains them here) or a purge.';
    END IF;
    UPDATE transport_partition SET grown_from = NULL WHERE grown_from IS NOT NULL;
END
$$;

-- harel_partition_map is this partition's view of its cluster: its number,
-- the count it was armed for (NULL: never grown, the count the proxy was
-- checked with) and, while growing, the count it grew from.
CREATE OR REPLACE FUNCTION harel_partition_map()
RETURNS TABLE (part INT, parts INT, grown_from INT, version INT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT p.part, p.parts, p.grown_from, (SELECT max(v.version) FROM transport_schema_version AS v)
        FROM (SELECT 1) AS one LEFT JOIN transport_partition AS p ON true $$;

-- The proxy's calls of version 14: a growing cluster's (functions above,
-- "Growing") and the calls that name one group, which the proxy routes to
-- the partition that holds the group now (proxy.sql, harel_px_locate).

-- harel_px_partition_map is harel_partition_map.
CREATE OR REPLACE FUNCTION harel_px_partition_map(p_part INT)
RETURNS TABLE (part INT, parts INT, grown_from INT, version INT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT * FROM harel_partition_map() $$;

-- harel_px_here is harel_here.
CREATE OR REPLACE FUNCTION harel_px_here(p_part INT, p_groups TEXT[])
RETURNS SETOF TEXT
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT * FROM harel_here(p_groups) $$;

-- harel_px_arm is harel_grow.
CREATE OR REPLACE FUNCTION harel_px_arm(p_part INT, p_from INT, p_to INT)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT true FROM harel_grow(p_from, p_to) $$;

-- harel_px_strays is harel_strays.
CREATE OR REPLACE FUNCTION harel_px_strays(p_part INT)
RETURNS TABLE (groups BIGINT, dead_letters BIGINT, kept_states BIGINT, dedup_keys BIGINT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT * FROM harel_strays() $$;

-- harel_px_settle is harel_grown.
CREATE OR REPLACE FUNCTION harel_px_settle(p_part INT)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT true FROM harel_grown() $$;

-- harel_px_on_X is harel_X, for the proxy's located calls.
CREATE OR REPLACE FUNCTION harel_px_on_nack(p_part INT, p_group TEXT, p_token TEXT, p_now DOUBLE PRECISION, p_delay DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT harel_nack(p_group, p_token, p_now, p_delay) $$;

CREATE OR REPLACE FUNCTION harel_px_on_extend(p_part INT, p_group TEXT, p_token TEXT, p_lease DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT harel_extend(p_group, p_token, p_lease) $$;

CREATE OR REPLACE FUNCTION harel_px_on_release(p_part INT, p_group TEXT, p_token TEXT)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT harel_release(p_group, p_token) $$;

CREATE OR REPLACE FUNCTION harel_px_on_restart_group(p_part INT, p_group TEXT, p_skip_head BOOLEAN)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT harel_restart_group(p_group, p_skip_head) $$;

CREATE OR REPLACE FUNCTION harel_px_on_state(p_part INT, p_group TEXT)
RETURNS BYTEA
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT harel_state(p_group) $$;

CREATE OR REPLACE FUNCTION harel_px_on_group(p_part INT, p_now DOUBLE PRECISION, p_group TEXT)
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT * FROM harel_group(p_now, p_group) $$;

CREATE OR REPLACE FUNCTION harel_px_on_peek(p_part INT, p_group TEXT, p_after BIGINT, p_limit INT)
RETURNS TABLE (seq BIGINT, event TEXT, published_at TIMESTAMPTZ, last_error TEXT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT * FROM harel_peek(p_group, p_after, p_limit) $$;

CREATE OR REPLACE FUNCTION harel_px_on_pause_group(p_part INT, p_group TEXT)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT harel_pause_group(p_group) $$;

CREATE OR REPLACE FUNCTION harel_px_on_resume_group(p_part INT, p_group TEXT)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT harel_resume_group(p_group) $$;

CREATE OR REPLACE FUNCTION harel_px_on_purge_group(p_part INT, p_group TEXT, p_now DOUBLE PRECISION, p_limit INT)
RETURNS BIGINT
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT harel_purge_group(p_group, p_now, p_limit) $$;

-- The inlined helpers run with the caller's privileges (every function here
-- is SECURITY INVOKER), so a worker role needs EXECUTE on them as on the
-- protocol's functions. PostgreSQL grants that to PUBLIC when a function is
-- created, unless default privileges revoke it; then schema.Grants, run
-- before an upgrade added a helper, would not cover it, and the worker's
-- next publish would fail. They compute a hash, a lock key and a group's
-- state from its arguments, and take the guard's advisory locks, which any
-- role may take anyway (pg_advisory_lock is PUBLIC's), so PUBLIC may
-- always execute them.
GRANT EXECUTE ON FUNCTION
    harel_group_lock_key(TEXT),
    harel_guard_class(),
    harel_try_guard(TEXT),
    harel_share_guard(TEXT),
    harel_clock_skewed(DOUBLE PRECISION),
    harel_group_state(TEXT, DOUBLE PRECISION, BOOLEAN, DOUBLE PRECISION)
    TO PUBLIC;

-- Roles granted access before an upgrade keep working after it. A role
-- given schema.Grants before version 10 has no privilege on the tables
-- version 10 added, which a claim may write (a dead letter) and a publish
-- with a key must (and, since version 12, on transport_kept_states, which
-- any delete of a group row with a state may write, and on the claim's
-- floor sequences, which every claim reads; since version 13, read on
-- transport_partition, which a proxy's check reads); and where the
-- owner's default privileges revoke EXECUTE
-- from PUBLIC, none on the functions it added. So every role that may
-- update transport_groups (PUBLIC aside) gets the same on the tables
-- added since, and every role that may execute harel_claim may execute
-- every function here (the harel_ functions of this schema, and no
-- other). Runs with each version change; GRANT of what is
-- held already changes nothing.
DO $pgtransport$
DECLARE
    r RECORD;
BEGIN
    FOR r IN
        SELECT DISTINCT quote_ident(pg_get_userbyid(a.grantee)) AS role
          FROM pg_class AS c, aclexplode(c.relacl) AS a
         WHERE c.oid = 'transport_groups'::regclass
           AND a.privilege_type = 'UPDATE' AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON transport_dead_letters, transport_dedup, transport_kept_states TO ' || r.role;
        EXECUTE 'GRANT SELECT ON transport_policy, transport_partition TO ' || r.role;
        EXECUTE 'GRANT SELECT, UPDATE ON SEQUENCE transport_groups_arrival, transport_claim_new, transport_claim_floor, transport_claim_held, transport_claim_sweep TO ' || r.role;
    END LOOP;
    FOR r IN
        SELECT DISTINCT quote_ident(pg_get_userbyid(a.grantee)) AS role
          FROM pg_proc AS p, aclexplode(p.proacl) AS a
         WHERE p.oid = 'harel_claim(double precision, double precision, text, integer)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        -- The queue's functions only (harel_ in this schema), never
        -- others that share the schema.
        EXECUTE (SELECT 'GRANT EXECUTE ON FUNCTION ' || string_agg(p.oid::regprocedure::text, ', ') || ' TO ' || r.role
                   FROM pg_proc AS p
                  WHERE p.pronamespace = (SELECT c.relnamespace FROM pg_class AS c WHERE c.oid = 'transport_groups'::regclass)
                    AND p.proname LIKE 'harel\_%');
    END LOOP;
END
$pgtransport$;
