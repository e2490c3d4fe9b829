-- 80_wakeups.sql: wake idle consumers with LISTEN/NOTIFY, and only them.
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
-- wake at the earliest park end they saw when they went idle (harel_wait),
-- or at their sweep (a lapsed lease too).

-- harel_channel is the NOTIFY channel of this schema's queue: named after
-- the groups table's oid, so two queues in one database never wake each
-- other, and always a valid identifier.
CREATE OR REPLACE FUNCTION harel_channel()
RETURNS TEXT
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
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
SET enable_bitmapscan = off
SET enable_mergejoin = off
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
-- (server clock) and returns the earliest end after p_now of a timed park
-- (a backoff, a nack's or snooze's delay) of a group at or above
-- p_min_priority (NULL if none): when the consumer must look
-- again even if no notification comes. It also clears rows of consumers
-- that stopped refreshing a minute ago, and, for a consumer of every
-- priority, reaps 64 slots of kept rows (harel_reap, 30_claim.sql): a
-- stream's exchange that leased nothing leaves the reap to it, so that
-- the reaped rows' guard buckets are held for this short transaction
-- only (version 24).
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
SET enable_bitmapscan = off
SET enable_mergejoin = off
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
    IF p_min_priority <= 0 THEN
        PERFORM harel_reap(p_now, 64);
    END IF;
    -- The first end after now of a timed park (a failed head's backoff,
    -- a nack's or snooze's delay: the due index; a stopped group, never
    -- due, is not in it). A lease that lapses (its holder died) is not
    -- announced: the consumer's own sweep (Config.IdleSweep) finds it.
    SELECT g.retry_at INTO v_next
      FROM transport_groups AS g
     WHERE g.retry_at > p_now AND g.priority >= p_min_priority AND NOT g.paused
     ORDER BY g.retry_at
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
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$ DELETE FROM transport_waiters WHERE waiter = p_waiter $$;
