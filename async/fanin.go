package async

import (
	"cmp"
	"context"
	"fmt"
	stdsync "sync"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/worker"
)

// Stream delivers leases on a channel as groups become claimable, from
// every partition of the queue.
//
// Each of its round-trips acks the leases its receivers acked since the
// last one (Transport.Ack on a lease from a stream joins that batch; its
// channel delivers once the batch commits) and claims as many groups as
// it has free slots, in one transaction. An acked lease whose group has
// more messages is kept, up to Config.MaxKeep in a row (KeepWhileWaiting
// while another group waits to be claimed), and the group's
// next message is delivered under the same token without a new claim.
//
// It holds at most MaxInFlight leases: a lease counts from its claim until
// it is acked, nacked or failed through the Transport or its visibility
// runs out. A lease left unreceived in C for half its visibility is given
// back (free at once, not counted as an attempt) before it can lapse, and
// the stream then holds its claims back until a receiver shows it is at
// work, so that other consumers get those groups.
//
// While idle it waits, without polling, for the first of: a notification of
// a new group (LISTEN/NOTIFY), an ack, nack or publish through the same
// Transport that may have freed work, the earliest lease or park it saw
// when it went idle running out, and Config.IdleSweep.
//
// Over partitions, each partition has a stream of its own with its share
// of MaxInFlight (at least one slot), and their leases are merged into C.
type Stream struct {
	one     *stream   // the only partition's stream: C is its channel, nothing forwards
	streams []*stream // every partition's
	out     chan *pgtransport.Lease
	stop    chan struct{} // closed by Close: forwarders give back what they hold
	ready   chan struct{}
	closed  chan struct{} // closed with out, once every forwarder has ended
	once    stdsync.Once
	fwd     stdsync.WaitGroup // the forwarders (goroutines of the Transport)
}

// Stream starts a consumer of leases for cfg.WorkerID. It runs until ctx
// ends, Close, or the Transport closes; then it acks what its receivers
// acked, gives back the leases still waiting in C, closes C and records why
// in Err. Errors from the database are retried with backoff; only
// ErrSchemaMissing ends the stream. An ack the database refuses for good
// is answered that error alone: the acks batched with it are settled
// without it, each on its own round-trip. A bad cfg is refused before any
// stream starts.
func (t *Transport) Stream(ctx context.Context, cfg StreamConfig) (*Stream, error) {
	cfg.WorkerID = cmp.Or(cfg.WorkerID, worker.DefaultID())
	cfg.Visibility = cmp.Or(cfg.Visibility, pgtransport.DefaultWorkerVisibility)
	if err := core.CheckClaim(cfg.WorkerID, cfg.Visibility, cfg.MinPriority); err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	if cfg.MaxInFlight < 0 || cfg.MaxInFlight > pgtransport.MaxBatch {
		return nil, fmt.Errorf("stream: %w: MaxInFlight %d, want 0 to %d", pgtransport.ErrInvalidConfig, cfg.MaxInFlight, pgtransport.MaxBatch)
	}
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, DefaultMaxInFlight)
	if t.cl.N() == 1 {
		s, err := t.startStream(ctx, t.parts[0], cfg)
		if err != nil {
			return nil, err
		}
		return &Stream{one: s, streams: []*stream{s}}, nil
	}
	st := &Stream{out: make(chan *pgtransport.Lease), stop: make(chan struct{}), ready: make(chan struct{}), closed: make(chan struct{})}
	for i, share := range t.cl.Shares(cfg.MaxInFlight) {
		scfg := cfg
		scfg.MaxInFlight = share
		s, err := t.startStream(ctx, t.parts[i], scfg)
		if err != nil {
			st.closeStreams()
			return nil, fmt.Errorf("partition %d: %w", i, err)
		}
		st.streams = append(st.streams, s)
	}
	if !t.spawnAll(st.goroutines(t, cfg.Visibility)) {
		st.closeStreams()
		return nil, fmt.Errorf("stream: %w", pgtransport.ErrClosed)
	}
	return st, nil
}

