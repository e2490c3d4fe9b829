package async

import (
	"context"
	"errors"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/worker"
)

// Work runs h on the queue's messages, cfg.Concurrency at a time, until
// ctx ends; then it shuts down gracefully and returns nil. It is the
// blocking transport's Work (see sync.Transport.Work for the heartbeats,
// the shutdown and what Close does) fed by one Stream with MaxInFlight
// cfg.Concurrency: the stream claims as slots come free and wakes on
// notifications, acks are batched into its round-trips (which keep hot
// groups, up to Config.MaxKeep in a row, and claim in the same
// transaction), and the leases it claimed but no slot started when the
// shutdown began are given back (not counted as attempts).
func (t *Transport) Work(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.Handler) error {
	cfg, err := worker.Check(cfg, h)
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
		return worker.Run(ctx, t.workerConfig(p, cfg), &feed{p: p, s: s}, h)
	})
}

// workStream is the stream a runtime of cfg (checked) takes its leases from.
func (t *Transport) workStream(ctx context.Context, p *part, cfg pgtransport.WorkerConfig) (*stream, error) {
	return t.startStream(ctx, p, StreamConfig{
		WorkerID:    cfg.WorkerID,
		Visibility:  cfg.Visibility,
		MinPriority: cfg.MinPriority,
		MaxInFlight: cfg.Concurrency,
	})
}

// workerConfig is the runtime's configuration for cfg (checked).
func (t *Transport) workerConfig(p *part, cfg pgtransport.WorkerConfig) worker.Config {
	return worker.Config{
		WorkerConfig: cfg,
		Logger:       p.core.Logger(),
		Observer:     t.cfg.Observer,
		Abandon:      pgtransport.AbandonTimeout,
	}
}

// feed is the async runtime's worker.Feed: the slots take their leases
// from one stream, and settle them through the Transport, which keeps the
// stream's ledger (its slot count) in step.
type feed struct {
	p *part
	s *stream
}

// Next receives a lease from the stream. A closed channel means the
// stream stopped: with the runtime's ctx (stop has ended too), or for
// good (the Transport closed: ErrClosed; ErrSchemaMissing).
func (f *feed) Next(stop context.Context) (*pgtransport.Lease, error) {
	select {
	case l, ok := <-f.s.C():
		if !ok {
			if err := f.s.Err(); err != nil {
				return nil, err
			}
			return nil, pgtransport.ErrClosed
		}
		return l, nil
	case <-stop.Done():
		return nil, stop.Err()
	}
}

// Ack queues the ack for the stream's next round-trip (pending delivers
// its outcome), or acks at once if the stream no longer holds l.
func (f *feed) Ack(ctx context.Context, l *pgtransport.Lease, _ bool) (*pgtransport.Lease, <-chan error, error) {
	if done, ok := f.p.streams.enqueue(l); ok {
		return nil, done, nil
	}
	err := f.p.core.Ack(ctx, l)
	f.p.forget(l)
	return nil, nil, err
}

func (f *feed) Fail(ctx context.Context, l *pgtransport.Lease, cause error) error {
	_, err := f.p.core.Fail(ctx, l, cause)
	if err == nil || errors.Is(err, pgtransport.ErrLeaseLost) {
		f.p.forget(l)
	}
	return err
}

func (f *feed) Release(ctx context.Context, l *pgtransport.Lease) error {
	err := f.p.core.Release(ctx, l)
	f.p.forget(l)
	return err
}

func (f *feed) Lost(l *pgtransport.Lease) { f.p.forget(l) }

// Extend extends the leases and books their new ends in the stream's
// ledger, which would otherwise count them lapsed.
func (f *feed) Extend(ctx context.Context, leases []*pgtransport.Lease, visibility time.Duration) ([]error, error) {
	start := time.Now()
	errs, err := f.p.core.ExtendMany(ctx, leases, visibility)
	if err != nil {
		return nil, err
	}
	for i, l := range leases {
		if errs[i] == nil {
			f.p.streams.extend(l, nil, start.Add(visibility))
		}
	}
	return errs, nil
}
