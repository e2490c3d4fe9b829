-- 012_state_and_floors.sql: two changes in one version.
--
-- Exactly-once effects: a small state value per group, written atomically
-- with an ack inside the caller's transaction (harel_ack_state), and kept
-- for a while after its group drains. The functions are in
-- functions/75_state.sql. Nothing here rewrites or scans a table: a
-- nullable column with no default, a new table, and a column with a
-- constant default. The design's two-INSERT publish and its
-- harel_claim/harel_ack calls keep working unchanged.
--
-- The claim beside a long transaction: the round-robin split by holder,
-- the never-served groups' arrival order, and the claim's floors (below;
-- functions/30_claim.sql, "The floor").

-- A group's state: NULL means none. Not indexed (read and written by
-- primary key only), so claims and acks pay nothing for it; a row that
-- carries no state stores nothing for it.
ALTER TABLE transport_groups ADD COLUMN IF NOT EXISTS state BYTEA;

-- The state of a drained group, kept for the queue's state_retention
-- (epoch seconds, server clock) so that a group whose messages come in
-- bursts finds its state again: a group row is deleted when its last
-- message is acked, and the next publish creates a fresh one. Written by
-- the trigger on transport_groups' deletes, read by harel_state, deleted
-- by the next state write of the group and, when it expires, by later
-- deletes (a few at a time).
CREATE TABLE IF NOT EXISTS transport_kept_states (
    group_id   TEXT PRIMARY KEY,
    state      BYTEA NOT NULL,
    keep_until DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS transport_kept_states_expiry
    ON transport_kept_states (keep_until);

-- How long (seconds) a drained group's state is kept: 0, a new queue's
-- choice, means not at all (it goes with the group row); at most a year.
ALTER TABLE transport_policy ADD COLUMN IF NOT EXISTS state_retention DOUBLE PRECISION NOT NULL DEFAULT 0
    CHECK (state_retention >= 0 AND state_retention <= 31536000);

-- The round-robin, split by holder, and the claim's floors (a long
-- transaction holding back vacuum; see "The floor" in
-- functions/30_claim.sql). The one round-robin index over every group row
-- put a leased row's entry at its lease's end; once the lease was acked and its
-- end passed, that dead entry sat among the free rows a claim walks, and
-- while an old snapshot kept vacuum from removing entries, every claim
-- walked all of them. Free rows (no holder) and held rows (a lease or a
-- nack's park, under a token) now have an index each, both partial, and
-- failed and stopped rows (holder '') keep transport_groups_retry. A claim
-- or an ack writes as many index entries as before: its row moves from one
-- partial index to the other. Built inside the upgrade's transaction, as
-- every step is: writes to transport_groups wait while they are built
-- (one row per group with messages).
-- Never-served groups (lock_expiry NULL) come first, as the design orders
-- them; among them, in the order they arrived (was: by group_id), so that
-- a claim can start its walk of them where the last one stopped, too: a
-- group row is created, claimed and deleted once per message in a queue
-- of one-message groups. The default numbers every new row, the design's
-- two-INSERT publish's included (it names no arrival); a row given back,
-- nacked with no delay or restarted (lock_expiry NULL again) is put first
-- in line by the function that does it. Rows from before the upgrade have
-- NULL, which sorts as 0: first.
CREATE SEQUENCE IF NOT EXISTS transport_groups_arrival AS BIGINT;
ALTER TABLE transport_groups ADD COLUMN IF NOT EXISTS arrival BIGINT;
ALTER TABLE transport_groups ALTER COLUMN arrival SET DEFAULT nextval('transport_groups_arrival');
CREATE INDEX IF NOT EXISTS transport_groups_free
    ON transport_groups ((COALESCE(lock_expiry, 0)), (COALESCE(arrival, 0)), group_id) WHERE locked_by IS NULL;
-- The held rows' predicate is locked_by > '' (a token is never empty):
-- the fences of acks, extends and nacks say locked_by <> '', which does not
-- imply it, so the planner never takes this index for theirs. (With the
-- statistics of a table where nothing was held, it took the index for
-- empty and walked all of it in place of a primary-key lookup.)
CREATE INDEX IF NOT EXISTS transport_groups_held
    ON transport_groups (lock_expiry, group_id) WHERE locked_by > '';
DROP INDEX IF EXISTS transport_groups_round_robin;

-- Where a claim starts its walks: the never-served rows' floor (an
-- arrival), and in epoch milliseconds the free rows' floor, the held
-- rows' floor, and when a claim last walked them all from the front.
-- Sequences, not a row: a sequence is one value written in place, so
-- reading it does not slow down while an old snapshot keeps vacuum from
-- removing row versions. Each is kept a margin behind what a claim found.
CREATE SEQUENCE IF NOT EXISTS transport_claim_new AS BIGINT MINVALUE 0 START 0;
CREATE SEQUENCE IF NOT EXISTS transport_claim_floor AS BIGINT MINVALUE 0 START 0;
CREATE SEQUENCE IF NOT EXISTS transport_claim_held AS BIGINT MINVALUE 0 START 0;
CREATE SEQUENCE IF NOT EXISTS transport_claim_sweep AS BIGINT MINVALUE 0 START 0;
