-- 20_publish.sql: publish (harel_publish, harel_publish_many) and what
-- readies a publish's groups: harel_ready_groups for these calls, and the
-- trigger transport_groups_ready for the design's plain two-INSERT publish.

-- harel_revive readies the kept rows of drained groups among p_groups
-- (see "Kept rows" in 30_claim.sql), p_priorities[i] and p_tenants[i]
-- being p_groups[i]'s (a group named more than once takes its first; a
-- NULL tenant, or none, leaves the row's), without writing them
-- (version 24): an entry in the ready log for each that is not paused,
-- with the publish's priority (25_ready.sql), and idle consumers woken as
-- for a new group (harel_wake_waiters; the statement trigger harel_wake
-- sees only rows inserted). The claim that takes the entry leases the
-- row and clears its mark in its one write. The row is written only when
-- its priority or tenant is not the publish's and this is the first
-- publish since the drain: the first publish after a drain sets them as
-- for a new group. Rows and entries in group order. A row another transaction is
-- writing (a claim, an ack) is read as it was, and not
-- waited for: a publisher waits for no drainer (unless it changes the
-- row's priority: that update waits for the row, as any does); under
-- repeatable read it takes the row FOR KEY SHARE, which a deleter's lock
-- conflicts with and a claim's or an ack's does not. Where that ack marks the
-- row drained after this read, not seeing the publish's message, the
-- message is under a marked row with no entry, and the sweep finds it
-- ("The sweep" in 30_claim.sql). (Until version 24 the revival cleared
-- the mark, a third version of the row per message, and waited for the
-- row's lock.) Returns how many it readied.
CREATE OR REPLACE FUNCTION harel_revive(
    p_groups     TEXT[],
    p_priorities INT[],
    p_tenants    TEXT[] DEFAULT NULL)
RETURNS INT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_groups  TEXT[];    -- the kept rows to ready (not paused)
    v_prios   INT[];     -- and the publish's priority of each
    v_tenants TEXT[];    -- and the row's tenant
    v_moved   TEXT[];    -- the kept rows whose priority or tenant is not the publish's
    v_mprios  INT[];
    v_mtenants TEXT[];
    v_mcounts BIGINT[];  -- and how many of the batch's messages are theirs
    v_kept    TEXT[];    -- every kept row named
BEGIN
    SELECT array_agg(k.group_id ORDER BY k.group_id) FILTER (WHERE NOT k.paused),
           array_agg(k.p ORDER BY k.group_id) FILTER (WHERE NOT k.paused),
           array_agg(k.tenant ORDER BY k.group_id) FILTER (WHERE NOT k.paused),
           array_agg(k.group_id ORDER BY k.group_id) FILTER (WHERE k.priority <> k.p OR k.tenant <> k.t),
           array_agg(k.p ORDER BY k.group_id) FILTER (WHERE k.priority <> k.p OR k.tenant <> k.t),
           array_agg(COALESCE(k.t, k.tenant) ORDER BY k.group_id) FILTER (WHERE k.priority <> k.p OR k.tenant <> k.t),
           array_agg(k.n ORDER BY k.group_id) FILTER (WHERE k.priority <> k.p OR k.tenant <> k.t),
           array_agg(k.group_id ORDER BY k.group_id)
      INTO v_groups, v_prios, v_tenants, v_moved, v_mprios, v_mtenants, v_mcounts, v_kept
      FROM (SELECT g.group_id, g.paused, g.priority, g.tenant, u.p, u.t, u.n
              FROM (SELECT DISTINCT ON (u.g) u.g, u.p, p_tenants[u.i] AS t,
                           count(*) OVER (PARTITION BY u.g) AS n
                      FROM unnest(p_groups, p_priorities) WITH ORDINALITY AS u(g, p, i)
                     ORDER BY u.g, u.i) AS u
              JOIN transport_groups AS g ON g.group_id = u.g
             WHERE g.drained_at IS NOT NULL) AS k;
    -- Read committed (every Go call, and the design's publish as most
    -- clients run it): the plain read above is enough. The message
    -- insert, before it, waited for any drainer that held the group's
    -- bucket, and its snapshot, taken after, sees that delete. Under
    -- repeatable read or serializable the transaction's snapshot may
    -- predate such a delete: there the rows are locked FOR KEY SHARE,
    -- which a deleter's lock conflicts with (a serialization failure, as
    -- an insert's conflict would be) and a claim's or an ack's (FOR NO KEY
    -- UPDATE) does not, so that no publish is left under a row that is
    -- gone. (Taken by every publish, the lock cost 200-250 us more server
    -- CPU a message in the first 7 minutes of a held-snapshot run at
    -- 1,000 msgs/s.)
    IF v_kept IS NOT NULL AND current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM 1 FROM transport_groups AS g
          WHERE g.group_id = ANY (v_kept)
          ORDER BY g.group_id
            FOR KEY SHARE;
    END IF;
    IF v_moved IS NOT NULL THEN
        -- The first publish since the drain sets the priority and the
        -- tenant: where no message of the group is there but this
        -- publish's (the newest first, so only this rare case reads past
        -- them). A paused row too: they are the publish's when resumed.
        -- The entries take the tenant each row has then.
        WITH moved AS (
            UPDATE transport_groups AS g
               SET priority = u.p, tenant = u.t
              FROM unnest(v_moved, v_mprios, v_mtenants, v_mcounts) AS u(g, p, t, n)
             WHERE g.group_id = u.g AND g.drained_at IS NOT NULL
               AND (SELECT count(*) FROM (SELECT 1 FROM transport_messages AS m WHERE m.group_id = u.g
                                            ORDER BY m.seq DESC LIMIT u.n + 1) AS x) <= u.n
            RETURNING g.group_id, g.tenant
        )
        SELECT array_agg(COALESCE(m.tenant, u.t) ORDER BY u.i) INTO v_tenants
          FROM unnest(v_groups, v_tenants) WITH ORDINALITY AS u(g, t, i)
          LEFT JOIN moved AS m ON m.group_id = u.g;
    END IF;
    IF v_groups IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM pg_current_xact_id();  -- an id before the virtual time ("The frontier" in 25_ready.sql)
    WITH p AS MATERIALIZED (  -- each tenant placed once: as a join's inner side it ran once a row
        SELECT t.t, p.base, p.step
          FROM (SELECT DISTINCT t FROM unnest(v_tenants) AS t) AS t,
               LATERAL harel_ready_place(t.t) AS p
    )
    INSERT INTO transport_ready (group_id, priority, tenant, vt)
    SELECT u.g, u.p, u.t, p.base + p.step * row_number() OVER (PARTITION BY u.t ORDER BY u.i)
      FROM unnest(v_groups, v_prios, v_tenants) WITH ORDINALITY AS u(g, p, t, i)
      JOIN p ON p.t = u.t
     ORDER BY u.i;
    PERFORM harel_wake_waiters((SELECT max(p) FROM unnest(v_prios) AS p));
    RETURN cardinality(v_groups);
