-- proxy.sql: the protocol on a PL/Proxy proxy database, over a queue
-- spread on N partition databases (docs/protocol.md, "Partitions").
-- Applied by schema.ApplyProxy (or loaded with psql like the main script,
-- after the prelude), never by Apply: a proxy holds no queue of its own.
--
-- The cluster. PL/Proxy's cluster 'pgtransport' (a foreign server of the
-- plproxy wrapper: CREATE SERVER pgtransport FOREIGN DATA WRAPPER plproxy
-- OPTIONS (p0 'dbname=… host=…', p1 …), and a user mapping) names the
-- partitions, N a power of two. Each partition holds the whole queue
-- schema (schema.Apply) in a schema of the same name as this one, and has
-- been numbered with harel_partition(i), i its place in the cluster.
--
-- Routing. A group lives in partition hashtext(group_id) & (N - 1) (while
-- the cluster grows, perhaps still in its old one: "Growing" below), so
-- every call that names a group runs there, in one transaction of that
-- partition: order, one holder and the fences stay inside one database.
-- Those calls are PL/Proxy functions of the protocol's own names, which
-- call the function of the same name and schema on the partition (acks
-- and fails, by seq), or plain SQL that locates the group first (the
-- others, "The calls that name one group or one message"). The calls
-- that name no group are plpgsql here, and reach the partitions through
-- harel_px_ functions (the partitions' harel_px_ functions, in
-- functions/85_partitions.sql):
--   claims (harel_claim, harel_claim_one, harel_claim_many,
--     harel_claim_leases) ask the partitions in turn from a random one
--     until one leases, so a claim comes back empty only when no partition
--     had claimable work at or above the floor;
--   batches (harel_publish_many, harel_publish_keyed, harel_ack_many,
--     harel_extend_many) split by group, run on their partitions at once,
--     and come back in input order;
--   lists and counts (harel_dead_letters, harel_redrive,
--     harel_purge_dead_letters, harel_stats, harel_groups) run on every
--     partition (on the group's alone when one is named) and are merged.
-- Transactions: PL/Proxy runs each remote call in a transaction of its
-- own on its partition, committed when the call returns, whatever the
-- caller's transaction on the proxy does after: a proxied call is never
-- part of the caller's transaction (so harel_ack_state, whose point is to
-- be, is not here). A batch is atomic per partition, not across: each
-- partition's part commits on its own. Not here: harel_exchange, harel_exchange_leases and
-- harel_ack_claim (one-database round-trip savers; call ack and claim),
-- and the wake-ups (harel_wait, harel_unwait, harel_channel: LISTEN on the
-- partitions).
--
-- The design's two-INSERT publish works here too, for the transaction that
-- makes it: the rows wait in this database's tables (which hold nothing
-- else, and nothing after a commit) and go to their partitions, as one
-- harel_publish_many, when the transaction commits; a rolled-back
-- transaction publishes nothing. Every other statement on those tables is
-- refused (PT009), naming the call to use: the design's nack (a fenced
-- UPDATE) would otherwise answer UPDATE 0, a lost lease, for a lease that
-- is held, and a read would show an empty queue ("The design's tables"
-- below).
--
-- Settings: every function pins search_path as the queue's functions do,
-- so PL/Proxy's routing calls (harel_px_home, harel_px_route) resolve in
-- this schema; the partitions' functions pin their own.

-- A queue's schema is not a proxy's: this script would replace its
-- functions and its triggers would delete its rows.
DO $pgtransport$
BEGIN
    IF to_regclass('transport_schema_version') IS NOT NULL THEN
        RAISE EXCEPTION 'pgtransport proxy: schema % holds a queue; a proxy''s schema holds none', current_schema()
            USING ERRCODE = '22023';
    END IF;
END
$pgtransport$;

-- The design's tables. Here only the two-INSERT publish can act on them:
-- every other statement the design gives (the nack's fenced UPDATE, the
-- statements inside harel_claim and harel_ack, a read) would find none of
-- the queue's rows, which are on the partitions, and answer as if the
-- queue were empty or the lease lost. Such a statement cannot be routed:
-- a trigger sees rows, not a WHERE clause; a view with INSTEAD OF
-- triggers, which could route, refuses the publish's ON CONFLICT
-- (group_id); and a routed write would commit on its own, outside the
-- caller's transaction. So it is refused, naming the call that does it on
-- the right partition. The rows wait in transport_px_messages and
-- transport_px_groups; transport_messages and transport_groups are views
-- of them that PostgreSQL updates itself: an INSERT goes through (with the
-- tables' defaults, constraints and ON CONFLICT arbiter), while a read,
-- UPDATE, DELETE or SELECT ... FOR UPDATE evaluates the views' condition,
-- harel_px_refuse, which raises PT009 once per statement, before any row
-- is read (a one-time filter: it names no column). The constraints,
-- indexes and sequence keep the names they have on one database (and had
-- here before version 15), which errors name.

-- A proxy of version 14 or before kept the rows under the design's names:
-- those tables are renamed (their constraints, indexes, sequence,
-- triggers and grants go with them; their grants are carried to the
-- views below).
DO $pgtransport$
BEGIN
    IF to_regclass('transport_px_messages') IS NULL
       AND (SELECT c.relkind FROM pg_class AS c WHERE c.oid = to_regclass('transport_messages')) = 'r' THEN
        ALTER TABLE transport_messages RENAME TO transport_px_messages;
        ALTER TABLE transport_groups RENAME TO transport_px_groups;
    END IF;
END
$pgtransport$;

-- The two-INSERT publish's tables: the same columns, constraints and
-- defaults the design's statements need; rows live here only until their
-- transaction commits (harel_px_flush).
CREATE SEQUENCE IF NOT EXISTS transport_messages_seq_seq;
CREATE TABLE IF NOT EXISTS transport_px_messages (
    seq          BIGINT NOT NULL DEFAULT nextval('transport_messages_seq_seq') CONSTRAINT transport_messages_pkey PRIMARY KEY,
    group_id     TEXT NOT NULL CONSTRAINT transport_messages_group_id_valid CHECK (octet_length(group_id) BETWEEN 1 AND 1024),
    event        TEXT NOT NULL,
    published_at TIMESTAMPTZ DEFAULT statement_timestamp(),
    last_error   TEXT
);
ALTER SEQUENCE transport_messages_seq_seq OWNED BY transport_px_messages.seq;
CREATE TABLE IF NOT EXISTS transport_px_groups (
    group_id      TEXT CONSTRAINT transport_groups_pkey PRIMARY KEY,
    locked_by     TEXT,
    lock_expiry   DOUBLE PRECISION,
    priority      INT NOT NULL DEFAULT 0 CONSTRAINT transport_groups_priority_check CHECK (priority BETWEEN 0 AND 4),
    delivered_seq BIGINT,
    attempts      INT NOT NULL DEFAULT 0,
    paused        BOOLEAN NOT NULL DEFAULT false,
    leased_at     DOUBLE PRECISION,
    arrival       BIGINT,
    state         BYTEA
);
-- A group's tenant, as on a partition (version 27).
ALTER TABLE transport_px_groups ADD COLUMN IF NOT EXISTS tenant TEXT NOT NULL DEFAULT 'default'
    CONSTRAINT transport_groups_tenant_valid CHECK (octet_length(tenant) BETWEEN 1 AND 256);

-- The publishes took no tenant before version 27: the old signatures go,
-- so that a call with the old arguments finds one function.
DROP FUNCTION IF EXISTS harel_px_publish_here(INT, TEXT, TEXT, INT, BOOLEAN);
DROP FUNCTION IF EXISTS harel_publish(TEXT, TEXT, INT);
DROP FUNCTION IF EXISTS harel_px_publish_many(INT[], TEXT[], TEXT[], INT[], TEXT[], DOUBLE PRECISION);
DROP FUNCTION IF EXISTS harel_px_publish_home(INT[], TEXT[], TEXT[], INT[], TEXT[], DOUBLE PRECISION);
DROP FUNCTION IF EXISTS harel_px_publish(TEXT[], TEXT[], INT[], TEXT[], DOUBLE PRECISION);
DROP FUNCTION IF EXISTS harel_px_publish_check(TEXT, TEXT[], TEXT[], INT[], TEXT[]);
DROP FUNCTION IF EXISTS harel_publish_many(TEXT[], TEXT[], INT[]);
DROP FUNCTION IF EXISTS harel_publish_keyed(TEXT[], TEXT[], INT[], TEXT[], DOUBLE PRECISION);
-- Version 28: a group's rows end with its tenant, a tenant's with
-- delivered, and harel_groups takes a tenant; a function's columns cannot
-- change in place.
DO $pgtransport$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc AS p
                WHERE p.oid = to_regprocedure('harel_group(double precision, text)') AND NOT 'tenant' = ANY (p.proargnames)) THEN
        DROP FUNCTION harel_group(DOUBLE PRECISION, TEXT);
        DROP FUNCTION IF EXISTS harel_px_on_group(INT, DOUBLE PRECISION, TEXT);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_proc AS p
                WHERE p.oid = to_regprocedure('harel_tenants(double precision)') AND NOT 'delivered' = ANY (p.proargnames)) THEN
        DROP FUNCTION harel_tenants(DOUBLE PRECISION);
        DROP FUNCTION IF EXISTS harel_px_tenants(DOUBLE PRECISION);
    END IF;
