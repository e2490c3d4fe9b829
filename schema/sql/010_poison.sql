-- 010_poison.sql: a poison message never blocks its group: delivery
-- attempts counted by the server, retry backoff, dead letters, redrive,
-- when a message was published, and idempotent publish. The functions that
-- use these are in functions/ (30_claim.sql, 50_fail.sql,
-- 55_keyed_publish.sql). Every column added here
-- has a default or is nullable, so the design's two-INSERT publish and
-- its harel_claim/harel_ack calls keep working unchanged; nothing here
-- rewrites a table or scans it.

-- The claim's one write of a group row records which message it handed
-- out and how many times: only a group's head is ever delivered, so a
-- group row can count for its head. NULL: nothing handed out since the
-- upgrade (a lease taken before it is settled as before).
ALTER TABLE transport_groups ADD COLUMN IF NOT EXISTS delivered_seq BIGINT;
ALTER TABLE transport_groups ADD COLUMN IF NOT EXISTS attempts INT NOT NULL DEFAULT 0;

-- Groups whose head failed and waits out its backoff (harel_fail parks
-- them under no token: locked_by = ''), by when it ends: a claim serves
-- those whose backoff has ended before the round-robin, so a failing
-- message is retried when its backoff ends, not a whole round later.
-- Partial: rows of leased, parked or free groups never enter it, so
-- claims and acks do not maintain it. (Stopped groups, '' until
-- 'Infinity', sit at its end and are never reached.)
CREATE INDEX IF NOT EXISTS transport_groups_retry
    ON transport_groups (lock_expiry) WHERE locked_by = '';

-- When a message was published (server clock, the publishing statement's
-- start), and the cause its last failed attempt gave (harel_fail). Rows
-- queued before the upgrade keep published_at NULL (unknown): the column
-- is added without a default, then given one, so no row is rewritten.
ALTER TABLE transport_messages ADD COLUMN IF NOT EXISTS published_at TIMESTAMPTZ;
ALTER TABLE transport_messages ALTER COLUMN published_at SET DEFAULT statement_timestamp();
ALTER TABLE transport_messages ADD COLUMN IF NOT EXISTS last_error TEXT;

-- Messages that used up their attempts, moved out of their group so that
-- it goes on. seq is the message's own: a redrive puts it back under it,
-- at the head of its group (older than anything published since).
CREATE TABLE IF NOT EXISTS transport_dead_letters (
    seq          BIGINT PRIMARY KEY,
    group_id     TEXT NOT NULL,
    event        TEXT NOT NULL,
    priority     INT NOT NULL,
    attempts     INT NOT NULL,
    last_error   TEXT,
    published_at TIMESTAMPTZ,
    died_at      TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp()
);
CREATE INDEX IF NOT EXISTS transport_dead_letters_group
    ON transport_dead_letters (group_id, seq);

-- The queue's retry policy, one row, read by the functions: every consumer
-- of the queue, in any language, applies the same limit.
--   max_attempts: hand-outs of a message before it is dead-lettered (or its
--     group stopped); 0 = never.
--   on_exhausted: 'dead_letter' (the message moves to
--     transport_dead_letters, its group goes on) or 'stop' (the message
--     stays at the head and its group is stopped until an operator runs
--     harel_restart_group).
--   backoff_min, backoff_max: seconds; harel_fail parks a group for
--     backoff_min * 2^(attempt-1), at most backoff_max, with equal jitter,
--     never below backoff_min.
CREATE TABLE IF NOT EXISTS transport_policy (
    id           BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
    max_attempts INT NOT NULL DEFAULT 10 CHECK (max_attempts >= 0),
    on_exhausted TEXT NOT NULL DEFAULT 'dead_letter' CHECK (on_exhausted IN ('dead_letter', 'stop')),
    backoff_min  DOUBLE PRECISION NOT NULL DEFAULT 1 CHECK (backoff_min >= 0.001),
    backoff_max  DOUBLE PRECISION NOT NULL DEFAULT 60 CHECK (backoff_max >= backoff_min AND backoff_max <= 86400)
);
INSERT INTO transport_policy DEFAULT VALUES ON CONFLICT (id) DO NOTHING;

-- Idempotent publish: a (group, key) seen within its window maps to the
-- seq it first published. expires_at is epoch seconds (server clock);
-- publishers with keys delete expired rows a few at a time (harel_publish_keyed).
CREATE TABLE IF NOT EXISTS transport_dedup (
    group_id   TEXT NOT NULL,
    dedup_key  TEXT NOT NULL CHECK (octet_length(dedup_key) BETWEEN 1 AND 256),
    seq        BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (group_id, dedup_key)
);
CREATE INDEX IF NOT EXISTS transport_dedup_expiry
    ON transport_dedup (expires_at);

ALTER TABLE transport_dedup SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0);
