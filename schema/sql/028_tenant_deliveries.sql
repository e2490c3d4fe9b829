-- 028_tenant_deliveries.sql: deliveries per tenant, and groups by tenant
-- (docs/protocol.md, "Tenants: weighted shares").
--
-- transport_groups.handed: the messages handed out from the row (by a
-- claim, or by an ack that kept the group for its next message), written
-- in the same update as the lease, a column no index holds (HOT).
-- transport_tenant_counts: what rows deleted since (or revived for
-- another tenant) had handed out, by tenant, a row added by each
-- deleting statement and folded into one row a tenant
-- (functions/70_operations.sql, "Deliveries per tenant"). harel_tenants
-- adds the two up: a tenant's deliveries so far, from which two readings
-- give its deliveries per second and its measured share.
--
-- harel_groups takes a tenant to list (p_tenant, last, DEFAULT NULL: every
-- tenant), and its rows, harel_group's and harel_group_rows' end with
-- the group's tenant; harel_tenants' with delivered. A function's
-- columns cannot change in place: those go, and functions/ makes them
-- again.
ALTER TABLE transport_groups ADD COLUMN IF NOT EXISTS handed BIGINT NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS transport_tenant_counts (
    tenant    TEXT NOT NULL,
    folded    BOOLEAN NOT NULL DEFAULT false,
    delivered BIGINT NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS transport_tenant_counts_folded ON transport_tenant_counts (tenant) WHERE folded;

DROP FUNCTION IF EXISTS harel_group_rows(DOUBLE PRECISION, TEXT[]);
DROP FUNCTION IF EXISTS harel_group(DOUBLE PRECISION, TEXT);
DROP FUNCTION IF EXISTS harel_px_on_group(INT, DOUBLE PRECISION, TEXT);
DROP FUNCTION IF EXISTS harel_groups(DOUBLE PRECISION, TEXT, TEXT, INT, INT);
DROP FUNCTION IF EXISTS harel_px_groups(DOUBLE PRECISION, TEXT, TEXT, INT, INT);
DROP FUNCTION IF EXISTS harel_tenants(DOUBLE PRECISION);
DROP FUNCTION IF EXISTS harel_px_tenants(DOUBLE PRECISION);
