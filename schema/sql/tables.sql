-- tables.sql: the current shape of every table, index, sequence and
-- storage setting of the queue, in one place, as the numbered steps
-- (NNN_*.sql) leave a database at the current version.
--
-- Read it; do not apply it. Apply runs the numbered steps, which are what
-- brought every existing database here one version at a time, and then
-- the functions (functions/NN_<section>.sql), which this file leaves out
-- with their triggers. TestTablesMatchTheSteps loads this file into an
-- empty schema and compares its catalog (columns with their types,
-- defaults and NOT NULL; constraints; indexes; storage options;
-- sequences) with that of a schema brought to the current version by
-- Apply: a step that changes a table fails it until this file shows the
-- change. The step that last changed each part is named beside it, so a
-- reader can find the why in full there.
--
-- Epoch seconds (DOUBLE PRECISION) are on the server's clock, as the
-- functions read it; a text group id is the exclusivity group.

-- The versions applied, one row each (schema.Apply writes it; it is not a
-- numbered step).
CREATE TABLE transport_schema_version (
    version    INT PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The messages, in FIFO order. Only ever inserted and deleted, never
-- updated. (001, 005, 009, 010)
CREATE TABLE transport_messages (
    seq          BIGSERIAL PRIMARY KEY,  -- FIFO order and the lease handle; on a
                                         -- partition, seq & 1023 is its number (harel_partition)
    group_id     TEXT NOT NULL,          -- the exclusivity group
    event        TEXT NOT NULL,          -- the payload
    published_at TIMESTAMPTZ DEFAULT statement_timestamp(),  -- NULL: queued before version 10
    last_error   TEXT                    -- the cause its last failed attempt gave (harel_fail)
) WITH (
    -- A FIFO: vacuumed at 2% dead (a deep backlog is not re-read for every
    -- fraction of it), unthrottled, and after inserts too, so the
    -- visibility map stays current for the head lookups. (005)
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_insert_scale_factor = 0.05);
-- The group-id rule, 1 to 1,024 bytes (pgtransport.MaxGroupBytes), on every
-- message that enters. NOT VALID even in a new database: the step adds it
-- so to an existing table without checking (or scanning) the rows already
-- there, and rows from before version 9 may break it. (009)
ALTER TABLE transport_messages
    ADD CONSTRAINT transport_messages_group_id_valid
    CHECK (octet_length(group_id) BETWEEN 1 AND 1024) NOT VALID;
-- Head-of-group lookup. (001)
CREATE INDEX transport_messages_group
    ON transport_messages (group_id, seq);

-- A group row's place in the claims' sweep, numbered when the row is
-- created (and, since 018, when it is revived where rounds are costly),
-- through 2^20 values and round again; the slot the next claim starts
-- from; when a claim that went round from the first slot last leased
-- nothing, in epoch milliseconds of its clock (functions/30_claim.sql, "The sweep"). (016)
-- Until when no claim goes round, in epoch milliseconds of the server's
-- clock ("Going round"). (018)
CREATE SEQUENCE transport_groups_slot AS INT MINVALUE 0 MAXVALUE 1048575 START 0 CYCLE;
CREATE SEQUENCE transport_claim_cursor AS INT MINVALUE 0 MAXVALUE 1048576 START 0;
CREATE SEQUENCE transport_claim_wrap AS BIGINT MINVALUE 0 START 0;
CREATE SEQUENCE transport_claim_rest AS BIGINT MINVALUE 0 START 0;
-- Where the next reap of kept rows goes on from (harel_reap). (020)
CREATE SEQUENCE transport_claim_reap_cursor AS INT MINVALUE 0 MAXVALUE 1048576 START 0;

-- One row per group that has messages (or is paused, or drained a moment
-- ago: drained_at): who holds it, until when, and what a claim handed
-- out. Claims, acks and extends rewrite a row in its columns that no
-- index holds, so in place (HOT); a drained row is kept for the group's
-- next publish until a claim finds it still empty, and that publish
-- leaves it unwritten. (001, 005, 010, 011, 012, 016, 017, 024)
CREATE TABLE transport_groups (
    group_id      TEXT PRIMARY KEY,
    locked_by     TEXT,              -- the lease token while leased or parked by a nack;
                                     -- '' while failed (backoff) or stopped; NULL: free
    lock_expiry   DOUBLE PRECISION,  -- when the lease, park or backoff ends ('Infinity': stopped);
                                     -- when a free row was freed; NULL = never claimed
    priority      INT NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 4),
    delivered_seq BIGINT,            -- the message the claim handed out (010)
    attempts      INT NOT NULL DEFAULT 0,  -- how many times it was handed out (010)
    paused        BOOLEAN NOT NULL DEFAULT false,  -- never claimed while true (011)
    leased_at     DOUBLE PRECISION,  -- when the holder was handed what it holds (011)
    state         BYTEA,             -- the group's exactly-once state; NULL: none (012)
    slot          INT NOT NULL DEFAULT nextval('transport_groups_slot'),  -- its place in the sweep, never rewritten (016)
    retry_at      DOUBLE PRECISION,  -- due before the sweep from then (a retry, a park, a give-back); NULL: not (016)
    drained_at    DOUBLE PRECISION,  -- when its last message was acked, the row kept for the next publish,
                                     -- which leaves it (024); cleared by the next lease; NULL: not drained
                                     -- since (a hint: claims read the head all the same) (017, 024)
    tenant        TEXT NOT NULL DEFAULT 'default'  -- the tenant, set by the publish that creates the row (027)
                  CONSTRAINT transport_groups_tenant_valid CHECK (octet_length(tenant) BETWEEN 1 AND 256),
    handed        BIGINT NOT NULL DEFAULT 0  -- messages handed out from the row (deliveries), for its tenant's count (028)
) WITH (
    -- Small and hot: vacuumed after a fixed number of dead rows, not a
    -- fraction of a table that is mostly churn, and never throttled (005);
    -- room in each page for all its rows to be rewritten in one
    -- transaction, so a batch claim's updates stay in their pages (HOT). (016)
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.05,
    fillfactor = 30);
