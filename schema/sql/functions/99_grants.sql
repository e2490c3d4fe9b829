-- 99_grants.sql: what roles granted before an upgrade need after it. Last,
-- so that it covers every function the files before it define.
--
-- The inlined helpers and the refusals (15_checks.sql) run with the
-- caller's privileges (every function here is SECURITY INVOKER), so a
-- worker role needs EXECUTE on them as on the protocol's functions.
-- PostgreSQL grants that to PUBLIC when a function is created, unless
-- default privileges revoke it; then schema.Grants, run before an upgrade
-- added a helper, would not cover it, and the worker's next publish would
-- fail (and a refusal would come as 42501, insufficient_privilege, instead
-- of its own code). They compute a hash, a lock key and a group's state
-- from its arguments, take the guard's advisory locks, which any role may
-- take anyway (pg_advisory_lock is PUBLIC's), or raise an error, or
-- (harel_ready_place) read the queue's tables with the caller's own
-- rights, so PUBLIC may always execute them.
GRANT EXECUTE ON FUNCTION
    harel_group_lock_key(TEXT),
    harel_guard_class(),
    harel_try_guard(TEXT),
    harel_share_guard(TEXT),
    harel_clock_skewed(DOUBLE PRECISION),
    harel_ready_place(TEXT),
    harel_group_state(TEXT, DOUBLE PRECISION, BOOLEAN, DOUBLE PRECISION),
    harel_refuse_token(TEXT),
    harel_refuse_lease(TEXT, DOUBLE PRECISION, DOUBLE PRECISION),
    harel_refuse_lease_past(TEXT, DOUBLE PRECISION),
    harel_refuse_skew(TEXT, DOUBLE PRECISION),
    harel_refuse_group(TEXT, TEXT),
    harel_refuse_lengths(TEXT),
    harel_refuse_tenant(TEXT, TEXT)
    TO PUBLIC;

-- Roles granted access before an upgrade keep working after it. A role
-- given schema.Grants before version 10 has no privilege on the tables
-- version 10 added, which a claim may write (a dead letter) and a publish
-- with a key must (and, since version 12, on transport_kept_states, which
-- any delete of a group row with a state may write, and on the claim's
-- floor sequences, which every claim reads; since version 13, read on
-- transport_partition, which a proxy's check reads; since version 20,
-- the ready log and its sequences, which every claim and ack writes; since
-- version 27, transport_tenants, which every entry reads and a claim
-- may write, and the virtual time; since version 28,
-- transport_tenant_counts, which a delete of group rows writes); and where the
-- owner's default privileges revoke EXECUTE
-- from PUBLIC, none on the functions it added. So every role that may
-- update transport_groups (PUBLIC aside) gets the same on the tables
-- added since, and every role that may execute harel_claim may execute
-- every function here (the harel_ functions of this schema, and no
-- other). Runs with each version change; GRANT of what is
-- held already changes nothing.
DO $pgtransport$
DECLARE
    r RECORD;
BEGIN
    FOR r IN
        SELECT DISTINCT quote_ident(pg_get_userbyid(a.grantee)) AS role
          FROM pg_class AS c, aclexplode(c.relacl) AS a
         WHERE c.oid = 'transport_groups'::regclass
           AND a.privilege_type = 'UPDATE' AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON transport_dead_letters, transport_dedup, transport_kept_states, transport_ready, transport_tenants, transport_tenant_counts TO ' || r.role;
        EXECUTE 'GRANT SELECT ON transport_policy, transport_partition TO ' || r.role;
        EXECUTE 'GRANT SELECT, UPDATE ON SEQUENCE transport_groups_slot, transport_claim_cursor, transport_claim_wrap, transport_claim_rest, '
             || 'transport_ready_rseq, transport_ready_front, transport_ready_check_vt, transport_ready_check_xid, transport_ready_vnow, transport_claim_reap_cursor TO ' || r.role;
        EXECUTE 'GRANT USAGE ON SEQUENCE transport_ready_rseq TO ' || r.role;
    END LOOP;
    FOR r IN
        SELECT DISTINCT quote_ident(pg_get_userbyid(a.grantee)) AS role
          FROM pg_proc AS p, aclexplode(p.proacl) AS a
         WHERE p.oid = 'harel_claim(double precision, double precision, text, integer)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        -- The queue's functions only (harel_ in this schema), never
        -- others that share the schema.
        EXECUTE (SELECT 'GRANT EXECUTE ON FUNCTION ' || string_agg(p.oid::regprocedure::text, ', ') || ' TO ' || r.role
                   FROM pg_proc AS p
                  WHERE p.pronamespace = (SELECT c.relnamespace FROM pg_class AS c WHERE c.oid = 'transport_groups'::regclass)
                    AND p.proname LIKE 'harel\_%');
    END LOOP;
END
$pgtransport$;
