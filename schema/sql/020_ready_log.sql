-- 020_ready_log.sql: the ready log. Claims take the groups that became
-- claimable in the order they did, from a log, rather than by walking
-- the group rows (functions/30_claim.sql, "The ready log").
--
-- transport_ready: one entry each time a group row became claimable at
-- once (a new group, a group freed with messages left, a drained group
-- revived, a paused group resumed), written by triggers on
-- transport_groups (functions/25_ready.sql), deleted by the claim that
-- takes it or finds it stale. Its numbers come from transport_ready_rseq,
-- CACHE 1, drawn after the writer holds a transaction id: the frontier's
-- check rests on both.
-- transport_ready_front: no entry below it is live or still to commit;
-- claims read the log from there. transport_ready_check_rseq and
-- transport_ready_check_xid: the pending check that moves it (the last
-- entry number when it was recorded, and a transaction id taken after;
-- 0: none).
--
-- The functions change with it (no call's arguments or results): the
-- claims take due groups, then the log's, then sweep only where those
-- left room and, for a claim that found something or a stream's exchange,
-- for at most about 10 ms a call (functions/30_claim.sql, "Going round");
-- a nack's park comes back through the due index when it ends; a revived
-- row keeps its slot (the log orders arrivals).
CREATE SEQUENCE IF NOT EXISTS transport_ready_rseq AS BIGINT MINVALUE 1 START 1 CACHE 1;
CREATE TABLE IF NOT EXISTS transport_ready (
    rseq     BIGINT PRIMARY KEY DEFAULT nextval('transport_ready_rseq'),
    group_id TEXT NOT NULL,
    priority INT NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0);
CREATE SEQUENCE IF NOT EXISTS transport_ready_front AS BIGINT MINVALUE 1 START 1;
CREATE SEQUENCE IF NOT EXISTS transport_ready_check_rseq AS BIGINT MINVALUE 0 START 0;
CREATE SEQUENCE IF NOT EXISTS transport_ready_check_xid AS BIGINT MINVALUE 0 START 0;
-- transport_claim_reap_cursor: the slot from which the next reap of kept
-- rows goes on (functions/30_claim.sql, harel_reap).
CREATE SEQUENCE IF NOT EXISTS transport_claim_reap_cursor AS INT MINVALUE 0 MAXVALUE 1048576 START 0;

-- Every group claimable now gets its entry, in sweep order, so that an
-- upgrade on a live queue hands them out as before. (A claim of version
-- 19 still running during the upgrade takes groups by the sweep; the
-- entries it leaves are stale and the claims drop them.)
INSERT INTO transport_ready (group_id, priority)
SELECT g.group_id, g.priority
  FROM transport_groups AS g
 WHERE g.locked_by IS NULL AND NOT g.paused AND g.drained_at IS NULL AND g.retry_at IS NULL
 ORDER BY g.slot;
