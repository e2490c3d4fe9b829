package worker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtransport/pgtransport"
)

// TxFeed is a Feed whose leases a transactional handler (WorkTx) settles
// inside its own transaction.
type TxFeed interface {
	Feed
	// Begin starts a handler's transaction.
	Begin(ctx context.Context) (pgx.Tx, error)
	// StateTx reads group's state in tx.
	StateTx(ctx context.Context, tx pgx.Tx, group string) ([]byte, error)
	// AckStateTx acks l in tx and saves state as its group's: nil, or
	// ErrLeaseLost (nothing written; the feed no longer counts l), or an
	// error after which nothing was written and l holds as before. With
	// more (the runtime is not stopping) it may also claim the slot's next
	// lease in tx, leased once tx commits; if that claim fails after the
	// ack succeeded, the error wraps ErrNextClaim (tx cannot commit).
	AckStateTx(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte, more bool) (next *pgtransport.Lease, err error)
	// Unclaim gives back a lease AckStateTx claimed in a transaction
	// whose commit's outcome is unknown: freed if the commit applied,
	// nothing otherwise, and no lost lease reported.
	Unclaim(ctx context.Context, l *pgtransport.Lease)
	// Settled is told that the ack of l committed.
	Settled(l *pgtransport.Lease)
}

// ErrNextClaim marks an AckStateTx whose ack succeeded and whose claim of
// the slot's next lease, in the same transaction, failed.
var ErrNextClaim = errors.New("the claim made with the ack failed")

// CheckTx is Check for a transactional handler.
func CheckTx(cfg pgtransport.WorkerConfig, h pgtransport.TxHandler) (pgtransport.WorkerConfig, error) {
	if h == nil {
		return cfg, fmt.Errorf("work: %w: nil handler", pgtransport.ErrInvalidConfig)
	}
	return checkConfig(cfg)
}

// RunTx is Run for a transactional handler: each message is handled in a
// transaction of its own, which the runtime begins, reads the group's
// state in, passes to h and, when h returns nil, acks the message and
// saves h's new state in, then commits. The heartbeats, the lapse timers,
// the shutdown and the failures are Run's. A lease found lost while h ran
// has its transaction rolled back. The ack runs after the lease has left
// the heartbeat's set, so the row lock it takes until the commit never
// holds up a heartbeat's extend of the other leases.
func RunTx(ctx context.Context, cfg Config, feed TxFeed, h pgtransport.TxHandler) error {
	return runWith(ctx, cfg, feed, nil, &txMode{feed: feed, h: h})
}

// txMode is RunTx's part of a runtime.
type txMode struct {
	feed TxFeed
	h    pgtransport.TxHandler
	// Until then (Unix nanoseconds) commits ack without claiming: a
	// claim sent with an ack failed, and a claim that keeps failing (a
	// handler's short statement_timeout, say) must not have every message
	// given back and handled again without end.
	plainUntil atomic.Int64
}

// plainFor is how long commits ack without claiming after a claim sent
// with an ack failed.
const plainFor = 30 * time.Second

// openTx is a handler's transaction, open after the handler returned nil,
// and the state it returned.
type openTx struct {
	tx    pgx.Tx
	state []byte
}

// rollbackTimeout bounds a rollback, which runs whatever the ctx.
const rollbackTimeout = 5 * time.Second

// rollback rolls o's transaction back; nothing if o is nil. A rollback
// that fails leaves nothing applied either: the server rolls back a
// transaction whose connection is gone.
func (o *openTx) rollback(base context.Context) {
	if o == nil {
		return
	}
	rollback(base, o.tx)
}

func rollback(base context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(base), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// call begins l's transaction, reads its group's state and runs the
// handler: the transaction still open when it returned nil, else rolled
// back (on a panic too) and the error.
func (m *txMode) call(ctx context.Context, l *pgtransport.Lease) (_ *openTx, err error) {
	tx, err := m.feed.Begin(ctx)
	if err != nil {
		return nil, err
	}
	open := false
	defer func() {
		if !open {
			rollback(ctx, tx)
		}
	}()
	state, err := m.feed.StateTx(ctx, tx, l.Group)
	if err != nil {
		return nil, err
	}
	next, err := m.h(ctx, tx, l, state)
	if err != nil {
		return nil, err
	}
	open = true
	return &openTx{tx: tx, state: next}, nil
}

// commit acks l in its open transaction, saving the handler's new state
// (and, unless the runtime is stopping, claiming the slot's next lease, as
// Work's ack does), and commits. It returns the next lease once the commit
// applied it. A lost lease rolls back (the core has logged it); an ack the
// database refused, or a commit that did not apply (a deferred constraint,
// a serialization failure, a transaction the handler left aborted),
// rolls back and fails the attempt; a commit whose reply was lost is
// logged: the message was acked if and only if the handler's writes
// committed, and otherwise it comes back after its lease.
func (r *runtime) commit(ctx context.Context, l *pgtransport.Lease, o *openTx) *pgtransport.Lease {
	m := r.tx
	claim := r.stop.Err() == nil && time.Now().UnixNano() >= m.plainUntil.Load()
	next, err := m.feed.AckStateTx(ctx, o.tx, l, o.state, claim)
	if err != nil {
		o.rollback(r.base)
		switch {
		case errors.Is(err, pgtransport.ErrLeaseLost):
		case errors.Is(err, ErrNextClaim):
			// Not the message's fault: it is given back, uncounted, and
			// handled again, and the acks that follow for a while claim
			// nothing, so the next attempt commits with its ack alone.
			m.plainUntil.Store(time.Now().Add(plainFor).UnixNano())
			r.log.Warn("pgtransport: the claim sent with an ack failed; the handler's transaction is rolled back and its message given back, to be handled again; acks claim nothing for a while",
				"worker", r.cfg.WorkerID, "group", l.Group, "seq", l.Seq, "err", err, "for", plainFor)
			r.release(l)
		default:
			r.fail(ctx, l, err)
		}
		return nil
	}
	err = o.tx.Commit(ctx)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		m.feed.Settled(l)
		return next
	case errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback):
		r.fail(ctx, l, err)
	default:
		if next != nil { // the commit's ctx may be spent: a fresh one
			uctx, cancel := context.WithTimeout(r.base, settleTimeout)
			m.feed.Unclaim(uctx, next)
			cancel()
		}
		r.log.Warn("pgtransport: commit's outcome unknown; the message was acked if and only if the handler's writes committed, else it is handled again",
			"worker", r.cfg.WorkerID, "group", l.Group, "seq", l.Seq, "err", err)
	}
	return nil
}