-- The sweep, in slot order. (016)
CREATE INDEX transport_groups_sweep
    ON transport_groups (slot);
-- Groups due before the sweep, by when: written by the settles that park
-- or give back, never by a claim or an ack that succeeds. (016)
CREATE INDEX transport_groups_due
    ON transport_groups (retry_at) WHERE retry_at IS NOT NULL;
-- Paused groups, for the operator's counts. (011)
CREATE INDEX transport_groups_paused
    ON transport_groups (group_id) WHERE paused;

-- The ready log: one entry each time a group row became claimable at
-- once (created, freed with messages left, revived, resumed), written by
-- the triggers of functions/25_ready.sql and deleted by the claim that
-- takes it or finds it stale; the claims read it from the frontier
-- (functions/30_claim.sql, "The ready log") in (vt, rseq) order: vt places
-- an entry among its tenant's and the other tenants' ("Shares" in
-- 25_ready.sql), the number, drawn one at a time (CACHE 1), orders equal
-- places. (020, 027)
CREATE SEQUENCE transport_ready_rseq AS BIGINT MINVALUE 1 START 1 CACHE 1;
CREATE TABLE transport_ready (
    rseq     BIGINT NOT NULL DEFAULT nextval('transport_ready_rseq'),
    group_id TEXT NOT NULL,
    priority INT NOT NULL,     -- the group's when it became claimable (a claim's floor reads it)
    tenant   TEXT NOT NULL DEFAULT 'default',  -- the group's (027)
    vt       BIGINT NOT NULL DEFAULT 0,        -- its place: a virtual time (027)
    PRIMARY KEY (vt, rseq)
) WITH (
    -- Only ever inserted and deleted: vacuumed after a fixed number of
    -- dead rows, never throttled. (020)
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0);
-- A tenant's last entry, for the next one's place. (027)
CREATE INDEX transport_ready_tenant
    ON transport_ready (tenant, vt);
-- The frontier, a vt: no entry below it is live or still to commit. The
-- pending check that moves it: the virtual time when it was recorded,
-- and a transaction id taken after that (0: none). (020, 027)
CREATE SEQUENCE transport_ready_front AS BIGINT MINVALUE 0 START 1;
CREATE SEQUENCE transport_ready_check_vt AS BIGINT MINVALUE 0 START 0;
CREATE SEQUENCE transport_ready_check_xid AS BIGINT MINVALUE 0 START 0;
-- The virtual time: the highest vt the claims read. (027)
CREATE SEQUENCE transport_ready_vnow AS BIGINT MINVALUE 0 START 0;

