-- A database as schema version 1 left it: run against a schema at version 1
-- (search_path set to it). Three groups: one in flight under a live lease,
-- one parked, one free with two messages queued. The upgrade test applies
-- the latest version over it and checks that all of it is still served.
INSERT INTO transport_messages (group_id, event) VALUES
    ('inflight', 'inflight-1'),
    ('inflight', 'inflight-2'),
    ('parked', 'parked-1'),
    ('free', 'free-1'),
    ('free', 'free-2');
INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority) VALUES
    ('inflight', 'old-worker:00000000-0000-4000-8000-000000000001', 1800000100, 2),
    ('parked', 'old-worker:00000000-0000-4000-8000-000000000002', 1800000050, 0),
    ('free', NULL, NULL, 1);