END
$pgtransport$;
DROP FUNCTION IF EXISTS harel_groups(DOUBLE PRECISION, TEXT, TEXT, INT, INT);
DROP FUNCTION IF EXISTS harel_px_groups(DOUBLE PRECISION, TEXT, TEXT, INT, INT);

-- harel_px_refuse refuses (PT009) a statement that reads, updates or
-- deletes the design's table p_table here, naming the calls to use.
-- STABLE, and of no column, so the views' condition is a one-time filter.
CREATE OR REPLACE FUNCTION harel_px_refuse(p_table TEXT)
RETURNS BOOLEAN
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_table = 'transport_groups' THEN
        RAISE EXCEPTION 'pgtransport proxy: transport_groups here takes only the design''s publish (INSERT ... ON CONFLICT DO NOTHING); the groups are on the partitions: nack with harel_nack, claim with harel_claim, ack with harel_ack, read with harel_groups'
            USING ERRCODE = 'PT009',
                  HINT = 'SELECT harel_nack(group, token, now, delay) is the fenced nack (true: the token held the group; a delay of 0 frees it); '
                         'SELECT * FROM harel_claim(now, now + visibility, token, min_priority) claims, SELECT harel_ack(group, seq, token, now) acks; '
                         'SELECT * FROM harel_groups(now, NULL, ''group'', 0, 100) lists the groups, harel_group(now, group) shows one '
                         '(docs/protocol.md, "Partitions").';
    END IF;
    RAISE EXCEPTION 'pgtransport proxy: transport_messages here takes only the design''s publish (INSERT); the messages are on the partitions: ack with harel_ack, claim with harel_claim, read with harel_peek'
        USING ERRCODE = 'PT009',
              HINT = 'SELECT harel_ack(group, seq, token, now) acks (true: the token held the group); '
                     'SELECT * FROM harel_peek(group, NULL, 10) reads a group''s messages, harel_stats() counts them '
                     '(docs/protocol.md, "Partitions").';
END
$$;

CREATE OR REPLACE VIEW transport_messages AS
    SELECT * FROM transport_px_messages WHERE harel_px_refuse('transport_messages');
CREATE OR REPLACE VIEW transport_groups AS
    SELECT * FROM transport_px_groups WHERE harel_px_refuse('transport_groups');

-- Whoever may insert into (or read back from: RETURNING) a publish table
-- may do so through its view: the grants of a proxy of version 14 or
-- before, which named the tables, carry over (schema.ProxyGrants names
-- both).
DO $pgtransport$
DECLARE
    r RECORD;
BEGIN
    FOR r IN SELECT v.view, a.privilege_type AS priv,
                    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::REGROLE::TEXT END AS grantee
               FROM (VALUES ('transport_px_messages', 'transport_messages'), ('transport_px_groups', 'transport_groups')) AS v(base, view),
                    pg_class AS c, aclexplode(c.relacl) AS a
              WHERE c.oid = to_regclass(v.base) AND a.grantee <> c.relowner AND a.privilege_type IN ('INSERT', 'SELECT')
    LOOP
        EXECUTE format('GRANT %s ON %I TO %s', r.priv, r.view, r.grantee);
    END LOOP;
END
$pgtransport$;

-- transport_proxy_parts is the cluster the proxy was checked against
-- (harel_px_check): its partition count and a digest of its partitions'
-- connection strings in order. Every routed call compares the cluster's
-- with it (harel_px_parts): a cluster given more partitions, or whose
-- partitions were swapped or replaced, by ALTER SERVER, would send a
-- group's next messages to another partition than its earlier ones, so it
-- is refused until the proxy is checked again.
CREATE TABLE IF NOT EXISTS transport_proxy_parts (
    id     BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
    parts  INT NOT NULL,
    digest TEXT NOT NULL
);
-- grown_from: while the cluster grows (harel_px_grow), the count it grew
-- from; NULL otherwise (version 14).
ALTER TABLE transport_proxy_parts ADD COLUMN IF NOT EXISTS grown_from INT;

