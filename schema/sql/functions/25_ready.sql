-- 25_ready.sql: the ready log (version 20): the entries the claims take,
-- written by triggers on transport_groups, and the frontier the claims
-- read them from.
--
-- The ready log. A group row becomes claimable at once (free, not
-- paused, not marked drained, not due later) when it is created by a
-- publish, freed by an ack or a settle with messages left, or resumed;
-- each time, a trigger writes an entry (transport_ready: its number, the
-- group, its priority, its tenant and its place, vt: "Shares" below). A
-- publish to a drained group's kept row writes the entry itself, the row
-- unwritten (harel_revive, 20_publish.sql; since version 24). The claims
-- take entries in (vt, number) order (functions/30_claim.sql, "The ready
-- log"), so a tenant's groups are handed out in the order they became
-- claimable, and tenants by their weights ("Shares"), and a claim
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
-- read it from the frontier (transport_ready_front, a vt), below which no
-- entry is live or still to commit. Entries commit out of vt order, so the
-- frontier moves only past values whose writers have all ended: a check
-- is recorded as (V, X), V the virtual time, then X a transaction id
-- taken after reading V. Every writer took its transaction id before
-- reading the virtual time, which only grows, and places its entry past
-- it (the triggers call pg_current_xact_id() first), so a writer with an
-- id of X or more places its entry past V, and one of an entry at V or
-- below holds an id below X. Once the oldest transaction id running is X
-- or more (pg_snapshot_xmin of the current snapshot), every entry up to
-- V has committed or rolled back, and the frontier moves to the first
-- live entry up to V, or V + 1. Then a new check is recorded. One claim at
-- a time reads and moves it, and only that claim moves the virtual time
-- (a transaction-level advisory lock, tried, never waited for). A
-- transaction that holds an id for long (not a read-only one: a snapshot
-- without an id holds the frontier back in nothing) keeps the frontier
-- where it was, and the claims pass the entries taken since:
-- docs/operating.md says what to watch.
--
-- Shares (version 27). A group belongs to a tenant (transport_groups.tenant,
-- set by the publish that creates its row; 'default' where none is named),
-- and the log is read in the order of each entry's vt, a virtual time, not
-- of its number: weighted fair queueing over tenants, round-robin over a
-- tenant's groups, FIFO within a group. The virtual time
-- (transport_ready_vnow) is the highest vt the claims read (moved by the
-- one holding the frontier's lock). A tenant's next entry is placed one
-- step past the later of the virtual time and its
-- tenant's last entry still in the log (and its charge, below): a step is
-- 100,000 / its weight (transport_tenants.weight, 1 to 1,000; 1 where the
-- tenant has no row). So each tenant's entries follow one another a step
-- apart, and tenants interleave in proportion to their weights whatever
-- their number of ready groups: a tenant with 10,000 ready groups has one
-- entry per step, as one with a single group does. A tenant that was idle
-- starts at the virtual time, with no credit saved; a lone tenant's
-- entries follow each other as they did in number order. Entries of equal
-- vt go in number order.
--
-- What is shared is turns: an entry is a turn, a group handed out for as
-- many messages as its holder keeps it (one for a plain-SQL claim; at
-- most Config.KeepWhileWaiting for a Go consumer while another group
-- waits, "A keep yields" in 40_ack.sql). A tenant's share of messages is
-- its share of turns where its turns are as long as the others' (its
-- groups hold a quantum or more, or no consumer keeps); one whose groups
-- hold fewer gets fewer messages a turn, never more: neither spreading a
-- backlog over more groups nor bursting buys a turn. (A turn is charged
-- before it is taken, when its entry is placed, and its length is not
-- known then; charging its messages after it, at the group's next entry,
-- let a tenant that published many short groups at once take up to a
-- quantum a step until they drained: 2.1 times its share in bench -only
-- tenants, docs/design.md.) Hand-outs outside the log (a due group's:
-- a retry, a park's end, a give-back, a restart; a lapsed lease the sweep
-- finds) are charged to their tenant a step each (transport_tenants.charged, written by the claim that makes
-- them): its next entries go as many steps back, so a tenant's failures
-- buy it no share. The placement reads one entry of the tenant's (the
-- index transport_ready_tenant, from the top, down to the virtual time)
-- and writes nothing but the entry. Writers of one tenant that run at
-- once do not see each other's entries and place them at one place: two
-- turns in a step, so a tenant with more of its groups freed at once gets
-- somewhat more than its weight (bench -only tenants: 3:1 weights gave
-- 3.6:1 turns under one stream of 64). The bound: with T tenants of equal
-- weight in the log, an entry written for a tenant with none there is at
-- most one step past the virtual time, so at most about T entries (one
-- per tenant, and those taken late) are ahead of it, each a turn of at
-- most Config.KeepWhileWaiting messages (TestSharesInterleaveTenants).
--
-- harel_ready_place is where p_tenant's next entries go ("Shares"): one
-- step past base, and how long its step is. Inlined (LANGUAGE sql, no SET
-- clause: 10_guard.sql), a probe of each index it names.
CREATE OR REPLACE FUNCTION harel_ready_place(p_tenant TEXT)
RETURNS TABLE (base BIGINT, step BIGINT)
LANGUAGE sql
STABLE
AS $$ SELECT GREATEST(v.v, t.charged,
                      (SELECT r.vt FROM transport_ready AS r
                        WHERE r.tenant = p_tenant AND r.vt > v.v
                        ORDER BY r.tenant DESC, r.vt DESC
                        LIMIT 1)),
             (100000 / COALESCE(t.weight, 1))::BIGINT
        FROM (SELECT COALESCE(pg_sequence_last_value('transport_ready_vnow'), 0) AS v) AS v
        LEFT JOIN transport_tenants AS t ON t.tenant = p_tenant $$;

