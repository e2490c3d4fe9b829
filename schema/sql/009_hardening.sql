-- 009_hardening.sql: one group-id rule for every client, enforced by the
-- schema, and functions that refuse misuse.
--
-- The group-id rule: 1 to 1,024 bytes (pgtransport.MaxGroupBytes), the rule
-- the Go client has always applied before sending. Until version 8 only Go
-- applied it, so a plain-SQL publish could create a group (an empty id, an
-- id of 2 KB) whose leases Go then refused to settle. The other two parts
-- of Go's rule need no constraint: a text value cannot hold a NUL byte in
-- PostgreSQL, and cannot hold invalid UTF-8 in a UTF8 database (in a
-- SQL_ASCII database it can, and Go settles such a lease all the same).
--
-- The constraint is on transport_messages, where every message enters: a
-- publish of a bad id, by harel_publish, harel_publish_many or the design's
-- two plain INSERTs, fails at its message insert with SQLSTATE 23514
-- (check_violation) naming transport_messages_group_id_valid, and its
-- transaction with it. Messages are only ever inserted and deleted, never
-- updated, so the constraint never touches a row already there.
--
-- Not on transport_groups: a CHECK is enforced on every UPDATE of a row,
-- even one that leaves group_id alone, so a group row with a bad id from
-- before the upgrade could then be neither leased nor freed, and the claim
-- that picked it (the round-robin's first, in time) would fail for every
-- worker. A group row cannot be deliverable without a message, and no new
-- message can carry a bad id; a group row inserted alone (no message) is
-- empty, and the first claim that reaches it deletes it.
--
-- Upgrading a database that holds such rows neither fails nor strands
-- them: the constraint is added NOT VALID, so rows already there are not
-- checked, nor the table scanned (its ACCESS EXCLUSIVE lock lasts until
-- the upgrade commits, as the triggers' re-creation's does). They are
-- still delivered, in order, by every claim, and settled like any other:
-- the Go client (since version 9) no longer applies the publish-side rule
-- to a lease the database issued. Only new messages for such a group are
-- refused; once its last message is acked, the group is gone. To find
-- them: SELECT DISTINCT group_id FROM transport_messages WHERE
-- octet_length(group_id) NOT BETWEEN 1 AND 1024. Once there are none,
-- ALTER TABLE transport_messages VALIDATE CONSTRAINT
-- transport_messages_group_id_valid marks it valid (optional: it changes
-- nothing for new rows).
--
-- The functions' refusals (SQLSTATE class PT) and the clock-skew bound
-- (the setting pgtransport.max_clock_skew) are in functions/15_checks.sql;
-- this step is also what makes a database at version 8 take them.
DO $pgtransport$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                    WHERE conrelid = 'transport_messages'::regclass
                      AND conname = 'transport_messages_group_id_valid') THEN
        ALTER TABLE transport_messages
            ADD CONSTRAINT transport_messages_group_id_valid
            CHECK (octet_length(group_id) BETWEEN 1 AND 1024) NOT VALID;
    END IF;
END
$pgtransport$;