-- harel_px_cluster is cluster 'pgtransport' as it is: the number of its
-- partitions (options p0, p1, ...; PL/Proxy's other spelling,
-- partition_0, ..., is not counted, so such a cluster is refused) and a
-- digest of their connection strings in order.
CREATE OR REPLACE FUNCTION harel_px_cluster(OUT parts INT, OUT digest TEXT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT count(*)::INT, md5(COALESCE(string_agg(o.option_value, E'\n' ORDER BY substr(o.option_name, 2)::INT), ''))
        FROM pg_foreign_server AS s, pg_options_to_table(s.srvoptions) AS o
       WHERE s.srvname = 'pgtransport' AND o.option_name ~ '^p[0-9]+$' $$;

-- harel_px_cluster_head is the digest harel_px_cluster would give the
-- cluster's first p_n partitions alone.
CREATE OR REPLACE FUNCTION harel_px_cluster_head(p_n INT)
RETURNS TEXT
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT md5(COALESCE(string_agg(o.option_value, E'\n' ORDER BY substr(o.option_name, 2)::INT), ''))
        FROM pg_foreign_server AS s, pg_options_to_table(s.srvoptions) AS o
       WHERE s.srvname = 'pgtransport' AND o.option_name ~ '^p[0-9]+$' AND substr(o.option_name, 2)::INT < p_n $$;

-- harel_px_map is the number of partitions and, while the cluster grows,
-- the number it grew from (else NULL), refused (22023) unless the cluster
-- is the one the proxy was checked against.
CREATE OR REPLACE FUNCTION harel_px_map(OUT parts INT, OUT grown_from INT)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_n      INT;
    v_digest TEXT;
    v_want_n INT;
    v_want_d TEXT;
BEGIN
    SELECT c.parts, c.digest INTO v_n, v_digest FROM harel_px_cluster() AS c;
    SELECT p.parts, p.digest, p.grown_from INTO v_want_n, v_want_d, grown_from FROM transport_proxy_parts AS p;
    IF v_want_n IS NULL THEN
        RAISE EXCEPTION 'pgtransport proxy: the proxy has not been checked against cluster pgtransport'
            USING ERRCODE = '22023', HINT = 'Check it: pgtransport migrate apply --proxy, or schema.ApplyProxy.';
    ELSIF v_n IS DISTINCT FROM v_want_n THEN
        RAISE EXCEPTION 'pgtransport proxy: cluster pgtransport has % partitions, the proxy was checked with %: groups would be looked for in other partitions', v_n, v_want_n
            USING ERRCODE = '22023', HINT = 'To grow from N to 2N partitions, add the new ones and call harel_px_grow in the same transaction (docs/protocol.md, "Growing the cluster"); otherwise put the cluster back.';
    ELSIF v_digest IS DISTINCT FROM v_want_d THEN
        RAISE EXCEPTION 'pgtransport proxy: the connection strings of cluster pgtransport changed since the proxy was checked'
            USING ERRCODE = '22023', HINT = 'If each partition is still where it was (a timeout or password changed), check the proxy again: pgtransport migrate apply --proxy, or schema.ApplyProxy; it refuses a cluster whose partitions moved.';
    END IF;
    parts := v_n;
END
$$;

-- harel_px_parts is the number of partitions, checked as harel_px_map.
CREATE OR REPLACE FUNCTION harel_px_parts()
RETURNS INT
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT m.parts FROM harel_px_map() AS m $$;

-- harel_px_home is a group's hash; PL/Proxy takes its partition from it
-- (hash & (N - 1)), once the cluster's count is checked. A NULL group goes
-- to partition 0, which refuses it as a single database does.
CREATE OR REPLACE FUNCTION harel_px_home(p_group TEXT)
RETURNS INT
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM harel_px_parts();
    RETURN COALESCE(hashtext(p_group), 0);
END
$$;

-- harel_px_first is the partition to publish p_group's messages in
-- first: its home, or while the cluster grows its home before it grew
-- (the same for a group that does not move), which publishes them if the
-- group still has something there and hands them back otherwise
-- ("Growing" below).
CREATE OR REPLACE FUNCTION harel_px_first(p_group TEXT)
RETURNS INT
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT COALESCE(hashtext(p_group), 0) & (COALESCE(m.grown_from, m.parts) - 1) FROM harel_px_map() AS m $$;

-- harel_px_of is the partition of message p_seq (seq & 1023 is the
-- partition that numbered it, whatever the count), once the cluster's
-- count is checked; a NULL seq goes to partition 0, which answers as a
-- single database does.
CREATE OR REPLACE FUNCTION harel_px_of(p_seq BIGINT)
RETURNS INT
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT COALESCE(p_seq & 1023, 0)::INT & (m.parts - 1) FROM harel_px_map() AS m $$;

-- harel_px_route is p_group's partition (while the cluster grows, both its
-- old and its new home, for a group that moves), or every partition for
-- NULL.
CREATE OR REPLACE FUNCTION harel_px_route(p_group TEXT)
RETURNS SETOF INT
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT DISTINCT x.p
        FROM harel_px_map() AS m,
             LATERAL (SELECT hashtext(p_group) & (m.parts - 1) WHERE p_group IS NOT NULL
                      UNION ALL
                      SELECT hashtext(p_group) & (m.grown_from - 1) WHERE p_group IS NOT NULL AND m.grown_from IS NOT NULL
                      UNION ALL
                      SELECT generate_series(0, m.parts - 1) WHERE p_group IS NULL) AS x(p) $$;

-- harel_px_here runs partition p_part's harel_here.
CREATE OR REPLACE FUNCTION harel_px_here(p_part INT, p_groups TEXT[])
RETURNS SETOF TEXT
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

-- harel_px_locate is the partition that holds p_group now: its home, or
-- while the cluster grows and the group moves, its old home if it still
-- has anything there (harel_here), else its new one. PL/Proxy cannot run a
-- cluster's function while routing a call to the same cluster, so the
-- calls that need this are plain SQL that locate the group first, then
-- call the partition it names (harel_px_on_ functions, RUN ON p_part, of
-- which each partition has the same: PL/Proxy calls a function of the
-- same name and arguments there).
CREATE OR REPLACE FUNCTION harel_px_locate(p_group TEXT)
RETURNS INT
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_h INT := COALESCE(hashtext(p_group), 0);
    m   RECORD;
BEGIN
    SELECT * INTO m FROM harel_px_map();
    IF m.grown_from IS NOT NULL AND v_h & (m.grown_from - 1) <> v_h & (m.parts - 1)
       AND EXISTS (SELECT 1 FROM harel_px_here(v_h & (m.grown_from - 1), ARRAY[p_group])) THEN
        RETURN v_h & (m.grown_from - 1);
    END IF;
    RETURN v_h & (m.parts - 1);
END
$$;

-- harel_px_partition_map is partition p_part's harel_partition_map.
CREATE OR REPLACE FUNCTION harel_px_partition_map(p_part INT)
RETURNS TABLE (part INT, parts INT, grown_from INT, version INT)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

-- harel_px_verify refuses (22023) a cluster of p_n partitions where
-- partition pi is not numbered i (harel_partition was not run there, or
-- the cluster lists it elsewhere: its groups would be looked for in
-- another database), or its schema is not at p_version, or (p_armed) it
-- was armed for another count than p_n.
CREATE OR REPLACE FUNCTION harel_px_verify(p_n INT, p_version INT, p_armed BOOLEAN)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    r RECORD;
BEGIN
    FOR i IN 0 .. p_n - 1 LOOP
        SELECT * INTO r FROM harel_px_partition_map(i);
        IF p_armed AND r.parts <> p_n THEN
            RAISE EXCEPTION 'pgtransport proxy: partition p% was armed for a cluster of % partitions, not %', i, r.parts, p_n
                USING ERRCODE = '22023';
        END IF;
        IF r.part IS DISTINCT FROM i THEN
            RAISE EXCEPTION 'pgtransport proxy: the cluster''s partition p% is %', i,
                  CASE WHEN r.part IS NULL THEN format('not numbered (run harel_partition(%s) there)', i)
                       ELSE format('numbered %s (fix the cluster''s order)', r.part) END
                USING ERRCODE = '22023';
        END IF;
        IF r.version IS DISTINCT FROM p_version THEN
            RAISE EXCEPTION 'pgtransport proxy: partition p% has schema version %, the proxy %', i, COALESCE(r.version::TEXT, 'none'), p_version
                USING ERRCODE = '22023';
        END IF;
    END LOOP;
END
$$;

-- harel_px_check refuses a cluster this proxy cannot route over: no
-- partitions, a count that is not a power of two, a count other than the
-- one checked before (groups would be looked for in other partitions:
-- harel_px_grow grows a cluster) or than a partition was armed for
-- (harel_grow), or a partition that is not the one its place names
-- (harel_partition was not run there, or the cluster lists it elsewhere:
-- its groups would be looked for in another database) or whose schema is
-- not at p_version. It returns N.
CREATE OR REPLACE FUNCTION harel_px_check(p_version INT)
RETURNS INT
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_n      INT;
    v_was    INT;
    v_digest TEXT;
BEGIN
    SELECT c.parts, c.digest INTO v_n, v_digest FROM harel_px_cluster() AS c;
    IF v_n = 0 OR v_n & (v_n - 1) <> 0 THEN
        RAISE EXCEPTION 'pgtransport proxy: cluster pgtransport has % partitions; it needs a power of two (a foreign server pgtransport of the plproxy wrapper, options p0, p1, ...)', v_n
            USING ERRCODE = '22023';
    END IF;
    SELECT p.parts INTO v_was FROM transport_proxy_parts AS p;
    IF v_was <> v_n THEN
        RAISE EXCEPTION 'pgtransport proxy: cluster pgtransport has % partitions, the proxy was checked with %: groups would be looked for in other partitions', v_n, v_was
            USING ERRCODE = '22023', HINT = 'Growing to twice as many is harel_px_grow, in the transaction that adds them (docs/protocol.md, "Growing the cluster").';
    END IF;
    PERFORM harel_px_verify(v_n, p_version, true);
    INSERT INTO transport_proxy_parts (parts, digest) VALUES (v_n, v_digest)
        ON CONFLICT (id) DO UPDATE SET parts = EXCLUDED.parts, digest = EXCLUDED.digest;
    RETURN v_n;
