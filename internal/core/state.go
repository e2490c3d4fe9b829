package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport"
)

// Exactly-once effects (schema version 12; see "Exactly-once: per-group
// state" in schema/sql/functions/75_state.sql): the ack inside the caller's
// transaction, with or without the group's new state, and the state's read.
//
// These wake nobody, as PublishTx: what they free becomes claimable when
// the caller commits, which the core does not see. (The runtime, which
// does, wakes one parked caller after its commit: Settled.)

// AckTx is Ack inside the caller's transaction tx: the message is deleted
// and its group freed (or its row deleted) when tx commits, together with
// the caller's own writes, or not at all. ErrLeaseLost when the lease no
// longer holds: nothing of the ack was written, and the caller must roll
// back so that nothing of its attempt is applied either.
func (c *Core) AckTx(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease) error {
	if l == nil { // refused, and observed, by ackTx
		return c.ackTx(ctx, tx, l, "")
	}
	return c.ackTx(ctx, tx, l, c.q.ack, l.Group, l.Seq, l.Token)
}

// AckStateTx is AckTx that also sets the lease's group state to state
// (nil clears it), fenced as the ack is: when it returns nil the state
// commits with tx, and a lease that was lost (ErrLeaseLost) changed
// nothing. A state longer than pgtransport.MaxStateSize is
// ErrStateTooLarge before anything is sent (tx is still usable).
func (c *Core) AckStateTx(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte) error {
	if len(state) > pgtransport.MaxStateSize {
		return fmt.Errorf("ack: %w: %d bytes, the limit is %d", pgtransport.ErrStateTooLarge, len(state), pgtransport.MaxStateSize)
	}
	if l == nil { // refused, and observed, by ackTx
		return c.ackTx(ctx, tx, l, "")
	}
	return c.ackTx(ctx, tx, l, c.q.ackState, l.Group, l.Seq, l.Token, state)
}

// AckStateClaimTx is AckStateTx followed, in the same round-trip and
// transaction, by a claim of the next claimable group for workerID: the
// transactional runtime's step between two messages, so that a message
// costs one commit (the caller's) rather than that and a claim's. next
// (nil: nothing was claimable) is leased only if tx commits; after a
// rollback it never was, and after a commit whose outcome is unknown it
// may be (ReleaseQuiet gives it back either way). err is the ack's, as
// AckStateTx's (ErrLeaseLost: roll back); claimErr is the claim's, after
// the ack succeeded: roll back (a server's error has aborted tx).
func (c *Core) AckStateClaimTx(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte, workerID string, visibility time.Duration, minPriority int) (next *pgtransport.Lease, claimErr, err error) {
	if err := CheckClaim(workerID, visibility, minPriority); err != nil {
		return nil, nil, fmt.Errorf("claim: %w", err)
	}
	if len(state) > pgtransport.MaxStateSize || l == nil || tx == nil {
		return nil, nil, c.AckStateTx(ctx, tx, l, state) // its refusal
	}
	t0 := c.timer()
	err = checkLease(l)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		err = fmt.Errorf("ack: %w", err)
		c.observeAcked(t0, 1, err)
		return nil, nil, err
	}
	token := NewToken(workerID)
	var b pgx.Batch
	b.Queue(c.q.ackState, c.now(), l.Group, l.Seq, l.Token, state)
	b.Queue(c.q.claimInTx, c.now(), visibility.Seconds(), token, minPriority)
	sent := time.Now()
	br := tx.SendBatch(ctx, &b)
	defer br.Close()
	var held bool
	if err := br.QueryRow().Scan(&held); err != nil {
		err = mapErr("ack", err)
		c.observeAcked(t0, 1, err)
		c.lostIf("ack", l, err) // PT001
		return nil, nil, err
	}
	if !held {
		err = fmt.Errorf("ack: %w", pgtransport.ErrLeaseLost)
		c.observeAcked(t0, 1, err)
		c.lostIf("ack", l, err)
		return nil, nil, err
	}
	c.observeAcked(t0, 1, nil)
	n := pgtransport.Lease{Token: token}
	var age *float64
	claimErr = br.QueryRow().Scan(&n.Group, &n.Seq, &n.Event, &n.Attempt, &age)
	switch {
	case errors.Is(claimErr, pgx.ErrNoRows):
		claimErr = nil
	case claimErr == nil:
		n.Expiry, n.PublishedAt = localExpiry(sent, visibility), localPublished(sent, age)
		next = &n
	default:
		claimErr = mapErr("claim", claimErr)
	}
	if c.Observing() {
		k := 0
		if next != nil {
			k = 1
		}
		c.observeClaimed(t0, k, claimErr)
	}
	return next, claimErr, nil
}

// ackTx runs a fenced ack statement on tx and observes it (the caller's
// commit is not seen).
func (c *Core) ackTx(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, sql string, args ...any) error {
	t0 := c.timer()
	err := checkLease(l)
	if err == nil && tx == nil {
		err = fmt.Errorf("%w: nil transaction", pgtransport.ErrInvalidConfig)
	}
	if err != nil {
		err = fmt.Errorf("ack: %w", err)
		c.observeAcked(t0, 1, err)
		return err
	}
	err = c.heldOn(ctx, tx, "ack", sql, append([]any{c.now()}, args...)...)
	c.observeAcked(t0, 1, err)
	c.lostIf("ack", l, err)
	return err
}

// State returns group's state (nil: none): the group row's, else the one
// kept after it drained while the queue's state retention lasts. Not
// fenced: read it inside the transaction that acks with AckStateTx.
func (c *Core) State(ctx context.Context, group string) ([]byte, error) {
	return c.StateTx(ctx, c.db, group)
}

// StateTx is State through db: a caller's transaction, or the core's
// handle.
func (c *Core) StateTx(ctx context.Context, db DBTX, group string) ([]byte, error) {
	if err := checkGroup(group); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	if isNil(db) {
		return nil, fmt.Errorf("state: %w: nil transaction", pgtransport.ErrInvalidConfig)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	var state []byte
	if err := db.QueryRow(ctx, c.q.state, group).Scan(&state); err != nil {
		return nil, mapErr("state", err)
	}
	return state, nil
}

// Begin starts a READ COMMITTED transaction on the core's handle (a
// savepoint, on a core opened on a pgx.Tx), whatever the server's
// default_transaction_isolation: under REPEATABLE READ or SERIALIZABLE the
// ack's write of the group row fails (40001) whenever a heartbeat extended
// the lease after the transaction's snapshot was taken.
func (c *Core) Begin(ctx context.Context) (pgx.Tx, error) {
	var (
		tx  pgx.Tx
		err error
	)
	if b, ok := c.db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		tx, err = b.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	} else {
		tx, err = c.db.Begin(ctx)
	}
	if err != nil {
		return nil, mapErr("begin", err)
	}
	return tx, nil
}

// Settled is told of an ack that a caller's transaction committed (the
// runtime's WorkTx): the group it freed may be claimable, so one parked
// caller is woken, as Ack does.
func (c *Core) Settled() { c.parking.Wake(1) }
