package sync

import (
	"context"
	"errors"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/worker"
)

// Work runs h on the queue's messages, cfg.Concurrency at a time, until
// ctx ends; then it shuts down gracefully and returns nil. It is the
// worker loop written once: see pgtransport.Handler for what h's result
// does.
//
// Each of its cfg.Concurrency slots waits for work as ClaimWait does (no
// polling), runs h, and then settles the result and claims its next lease
// in one transaction: the ack keeps a hot group for the next message, up
// to Config.MaxKeep in a row (Config.KeepWhileWaiting while another group
// waits), or claims the group that became claimable first. The
// slots that finish while such a step is on its way have theirs sent
// together in the next round-trip (at most two on their way at once), so
// a busy runtime makes about one round-trip and one commit per batch of
// slots rather than one per message (a slot that got no lease from its
// step claims on its own, as an idle one does). It needs a pool connection for each slot waiting for work, two
// for the steps and one for the heartbeats. Every third of cfg.Visibility one round-trip extends the
// leases of the handlers that have been running for a while; a lease it
// finds lost cancels that handler's ctx at once, and what the handler then
// returns is ignored (the message will be handled again).
//
// Shutdown, when ctx ends: no more claims; the handlers running get
// cfg.ShutdownTimeout to finish (their results are settled as usual),
// then their ctx is cancelled (an error a handler then returns gives its
// message back, not counted as an attempt: the shutdown cut it short, not
// the message), and a handler that ignores it is given
// pgtransport.AbandonTimeout more before Work returns without it (logged
// at Error; its lease lapses). A lease claimed as the shutdown began and
// not yet started is given back (free at once, not counted as an
// attempt). Work returns once every goroutine it started has ended. A
// caller that wants a quicker stop passes a short ShutdownTimeout.
//
// Close during Work ends it the same way, and Work then returns ErrClosed
// (results settled after a Close that closed the pool cannot be: their
// leases lapse). An invalid cfg returns ErrInvalidConfig (or the sentinel
// of the field: ErrInvalidWorkerID, ErrInvalidVisibility,
// ErrInvalidPriority) at once, as does a Transport already closed
// (ErrClosed).
func (t *Transport) Work(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.Handler) error {
	if err := t.check("work"); err != nil {
		return err
	}
	cfg, err := worker.Check(cfg, h)
	if err != nil {
		return err
	}
	return t.cl.RunEach(ctx, cfg, func(ctx context.Context, i int, cfg pgtransport.WorkerConfig) error {
		c := t.cl.Part(i)
		f := &feed{c: c, cfg: cfg, steps: newCombiner(c, cfg)}
		defer f.steps.close()
		return worker.Run(ctx, workerConfig(c, cfg), f, h)
	})
}

// workerConfig is the runtime's configuration for cfg (checked) on c.
func workerConfig(c *core.Core, cfg pgtransport.WorkerConfig) worker.Config {
	return worker.Config{
		WorkerConfig: cfg,
		Logger:       c.Logger(),
		Observer:     c.Config().Observer,
		Abandon:      pgtransport.AbandonTimeout,
	}
}

// feed is the blocking runtime's worker.Feed: each slot claims for
// itself when it has no lease, and acks and takes its next lease in one
// step, which the combiner sends with the other slots' (core.Exchange, or
// core.AckClaim for a step alone).
type feed struct {
	c     *core.Core
	cfg   pgtransport.WorkerConfig
	steps *combiner // nil: each slot's step a round-trip of its own (WorkTx's)
}

// Next is ClaimWait whose claims stop does not cut short (a lease that
// arrives once stop has ended is given back, not left in doubt).
func (f *feed) Next(stop context.Context) (*pgtransport.Lease, error) {
	l, err := f.c.ClaimWaitDetached(stop, f.cfg.WorkerID, f.cfg.Visibility, f.cfg.MinPriority)
	if err != nil && stop.Err() != nil && !errors.Is(err, pgtransport.ErrClosed) {
		return nil, stop.Err()
	}
	return l, err
}

// Ack acks l and, with more, keeps its group for the next message or
// claims the slot's next lease, in one step (the combiner's).
func (f *feed) Ack(ctx context.Context, l *pgtransport.Lease, more bool) (*pgtransport.Lease, <-chan error, error) {
	if !more { // shutting down: the ack alone
		return nil, nil, f.c.Ack(ctx, l)
	}
	var (
		next        *pgtransport.Lease
		ackErr, err error
	)
	if f.steps != nil {
		next, ackErr, err = f.steps.ackClaim(ctx, l)
	} else {
		next, ackErr, err = f.c.AckClaim(ctx, l, f.cfg.WorkerID, f.cfg.Visibility, f.cfg.MinPriority)
	}
	if err != nil {
		return nil, nil, err
	}
	return next, nil, ackErr
}

func (f *feed) Fail(ctx context.Context, l *pgtransport.Lease, cause error) error {
	_, err := f.c.Fail(ctx, l, cause)
	return err
}

func (f *feed) Release(ctx context.Context, l *pgtransport.Lease) error { return f.c.Release(ctx, l) }

func (f *feed) Lost(*pgtransport.Lease) {}

func (f *feed) Extend(ctx context.Context, leases []*pgtransport.Lease, visibility time.Duration) ([]error, error) {
	return f.c.ExtendMany(ctx, leases, visibility)
}
