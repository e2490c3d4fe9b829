-- 001_init.sql: the design's tables.
--
-- The numbered files hold only what runs once in a database's life (tables,
-- columns, indexes, storage settings), in version order, and tables.sql
-- shows what they add up to; every function and trigger is defined once,
-- as it runs today, in the files of functions/, which are applied after
-- them. Runs with search_path set to the target schema followed by
-- pg_temp. Idempotent: safe to run again on a database that has it.

CREATE TABLE IF NOT EXISTS transport_messages (
    seq      BIGSERIAL PRIMARY KEY,  -- FIFO order and the lease handle
    group_id TEXT NOT NULL,          -- the exclusivity group
    event    TEXT NOT NULL           -- the payload
);
-- Head-of-group lookup.
CREATE INDEX IF NOT EXISTS transport_messages_group
    ON transport_messages (group_id, seq);

CREATE TABLE IF NOT EXISTS transport_groups (
    group_id    TEXT PRIMARY KEY,  -- one row per group that has messages
    locked_by   TEXT,              -- lease token while in flight or parked, else NULL
    lock_expiry DOUBLE PRECISION,  -- epoch seconds the lease or park ends; NULL = never claimed
    priority    INT NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 4)
);
-- The claim's ORDER BY, as an index: the claim walks it from the front and
-- stops at the first claimable unlocked row instead of sorting the table.
-- (The design's plain index on lock_expiry would serve no query and cost a
-- write on every claim and ack, so it is left out.)
CREATE INDEX IF NOT EXISTS transport_groups_round_robin
    ON transport_groups ((COALESCE(lock_expiry, 0)), group_id);