END
$$;

-- harel_px_all is every partition, once the cluster's count is checked
-- (PL/Proxy's RUN ON ALL would not check it).
CREATE OR REPLACE FUNCTION harel_px_all()
RETURNS SETOF INT
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT generate_series(0, harel_px_parts() - 1) $$;

-- Growing (version 14): from N partitions to 2N, each partition i split
-- with new partition i + N (functions/90_growing.sql says how a moving
-- group drains in place and how the partitions fence it). In one
-- transaction on this database:
--   BEGIN;
--   ALTER SERVER pgtransport OPTIONS (ADD pN '...', ..., ADD p2N-1 '...');
--   SELECT harel_px_grow(<schema version>);
--   COMMIT;
-- the new partitions holding the queue at that version, numbered N to
-- 2N - 1 (harel_partition), empty. harel_px_grow arms every partition
-- (harel_grow, each committed on its own: the new ones first, then the
-- old, whose fence waits for their publishes in flight) and then records
-- the new count and the count it grew from, which makes this proxy route
-- moving groups (harel_px_first, harel_px_locate) until harel_px_grown,
-- run once no partition holds anything of a group whose home is another
-- (it refuses until then, with what remains), ends the growth. If the
-- transaction fails after arming, partitions are armed and this proxy is
-- not: run it again (it is idempotent); meanwhile publishes of moving
-- groups that have nothing in their old home are refused (PT010).

-- harel_px_arm, harel_px_strays and harel_px_settle run partition
-- p_part's harel_grow, harel_strays and harel_grown.
CREATE OR REPLACE FUNCTION harel_px_arm(p_part INT, p_from INT, p_to INT)
RETURNS BOOLEAN
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_px_strays(p_part INT)
RETURNS TABLE (groups BIGINT, dead_letters BIGINT, kept_states BIGINT, dedup_keys BIGINT)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_px_settle(p_part INT)
RETURNS BOOLEAN
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

-- harel_px_grow grows the cluster this proxy was checked with (N
-- partitions) to the 2N cluster pgtransport now lists, and returns 2N.
-- Refused (22023), before anything is armed: a cluster that is not twice
-- the checked one, or whose first N connection strings changed; a
-- partition not numbered by its place or not at p_version; a proxy still
-- growing from an earlier count (harel_px_grown first). Run again after
-- it succeeded, it returns 2N and changes nothing.
CREATE OR REPLACE FUNCTION harel_px_grow(p_version INT)
RETURNS INT
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_n      INT;
    v_digest TEXT;
    v_was    RECORD;
BEGIN
    SELECT p.parts, p.digest, p.grown_from INTO v_was FROM transport_proxy_parts AS p FOR UPDATE;
    SELECT c.parts, c.digest INTO v_n, v_digest FROM harel_px_cluster() AS c;
    IF v_was.parts IS NULL THEN
        RAISE EXCEPTION 'pgtransport proxy: the proxy has not been checked against cluster pgtransport'
            USING ERRCODE = '22023', HINT = 'Check it first: pgtransport migrate apply --proxy, or schema.ApplyProxy.';
    ELSIF v_was.grown_from IS NOT NULL AND v_n = v_was.parts AND v_digest = v_was.digest THEN
        RETURN v_n;  -- grown already
    ELSIF v_was.grown_from IS NOT NULL THEN
        RAISE EXCEPTION 'pgtransport proxy: the cluster is still growing from % to % partitions', v_was.grown_from, v_was.parts
            USING ERRCODE = '22023', HINT = 'Finish that first: harel_px_grown().';
    ELSIF v_n <> 2 * v_was.parts OR v_n > 1024 THEN
        RAISE EXCEPTION 'pgtransport proxy: cluster pgtransport has % partitions; growing from % needs %', v_n, v_was.parts, 2 * v_was.parts
            USING ERRCODE = '22023', HINT = 'ALTER SERVER pgtransport OPTIONS (ADD pN ''...'', ...) in the same transaction, one per new partition.';
    ELSIF harel_px_cluster_head(v_was.parts) <> v_was.digest THEN
        RAISE EXCEPTION 'pgtransport proxy: the connection strings of the cluster''s first % partitions changed since the proxy was checked', v_was.parts
            USING ERRCODE = '22023', HINT = 'Growing adds partitions after the old ones and changes none of them.';
    END IF;
    PERFORM harel_px_verify(v_n, p_version, false);  -- each harel_grow checks its own counts
    FOR i IN 0 .. v_n - 1 LOOP
        PERFORM harel_px_arm((i + v_was.parts) % v_n, v_was.parts, v_n);  -- the new partitions first
    END LOOP;
    UPDATE transport_proxy_parts SET parts = v_n, digest = v_digest, grown_from = v_was.parts;
    RETURN v_n;
END
$$;

-- harel_px_grown ends a growth: refused (55000) while any partition holds
-- something of a group whose home is another partition (its counts in
-- the error), else every partition and this proxy forget the count they
-- grew from, and the proxy routes every group to its home directly.
-- Returns the partition count; without a growth under way it changes
-- nothing.
CREATE OR REPLACE FUNCTION harel_px_grown()
RETURNS INT
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    m      RECORD;
    s      RECORD;
    v_left TEXT[];
BEGIN
    SELECT * INTO m FROM harel_px_map();
    IF m.grown_from IS NULL THEN
        RETURN m.parts;
    END IF;
    FOR i IN 0 .. m.parts - 1 LOOP
        SELECT * INTO s FROM harel_px_strays(i);
        IF s.groups + s.dead_letters + s.kept_states + s.dedup_keys > 0 THEN
            v_left := v_left || format('p%s: %s groups, %s dead letters, %s kept states, %s dedup keys',
                                       i, s.groups, s.dead_letters, s.kept_states, s.dedup_keys);
        END IF;
    END LOOP;
    IF v_left IS NOT NULL THEN
        RAISE EXCEPTION 'pgtransport proxy: moving groups still hold %', array_to_string(v_left, '; ')
            USING ERRCODE = '55000',
                  HINT = 'Rows drain as their messages are handled; kept states and keys expire; dead letters wait for a redrive (which drains them in place) or a purge.';
    END IF;
    FOR i IN 0 .. m.parts - 1 LOOP
        PERFORM harel_px_settle(i);
    END LOOP;
    UPDATE transport_proxy_parts SET grown_from = NULL;
    RETURN m.parts;
END
$$;

-- The calls that name one group or one message. A lease's calls that
-- name its message (ack, fail) run on the message's partition
-- (harel_px_of); the others locate the group (harel_px_locate), which is
-- its home but while a moving group still has something in its old home.
-- A publish goes to harel_px_first and, handed back, to the group's home.

-- harel_px_publish_here runs partition p_part's: the seq, or (not
-- p_strict) NULL for a moving group that has nothing left there.
CREATE OR REPLACE FUNCTION harel_px_publish_here(p_part INT, p_group TEXT, p_event TEXT, p_priority INT, p_strict BOOLEAN, p_tenant TEXT)
RETURNS BIGINT LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_publish(p_group TEXT, p_event TEXT, p_priority INT DEFAULT 0, p_tenant TEXT DEFAULT NULL)
RETURNS BIGINT
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT COALESCE(harel_px_publish_here(harel_px_first(p_group), p_group, p_event, p_priority, false, p_tenant),
                      harel_px_publish_here(harel_px_home(p_group), p_group, p_event, p_priority, true, p_tenant)) $$;

CREATE OR REPLACE FUNCTION harel_ack(p_group TEXT, p_seq BIGINT, p_token TEXT, p_now DOUBLE PRECISION)
RETURNS BOOLEAN LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON harel_px_of(p_seq); $$;

CREATE OR REPLACE FUNCTION harel_fail(p_group TEXT, p_seq BIGINT, p_token TEXT, p_now DOUBLE PRECISION, p_error TEXT)
RETURNS TEXT LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON harel_px_of(p_seq); $$;

