-- 011_operations.sql: what an operator sees and steers: the queue's stats,
-- its groups and their heads, and pausing, resuming and purging a group.
-- The functions are in functions/70_operations.sql.
-- Both columns are added without a table rewrite (a constant default, or
-- none), so the design's two-INSERT publish and its harel_claim/harel_ack
-- calls keep working unchanged.

-- A paused group is never claimed, by any claim function, and its row is
-- not deleted when it drains, so the pause outlasts an empty spell; its
-- lock_expiry (its place in the round-robin) is left alone, so a resume
-- puts it back where it was. No index: a claim skips paused rows as it
-- walks the round-robin index (operators pause few groups).
ALTER TABLE transport_groups ADD COLUMN IF NOT EXISTS paused BOOLEAN NOT NULL DEFAULT false;

-- When the holder was handed the message it holds (epoch seconds, the
-- claim's p_now): a claim, and a keep (the same holder going on to the
-- next message), write it in their one write of the row; an extend
-- leaves it. NULL: not leased since the upgrade. Not indexed: read only by
-- the operator's listing (harel_groups, held_longest: the handlers that
-- have run longest).
ALTER TABLE transport_groups ADD COLUMN IF NOT EXISTS leased_at DOUBLE PRECISION;

-- Paused groups, for the operator's counts (harel_stats): partial, so a
-- row enters it only while paused, and claims and acks of other groups
-- never touch it.
CREATE INDEX IF NOT EXISTS transport_groups_paused
    ON transport_groups (group_id) WHERE paused;
