-- 007_index_plans.sql: the functions reach rows through indexes, whatever
-- the statistics say.
--
-- These functions run generic plans (plan_cache_mode), each made once per
-- connection from the statistics of that moment. A queue's tables are often
-- never analyzed while they grow from empty (autovacuum off, or not yet
-- run): planned as tiny, "WHERE group_id = ANY (array)" became a sequential
-- scan testing every row against every element. Leasing 1,000 groups out
-- of 20,000 took 200 ms (auto_explain, BenchmarkAckMany freed/batch=1000).
-- Every statement in them is meant to reach its rows by an index (the
-- primary keys, the round-robin index, the group index), so
-- enable_seqscan = off, for their duration only, keeps the planner on
-- those paths. And jit = off: a plan priced with a disabled scan in it
-- (the waiters check of the wake-up trigger has no other way) costs more
-- than jit_above_cost, and compiling it took 85 ms a publish. A later file
-- that replaces one of these functions must set both again.
-- Idempotent.
ALTER FUNCTION harel_claim(DOUBLE PRECISION, DOUBLE PRECISION, TEXT, INT) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION harel_ack(TEXT, BIGINT, TEXT, DOUBLE PRECISION) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION harel_publish(TEXT, TEXT, INT) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION harel_nack(TEXT, TEXT, DOUBLE PRECISION, DOUBLE PRECISION) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION harel_extend(TEXT, TEXT, DOUBLE PRECISION) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION harel_wait(TEXT, INT, DOUBLE PRECISION, DOUBLE PRECISION) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION harel_publish_many(TEXT[], TEXT[], INT[]) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION harel_claim_many(DOUBLE PRECISION, DOUBLE PRECISION, TEXT, INT, INT) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION harel_ack_many(TEXT[], BIGINT[], TEXT[], BOOLEAN[], DOUBLE PRECISION, DOUBLE PRECISION) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION harel_exchange(DOUBLE PRECISION, DOUBLE PRECISION, TEXT, INT, INT, TEXT[], BIGINT[], TEXT[], BOOLEAN[]) SET enable_seqscan = off SET jit = off;
