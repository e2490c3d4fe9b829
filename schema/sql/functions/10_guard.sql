-- 10_guard.sql: the rules every file of functions/ follows, then the
-- lost-publish guard (the trigger every message insert runs).
--
-- functions/ holds the live definition of every function and trigger,
-- each once, as it runs, one file per part of the protocol (10_guard.sql
-- to 99_grants.sql). Apply runs the files in name order, after the missing
-- numbered steps and in the same transaction, whenever a database's
-- recorded version is below the library's; schema.Functions and
-- schema.SQL hand out the same text, the files one after the other. A
-- LANGUAGE sql function must come after the functions it calls (its body
-- is checked when it is created), and a trigger after its function;
-- PL/pgSQL bodies are resolved when they first run.
--
-- Why these files beside the numbered ones: the numbered files (NNN_*.sql)
-- are forward-only upgrade steps and hold only what must run once in a
-- database's life (tables, columns, indexes, storage settings; tables.sql
-- shows what they add up to). Until version 8 they defined the functions
-- too, later steps redefining earlier ones, so the code that ran had to be
-- pieced together from several files. These files are instead re-applied
-- whole: what you read here is what runs. Everything is CREATE OR REPLACE
-- (a trigger: DROP TRIGGER IF EXISTS, then CREATE TRIGGER), so it is
-- idempotent. A change to any of them ships with a new numbered step (a
-- comment-only one will do) and a new testdata/schema/vN.sql, so that
-- databases at the previous version pick it up; the schema tests prove
-- that a database upgraded from every shipped version ends with exactly
-- the catalog of a fresh install.
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
-- FUNCTION). Today that is every function but the inlined helpers and two
-- exceptions, harel_hold_group (below) and harel_home (90_growing.sql).
--   search_path FROM CURRENT: Apply runs these files with search_path set to
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
-- The message path (the functions of 20_publish.sql, 25_ready.sql,
-- 30_claim.sql, 40_ack.sql, 50_fail.sql, 55_keyed_publish.sql,
-- 60_nack_extend.sql, 75_state.sql and 80_wakeups.sql) pins two more:
--   enable_bitmapscan = off: its walks are ordered scans that stop at a
--     limit (the sweep's slots, a group's head), and a bitmap scan reads
--     the whole range first (a hot group's every message) and sorts it.
--   enable_mergejoin = off: a merge join reads its sides in order, which
--     for a queue table means an index from end to end.
-- Plans that probe. A queue's messages table is often empty, and an
-- ANALYZE or VACUUM that finds it so records 0 or 1 rows; the planner then
-- prices every index of it at one page, and a generic plan made then (the
-- next call after each autovacuum re-plans) may read an index end to end
-- instead of probing it. Under a held snapshot that index holds an entry
-- for every message since the snapshot began, and such a plan held every
-- stream's exchange at 150-200 ms for the minute until the next ANALYZE
-- (TestPlansProbeAnEmptyLookingQueue). So the message path reaches the
-- queue's rows by probes the planner cannot trade for one read of a whole
-- index: a lookup names its group (transport_messages_group); an EXISTS
-- that names a row of its statement ends in OFFSET 0, and a set of
-- messages is found by a LATERAL subquery that does, each then run once a
-- row (PostgreSQL neither joins, hashes nor flattens such a subquery); and
-- a statement that joins an input array to transport_groups compares
-- group_id = ANY (ARRAY[...]), which no hash join can use, so the primary
-- key is probed once an input (with merge joins off, a fence planned at
-- 20 rows analyzed had hashed a read of all of it).
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
-- 6, the pinned plan settings with 7, the functions in one file
-- (functions.sql) and the guard helpers with 8, the entry checks
-- (15_checks.sql) with 9, delivery attempts, fail, dead letters and keyed
-- publish (30_claim.sql, 50_fail.sql, 55_keyed_publish.sql) with 10, the
-- operator's stats, listings, pause, resume and purge (70_operations.sql)
-- with 11, the per-group state and its ack (75_state.sql) with 12, the
-- partitions' calls (85_partitions.sql) with 13, growing a cluster
-- (90_growing.sql) with 14, with 15 the one file split into these, by
-- section, and each refusal that several functions share worded once
-- (15_checks.sql), the sweep (30_claim.sql) with 16, and with 17 the kept
-- rows of drained groups and what revives them (20_publish.sql).

-- The lost-publish guard. A publish that lands in a group while an ack
-- drains it must not end with its message and no group row: the ack cannot
-- see the uncommitted message. So every message insert first takes a
-- shared transaction-scoped advisory lock on its group's bucket
-- (harel_share_guard, from the trigger below), and a drainer deletes a
-- group row only when it gets that lock exclusively without waiting
-- (harel_try_guard); otherwise it frees the row. (Since version 17 an ack
-- that drains a group keeps its row, marked, and takes no lock: a claim
-- deletes the row later, through this guard; see "Kept rows" in
-- 30_claim.sql.) The key is (the messages
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
