-- 90_growing.sql: growing (version 14). A cluster of N partitions grows
-- to 2N: partition i keeps its groups whose hashtext & (2N - 1) is i, and new
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
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT, tenant TEXT)
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
