-- 027_tenants.sql: tenants and their weighted shares
-- (functions/25_ready.sql, "Shares").
--
-- transport_groups.tenant: the tenant a group belongs to, set by the
-- publish that creates its row ('default' for the design's two-INSERT
-- publish and every publish that names none), 1 to 256 bytes.
-- transport_tenants: a row for each tenant given a weight or charged for
-- a hand-out outside the ready log (a retry, a lapsed lease); a tenant
-- with no row weighs 1.
-- transport_ready.tenant and .vt: the entry's tenant and its place in
-- the log. The log is read in (vt, rseq) order, no longer rseq order, so
-- its key is that pair. transport_ready_vnow: the virtual time, the
-- highest vt the claims read. The frontier and its check are in vt now:
-- transport_ready_check_rseq becomes transport_ready_check_vt.
--
-- The entries there are kept, in their order, ahead of every entry
-- written from now on (vt 1 to n; a new one is placed a step, 100 or
-- more, past the virtual time, n), and the frontier restarts at 0.
ALTER TABLE transport_groups ADD COLUMN IF NOT EXISTS tenant TEXT NOT NULL DEFAULT 'default'
    CONSTRAINT transport_groups_tenant_valid CHECK (octet_length(tenant) BETWEEN 1 AND 256);

CREATE TABLE IF NOT EXISTS transport_tenants (
    tenant  TEXT PRIMARY KEY CHECK (octet_length(tenant) BETWEEN 1 AND 256),
    weight  INT NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    charged BIGINT NOT NULL DEFAULT 0
);

CREATE SEQUENCE IF NOT EXISTS transport_ready_vnow AS BIGINT MINVALUE 0 START 0;
-- Once: the script runs every step again over a later version, and a
-- second numbering would undo the places (step 020 makes the old check
-- sequence again, which goes).
DO $pgtransport$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute AS a
                    WHERE a.attrelid = 'transport_ready'::regclass AND a.attname = 'vt' AND NOT a.attisdropped) THEN
        ALTER TABLE transport_ready ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default',
                                    ADD COLUMN vt BIGINT NOT NULL DEFAULT 0;
        UPDATE transport_ready AS r
           SET vt = o.n
          FROM (SELECT x.rseq, row_number() OVER (ORDER BY x.rseq) AS n FROM transport_ready AS x) AS o
         WHERE r.rseq = o.rseq;
        ALTER TABLE transport_ready DROP CONSTRAINT transport_ready_pkey;
        ALTER TABLE transport_ready ADD PRIMARY KEY (vt, rseq);
        PERFORM setval('transport_ready_vnow', COALESCE((SELECT max(r.vt) FROM transport_ready AS r), 0), true);
        ALTER SEQUENCE transport_ready_front MINVALUE 0;
        PERFORM setval('transport_ready_front', 0, true);
        PERFORM setval('transport_ready_check_xid', 0, true);
    END IF;
    IF to_regclass('transport_ready_check_vt') IS NULL THEN
        ALTER SEQUENCE transport_ready_check_rseq RENAME TO transport_ready_check_vt;
    ELSE
        DROP SEQUENCE IF EXISTS transport_ready_check_rseq;
    END IF;
END
$pgtransport$;
CREATE INDEX IF NOT EXISTS transport_ready_tenant ON transport_ready (tenant, vt);
-- The entries step 020 writes again when the script runs over this
-- version have vt 0 (the column's default): they go, as any entry below
-- the frontier,
-- above it (no placed entry is at 0: they start at 1, and a placement is
-- a step or more past the virtual time).
DELETE FROM transport_ready AS r WHERE r.vt < GREATEST((SELECT f.last_value FROM transport_ready_front AS f), 1);

-- The publishes take a tenant, a parameter with a default at the end:
-- the old signatures go, so that a call with the old arguments finds one
-- function.
DROP FUNCTION IF EXISTS harel_revive(TEXT[], INT[]);
DROP FUNCTION IF EXISTS harel_ready_groups(TEXT[], INT[]);
DROP FUNCTION IF EXISTS harel_publish(TEXT, TEXT, INT);
DROP FUNCTION IF EXISTS harel_publish_many(TEXT[], TEXT[], INT[]);
DROP FUNCTION IF EXISTS harel_publish_keyed(TEXT[], TEXT[], INT[], TEXT[], DOUBLE PRECISION);
DROP FUNCTION IF EXISTS harel_px_publish_many(INT[], TEXT[], TEXT[], INT[], TEXT[], DOUBLE PRECISION);
DROP FUNCTION IF EXISTS harel_px_publish_home(INT[], TEXT[], TEXT[], INT[], TEXT[], DOUBLE PRECISION);
DROP FUNCTION IF EXISTS harel_px_publish_here(INT, TEXT, TEXT, INT, BOOLEAN);
