-- 003_wakeups.sql: the table of idle consumers that want a LISTEN/NOTIFY
-- wake-up. The functions and the trigger that use it (harel_channel,
-- harel_wake, harel_wait, harel_unwait) live in functions/80_wakeups.sql,
-- with the why of the wake-ups. Idempotent.

-- One row per idle consumer that wants a notification for a new group at
-- or above min_priority. until (epoch seconds, server clock) lets a row
-- outlive a crashed consumer only briefly: consumers refresh it while idle.
CREATE TABLE IF NOT EXISTS transport_waiters (
    waiter       TEXT PRIMARY KEY,
    min_priority INT NOT NULL,
    until        DOUBLE PRECISION NOT NULL
);
