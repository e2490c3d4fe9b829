-- 15_checks.sql: the entry checks (version 9) and the refusals they share.
--
-- Each function refuses, with an error of
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
--   PT011 invalid tenant (version 27): a publish or an operator's call
--     naming a tenant that is empty or longer than 256 bytes.
--   PT012 invalid weight (version 27): harel_set_tenant_weight of a weight
--     NULL or outside 1 to 1,000.
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
-- than the bound. Inlined (see the settings invariant, 10_guard.sql): it
-- runs inside its caller's expression at no call's cost. date_part, not
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

-- The refusals several functions share, each worded once: p_fn is the
-- refusing function's name, which starts the message as it starts every
-- refusal's; code, message and hint are what the inline RAISEs gave
-- (TestRefusalsWordedAsShipped compares every call with version 14's). A
-- caller keeps its check inline and calls the helper only to refuse (IF
-- <check> THEN PERFORM harel_refuse_...; END IF), so a call whose
-- arguments pass never runs one: PL/pgSQL prepares a statement the first
-- time it runs it, and a helper's call and SET clauses are paid only on the
-- way to the error. Measured against the inline RAISEs of version 14
-- (blocks of calls from PL/pgSQL, the two versions alternated, 3 x 150
-- pairs), the median per-call difference was -0.01% for a harel_ack that
-- holds nothing (29 us), -0.2% for a harel_claim of an empty queue
-- (61 us), +0.3% for a harel_exchange of an empty queue (190 us), +0.4%
-- for a publish, harel_claim and harel_ack (280 us) and -3.9% for ten
-- published, claimed by harel_claim_many and settled by harel_exchange
-- (1.3 ms); the helpers' side was the slower in 39 to 51% of the pairs:
-- no cost to measure. They pin the four settings as every other function
-- does.

-- harel_refuse_token: PT002, a claim's p_token is NULL or empty.
CREATE OR REPLACE FUNCTION harel_refuse_token(p_fn TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RAISE EXCEPTION '%: p_token is NULL or empty', p_fn USING ERRCODE = 'PT002';
END
$$;

-- harel_refuse_lease: PT003, a claim's (or a kept lease's) p_lease is NULL
-- or not after p_now.
CREATE OR REPLACE FUNCTION harel_refuse_lease(p_fn TEXT, p_lease DOUBLE PRECISION, p_now DOUBLE PRECISION)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RAISE EXCEPTION '%: the lease end p_lease (%) is not after p_now (%)', p_fn, p_lease, p_now USING ERRCODE = 'PT003';
END
$$;

-- harel_refuse_lease_past: PT003, an extend's p_lease is NULL or before
-- the server's clock by more than the bound.
CREATE OR REPLACE FUNCTION harel_refuse_lease_past(p_fn TEXT, p_lease DOUBLE PRECISION)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RAISE EXCEPTION '%: the lease end p_lease (%) is NULL or in the past', p_fn, p_lease USING ERRCODE = 'PT003';
END
$$;

-- harel_refuse_skew: PT005, p_now is farther from the server's clock than
-- the bound (harel_clock_skewed).
CREATE OR REPLACE FUNCTION harel_refuse_skew(p_fn TEXT, p_now DOUBLE PRECISION)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RAISE EXCEPTION '%: p_now (%) is farther from the server''s clock than pgtransport.max_clock_skew allows', p_fn, p_now
        USING ERRCODE = 'PT005', HINT = 'Pass the server''s clock, extract(epoch FROM clock_timestamp()), or fix the client''s clock.';
END
$$;

-- harel_refuse_group: PT007, an operator's call names a group that has no
-- row.
CREATE OR REPLACE FUNCTION harel_refuse_group(p_fn TEXT, p_group TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RAISE EXCEPTION '%: group % has no row (never published to, or drained)', p_fn, p_group USING ERRCODE = 'PT007';
END
$$;

-- harel_refuse_lengths: 22023 (invalid_parameter_value), a batch call's
-- parallel arrays differ in length.
CREATE OR REPLACE FUNCTION harel_refuse_lengths(p_fn TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RAISE EXCEPTION '%: arrays of different lengths', p_fn USING ERRCODE = '22023';
END
$$;

-- harel_refuse_tenant: PT011, a tenant that is empty or longer than 256
-- bytes.
CREATE OR REPLACE FUNCTION harel_refuse_tenant(p_fn TEXT, p_tenant TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RAISE EXCEPTION '%: a tenant is 1 to 256 bytes, not % bytes', p_fn, octet_length(p_tenant) USING ERRCODE = 'PT011';
END
$$;