// goroutines are a merged stream's: a forwarder per partition, the one
// that closes C once they have ended, and the one that closes ready.
func (st *Stream) goroutines(t *Transport, visibility time.Duration) []func() {
	fs := make([]func(), 0, len(st.streams)+2)
	st.fwd.Add(len(st.streams))
	for _, s := range st.streams {
		fs = append(fs, func() {
			defer st.fwd.Done()
			st.forward(s, visibility)
		})
	}
	fs = append(fs, func() { // ends once every forwarder has
		st.fwd.Wait()
		close(st.out)
		close(st.closed)
	}, func() { // ends once every partition's stream is ready or stopped
		for _, s := range st.streams {
			select {
			case <-s.Ready():
			case <-s.done:
			}
		}
		close(st.ready)
	})
	return fs
}

// forward moves s's leases to C until s stops. A lease it holds when the
// stream closes or s stops (ctx ended, the Transport closed), or that no
// receiver takes before half its visibility has passed since its claim
// (the point where a partition's stream gives back a lease left in its
// channel: a receiver must get it with time to handle it), goes back to
// its partition, not counted as an attempt.
//
// After such a give-back the partition's stream holds its claims back
// (its gate), as after one of its own, until a receiver takes a lease
// from C: the forwarder's own takes from the partition's channel do not
// count as a receiver's.
func (st *Stream) forward(s *stream, visibility time.Duration) {
	stalled := false // the last lease waited out its due time unreceived
	for l := range s.C() {
		if stalled {
			s.regate()
		}
		due := time.NewTimer(time.Until(l.Expiry.Add(-visibility / 2)))
		overdue := false
		select {
		case st.out <- l:
			due.Stop()
			stalled = false
			continue
		case <-st.stop:
		case <-s.done:
		case <-due.C:
			overdue = true
		}
		due.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.p.core.Release(ctx, l)
		cancel()
		s.p.forget(l)
		if overdue {
			s.heldBack()
			stalled = true
		}
	}
}

// C returns the channel of leases. The stream closes it when it stops.
func (st *Stream) C() <-chan *pgtransport.Lease {
	if st.one != nil {
		return st.one.C()
	}
	return st.out
}

// Err says why the stream stopped: ErrStreamClosed after its Close,
// ErrClosed after the Transport's (errors.Is(err, ErrClosed) holds for
// both), ctx's error after its ctx ended, or the error that ended
// it (over partitions, the first partition's that has one). Nil while it
// runs.
func (st *Stream) Err() error {
	for _, s := range st.streams {
		if err := s.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Ready returns a channel closed once the stream's notifications are live
// (over partitions, every partition's, or its stream stopped). On one
// database it is replaced by an open one while the listener reconnects.
// With Config.Async.DisableNotify it is closed at once: there is nothing
// to wait for. Behind a transaction pooler with no Config.Async.ListenDSN
// it is never closed: no notification can arrive, and the stream finds
// work every IdleSweep (PollOnly says so). Tests wait on it.
func (st *Stream) Ready() <-chan struct{} {
	if st.one != nil {
		return st.one.Ready()
	}
	return st.ready
}

// PollOnly reports whether the stream learns of work other processes
// publish only by looking for it every Config.IdleSweep (on some
// partition): with Config.Async.DisableNotify, and behind a transaction
// pooler (Config.Pooling) with no Config.Async.ListenDSN.
func (st *Stream) PollOnly() bool {
	for _, s := range st.streams {
		if s.PollOnly() {
			return true
		}
	}
	return false
}

// Close stops the stream and waits for it: acks already asked for are
// done, leases waiting in C are given back, and C is closed. Safe to call
// twice.
func (st *Stream) Close() {
	if st.one != nil {
		st.one.Close()
		return
	}
	st.once.Do(func() { close(st.stop) })
	st.closeStreams()
	<-st.closed
}

// closeStreams closes every partition's stream started so far.
func (st *Stream) closeStreams() {
	for _, s := range st.streams {
		s.Close()
	}
}
