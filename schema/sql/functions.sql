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
--     keys, the round-robin index, the group index); with sequential scans
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
-- with 8, the entry checks (see there) with 9.


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
--   PT001 is not used: an ack of a message that is not its group's head
--     is still accepted. The server does not record which message a claim
--     handed out, and two publishes to one group that overlap make a
--     claim hand out a higher seq while a lower one is uncommitted: that
--     ack is legitimate, and refusing every ack behind the head would
--     refuse it too. Recording the handed-out seq belongs with the claim's
--     own write of the group row (delivery attempts, issue 13).
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

-- harel_claim leases the claimable group that was served longest ago (never
-- served first) and returns its head: zero rows when nothing at or above
-- p_min_priority is claimable.
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
AS $$
#variable_conflict use_column
DECLARE
    v_group TEXT;
    v_held  TEXT[] := '{}';  -- empty groups a publisher still holds: skip this call
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
    LOOP
        -- FOR NO KEY UPDATE: the key never changes, and no stronger lock is
        -- needed (the lost-publish guard above does not use row locks).
        UPDATE transport_groups AS g
           SET locked_by = p_token, lock_expiry = p_lease
         WHERE g.group_id = (
                 SELECT c.group_id
                   FROM transport_groups AS c
                  WHERE (c.locked_by IS NULL OR c.lock_expiry < p_now)
                    AND c.priority >= p_min_priority
                    AND c.group_id <> ALL (v_held)
                  ORDER BY COALESCE(c.lock_expiry, 0), c.group_id
                  LIMIT 1
                    FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING g.group_id INTO v_group;
        IF v_group IS NULL THEN
            RETURN;
        END IF;

        -- A statement of its own, so a snapshot taken after the lock: the head
        -- as it is now, never one that an earlier holder has just acked.
        RETURN QUERY
            SELECT m.group_id, m.seq, m.event
              FROM transport_messages AS m
             WHERE m.group_id = v_group
             ORDER BY m.seq
             LIMIT 1;
        IF FOUND THEN
            RETURN;
        END IF;

        -- An empty group row. Delete it only if no publisher is mid-
        -- transaction on it: a publisher holds the group's lock (shared;
        -- see harel_hold_group) from its message insert until it commits,
        -- and its message is invisible to us until then.
        IF harel_try_guard(v_group) THEN
            RETURN QUERY
                SELECT m.group_id, m.seq, m.event
                  FROM transport_messages AS m
                 WHERE m.group_id = v_group
                 ORDER BY m.seq
                 LIMIT 1;
            IF FOUND THEN
                RETURN;  -- a publisher committed meanwhile
            END IF;
            DELETE FROM transport_groups AS g WHERE g.group_id = v_group;
        ELSE
            UPDATE transport_groups AS g
               SET locked_by = NULL, lock_expiry = p_now
             WHERE g.group_id = v_group;
            v_held := v_held || v_group;
        END IF;
    END LOOP;
END
$$;

-- harel_claim_many leases up to p_limit claimable groups (priority >=
-- p_min_priority, served longest ago first) to one token and returns the
-- head of each. Every lease is fenced on its own group row, so one token
-- for the batch is enough: an ack names the group and the token.
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
AS $$
#variable_conflict use_column
DECLARE
    v_groups TEXT[];
    v_empty  TEXT[];
    v_gone   TEXT[];
    r        RECORD;
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
    -- Pick, then lease by primary key: every statement here reaches rows
    -- through an index (= ANY of an array), whatever the plan guesses
    -- about the array's size.
    SELECT array_agg(c.group_id) INTO v_groups
      FROM (SELECT c.group_id
              FROM transport_groups AS c
             WHERE (c.locked_by IS NULL OR c.lock_expiry < p_now)
               AND c.priority >= p_min_priority
             ORDER BY COALESCE(c.lock_expiry, 0), c.group_id
             LIMIT p_limit
               FOR NO KEY UPDATE SKIP LOCKED) AS c;
    UPDATE transport_groups AS g
       SET locked_by = p_token, lock_expiry = p_lease
     WHERE g.group_id = ANY (v_groups);
    IF v_groups IS NULL THEN
        RETURN;
    END IF;

    -- The heads, in a statement of their own: a snapshot taken after the
    -- locks, never a head an earlier holder has just acked.
    FOR r IN
        SELECT u.gid, h.seq, h.event
          FROM unnest(v_groups) AS u(gid)
          LEFT JOIN LATERAL (
                SELECT m.seq, m.event
                  FROM transport_messages AS m
                 WHERE m.group_id = u.gid
                 ORDER BY m.seq
                 LIMIT 1) AS h ON true
    LOOP
        IF r.seq IS NULL THEN
            v_empty := v_empty || r.gid;
        ELSE
            group_id := r.gid; seq := r.seq; event := r.event;
            RETURN NEXT;
        END IF;
    END LOOP;
    IF v_empty IS NULL THEN
        RETURN;
    END IF;

    -- Empty group rows: the same guard as harel_claim. Delete those no
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
         WHERE g.group_id = p_group AND g.locked_by = p_token
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
         WHERE g.group_id = p_group AND g.locked_by = p_token
           AND EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = p_seq AND m.group_id = p_group);
        IF NOT FOUND THEN
            RETURN false;
        END IF;
    END IF;
    DELETE FROM transport_messages AS m
     WHERE m.seq = p_seq AND m.group_id = p_group;
    RETURN true;