END
$$;

-- harel_ready_group is the trigger transport_groups_ready: BEFORE each
-- insert of a group row (the design's two-INSERT publish inserts one, ON
-- CONFLICT DO NOTHING), a kept row of the group is revived instead
-- (harel_revive) and nothing is inserted; otherwise the insert goes on.
-- The calls here ready their groups a batch at a time
-- (harel_ready_groups), and the trigger stands aside for them: its WHEN
-- reads the transaction setting harel.revives, which harel_ready_groups
-- turns on around its insert. (Run for every row of a 1,000-group batch,
-- the trigger cost a third of the batch publish's throughput.) A client
-- that sets harel.revives itself turns the revival off for its inserts.
CREATE OR REPLACE FUNCTION harel_ready_group()
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
    -- A tenant the row's check refuses: the insert goes on, to be refused
    -- (23514), not a revival that would take it.
    IF octet_length(NEW.tenant) BETWEEN 1 AND 256
       AND harel_revive(ARRAY[NEW.group_id], ARRAY[NEW.priority], ARRAY[NEW.tenant]) > 0 THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS transport_groups_ready ON transport_groups;
CREATE TRIGGER transport_groups_ready
    BEFORE INSERT ON transport_groups
    FOR EACH ROW WHEN (current_setting('harel.revives', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION harel_ready_group();

-- harel_ready_groups readies the groups of messages just inserted
-- (p_groups[i] with p_priorities[i] and p_tenants[i]; a group named more
-- than once takes its first; a NULL tenant, or none, is 'default'): a row for each group that has none (its priority,
-- a new slot; the wake-up trigger harel_wake sees those), then, if some
-- group had one, the kept rows among them revived (harel_revive); each in
-- group order, so that two publishers take the rows they share in the
-- same order. A batch of new groups costs its insert alone.
CREATE OR REPLACE FUNCTION harel_ready_groups(
    p_groups     TEXT[],
    p_priorities INT[],
    p_tenants    TEXT[] DEFAULT NULL)
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
    v_new INT;
BEGIN
    -- The trigger stands aside for this insert (a setting of this
    -- transaction, put back at once: a function's SET clause may not name
    -- a setting PostgreSQL does not know unless a superuser creates it).
    PERFORM set_config('harel.revives', 'on', true);
    WITH ins AS (
        INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority, tenant)
        SELECT DISTINCT ON (u.g) u.g, NULL, NULL, u.p, COALESCE(p_tenants[u.i], 'default')
          FROM unnest(p_groups, p_priorities) WITH ORDINALITY AS u(g, p, i)
         ORDER BY u.g, u.i
        ON CONFLICT (group_id) DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO v_new FROM ins;
    PERFORM set_config('harel.revives', '', true);
    IF v_new < (SELECT count(DISTINCT g) FROM unnest(p_groups) AS g) THEN
        PERFORM harel_revive(p_groups, p_priorities, p_tenants);
    END IF;
END
$$;

-- harel_publish is the design's publish in one round-trip: append p_event
-- to p_group, then ready the group (a new group row gets p_priority and
-- p_tenant, NULL being 'default', as does a drained one kept; an existing
-- one keeps its lease, priority and tenant). A tenant that is empty or
-- longer than 256 bytes is refused (PT011) before anything is written.
-- The message insert's trigger guards it
-- against a concurrent drain. Returns the message's seq.
CREATE OR REPLACE FUNCTION harel_publish(
    p_group    TEXT,
    p_event    TEXT,
    p_priority INT DEFAULT 0,
    p_tenant   TEXT DEFAULT NULL)
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
    v_seq BIGINT;
    v_new BOOLEAN;
BEGIN
    IF octet_length(p_tenant) NOT BETWEEN 1 AND 256 THEN
        PERFORM harel_refuse_tenant('harel_publish', p_tenant);
    END IF;
    INSERT INTO transport_messages (group_id, event)
    VALUES (p_group, p_event)
    RETURNING seq INTO v_seq;
    -- harel_ready_groups for one group, written out: a call of a
    -- function with SET clauses costs about 20 µs, half again this
    -- publish's own time on the server.
    PERFORM set_config('harel.revives', 'on', true);
    INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority, tenant)
    VALUES (p_group, NULL, NULL, p_priority, COALESCE(p_tenant, 'default'))
    ON CONFLICT (group_id) DO NOTHING;
    v_new := FOUND;
    PERFORM set_config('harel.revives', '', true);
    IF NOT v_new THEN
        PERFORM harel_revive(ARRAY[p_group], ARRAY[p_priority], ARRAY[p_tenant]);
    END IF;
    RETURN v_seq;
END
$$;

-- harel_publish_many appends p_events[i] to p_groups[i], in array order
-- (so in order within each group), and readies new groups with the
-- priority and tenant of their first message in the batch (p_tenants NULL,
-- or an element of it: 'default'; an empty or over-long one: PT011). Returns the seqs in array
-- order. One statement per table: a batch of any size is one round-trip.
CREATE OR REPLACE FUNCTION harel_publish_many(
    p_groups     TEXT[],
    p_events     TEXT[],
    p_priorities INT[],
    p_tenants    TEXT[] DEFAULT NULL)
RETURNS SETOF BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    IF cardinality(p_events) <> cardinality(p_groups) OR cardinality(p_priorities) <> cardinality(p_groups)
       OR cardinality(p_tenants) <> cardinality(p_groups) THEN
        PERFORM harel_refuse_lengths('harel_publish_many');
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_tenants) AS t WHERE octet_length(t) NOT BETWEEN 1 AND 256) THEN
        PERFORM harel_refuse_tenant('harel_publish_many', (SELECT t FROM unnest(p_tenants) AS t WHERE octet_length(t) NOT BETWEEN 1 AND 256 LIMIT 1));
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
    PERFORM harel_ready_groups(p_groups, p_priorities, p_tenants);
END
$$;