CREATE OR REPLACE FUNCTION harel_dead_letter(p_group TEXT, p_seq BIGINT, p_token TEXT, p_now DOUBLE PRECISION, p_error TEXT)
RETURNS BOOLEAN LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON harel_px_of(p_seq); $$;

CREATE OR REPLACE FUNCTION harel_snooze(p_group TEXT, p_seq BIGINT, p_token TEXT, p_now DOUBLE PRECISION, p_delay DOUBLE PRECISION)
RETURNS BOOLEAN LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON harel_px_of(p_seq); $$;

CREATE OR REPLACE FUNCTION harel_px_on_nack(p_part INT, p_group TEXT, p_token TEXT, p_now DOUBLE PRECISION, p_delay DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_nack(p_group TEXT, p_token TEXT, p_now DOUBLE PRECISION, p_delay DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT harel_px_on_nack(harel_px_locate(p_group), p_group, p_token, p_now, p_delay) $$;

CREATE OR REPLACE FUNCTION harel_px_on_extend(p_part INT, p_group TEXT, p_token TEXT, p_lease DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_extend(p_group TEXT, p_token TEXT, p_lease DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT harel_px_on_extend(harel_px_locate(p_group), p_group, p_token, p_lease) $$;

CREATE OR REPLACE FUNCTION harel_px_on_release(p_part INT, p_group TEXT, p_token TEXT)
RETURNS BOOLEAN
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_release(p_group TEXT, p_token TEXT)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT harel_px_on_release(harel_px_locate(p_group), p_group, p_token) $$;

CREATE OR REPLACE FUNCTION harel_px_on_restart_group(p_part INT, p_group TEXT, p_skip_head BOOLEAN)
RETURNS BOOLEAN
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_restart_group(p_group TEXT, p_skip_head BOOLEAN)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT harel_px_on_restart_group(harel_px_locate(p_group), p_group, p_skip_head) $$;

CREATE OR REPLACE FUNCTION harel_px_on_state(p_part INT, p_group TEXT)
RETURNS BYTEA
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_state(p_group TEXT)
RETURNS BYTEA
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT harel_px_on_state(harel_px_locate(p_group), p_group) $$;

CREATE OR REPLACE FUNCTION harel_px_on_group(p_part INT, p_now DOUBLE PRECISION, p_group TEXT)
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT, tenant TEXT)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_group(p_now DOUBLE PRECISION, p_group TEXT)
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT, tenant TEXT)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT * FROM harel_px_on_group(harel_px_locate(p_group), p_now, p_group) $$;

CREATE OR REPLACE FUNCTION harel_px_on_peek(p_part INT, p_group TEXT, p_after BIGINT, p_limit INT)
RETURNS TABLE (seq BIGINT, event TEXT, published_at TIMESTAMPTZ, last_error TEXT)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_peek(p_group TEXT, p_after BIGINT, p_limit INT)
RETURNS TABLE (seq BIGINT, event TEXT, published_at TIMESTAMPTZ, last_error TEXT)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT * FROM harel_px_on_peek(harel_px_locate(p_group), p_group, p_after, p_limit) $$;

CREATE OR REPLACE FUNCTION harel_px_on_pause_group(p_part INT, p_group TEXT)
RETURNS BOOLEAN
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_pause_group(p_group TEXT)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT harel_px_on_pause_group(harel_px_locate(p_group), p_group) $$;

CREATE OR REPLACE FUNCTION harel_px_on_resume_group(p_part INT, p_group TEXT)
RETURNS BOOLEAN
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_resume_group(p_group TEXT)
RETURNS BOOLEAN
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT harel_px_on_resume_group(harel_px_locate(p_group), p_group) $$;

CREATE OR REPLACE FUNCTION harel_px_on_purge_group(p_part INT, p_group TEXT, p_now DOUBLE PRECISION, p_limit INT)
RETURNS BIGINT
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

CREATE OR REPLACE FUNCTION harel_purge_group(p_group TEXT, p_now DOUBLE PRECISION, p_limit INT)
RETURNS BIGINT
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT harel_px_on_purge_group(harel_px_locate(p_group), p_group, p_now, p_limit) $$;

-- Claims: the partitions in turn, from a random one, until one leases.

-- harel_px_claim runs the partitions' harel_px_claim on partition p_part.
CREATE OR REPLACE FUNCTION harel_px_claim(
    p_part INT, p_now DOUBLE PRECISION, p_lease DOUBLE PRECISION, p_token TEXT, p_min_priority INT, p_limit INT)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT, attempt INT, age DOUBLE PRECISION)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON p_part; $$;

-- harel_px_claims leases up to p_limit groups (p_one: one, as
-- harel_claim_one), from the partitions in turn (a random one first), each
-- asked for what the others did not give. A partition that fails is
-- passed over; its error is raised only if no partition leased anything,
-- so one partition down leaves the others' work claimable, and a refusal
-- (every partition refuses alike) reaches the caller with its SQLSTATE.
-- Leases a partition gave before the statement was cancelled are not
-- returned: they lapse at p_lease, as those of a claim whose reply is lost.
CREATE OR REPLACE FUNCTION harel_px_claims(
    p_now DOUBLE PRECISION, p_lease DOUBLE PRECISION, p_token TEXT, p_min_priority INT, p_limit INT, p_one BOOLEAN)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT, attempt INT, age DOUBLE PRECISION)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_n     INT := harel_px_parts();
    v_start INT := floor(random() * v_n)::INT;
    v_want  INT := CASE WHEN p_one THEN 1 ELSE p_limit END;
    v_left  INT := v_want;
    v_got   BIGINT;
    v_state TEXT;
    v_msg   TEXT;
    v_hint  TEXT;
BEGIN
    IF NOT p_one AND (p_limit IS NULL OR p_limit <= 0) THEN
        RETURN;  -- as one database: nothing asked, nothing leased or checked
    END IF;
    FOR i IN 0 .. v_n - 1 LOOP
        BEGIN
            RETURN QUERY SELECT * FROM harel_px_claim((v_start + i) % v_n, p_now, p_lease, p_token, p_min_priority,
                                                     CASE WHEN p_one THEN NULL ELSE v_left END);
            GET DIAGNOSTICS v_got = ROW_COUNT;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT, v_hint = PG_EXCEPTION_HINT;
            v_got := 0;
        END;
        v_left := v_left - v_got;
        EXIT WHEN v_left <= 0;  -- enough leased
    END LOOP;
    IF v_state IS NOT NULL AND v_left IS NOT DISTINCT FROM v_want THEN
        RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_msg, HINT = COALESCE(v_hint, '');
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION harel_claim_leases(
    p_now DOUBLE PRECISION, p_lease DOUBLE PRECISION, p_token TEXT, p_min_priority INT, p_limit INT)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT, attempt INT, age DOUBLE PRECISION)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT * FROM harel_px_claims(p_now, p_lease, p_token, p_min_priority, p_limit, false) $$;

CREATE OR REPLACE FUNCTION harel_claim_one(
    p_now DOUBLE PRECISION, p_lease DOUBLE PRECISION, p_token TEXT, p_min_priority INT DEFAULT 0)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT, attempt INT, age DOUBLE PRECISION)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT * FROM harel_px_claims(p_now, p_lease, p_token, p_min_priority, NULL, true) $$;

CREATE OR REPLACE FUNCTION harel_claim(
    p_now DOUBLE PRECISION, p_lease DOUBLE PRECISION, p_token TEXT, p_min_priority INT DEFAULT 0)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT c.group_id, c.seq, c.event FROM harel_px_claims(p_now, p_lease, p_token, p_min_priority, NULL, true) AS c $$;

CREATE OR REPLACE FUNCTION harel_claim_many(
    p_now DOUBLE PRECISION, p_lease DOUBLE PRECISION, p_token TEXT, p_min_priority INT, p_limit INT)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT c.group_id, c.seq, c.event FROM harel_px_claims(p_now, p_lease, p_token, p_min_priority, p_limit, false) AS c $$;

