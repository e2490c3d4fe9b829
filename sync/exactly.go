package sync

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/worker"
)

// AckTx is Ack inside the caller's transaction tx: the message is deleted
// and its group freed when tx commits, together with the caller's own
// writes in tx, or not at all when tx rolls back (the lease then holds as
// before: ack it again, nack it, or let it lapse). So an effect written in
// tx is applied exactly once: check the error before you commit.
// ErrLeaseLost means the lease was lost (it lapsed and another worker took
// the group, or it was settled already): nothing of the ack was written,
// and you must roll back, so that nothing of this attempt is applied
// either; the message's next holder applies it. One round-trip on tx.
//
// A lost reply of the COMMIT: the ack committed if and only if your
// writes did (one transaction); the message will be handed out again if
// they did not. Read your own writes, or let the redelivery decide: a
// redelivered message's handler finds its effect absent and applies it.
//
// tx must be READ COMMITTED (PostgreSQL's default): under REPEATABLE READ
// or SERIALIZABLE the ack fails with a serialization error whenever the
// lease was extended after tx's snapshot was taken.
//
// The group row stays locked from AckTx until tx ends: commit soon after.
// It wakes no ClaimWait caller (the group is freed only at the commit).
func (t *Transport) AckTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease) error {
	if err := t.check("ack"); err != nil {
		return err
	}
	c, err := t.cl.TxLease(ctx, tx, lease)
	if err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	return c.AckTx(ctx, tx, lease)
}

// AckStateTx is AckTx that also saves state as the lease's group state,
// fenced as the ack is: a holder whose lease was lost gets ErrLeaseLost
// and can never overwrite the state. nil clears the state. State reads it
// back (also after the group drains, for the queue's
// Policy.StateRetention). A state longer than pgtransport.MaxStateSize is
// ErrStateTooLarge, and nothing is written (tx is still usable). This is
// the step of an event-sourced consumer: read S(n-1) with StateTx, apply
// message n, save S(n) with its ack, in one transaction.
func (t *Transport) AckStateTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease, state []byte) error {
	if err := t.check("ack"); err != nil {
		return err
	}
	c, err := t.cl.TxLease(ctx, tx, lease)
	if err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	return c.AckStateTx(ctx, tx, lease, state)
}

// State returns group's state (nil: none), as the last AckStateTx of the
// group saved it; after the group drains, for the queue's
// Policy.StateRetention. Reading is not fenced: any caller may read any
// group's state. Read it with StateTx inside the transaction that acks
// with AckStateTx.
func (t *Transport) State(ctx context.Context, group string) ([]byte, error) {
	c, err := t.group(ctx, "state", group)
	if err != nil {
		return nil, err
	}
	return c.State(ctx, group)
}

// StateTx is State inside the caller's transaction tx.
func (t *Transport) StateTx(ctx context.Context, tx pgx.Tx, group string) ([]byte, error) {
	if err := t.check("state"); err != nil {
		return nil, err
	}
	c, err := t.cl.TxGroup(ctx, tx, group)
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	return c.StateTx(ctx, tx, group)
}

// WorkTx is Work for a transactional handler: each message is handled
// inside a transaction of its own, in which the runtime reads the group's
// state (StateTx), runs h, and, when h returns nil, acks the message and
// saves h's new state (AckStateTx), then commits. So the handler's writes
// in tx, the group's state and the ack commit together or not at all: an
// effect is applied exactly once, however the worker dies, the lease
// lapses or a reply is lost. A lease lost while h runs cancels h's ctx
// and rolls its transaction back; an error or a panic rolls back and
// fails the attempt (retries, dead letters), as in Work. See
// pgtransport.TxHandler; the slots, heartbeats and shutdown are Work's.
//
// Each busy slot holds a pool connection for its transaction while h
// runs (size the pool for Concurrency such connections and a few more).
// The ack's round-trip also claims the slot's next lease in the same
// transaction, so a message costs one commit, the handler's; that lease
// is held only if the commit applies (a failed commit leaves its group
// claimable at once). A message costs four round-trips besides h's own
// statements (begin, state, ack and claim, commit) where Work's costs one.
func (t *Transport) WorkTx(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.TxHandler) error {
	if err := t.check("work"); err != nil {
		return err
	}
	cfg, err := worker.CheckTx(cfg, h)
	if err != nil {
		return err
	}
	return t.cl.RunEach(ctx, cfg, func(ctx context.Context, i int, cfg pgtransport.WorkerConfig) error {
		c := t.cl.Part(i)
		return worker.RunTx(ctx, workerConfig(c, cfg), &txFeed{feed{c: c, cfg: cfg}}, h)
	})
}

// txFeed is WorkTx's worker.TxFeed: Work's feed, and the calls of a
// handler's transaction.
type txFeed struct{ feed }

func (f *txFeed) Begin(ctx context.Context) (pgx.Tx, error) { return f.c.Begin(ctx) }

func (f *txFeed) StateTx(ctx context.Context, tx pgx.Tx, group string) ([]byte, error) {
	return f.c.StateTx(ctx, tx, group)
}

// AckStateTx acks in tx and, with more, claims the slot's next lease in
// the same round-trip and commit (core.AckStateClaimTx), as Work's feed
// does with its ack.
func (f *txFeed) AckStateTx(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte, more bool) (*pgtransport.Lease, error) {
	if !more {
		return nil, f.c.AckStateTx(ctx, tx, l, state)
	}
	next, claimErr, err := f.c.AckStateClaimTx(ctx, tx, l, state, f.cfg.WorkerID, f.cfg.Visibility, f.cfg.MinPriority)
	if err == nil && claimErr != nil {
		err = fmt.Errorf("%w: %w", worker.ErrNextClaim, claimErr)
	}
	return next, err
}

func (f *txFeed) Unclaim(ctx context.Context, l *pgtransport.Lease) { _ = f.c.ReleaseQuiet(ctx, l) }

func (f *txFeed) Settled(*pgtransport.Lease) { f.c.Settled() }