END
$$;

-- harel_exchange is a worker's whole round-trip: settle a batch of leases
-- as harel_ack_many describes, then lease up to p_limit more groups minus
-- those kept (harel_claim_many), in one transaction. Rows: kind 'a' per
-- settled lease, in input order (held, and the next head if kept), then
-- kind 'c' per new lease. The settling lives here, and harel_ack_many
-- calls this, so that a stream's round-trip runs one function less.
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
               count(*) FILTER (WHERE x.first AND x.seq IS NULL) > 0
          INTO v_first, v_next, v_events, v_drained
          FROM (SELECT u.i, h.seq, h.event,
                       row_number() OVER (PARTITION BY u.gid ORDER BY u.i) = 1 AS first
                  FROM unnest(p_groups, p_seqs) WITH ORDINALITY AS u(gid, s, i)
                  LEFT JOIN LATERAL (
                        SELECT m.seq, m.event
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
                 WHERE a.locked AND g.group_id = a.gid AND g.locked_by = a.tok
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
        -- and whose answer was lost, and it gets the same next message.
        WITH fenced AS (
            UPDATE transport_groups AS g
               SET locked_by   = CASE WHEN a.keep AND a.nxt IS NOT NULL THEN g.locked_by END,
                   lock_expiry = CASE WHEN a.keep AND a.nxt IS NOT NULL THEN p_lease ELSE p_now END
              FROM unnest(p_groups, p_seqs, p_tokens, p_keep, v_next, v_first) WITH ORDINALITY AS a(gid, s, tok, keep, nxt, first, i)
             WHERE a.first AND g.group_id = a.gid AND g.locked_by = a.tok
               AND ((a.keep AND a.nxt IS NOT NULL)
                    OR EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.seq = a.s AND m.group_id = a.gid))
            RETURNING a.i, a.keep AND a.nxt IS NOT NULL AS kept, g.group_id, a.s
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
                   CASE WHEN h.kept THEN a.nxt END, CASE WHEN h.kept THEN a.event END
              FROM unnest(p_groups, v_next, v_events) WITH ORDINALITY AS a(gid, nxt, event, i)
              LEFT JOIN unnest(v_at, v_kept) AS h(i, kept) ON h.i = a.i
             ORDER BY a.i;
    END IF;
    IF p_limit - v_nkept > 0 THEN
        RETURN QUERY
            SELECT 'c'::"char", c.group_id, true, c.seq, c.event
              FROM harel_claim_many(p_now, p_lease, p_token, p_min_priority, p_limit - v_nkept) AS c;
    END IF;
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
          FROM harel_exchange(p_now, p_lease, NULL, 0, 0, p_groups, p_seqs, p_tokens, p_keep)
               WITH ORDINALITY AS e(kind, group_id, held, seq, event, n)
         ORDER BY e.n;
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
         WHERE g.group_id = p_group AND g.locked_by = p_token;
    ELSE
        UPDATE transport_groups AS g
           SET locked_by = NULL, lock_expiry = NULL
         WHERE g.group_id = p_group AND g.locked_by = p_token;
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
     WHERE g.group_id = p_group AND g.locked_by = p_token;
    RETURN FOUND;
END
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
-- (server clock) and returns the earliest lock_expiry after p_now of a leased or parked group
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
    -- Walks the round-robin index from p_now: free groups sit at or before
    -- now (their lock_expiry is when they were freed), so the first locked
    -- row past now is the answer.
    SELECT g.lock_expiry INTO v_next
      FROM transport_groups AS g
     WHERE COALESCE(g.lock_expiry, 0) > p_now
       AND g.locked_by IS NOT NULL
       AND g.priority >= p_min_priority
     ORDER BY COALESCE(g.lock_expiry, 0), g.group_id
     LIMIT 1;
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

-- The inlined helpers run with the caller's privileges (every function here
-- is SECURITY INVOKER), so a worker role needs EXECUTE on them as on the
-- protocol's functions. PostgreSQL grants that to PUBLIC when a function is
-- created, unless default privileges revoke it; then schema.Grants, run
-- before an upgrade added a helper, would not cover it, and the worker's
-- next publish would fail. They compute a hash and a lock key and take the
-- guard's advisory locks, which any role may take anyway (pg_advisory_lock
-- is PUBLIC's), so PUBLIC may always execute them.
GRANT EXECUTE ON FUNCTION
    harel_group_lock_key(TEXT),
    harel_guard_class(),
    harel_try_guard(TEXT),
    harel_share_guard(TEXT),
    harel_clock_skewed(DOUBLE PRECISION)
    TO PUBLIC;