-- Batches: split by group, run on their partitions at once (PL/Proxy's
-- SPLIT), back in input order (p_ords).

-- harel_px_publish_many runs the partitions' harel_px_publish_many, each
-- group's messages on harel_px_first's partition; harel_px_publish_home
-- runs theirs (a strict publish, which hands nothing back) on each
-- group's home.
CREATE OR REPLACE FUNCTION harel_px_publish_many(
    p_ords INT[], p_groups TEXT[], p_events TEXT[], p_priorities INT[], p_keys TEXT[], p_window DOUBLE PRECISION, p_tenants TEXT[])
RETURNS TABLE (ord INT, seq BIGINT)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; SPLIT p_ords, p_groups, p_events, p_priorities, p_keys, p_tenants; RUN ON harel_px_first(p_groups); $$;

CREATE OR REPLACE FUNCTION harel_px_publish_home(
    p_ords INT[], p_groups TEXT[], p_events TEXT[], p_priorities INT[], p_keys TEXT[], p_window DOUBLE PRECISION, p_tenants TEXT[])
RETURNS TABLE (ord INT, seq BIGINT)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; SPLIT p_ords, p_groups, p_events, p_priorities, p_keys, p_tenants; RUN ON harel_px_home(p_groups); $$;

-- harel_px_publish publishes a batch (p_ords 1 to n): first where
-- harel_px_first says, then the messages handed back (their groups moved
-- while the cluster grows) in their groups' new homes. Rows in no order.
-- p_tenants has an element per message (NULL: 'default').
CREATE OR REPLACE FUNCTION harel_px_publish(
    p_groups TEXT[], p_events TEXT[], p_priorities INT[], p_keys TEXT[], p_window DOUBLE PRECISION, p_tenants TEXT[])
RETURNS TABLE (ord INT, seq BIGINT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_ords INT[];
    v_seqs BIGINT[];
    v_back INT[];
BEGIN
    SELECT array_agg(r.ord), array_agg(r.seq) INTO v_ords, v_seqs
      FROM harel_px_publish_many(ARRAY(SELECT generate_series(1, cardinality(p_groups))), p_groups, p_events,
                                 p_priorities, p_keys, p_window, p_tenants) AS r;
    RETURN QUERY SELECT u.o, u.s FROM unnest(v_ords, v_seqs) AS u(o, s) WHERE u.s IS NOT NULL;
    SELECT array_agg(u.o ORDER BY u.o) INTO v_back FROM unnest(v_ords, v_seqs) AS u(o, s) WHERE u.s IS NULL;
    IF v_back IS NOT NULL THEN
        RETURN QUERY SELECT r.ord, r.seq
                       FROM harel_px_publish_home(v_back, ARRAY(SELECT p_groups[o] FROM unnest(v_back) AS o),
                                                  ARRAY(SELECT p_events[o] FROM unnest(v_back) AS o),
                                                  ARRAY(SELECT p_priorities[o] FROM unnest(v_back) AS o),
                                                  ARRAY(SELECT p_keys[o] FROM unnest(v_back) AS o), p_window,
                                                  ARRAY(SELECT p_tenants[o] FROM unnest(v_back) AS o)) AS r;
    END IF;
END
$$;

-- harel_px_split_check refuses arrays of different lengths as the
-- partitions would (SPLIT needs them equal too): a NULL array's length is
-- NULL, which differs from any other (the batch functions of one database
-- but harel_publish_many compare so; an empty batch reaches no partition,
-- so only the proxy's checks apply to it).
CREATE OR REPLACE FUNCTION harel_px_split_check(p_fn TEXT, p_n INT, VARIADIC p_lens INT[])
RETURNS VOID
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_lens) AS l WHERE l IS DISTINCT FROM p_n) THEN
        RAISE EXCEPTION '%: arrays of different lengths', p_fn USING ERRCODE = '22023';
    END IF;
END
$$;

-- harel_px_publish_check refuses, before any partition writes, what one
-- of them would refuse in a publish batch, with its SQLSTATE: otherwise
-- the other partitions' parts would commit and a corrected retry publish
-- them twice.
CREATE OR REPLACE FUNCTION harel_px_publish_check(p_fn TEXT, p_groups TEXT[], p_events TEXT[], p_priorities INT[], p_keys TEXT[], p_tenants TEXT[])
RETURNS VOID
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_groups, p_events) AS u(g, e) WHERE u.g IS NULL OR u.e IS NULL) THEN
        RAISE EXCEPTION '%: a NULL group or event', p_fn USING ERRCODE = '23502';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_groups) AS g WHERE octet_length(g) NOT BETWEEN 1 AND 1024) THEN
        RAISE EXCEPTION '%: a group id outside 1 to 1,024 bytes', p_fn
            USING ERRCODE = '23514', CONSTRAINT = 'transport_messages_group_id_valid';
    END IF;
    -- A group's first message in the batch gives a new group its
    -- priority, and one database checks that one alone (whether or not
    -- the group is new).
    IF EXISTS (SELECT 1 FROM (SELECT DISTINCT ON (u.g) u.q FROM unnest(p_groups, p_priorities) WITH ORDINALITY AS u(g, q, n)
                              ORDER BY u.g, u.n) AS f WHERE f.q IS NULL) THEN
        RAISE EXCEPTION '%: a NULL priority', p_fn USING ERRCODE = '23502';
    END IF;
    IF EXISTS (SELECT 1 FROM (SELECT DISTINCT ON (u.g) u.q FROM unnest(p_groups, p_priorities) WITH ORDINALITY AS u(g, q, n)
                              ORDER BY u.g, u.n) AS f WHERE f.q NOT BETWEEN 0 AND 4) THEN
        RAISE EXCEPTION '%: a priority outside 0 to 4', p_fn USING ERRCODE = '23514';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_keys) AS k WHERE k = '' OR octet_length(k) > 256) THEN
        RAISE EXCEPTION '%: a dedup key that is empty or longer than 256 bytes', p_fn USING ERRCODE = 'PT006';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_tenants) AS t WHERE octet_length(t) NOT BETWEEN 1 AND 256) THEN
        RAISE EXCEPTION '%: a tenant that is empty or longer than 256 bytes', p_fn USING ERRCODE = 'PT011';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION harel_publish_many(p_groups TEXT[], p_events TEXT[], p_priorities INT[], p_tenants TEXT[] DEFAULT NULL)
RETURNS SETOF BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_n INT := COALESCE(cardinality(p_groups), 0);
BEGIN
    -- One database compares with <>: a NULL array passes, as nothing.
    IF cardinality(p_events) <> cardinality(p_groups) OR cardinality(p_priorities) <> cardinality(p_groups)
       OR cardinality(p_tenants) <> cardinality(p_groups) THEN
        RAISE EXCEPTION 'harel_publish_many: arrays of different lengths' USING ERRCODE = '22023';
    END IF;
    IF p_groups IS NULL OR p_events IS NULL OR p_priorities IS NULL THEN
        RETURN;
    END IF;
    PERFORM harel_px_publish_check('harel_publish_many', p_groups, p_events, p_priorities, NULL, p_tenants);
    RETURN QUERY SELECT r.seq
                   FROM harel_px_publish(p_groups, p_events, p_priorities, array_fill(NULL::TEXT, ARRAY[v_n]), NULL,
                                         COALESCE(p_tenants, array_fill(NULL::TEXT, ARRAY[v_n]))) AS r
                  ORDER BY r.ord;
END
$$;

CREATE OR REPLACE FUNCTION harel_publish_keyed(
    p_groups TEXT[], p_events TEXT[], p_priorities INT[], p_keys TEXT[], p_window DOUBLE PRECISION, p_tenants TEXT[] DEFAULT NULL)
