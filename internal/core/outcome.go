package core

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtransport/pgtransport"
)

// What a failed call did, told from its error: whether it may have applied
// (its reply was lost), and whether trying it again unchanged can succeed.

// mayHaveApplied reports whether a call that failed with err (not a
// PostgreSQL error: the server answers those after rolling back) may have
// reached the server and committed: pgconn says whether the request surely
// never left (SafeToRetry); a failed connect never sent anything either.
func mayHaveApplied(err error) bool {
	var connect *pgconn.ConnectError
	return !pgconn.SafeToRetry(err) && !errors.As(err, &connect)
}

// inputErrors are the typed errors of arguments the database never saw, or
// refused as such: the same call fails the same way every time.
var inputErrors = []error{
	pgtransport.ErrNilLease, pgtransport.ErrInvalidGroup, pgtransport.ErrInvalidEvent,
	pgtransport.ErrEventTooLarge, pgtransport.ErrInvalidPriority, pgtransport.ErrInvalidVisibility,
	pgtransport.ErrInvalidDelay, pgtransport.ErrInvalidWorkerID, pgtransport.ErrInvalidBatch,
	pgtransport.ErrInvalidConfig, pgtransport.ErrLeaseLost, pgtransport.ErrInvalidDedupKey,
}

// Permanent reports whether a call that failed with err would fail again
// if retried unchanged: an input error, or a refusal by the server (any
// SQLSTATE but those of a lost connection, a serialization failure or
// deadlock, a lack of resources, an operator's intervention or a system
// error). Anything else (a broken connection, a timeout, a closed pool, a
// missing schema, which the stream treats on its own) may pass on a retry.
func Permanent(err error) bool {
	if err == nil || errors.Is(err, pgtransport.ErrSchemaMissing) || errors.Is(err, pgtransport.ErrClosed) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch class := pgErr.Code[:min(2, len(pgErr.Code))]; class {
		case "08", "40", "53", "57", "58": // connection, rollback, resources, operator, system
			return false
		}
		return pgErr.Code != "55P03" // lock_not_available: a lock_timeout
	}
	for _, e := range inputErrors {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Pending reports, for each lease, whether its message is still queued
// (not deleted by an ack). A stream asks after an ack whose first attempt
// lost its reply and whose retry found the lease no longer held: gone
// means that first attempt applied, provided the lease could not have
// lapsed meanwhile (see async's resolve).
func (c *Core) Pending(ctx context.Context, leases []*pgtransport.Lease) ([]bool, error) {
	groups, seqs := make([]string, len(leases)), make([]int64, len(leases))
	for i, l := range leases {
		groups[i], seqs[i] = l.Group, l.Seq
	}
	rows, err := c.db.Query(ctx, c.q.pending, groups, seqs)
	if err != nil {
		return nil, mapErr("pending", err)
	}
	defer rows.Close()
	pending := make([]bool, len(leases))
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			return nil, mapErr("pending", err)
		}
		if i >= 1 && i <= len(leases) {
			pending[i-1] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr("pending", err)
	}
	return pending, nil
}