-- The tenants given a weight or charged for a hand-out outside the ready
-- log; a tenant with no row weighs 1 (functions/25_ready.sql, "Shares").
-- (027)
CREATE TABLE transport_tenants (
    tenant  TEXT PRIMARY KEY CHECK (octet_length(tenant) BETWEEN 1 AND 256),
    weight  INT NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    charged BIGINT NOT NULL DEFAULT 0  -- its next entries go past this vt
);

-- The deliveries of group rows since deleted (or revived for another
-- tenant), by tenant: a row added by each deleting statement, folded
-- into one row a tenant (functions/70_operations.sql, "Deliveries per
-- tenant"). harel_tenants adds these and the live rows' handed. (028)
CREATE TABLE transport_tenant_counts (
    tenant    TEXT NOT NULL,
    folded    BOOLEAN NOT NULL DEFAULT false,
    delivered BIGINT NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX transport_tenant_counts_folded ON transport_tenant_counts (tenant) WHERE folded;

-- Idle consumers that want a LISTEN/NOTIFY wake-up for a new group at or
-- above min_priority, until a time they refresh while idle. (003, 005)
CREATE TABLE transport_waiters (
    waiter       TEXT PRIMARY KEY,
    min_priority INT NOT NULL,
    until        DOUBLE PRECISION NOT NULL
) WITH (
    -- A handful of rows rewritten on every idle spell. (005)
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 200,
    autovacuum_vacuum_cost_delay = 0);

-- Messages that used up their attempts, out of their group so that it goes
-- on; seq is the message's own, under which a redrive puts it back. (010)
CREATE TABLE transport_dead_letters (
    seq          BIGINT PRIMARY KEY,
    group_id     TEXT NOT NULL,
    event        TEXT NOT NULL,
    priority     INT NOT NULL,
    attempts     INT NOT NULL,
    last_error   TEXT,
    published_at TIMESTAMPTZ,
    died_at      TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp()
);
CREATE INDEX transport_dead_letters_group
    ON transport_dead_letters (group_id, seq);

-- The queue's policy, one row (inserted by the step that creates the
-- table), read by the functions, so every consumer in any language applies
-- the same. (010, 012)
CREATE TABLE transport_policy (
    id              BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
    max_attempts    INT NOT NULL DEFAULT 10 CHECK (max_attempts >= 0),  -- hand-outs before exhausted; 0 = never
    on_exhausted    TEXT NOT NULL DEFAULT 'dead_letter' CHECK (on_exhausted IN ('dead_letter', 'stop')),
    backoff_min     DOUBLE PRECISION NOT NULL DEFAULT 1 CHECK (backoff_min >= 0.001),  -- seconds
    backoff_max     DOUBLE PRECISION NOT NULL DEFAULT 60 CHECK (backoff_max >= backoff_min AND backoff_max <= 86400),
    state_retention DOUBLE PRECISION NOT NULL DEFAULT 0  -- seconds a drained group's state is kept
        CHECK (state_retention >= 0 AND state_retention <= 31536000)
);
INSERT INTO transport_policy DEFAULT VALUES;

-- Idempotent publish: a (group, key) seen within its window maps to the seq
-- it first published; publishers with keys delete expired rows a few at a
-- time. (010)
CREATE TABLE transport_dedup (
    group_id   TEXT NOT NULL,
    dedup_key  TEXT NOT NULL CHECK (octet_length(dedup_key) BETWEEN 1 AND 256),
    seq        BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (group_id, dedup_key)
) WITH (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0);
CREATE INDEX transport_dedup_expiry
    ON transport_dedup (expires_at);

-- The state of a drained group, kept for the policy's state_retention:
-- written by the trigger on transport_groups' deletes, read by harel_state.
-- (012)
CREATE TABLE transport_kept_states (
    group_id   TEXT PRIMARY KEY,
    state      BYTEA NOT NULL,
    keep_until DOUBLE PRECISION NOT NULL
);
CREATE INDEX transport_kept_states_expiry
    ON transport_kept_states (keep_until);

-- A partition's number in a cluster behind a proxy (harel_partition), the
-- partition count it was armed for (harel_grow) and, while the cluster
-- grows, the count it grew from. No row: not a partition. (013, 014)
CREATE TABLE transport_partition (
    id         BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
    part       INT NOT NULL CHECK (part BETWEEN 0 AND 1023),
    parts      INT CHECK (parts BETWEEN 1 AND 1024 AND parts & (parts - 1) = 0 AND part < parts),
    grown_from INT CHECK (grown_from * 2 = parts)
);