RETURNS SETOF BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_n INT := COALESCE(cardinality(p_groups), 0);
BEGIN
    PERFORM harel_px_split_check('harel_publish_keyed', cardinality(p_groups), cardinality(p_events),
                                 cardinality(p_priorities), cardinality(p_keys),
                                 COALESCE(cardinality(p_tenants), cardinality(p_groups)));
    IF p_window IS NULL OR p_window < 0 THEN
        RAISE EXCEPTION 'harel_publish_keyed: p_window % is NULL or negative', p_window USING ERRCODE = 'PT006';
    END IF;
    IF p_groups IS NULL THEN
        RETURN;  -- every array NULL: nothing, as one database
    END IF;
    PERFORM harel_px_publish_check('harel_publish_keyed', p_groups, p_events, p_priorities, p_keys, p_tenants);
    -- The partition tells a keyed batch from a plain one by p_window,
    -- never NULL here: a batch whose keys are all NULL stays keyed.
    RETURN QUERY SELECT r.seq
                   FROM harel_px_publish(p_groups, p_events, p_priorities, p_keys, p_window,
                                         COALESCE(p_tenants, array_fill(NULL::TEXT, ARRAY[v_n]))) AS r
                  ORDER BY r.ord;
END
$$;

-- harel_px_ack_many runs the partitions' harel_px_ack_many.
CREATE OR REPLACE FUNCTION harel_px_ack_many(
    p_ords INT[], p_groups TEXT[], p_seqs BIGINT[], p_tokens TEXT[], p_keep BOOLEAN[],
    p_now DOUBLE PRECISION, p_lease DOUBLE PRECISION)
RETURNS TABLE (ord INT, group_id TEXT, held BOOLEAN, next_seq BIGINT, next_event TEXT)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; SPLIT p_ords, p_groups, p_seqs, p_tokens, p_keep; RUN ON harel_px_of(p_seqs); $$;

CREATE OR REPLACE FUNCTION harel_ack_many(
    p_groups TEXT[], p_seqs BIGINT[], p_tokens TEXT[], p_keep BOOLEAN[], p_now DOUBLE PRECISION, p_lease DOUBLE PRECISION)
RETURNS TABLE (group_id TEXT, held BOOLEAN, next_seq BIGINT, next_event TEXT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_n INT := COALESCE(cardinality(p_groups), 0);
BEGIN
    PERFORM harel_px_split_check('harel_ack_many', cardinality(p_groups), cardinality(p_seqs),
                                 cardinality(p_tokens), cardinality(p_keep));
    IF p_groups IS NULL THEN
        RETURN;  -- every array NULL: nothing, as one database
    END IF;
    RETURN QUERY SELECT r.group_id, r.held, r.next_seq, r.next_event
                   FROM harel_px_ack_many(ARRAY(SELECT generate_series(1, v_n)), p_groups, p_seqs, p_tokens,
                                          p_keep, p_now, p_lease) AS r
                  ORDER BY r.ord;
END
$$;

-- harel_px_extend_many runs the partitions' harel_px_extend_many.
CREATE OR REPLACE FUNCTION harel_px_extend_many(
    p_ords INT[], p_groups TEXT[], p_seqs BIGINT[], p_tokens TEXT[], p_lease DOUBLE PRECISION)
RETURNS TABLE (ord INT, group_id TEXT, held BOOLEAN)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; SPLIT p_ords, p_groups, p_seqs, p_tokens; RUN ON harel_px_of(p_seqs); $$;

CREATE OR REPLACE FUNCTION harel_extend_many(
    p_groups TEXT[], p_seqs BIGINT[], p_tokens TEXT[], p_lease DOUBLE PRECISION)
RETURNS TABLE (group_id TEXT, held BOOLEAN)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_n INT := COALESCE(cardinality(p_groups), 0);
BEGIN
    IF p_lease IS NULL THEN
        RAISE EXCEPTION 'harel_extend_many: the lease end p_lease (%) is NULL or in the past', p_lease USING ERRCODE = 'PT003';
    END IF;
    PERFORM harel_px_split_check('harel_extend_many', cardinality(p_groups), cardinality(p_seqs), cardinality(p_tokens));
    IF p_groups IS NULL THEN
        RETURN;  -- every array NULL: nothing, as one database
    END IF;
    RETURN QUERY SELECT r.group_id, r.held
                   FROM harel_px_extend_many(ARRAY(SELECT generate_series(1, v_n)), p_groups, p_seqs, p_tokens, p_lease) AS r
                  ORDER BY r.ord;
END
$$;

-- Lists and counts: every partition (the group's alone when one is
-- named), merged. Dead letters' seqs are disjoint across partitions
-- (harel_partition), so one seq order pages through all of them.

CREATE OR REPLACE FUNCTION harel_px_dead_letters(p_group TEXT, p_after BIGINT, p_limit INT)
RETURNS TABLE (seq BIGINT, group_id TEXT, event TEXT, priority INT, attempts INT,
               last_error TEXT, published_at TIMESTAMPTZ, died_at TIMESTAMPTZ)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON harel_px_route(p_group); $$;

CREATE OR REPLACE FUNCTION harel_dead_letters(p_group TEXT, p_after BIGINT, p_limit INT)
RETURNS TABLE (seq BIGINT, group_id TEXT, event TEXT, priority INT, attempts INT,
               last_error TEXT, published_at TIMESTAMPTZ, died_at TIMESTAMPTZ)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT * FROM harel_px_dead_letters(p_group, p_after, p_limit) AS d ORDER BY d.seq LIMIT p_limit $$;

CREATE OR REPLACE FUNCTION harel_px_redrive(p_group TEXT, p_seqs BIGINT[], p_purge BOOLEAN)
RETURNS SETOF BIGINT
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON harel_px_route(p_group); $$;

CREATE OR REPLACE FUNCTION harel_redrive(p_group TEXT, p_seqs BIGINT[])
RETURNS BIGINT
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT COALESCE(sum(n), 0)::BIGINT FROM harel_px_redrive(p_group, p_seqs, false) AS n $$;

CREATE OR REPLACE FUNCTION harel_purge_dead_letters(p_group TEXT, p_seqs BIGINT[])
RETURNS BIGINT
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT COALESCE(sum(n), 0)::BIGINT FROM harel_px_redrive(p_group, p_seqs, true) AS n $$;

CREATE OR REPLACE FUNCTION harel_px_stats(p_now DOUBLE PRECISION)
RETURNS TABLE (priority INT, groups BIGINT, free BIGINT, leased BIGINT, parked BIGINT,
               stopped BIGINT, paused BIGINT, messages BIGINT, messages_exact BOOLEAN,
               oldest_head_age DOUBLE PRECISION, oldest_head_exact BOOLEAN,
               dead_letters BIGINT, dead_letters_exact BOOLEAN, waiters BIGINT,
               at TIMESTAMPTZ, groups_exact BOOLEAN)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON harel_px_all(); $$;

-- harel_stats: the partitions' rows added up per priority (and the total),
-- exact where every partition's is, the oldest head the oldest of all.
CREATE OR REPLACE FUNCTION harel_stats(p_now DOUBLE PRECISION DEFAULT NULL)
RETURNS TABLE (priority INT, groups BIGINT, free BIGINT, leased BIGINT, parked BIGINT,
               stopped BIGINT, paused BIGINT, messages BIGINT, messages_exact BOOLEAN,
               oldest_head_age DOUBLE PRECISION, oldest_head_exact BOOLEAN,
               dead_letters BIGINT, dead_letters_exact BOOLEAN, waiters BIGINT,
               at TIMESTAMPTZ, groups_exact BOOLEAN)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT s.priority, sum(s.groups)::BIGINT, sum(s.free)::BIGINT, sum(s.leased)::BIGINT, sum(s.parked)::BIGINT,
           sum(s.stopped)::BIGINT, sum(s.paused)::BIGINT, sum(s.messages)::BIGINT, bool_and(s.messages_exact),
           max(s.oldest_head_age), bool_and(s.oldest_head_exact),
           sum(s.dead_letters)::BIGINT, bool_and(s.dead_letters_exact), sum(s.waiters)::BIGINT,
           max(s.at), bool_and(s.groups_exact)
      FROM harel_px_stats(p_now) AS s
     GROUP BY s.priority
     ORDER BY s.priority NULLS LAST
$$;

CREATE OR REPLACE FUNCTION harel_px_groups(p_now DOUBLE PRECISION, p_state TEXT, p_order TEXT, p_offset INT, p_limit INT, p_tenant TEXT)
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT, tenant TEXT)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON harel_px_all(); $$;

