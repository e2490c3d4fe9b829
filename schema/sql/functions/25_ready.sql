-- 25_ready.sql: the ready log (version 20): the entries the claims take,
-- written by triggers on transport_groups, and the frontier the claims
-- read them from.
--
-- The ready log. A group row becomes claimable at once (free, not
-- paused, not marked drained, not due later) when it is created by a
-- publish, freed by an ack or a settle with messages left, or resumed;
-- each time, a trigger appends an entry (transport_ready: its number, the
-- group, its priority). A publish to a drained group's kept row appends
-- the entry itself, the row unwritten (harel_revive, 20_publish.sql;
-- since version 24). The claims take
-- entries in number order (functions/30_claim.sql, "The ready log"), so
-- groups are handed out in the order they became claimable, and a claim
-- reads the entries it takes and the few dead ones just before them, not
-- the rows it cannot take. An entry is a hint, as the drained mark is:
-- the claim locks the group row and checks it, and drops an entry whose
-- group is gone or not claimable (leased since by the sweep, paused);
-- whatever makes it claimable again writes a new one. What makes a group
-- claimable with no entry (a lease or a park that lapses, a message under
-- a wrong drained mark) the sweep finds, as before ("The sweep").
--
-- The frontier. Under a long-held snapshot the entries the claims have
-- deleted stay in the table and its index, and a claim that read the log
-- from its start would pass all of them (about rate × age). So the claims
-- read it from the frontier (transport_ready_front), below which no entry
-- is live or still to commit. Entries commit out of number order, so the
-- frontier moves only past numbers whose writers have all ended: a check
-- is recorded as (R, X), R the last entry number drawn, then X a
-- transaction id taken after reading R. Every writer took its
-- transaction id before drawing its number (the triggers call
-- pg_current_xact_id() first; numbers are drawn one at a time, CACHE 1),
-- so a writer of a number up to R holds an id below X. Once the oldest
-- transaction id running is X or more (pg_snapshot_xmin of the current
-- snapshot), every entry up to R has committed or rolled back, and the
-- frontier moves to the first live entry up to R, or R + 1. Then a new
-- check is recorded. One claim at a time reads and moves it (a
-- transaction-level advisory lock, tried, never waited for). A transaction that holds an
-- id for long (not a read-only one: a snapshot without an id holds the
-- frontier back in nothing) keeps the frontier where it was, and the
-- claims pass the entries taken since: docs/operating.md says what to
-- watch.

-- harel_ready_group_entry is the trigger transport_groups_enqueue: after
-- an update that makes a group row claimable at once, an entry for it.
CREATE OR REPLACE FUNCTION harel_ready_group_entry()
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
    PERFORM pg_current_xact_id();  -- an id before the number (see "The frontier")
    INSERT INTO transport_ready (group_id, priority) VALUES (NEW.group_id, NEW.priority);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS transport_groups_enqueue ON transport_groups;
CREATE TRIGGER transport_groups_enqueue
    AFTER UPDATE ON transport_groups
    FOR EACH ROW
    WHEN (NEW.locked_by IS NULL AND NOT NEW.paused AND NEW.drained_at IS NULL AND NEW.retry_at IS NULL
          AND (OLD.locked_by IS NOT NULL OR OLD.paused OR OLD.drained_at IS NOT NULL OR OLD.retry_at IS NOT NULL))
    EXECUTE FUNCTION harel_ready_group_entry();

-- harel_ready_new_groups is the trigger transport_groups_enqueue_new:
-- after a statement that created group rows, an entry for each that is
-- claimable at once, in group order. A statement trigger, as the wake-up
-- is (80_wakeups.sql): a batch publish of a thousand new groups runs it
-- once.
CREATE OR REPLACE FUNCTION harel_ready_new_groups()
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
    PERFORM pg_current_xact_id();  -- an id before the numbers (see "The frontier")
    INSERT INTO transport_ready (group_id, priority)
    SELECT n.group_id, n.priority
      FROM harel_ready_created AS n
     WHERE n.locked_by IS NULL AND NOT n.paused AND n.drained_at IS NULL AND n.retry_at IS NULL
     ORDER BY n.group_id;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS transport_groups_enqueue_new ON transport_groups;