-- harel_ready_group_entry is the trigger transport_groups_enqueue: after
-- an update that makes a group row claimable at once, an entry for it,
-- one step past its tenant's place ("Shares").
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
    PERFORM pg_current_xact_id();  -- an id before the virtual time is read (see "The frontier")
    INSERT INTO transport_ready (group_id, priority, tenant, vt)
    SELECT NEW.group_id, NEW.priority, NEW.tenant, p.base + p.step
      FROM harel_ready_place(NEW.tenant) AS p;
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
-- claimable at once, in group order, each tenant's a step apart. A
-- statement trigger, as the wake-up is (80_wakeups.sql): a batch publish
-- of a thousand new groups runs it once, and places each tenant's once.
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
    PERFORM pg_current_xact_id();  -- an id before the virtual time is read (see "The frontier")
    WITH p AS MATERIALIZED (  -- each tenant placed once: as a join's inner side it ran once a row
        SELECT t.tenant, p.base, p.step
          FROM (SELECT DISTINCT c.tenant FROM harel_ready_created AS c) AS t,
               LATERAL harel_ready_place(t.tenant) AS p
    )
    INSERT INTO transport_ready (group_id, priority, tenant, vt)
    SELECT n.group_id, n.priority, n.tenant,
           p.base + p.step * row_number() OVER (PARTITION BY n.tenant ORDER BY n.group_id)
      FROM harel_ready_created AS n
      JOIN p ON p.tenant = n.tenant
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

-- harel_ready_charge charges the tenants of p_groups for a hand-out each
-- outside the log ("Shares"): each tenant's charge moves to as many steps
-- past where its next entry would go. Its tenant row is written (and
-- created), so claims that charge one tenant at once wait for each other
-- (only hand-outs outside the log are charged), and each adds its steps to
-- the charge it finds once it has the row: none is lost.
CREATE OR REPLACE FUNCTION harel_ready_charge(p_groups TEXT[])
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    INSERT INTO transport_tenants AS t (tenant)
    SELECT DISTINCT g.tenant FROM transport_groups AS g WHERE g.group_id = ANY (p_groups)
     ORDER BY g.tenant
    ON CONFLICT (tenant) DO NOTHING;
    -- The row's charge as it is once locked (a claim that charged it
    -- meanwhile has committed), not as this statement's snapshot saw it.
    UPDATE transport_tenants AS t
       SET charged = GREATEST(t.charged, p.base) + p.step * c.n
      FROM (SELECT g.tenant, count(*) AS n
              FROM transport_groups AS g
             WHERE g.group_id = ANY (p_groups)
             GROUP BY g.tenant) AS c,
           LATERAL harel_ready_place(c.tenant) AS p
     WHERE t.tenant = c.tenant;
END
$$;

-- harel_ready_front returns the frontier, moving it first where its
-- pending check passes and no other claim is moving it (see "The
-- frontier"), and recording the next check where this transaction holds
-- no transaction id yet (one taken then is newer than the virtual time
-- read just before it; a check that passed is cleared, so that the next
-- such call records one). The claims call it before they write
-- anything (harel_sweep; harel_exchange_leases and harel_ack_claim before
-- their acks), so that a stream's round-trips record checks too. Only
-- the claim that holds its lock moves the virtual time (harel_sweep).
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
    v_mark  BIGINT;
    v_xid   BIGINT;
    v_next  BIGINT;
BEGIN
    v_front := (SELECT f.last_value FROM transport_ready_front AS f);
    IF NOT pg_try_advisory_xact_lock(('transport_ready'::regclass::oid::bigint & 2147483647)::int, 0) THEN
        RETURN v_front;
    END IF;
    -- The check is read and written under the lock only.
    v_mark := (SELECT c.last_value FROM transport_ready_check_vt AS c);
    v_xid := (SELECT c.last_value FROM transport_ready_check_xid AS c);
    IF v_xid > 0 AND pg_snapshot_xmin(pg_current_snapshot())::text::BIGINT >= v_xid THEN
        -- A statement of its own, so that its snapshot, taken after the
        -- check passed, sees every entry up to v_mark that committed.
        v_next := COALESCE((SELECT r.vt FROM transport_ready AS r
                             WHERE r.vt >= v_front AND r.vt <= v_mark
                             ORDER BY r.vt
                             LIMIT 1), v_mark + 1);
        IF v_next > v_front THEN
            v_front := setval('transport_ready_front', v_next);
        END IF;
        PERFORM setval('transport_ready_check_xid', 0);
        v_xid := 0;
    END IF;
    -- Whether this transaction holds an id is asked here, not on entry: a
    -- setval takes one (it is logged), and an id taken before the virtual
    -- time is read would let the frontier pass a writer that read it in
    -- between (version 21; a 30-minute paced run left 61 entries behind
    -- the frontier so, when the check was on entry numbers).
    IF v_xid = 0 AND pg_current_xact_id_if_assigned() IS NULL THEN
        -- The next check: the virtual time, then an id (this
        -- transaction's, taken now).
        v_mark := (SELECT v.last_value FROM transport_ready_vnow AS v);
        PERFORM setval('transport_ready_check_xid', pg_current_xact_id()::text::BIGINT);
        PERFORM setval('transport_ready_check_vt', v_mark);
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
                    WHERE r.vt >= p_front AND r.priority >= p_min_priority AND r.group_id <> ALL (p_except)
                      AND NOT EXISTS (SELECT 1 FROM transport_groups AS g
                                       WHERE g.group_id = r.group_id
                                         AND (g.paused OR (g.locked_by IS NOT NULL AND g.lock_expiry >= p_now)) OFFSET 0));
END
$$;