-- harel_groups: each partition's first p_offset + p_limit in the order
-- asked, merged in that order. 'oldest_head' orders by the head's age
-- here (seqs of two partitions say nothing of which came first).
CREATE OR REPLACE FUNCTION harel_groups(p_now DOUBLE PRECISION, p_state TEXT, p_order TEXT, p_offset INT, p_limit INT,
                                        p_tenant TEXT DEFAULT NULL)
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT, tenant TEXT)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT g.*
      FROM harel_px_groups(p_now, p_state, p_order,
                           -- a NULL or negative offset or limit goes on as it
                           -- is, for the partitions to answer or refuse
                           CASE WHEN p_offset >= 0 AND p_limit >= 0 THEN 0 ELSE p_offset END,
                           CASE WHEN p_offset >= 0 AND p_limit >= 0 THEN LEAST(p_offset::BIGINT + p_limit, 2147483647)::INT
                                ELSE p_limit END,
                           p_tenant) AS g
     ORDER BY CASE WHEN p_order = 'held_longest' THEN g.leased_at END NULLS FIRST,
              CASE WHEN p_order = 'most_attempts' THEN g.attempts END DESC,
              CASE WHEN p_order = 'oldest_head' THEN g.head_age END DESC NULLS LAST,
              g.group_id
    OFFSET p_offset LIMIT p_limit
$$;

-- Tenants (version 27): a weight is set on every partition, each of
-- which shares its own claims among its tenants (docs/design.md, "Shares
-- across tenants"); the input is checked here first, so that a bad one
-- writes nothing anywhere. The tenants are merged: counts added up, the
-- share from the merged counts.
CREATE OR REPLACE FUNCTION harel_px_set_tenant_weight(p_tenant TEXT, p_weight INT)
RETURNS SETOF INT
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON harel_px_all(); $$;

CREATE OR REPLACE FUNCTION harel_set_tenant_weight(p_tenant TEXT, p_weight INT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_tenant IS NULL OR octet_length(p_tenant) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'harel_set_tenant_weight: a tenant is 1 to 256 bytes, not % bytes', octet_length(p_tenant) USING ERRCODE = 'PT011';
    END IF;
    IF p_weight IS NULL OR p_weight NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'harel_set_tenant_weight: a weight is 1 to 1000, not %', p_weight USING ERRCODE = 'PT012';
    END IF;
    PERFORM count(*) FROM harel_px_set_tenant_weight(p_tenant, p_weight);
END
$$;

CREATE OR REPLACE FUNCTION harel_px_tenants(p_now DOUBLE PRECISION)
RETURNS TABLE (tenant TEXT, weight INT, groups BIGINT, leased BIGINT, ready BIGINT, share DOUBLE PRECISION,
               delivered BIGINT)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON harel_px_all(); $$;

CREATE OR REPLACE FUNCTION harel_tenants(p_now DOUBLE PRECISION DEFAULT NULL)
RETURNS TABLE (tenant TEXT, weight INT, groups BIGINT, leased BIGINT, ready BIGINT, share DOUBLE PRECISION,
               delivered BIGINT)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$ SELECT a.tenant, a.weight, a.groups, a.leased, a.ready,
             CASE WHEN a.ready > 0 THEN a.weight::float8 / sum(a.weight) FILTER (WHERE a.ready > 0) OVER () ELSE 0 END,
             a.delivered
        FROM (SELECT t.tenant, max(t.weight) AS weight, sum(t.groups)::BIGINT AS groups,
                     sum(t.leased)::BIGINT AS leased, sum(t.ready)::BIGINT AS ready, sum(t.delivered)::BIGINT AS delivered
                FROM harel_px_tenants(p_now) AS t
               GROUP BY t.tenant) AS a
       ORDER BY a.tenant $$;

-- harel_counters: each partition's row (add them up).
CREATE OR REPLACE FUNCTION harel_counters()
RETURNS TABLE (published BIGINT, deleted BIGINT)
LANGUAGE plproxy SET search_path FROM CURRENT
AS $$ CLUSTER 'pgtransport'; RUN ON harel_px_all(); $$;

-- The two-INSERT publish. harel_px_flush sends this transaction's rows to
-- their partitions, in seq order, each message with its group row's
-- priority (0 without one), and deletes them: it runs when the transaction
-- commits (the deferred triggers below), once for all its rows (later
-- firings find none). Only the transaction's own rows are visible to it:
-- no row here is ever committed.
CREATE OR REPLACE FUNCTION harel_px_flush()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_groups TEXT[];
    v_events TEXT[];
    v_prios  INT[];
    v_tenants TEXT[];
BEGIN
    -- Sent already by an earlier firing: one index probe, not a scan.
    IF TG_TABLE_NAME = 'transport_px_messages' THEN
        PERFORM 1 FROM transport_px_messages AS m WHERE m.seq = NEW.seq;
    ELSE
        PERFORM 1 FROM transport_px_groups AS g WHERE g.group_id = NEW.group_id;
    END IF;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    WITH m AS (DELETE FROM transport_px_messages RETURNING seq, group_id, event),
         g AS (DELETE FROM transport_px_groups RETURNING group_id, priority, tenant)
    SELECT array_agg(m.group_id ORDER BY m.seq), array_agg(m.event ORDER BY m.seq),
           array_agg(COALESCE(g.priority, 0) ORDER BY m.seq), array_agg(g.tenant ORDER BY m.seq)
      INTO v_groups, v_events, v_prios, v_tenants
      FROM m LEFT JOIN g ON g.group_id = m.group_id;
    IF v_groups IS NOT NULL THEN
        PERFORM harel_publish_many(v_groups, v_events, v_prios, v_tenants);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS transport_messages_flush ON transport_px_messages;
CREATE CONSTRAINT TRIGGER transport_messages_flush
    AFTER INSERT ON transport_px_messages DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION harel_px_flush();
DROP TRIGGER IF EXISTS transport_groups_flush ON transport_px_groups;
CREATE CONSTRAINT TRIGGER transport_groups_flush
    AFTER INSERT ON transport_px_groups DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION harel_px_flush();

-- Roles granted the proxy's calls before an upgrade keep them: where the
-- owner's default privileges revoke EXECUTE from PUBLIC, a function this
-- script created anew (version 27 recreated the publishes, which took a
-- tenant) or added would otherwise be the owner's alone. Every role that
-- may execute harel_claim here may execute every harel_ function of this
-- schema, as on a partition (functions/99_grants.sql).
DO $pgtransport$
DECLARE
    r RECORD;
BEGIN
    FOR r IN
        SELECT DISTINCT quote_ident(pg_get_userbyid(a.grantee)) AS role
          FROM pg_proc AS p, aclexplode(p.proacl) AS a
         WHERE p.oid = 'harel_claim(double precision, double precision, text, integer)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE (SELECT 'GRANT EXECUTE ON FUNCTION ' || string_agg(p.oid::regprocedure::text, ', ') || ' TO ' || r.role
                   FROM pg_proc AS p
                  WHERE p.pronamespace = (SELECT c.relnamespace FROM pg_class AS c WHERE c.oid = 'transport_px_groups'::regclass)
                    AND p.proname LIKE 'harel\_%');
    END LOOP;
END
$pgtransport$;
