-- 005_storage.sql: storage settings for queue tables, which churn: every
-- claim and ack rewrites a transport_groups row (lock_expiry is in the
-- round-robin index, so no update is HOT), and transport_messages is
-- inserted at one end and deleted at the other.
-- Idempotent.

-- transport_groups: small and hot. Vacuum it after a fixed number of dead
-- rows rather than a fraction of a table that is mostly dead churn, and
-- never throttle that vacuum (it is short). fillfactor leaves room in each
-- page, so a rewritten row usually stays in its page and the page's dead
-- versions are pruned in place.
ALTER TABLE transport_groups SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.05);

-- transport_messages: a FIFO. Vacuum at 2% dead (a deep backlog is not
-- re-read for every fraction of it), unthrottled, and after inserts too, so
-- the visibility map stays current for the head lookups.
ALTER TABLE transport_messages SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_insert_scale_factor = 0.05);

-- transport_waiters: a handful of rows rewritten on every idle spell.
ALTER TABLE transport_waiters SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 200,
    autovacuum_vacuum_cost_delay = 0);
