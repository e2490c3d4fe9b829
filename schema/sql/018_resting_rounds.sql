-- 018_resting_rounds.sql: a costly round that leased nothing rests the
-- rounds; a revived group joins the end of the round.
--
-- transport_claim_rest: until when (epoch milliseconds, the server's
-- clock) the claims that have found something, and a stream's exchanges
-- (harel_exchange_leases with p_rest), do not go round from the first slot; set by a round that leased nothing
-- and took 5 ms or more, for 9 times what it took, at most 2 s
-- (functions/30_claim.sql, "Going round"). 0: no rest. Within 10 s of a
-- rest, a kept row revived behind the cursor gets a new slot
-- (functions/20_publish.sql, harel_revive).
CREATE SEQUENCE IF NOT EXISTS transport_claim_rest AS BIGINT MINVALUE 0 START 0;

-- harel_sweep and harel_exchange_leases take p_rest (functions/30_claim.sql,
-- 40_ack.sql), last and with a default, so that calls of version 17 keep
-- working; the functions files define them anew.
DROP FUNCTION IF EXISTS harel_sweep(DOUBLE PRECISION, DOUBLE PRECISION, TEXT, INT, INT, TEXT);
DROP FUNCTION IF EXISTS harel_exchange_leases(DOUBLE PRECISION, DOUBLE PRECISION, TEXT, INT, INT, TEXT[], BIGINT[], TEXT[], BOOLEAN[]);
