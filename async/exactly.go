package async

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/worker"
)

// AckTx is Ack inside the caller's transaction tx, as sync.Transport.AckTx:
// the ack commits or rolls back with the caller's writes, and ErrLeaseLost
// (the lease was lost; nothing written) means the caller must roll back.
// It runs on tx at once, never in a stream's batch. The transaction is in
// use until the result is delivered; do not use it meanwhile.
//
// A lease a Stream delivered leaves the stream when AckTx succeeds (or
// finds it lost): its slot is free for the stream's next claim, and the
// stream never acks it, nor gives it back. If the caller then rolls back,
// the lease holds as before, outside the stream: ack it again (Ack, AckTx),
// nack or fail it, or it lapses after its visibility. While AckTx runs, an
// Ack of the same lease is answered ErrLeaseLost, as a second ack is.
func (t *Transport) AckTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease) <-chan error {
	return callErr(t, ctx, func(ctx context.Context) error {
		c, err := t.cl.TxLease(ctx, tx, lease)
		if err != nil {
			return fmt.Errorf("ack: %w", err)
		}
		return t.of(lease).ackTx(lease, func() error { return c.AckTx(ctx, tx, lease) })
	})
}

// AckStateTx is AckTx that also saves state as the lease's group state,
// fenced as the ack is; as sync.Transport.AckStateTx (nil clears it;
// ErrStateTooLarge past pgtransport.MaxStateSize, nothing written).
func (t *Transport) AckStateTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease, state []byte) <-chan error {
	return callErr(t, ctx, func(ctx context.Context) error {
		c, err := t.cl.TxLease(ctx, tx, lease)
		if err != nil {
			return fmt.Errorf("ack: %w", err)
		}
		return t.of(lease).ackTx(lease, func() error { return c.AckStateTx(ctx, tx, lease, state) })
	})
}

// ackTx runs ack, an ack of l on a caller's transaction, with the
// bookkeeping of the stream that holds l: marked acked while it runs (a
// queued Ack of it would free a group the caller's commit frees), then
// dropped if the ack held or found it lost, or held as before if it
// failed otherwise (nothing was written).
func (p *part) ackTx(l *pgtransport.Lease, ack func() error) error {
	s, verdict := p.streams.admit(l)
	if verdict == lostAck {
		p.core.LeaseLost("ack", l)
		return fmt.Errorf("ack: %w", pgtransport.ErrLeaseLost)
	}
	err := ack()
	if s != nil {
		if err == nil || errors.Is(err, pgtransport.ErrLeaseLost) {
			s.release(l)
		} else {
			s.unadmit(l)
		}
	}
	return err
}

// State delivers group's state (nil: none); as sync.Transport.State.
func (t *Transport) State(ctx context.Context, group string) <-chan Result[[]byte] {
	return onGroup(t, ctx, group, func(ctx context.Context, c *core.Core) ([]byte, error) {
		return c.State(ctx, group)
	})
}

// StateTx is State inside the caller's transaction tx; as
// sync.Transport.StateTx. The transaction is in use until the result is
// delivered.
func (t *Transport) StateTx(ctx context.Context, tx pgx.Tx, group string) <-chan Result[[]byte] {
	return call(t, ctx, func(ctx context.Context) ([]byte, error) {
		c, err := t.cl.TxGroup(ctx, tx, group)
		if err != nil {
			return nil, fmt.Errorf("state: %w", err)
		}
		return c.StateTx(ctx, tx, group)
	})
}

// admit marks an ack of l, about to run outside the stream's batches, in
// the ledger of the stream that holds l, if one does: that stream and
// queueAck, or lostAck (the stream holds l in another form, or its ack is
// on its way already), or nil and notHeld.
func (ss *streamSet) admit(l *pgtransport.Lease) (held *stream, verdict ackVerdict) {
	ss.find(l, func(s *stream) bool {
		verdict = s.admit(l)
		if verdict == notHeld {
			return false
		}
		held = s
		return true
	})
	return held, verdict
}

// admit is ledger.admit under the stream's lock; notHeld once the stream
// is stopping (it settles nothing more).
func (s *stream) admit(l *pgtransport.Lease) ackVerdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acks.closed {
		return notHeld
	}
	return s.ledger.admit(l)
}

// unadmit takes back an admit whose ack wrote nothing: the lease is held
// as before and may be acked again.
func (s *stream) unadmit(l *pgtransport.Lease) {
	s.mu.Lock()
	s.ledger.refuse([]*pgtransport.Lease{l})
	s.mu.Unlock()
}

// WorkTx is Work for a transactional handler, as sync.Transport.WorkTx:
// each message is handled in a transaction of its own, in which its ack
// and the group's new state commit with the handler's writes, or nothing
// does. Fed by one Stream as Work is; the acks do not join the stream's
// batches (each commits with its handler's transaction), and a committed
// ack frees its slot at once for the stream's next claim.
func (t *Transport) WorkTx(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.TxHandler) error {
	cfg, err := worker.CheckTx(cfg, h)
	if err != nil {
		return err
	}
	return t.cl.RunEach(ctx, cfg, func(ctx context.Context, i int, cfg pgtransport.WorkerConfig) error {
		p := t.parts[i]
		s, err := t.workStream(ctx, p, cfg)
		if err != nil {
			return err
		}
		defer s.Close() // waits for it; it stops as ctx ends anyway
		return worker.RunTx(ctx, t.workerConfig(p, cfg), &txFeed{feed{p: p, s: s}}, h)
	})
}

// txFeed is WorkTx's worker.TxFeed: Work's feed, and the calls of a
// handler's transaction, which keep the stream's ledger as AckTx does.
type txFeed struct{ feed }

func (f *txFeed) Begin(ctx context.Context) (pgx.Tx, error) { return f.p.core.Begin(ctx) }

func (f *txFeed) StateTx(ctx context.Context, tx pgx.Tx, group string) ([]byte, error) {
	return f.p.core.StateTx(ctx, tx, group)
}

// AckStateTx acks in tx; the stream claims the next leases.
func (f *txFeed) AckStateTx(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte, _ bool) (*pgtransport.Lease, error) {
	return nil, f.p.ackTx(l, func() error { return f.p.core.AckStateTx(ctx, tx, l, state) })
}

func (f *txFeed) Settled(*pgtransport.Lease) { f.p.core.Settled() }

// Unclaim is never needed here (AckStateTx claims nothing), and would give
// back l as the blocking feed does.
func (f *txFeed) Unclaim(ctx context.Context, l *pgtransport.Lease) {
	_ = f.p.core.ReleaseQuiet(ctx, l)
}