CREATE TRIGGER transport_groups_enqueue_new
    AFTER INSERT ON transport_groups
    REFERENCING NEW TABLE AS harel_ready_created
    FOR EACH STATEMENT EXECUTE FUNCTION harel_ready_new_groups();

-- harel_ready_front returns the frontier, moving it first where its
-- pending check passes and no other claim is moving it (see "The
-- frontier"), and recording the next check where this transaction holds
-- no transaction id yet (one taken then is newer than the entry number
-- read just before it; a check that passed is cleared, so that the next
-- such call records one). The claims call it before they write
-- anything (harel_sweep; harel_exchange_leases and harel_ack_claim before
-- their acks), so that a stream's round-trips record checks too.
CREATE OR REPLACE FUNCTION harel_ready_front()
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_front BIGINT;
    v_rseq  BIGINT;
    v_xid   BIGINT;
    v_next  BIGINT;
BEGIN
    v_front := (SELECT f.last_value FROM transport_ready_front AS f);
    IF NOT pg_try_advisory_xact_lock(('transport_ready'::regclass::oid::bigint & 2147483647)::int, 0) THEN
        RETURN v_front;
    END IF;
    -- The check is read and written under the lock only.
    v_rseq := (SELECT c.last_value FROM transport_ready_check_rseq AS c);
    v_xid := (SELECT c.last_value FROM transport_ready_check_xid AS c);
    IF v_xid > 0 AND pg_snapshot_xmin(pg_current_snapshot())::text::BIGINT >= v_xid THEN
        -- A statement of its own, so that its snapshot, taken after the
        -- check passed, sees every entry up to v_rseq that committed.
        v_next := COALESCE((SELECT min(r.rseq) FROM transport_ready AS r
                             WHERE r.rseq >= v_front AND r.rseq <= v_rseq), v_rseq + 1);
        IF v_next > v_front THEN
            v_front := setval('transport_ready_front', v_next);
        END IF;
        PERFORM setval('transport_ready_check_xid', 0);
        v_xid := 0;
    END IF;
    -- Whether this transaction holds an id is asked here, not on entry: a
    -- setval takes one (it is logged), and an id taken before the number
    -- is read would let the frontier pass a writer that drew its number
    -- in between (version 21; a 30-minute paced run left 61 entries
    -- behind the frontier so).
    IF v_xid = 0 AND pg_current_xact_id_if_assigned() IS NULL THEN
        -- The next check: the last number drawn, then an id (this
        -- transaction's, taken now).
        v_rseq := (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END
                     FROM transport_ready_rseq AS s);
        PERFORM setval('transport_ready_check_xid', pg_current_xact_id()::text::BIGINT);
        PERFORM setval('transport_ready_check_rseq', v_rseq);
    END IF;
    RETURN v_front;
END
$$;

-- harel_ready_waits says whether a group other than p_except's waits in the
-- ready log from p_front on at or above p_min_priority: an entry whose
-- group is neither paused nor held by a lease at p_now (a kept group's own
-- entries, and those of groups a sweep leased or an operator paused since,
-- are stale). A keep yields to it
-- (functions/40_ack.sql, "A keep yields"). It reads entries from the
-- frontier up to the first such one, as a claim does.
CREATE OR REPLACE FUNCTION harel_ready_waits(
    p_front        BIGINT,
    p_min_priority INT,
    p_now          DOUBLE PRECISION,
    p_except       TEXT[])
RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM transport_ready AS r
                    WHERE r.rseq >= p_front AND r.priority >= p_min_priority AND r.group_id <> ALL (p_except)
                      AND NOT EXISTS (SELECT 1 FROM transport_groups AS g
                                       WHERE g.group_id = r.group_id
                                         AND (g.paused OR (g.locked_by IS NOT NULL AND g.lock_expiry >= p_now)) OFFSET 0));
END
$$;
