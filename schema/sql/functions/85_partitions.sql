-- 85_partitions.sql: partitions (version 13). A queue may be spread over
-- N databases (N a power of two, at most 1,024), each holding this whole
-- schema, behind a proxy database whose functions (schema/sql/proxy.sql)
-- are PL/Proxy functions of the same names: a group lives in one
-- partition, hashtext(group_id) & (N - 1), so its order, its one holder
-- and its fences stay inside one database. Nothing here changes how a
-- single database works; these are what a proxy needs of its partitions.
--
-- Seqs. Each partition's seqs are its own, so across partitions they would
-- collide, and a seq alone (a dead letter's page, a redrive by seq) could
-- not name a message. harel_partition makes them disjoint: the message
-- sequence steps by 1,024 from a value whose remainder is the partition's
-- number, so seq & 1023 is where a message lives, whatever N is (a group
-- that stays behind when the cluster grows keeps its seqs, and its
-- partition keeps its number). Within a partition seqs still rise in
-- publish order, which is all the protocol asks of them.

-- transport_partition is this database's number in its cluster, one row,
-- written by harel_partition; no row in a database that is not a partition.
-- harel_partition numbers this database p_index (0 to 1,023) and makes its
-- seqs disjoint from the other partitions' (above). Run by the schema's
-- owner (it alters the message sequence), once per partition before it
-- takes messages through a proxy; again with the same number it changes
-- nothing. A different number than the one recorded is refused (22023):
-- messages it holds would be looked for in the wrong partition; so is a
-- database that holds messages or dead letters from before (their groups
-- and seqs could be another partition's).
CREATE OR REPLACE FUNCTION harel_partition(p_index INT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_part INT;
    v_last BIGINT;
BEGIN
    IF p_index IS NULL OR p_index NOT BETWEEN 0 AND 1023 THEN
        RAISE EXCEPTION 'harel_partition: p_index % is not 0 to 1023', p_index USING ERRCODE = '22023';
    END IF;
    LOCK TABLE transport_partition IN EXCLUSIVE MODE;
    SELECT p.part INTO v_part FROM transport_partition AS p;
    IF v_part = p_index THEN
        RETURN;
    ELSIF v_part IS NOT NULL THEN
        RAISE EXCEPTION 'harel_partition: this database is partition %, not %', v_part, p_index USING ERRCODE = '22023';
    END IF;
    -- Messages from before could be another partition's groups, and their
    -- seqs another partition's: an unnumbered database must be empty.
    -- Publishes wait until it is numbered.
    LOCK TABLE transport_messages, transport_dead_letters IN SHARE MODE;
    IF EXISTS (SELECT 1 FROM transport_messages) OR EXISTS (SELECT 1 FROM transport_dead_letters) THEN
        RAISE EXCEPTION 'harel_partition: this database holds messages or dead letters from before it was numbered; drain and purge them first'
            USING ERRCODE = '22023';
    END IF;
    -- The next seq: above any handed out so far, and = p_index mod 1024.
    SELECT s.last_value INTO v_last FROM transport_messages_seq_seq AS s;
    EXECUTE format('ALTER SEQUENCE transport_messages_seq_seq INCREMENT BY 1024 RESTART WITH %s',
                   (v_last / 1024 + 1) * 1024 + p_index);
    INSERT INTO transport_partition (part) VALUES (p_index);
END
$$;

-- harel_counters is what a sampler takes rates from: how many messages
-- were ever published (the message sequence's last value over its step:
-- seqs are taken once each, a partition's step is 1,024) and ever deleted
-- from the queue (acked, purged or dead-lettered: PostgreSQL's statistics
-- counter, flushed about once a second; -1 where the statistics are off).
-- One row; through a proxy, one per partition (add them up). Version 13.
CREATE OR REPLACE FUNCTION harel_counters()
RETURNS TABLE (published BIGINT, deleted BIGINT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT COALESCE((SELECT pg_sequence_last_value(q.seqrelid) / q.seqincrement FROM pg_sequence AS q
                        WHERE q.seqrelid = 'transport_messages_seq_seq'::regclass), 0),
             COALESCE((SELECT t.n_tup_del FROM pg_stat_user_tables AS t
                        WHERE t.relid = 'transport_messages'::regclass), -1) $$;

-- harel_px_partition is what the proxy checks of a partition before it
-- routes to it: the number harel_partition gave this database (NULL: none)
-- and the schema's version. p_part is the proxy's routing only.
CREATE OR REPLACE FUNCTION harel_px_partition(p_part INT)
RETURNS TABLE (part INT, version INT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT (SELECT p.part FROM transport_partition AS p),
             (SELECT max(v.version) FROM transport_schema_version AS v) $$;

-- The proxy's calls. A proxy function that must do more than pass its
-- arguments on (rotate a claim over partitions, put a batch's results
-- back in input order, merge lists) is written in plpgsql on the proxy
-- and reaches each partition through a PL/Proxy function, which calls the
-- function of its own name and schema here. These are those: the
-- protocol's functions under a harel_px_ name, with p_part (the partition
-- the proxy chose, for its routing only) or p_ords (each input's place in
-- the proxy's batch, returned beside its result) added. They change
-- nothing a single database does, and are not part of the protocol.

-- harel_px_claim is harel_claim_one (p_limit NULL) or harel_claim_leases.
CREATE OR REPLACE FUNCTION harel_px_claim(
    p_part         INT,
    p_now          DOUBLE PRECISION,
    p_lease        DOUBLE PRECISION,
    p_token        TEXT,
    p_min_priority INT,
    p_limit        INT)
RETURNS TABLE (group_id TEXT, seq BIGINT, event TEXT, attempt INT, age DOUBLE PRECISION)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF p_limit IS NULL THEN
        RETURN QUERY SELECT * FROM harel_claim_one(p_now, p_lease, p_token, p_min_priority);
    ELSE
        RETURN QUERY SELECT * FROM harel_claim_leases(p_now, p_lease, p_token, p_min_priority, p_limit);
    END IF;
END
$$;

-- harel_px_publish_many is harel_publish_many (p_window NULL) or
-- harel_publish_keyed (with p_tenants), each seq beside its input's place, and, while the
-- cluster grows, a publish if here: the messages of a group whose home is
-- another partition and that has nothing left here (harel_stays, asked in
-- group order) are not published and come back with a NULL seq, for the
-- router to publish in the group's new home; the others are published.
CREATE OR REPLACE FUNCTION harel_px_publish_many(
    p_ords       INT[],
    p_groups     TEXT[],
    p_events     TEXT[],
    p_priorities INT[],
    p_keys       TEXT[],
    p_window     DOUBLE PRECISION,
    p_tenants    TEXT[] DEFAULT NULL)
RETURNS TABLE (ord INT, seq BIGINT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_gone TEXT[];
BEGIN
    v_gone := ARRAY(SELECT harel_left(p_groups));
    IF cardinality(v_gone) > 0 THEN
        BEGIN
            RETURN QUERY SELECT p_ords[u.n]::INT, NULL::BIGINT
                           FROM unnest(p_groups) WITH ORDINALITY AS u(g, n) WHERE u.g = ANY (v_gone);
            SELECT array_agg(p_ords[n] ORDER BY n), array_agg(p_groups[n] ORDER BY n), array_agg(p_events[n] ORDER BY n),
                   array_agg(p_priorities[n] ORDER BY n), array_agg(p_keys[n] ORDER BY n), array_agg(p_tenants[n] ORDER BY n)
              INTO p_ords, p_groups, p_events, p_priorities, p_keys, p_tenants
              FROM generate_subscripts(p_groups, 1) AS n
             WHERE p_groups[n] IS NULL OR p_groups[n] <> ALL (v_gone);
            IF p_groups IS NULL THEN
                RETURN;
            END IF;
        END;
    END IF;
    RETURN QUERY SELECT * FROM harel_px_publish_home(p_ords, p_groups, p_events, p_priorities, p_keys, p_window, p_tenants);
END
$$;

-- harel_px_publish_here is harel_publish, or (not p_strict) NULL with
-- nothing written for a group whose home is another partition and that
-- has nothing left here (harel_stays): the proxy then publishes it, strict,
-- in its new home, where the fence refuses (PT010) what lives elsewhere.
CREATE OR REPLACE FUNCTION harel_px_publish_here(p_part INT, p_group TEXT, p_event TEXT, p_priority INT, p_strict BOOLEAN,
                                                 p_tenant TEXT DEFAULT NULL)
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF NOT p_strict AND EXISTS (SELECT 1 FROM harel_left(ARRAY[p_group])) THEN
        RETURN NULL;
    END IF;
    RETURN harel_publish(p_group, p_event, p_priority, p_tenant);
END
$$;

-- harel_px_publish_home is harel_publish_many (p_window NULL) or
-- harel_publish_keyed, each seq beside its input's place, with nothing
-- handed back: the proxy's second try, in each group's home, where the
-- fence refuses (PT010) a group that lives elsewhere (a proxy whose map is
-- older than the partitions'), and harel_px_publish_many's last step.
CREATE OR REPLACE FUNCTION harel_px_publish_home(
    p_ords       INT[],
    p_groups     TEXT[],
    p_events     TEXT[],
    p_priorities INT[],
    p_keys       TEXT[],
    p_window     DOUBLE PRECISION,
    p_tenants    TEXT[] DEFAULT NULL)
RETURNS TABLE (ord INT, seq BIGINT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF p_window IS NULL THEN
        RETURN QUERY SELECT p_ords[r.n]::INT, r.s
                       FROM harel_publish_many(p_groups, p_events, p_priorities, p_tenants) WITH ORDINALITY AS r(s, n);
    ELSE
        RETURN QUERY SELECT p_ords[r.n]::INT, r.s
                       FROM harel_publish_keyed(p_groups, p_events, p_priorities, p_keys, p_window, p_tenants) WITH ORDINALITY AS r(s, n);
    END IF;
END
$$;

-- harel_px_ack_many is harel_ack_many, each row beside its input's place.
CREATE OR REPLACE FUNCTION harel_px_ack_many(
    p_ords   INT[],
    p_groups TEXT[],
    p_seqs   BIGINT[],
    p_tokens TEXT[],
    p_keep   BOOLEAN[],
    p_now    DOUBLE PRECISION,
    p_lease  DOUBLE PRECISION)
RETURNS TABLE (ord INT, group_id TEXT, held BOOLEAN, next_seq BIGINT, next_event TEXT)
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT p_ords[r.n]::INT, r.group_id, r.held, r.next_seq, r.next_event
        FROM harel_ack_many(p_groups, p_seqs, p_tokens, p_keep, p_now, p_lease)
             WITH ORDINALITY AS r(group_id, held, next_seq, next_event, n) $$;

-- harel_px_extend_many is harel_extend_many, each row beside its input's
-- place.
CREATE OR REPLACE FUNCTION harel_px_extend_many(
    p_ords   INT[],
    p_groups TEXT[],
    p_seqs   BIGINT[],
    p_tokens TEXT[],
    p_lease  DOUBLE PRECISION)
RETURNS TABLE (ord INT, group_id TEXT, held BOOLEAN)
LANGUAGE sql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT p_ords[r.n]::INT, r.group_id, r.held
        FROM harel_extend_many(p_groups, p_seqs, p_tokens, p_lease)
             WITH ORDINALITY AS r(group_id, held, n) $$;

-- harel_px_dead_letters is harel_dead_letters.
CREATE OR REPLACE FUNCTION harel_px_dead_letters(
    p_group TEXT,
    p_after BIGINT,
    p_limit INT)
RETURNS TABLE (seq BIGINT, group_id TEXT, event TEXT, priority INT, attempts INT,
               last_error TEXT, published_at TIMESTAMPTZ, died_at TIMESTAMPTZ)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT * FROM harel_dead_letters(p_group, p_after, p_limit) $$;

-- harel_px_redrive is harel_redrive (p_purge false) or
-- harel_purge_dead_letters.
CREATE OR REPLACE FUNCTION harel_px_redrive(
    p_group TEXT,
    p_seqs  BIGINT[],
    p_purge BOOLEAN)
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF p_purge THEN
        RETURN harel_purge_dead_letters(p_group, p_seqs);
    END IF;
    RETURN harel_redrive(p_group, p_seqs);
END
$$;

-- harel_px_stats is harel_stats.
CREATE OR REPLACE FUNCTION harel_px_stats(p_now DOUBLE PRECISION)
RETURNS TABLE (priority INT, groups BIGINT, free BIGINT, leased BIGINT, parked BIGINT,
               stopped BIGINT, paused BIGINT, messages BIGINT, messages_exact BOOLEAN,
               oldest_head_age DOUBLE PRECISION, oldest_head_exact BOOLEAN,
               dead_letters BIGINT, dead_letters_exact BOOLEAN, waiters BIGINT,
               at TIMESTAMPTZ, groups_exact BOOLEAN)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT * FROM harel_stats(p_now) $$;

-- harel_px_groups is harel_groups.
CREATE OR REPLACE FUNCTION harel_px_groups(
    p_now    DOUBLE PRECISION,
    p_state  TEXT,
    p_order  TEXT,
    p_offset INT,
    p_limit  INT,
    p_tenant TEXT DEFAULT NULL)  -- a proxy of version 27 names none
RETURNS TABLE (group_id TEXT, priority INT, state TEXT, holder TEXT, leased_at DOUBLE PRECISION,
               until DOUBLE PRECISION, head_seq BIGINT, head_age DOUBLE PRECISION, attempts INT, tenant TEXT)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ SELECT * FROM harel_groups(p_now, p_state, p_order, p_offset, p_limit, p_tenant) $$;

-- harel_px_set_tenant_weight and harel_px_tenants are harel_set_tenant_weight
-- and harel_tenants for a proxy's RUN ON ALL (it sets each partition's
-- weight and merges their tenants): a row back from each.
CREATE OR REPLACE FUNCTION harel_px_set_tenant_weight(p_tenant TEXT, p_weight INT)
RETURNS INT
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    PERFORM harel_set_tenant_weight(p_tenant, p_weight);
    RETURN 1;
END
$$;

CREATE OR REPLACE FUNCTION harel_px_tenants(p_now DOUBLE PRECISION)
RETURNS TABLE (tenant TEXT, weight INT, groups BIGINT, leased BIGINT, ready BIGINT, share DOUBLE PRECISION,
               delivered BIGINT)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$ BEGIN RETURN QUERY SELECT * FROM harel_tenants(p_now); END $$;
