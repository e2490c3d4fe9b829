// Package worker is the handler runtime both front-ends share (their Work
// methods): a fixed set of slots that each take a lease, run the handler on
// it and settle it; one heartbeat that keeps the running handlers' leases
// alive; panic recovery; and the graceful shutdown. A front-end supplies
// only a Feed: where a slot's leases come from and how they are settled.
//
// Every goroutine it starts is waited for before Run returns, except a
// handler that ignores its cancelled ctx past Config.Abandon: its slot is
// abandoned (logged), and when the handler returns at last the slot
// settles nothing and ends.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	stdsync "sync"
	"sync/atomic"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// Feed is a front-end's side of the runtime. Its methods are called
// concurrently by the slots (Next, Ack, Fail, Release, Lost) and the
// heartbeat (Extend).
type Feed interface {
	// Next blocks until it holds a lease for a slot, or stop ends (it
	// returns stop's error), or the transport stops for good (ErrClosed,
	// ErrSchemaMissing: the runtime stops). Other errors are retried with
	// backoff. A lease it comes by once stop has ended it gives back
	// itself (Release) rather than return it.
	Next(stop context.Context) (*pgtransport.Lease, error)
	// Ack acks l. With more (the runtime is not stopping) it may return
	// the slot's next lease, claimed or kept in the same round-trip. An
	// ack that completes later returns its outcome on pending instead
	// (nil when err tells it).
	Ack(ctx context.Context, l *pgtransport.Lease, more bool) (next *pgtransport.Lease, pending <-chan error, err error)
	// Fail fails l with cause (the queue's policy: retry, dead letter or
	// stopped group).
	Fail(ctx context.Context, l *pgtransport.Lease, cause error) error
	// Release gives back a lease no handler ran on (not counted as an
	// attempt).
	Release(ctx context.Context, l *pgtransport.Lease) error
	// Lost is told of a lease the runtime found lost and will not settle.
	Lost(l *pgtransport.Lease)
	// Extend moves every lease's end to now + visibility in one round-trip
	// (core.ExtendMany: per lease nil or ErrLeaseLost).
	Extend(ctx context.Context, leases []*pgtransport.Lease, visibility time.Duration) ([]error, error)
}

// Config is a runtime's configuration: the user's, filled by Check, and
// the transport's logger and observer.
type Config struct {
	pgtransport.WorkerConfig
	Logger   *slog.Logger         // never nil
	Observer pgtransport.Observer // nil: none
	// Abandon is how long a shutdown waits for handlers that ignore their
	// cancelled ctx: pgtransport.AbandonTimeout (tests shorten it).
	Abandon time.Duration
}

// Check fills cfg's defaults and checks it and h (not nil): the one place both front-ends
// do so.
func Check(cfg pgtransport.WorkerConfig, h pgtransport.Handler) (pgtransport.WorkerConfig, error) {
	if h == nil {
		return cfg, fmt.Errorf("work: %w: nil handler", pgtransport.ErrInvalidConfig)
	}
	return checkConfig(cfg)
}

// checkConfig fills cfg's defaults and checks it.
func checkConfig(cfg pgtransport.WorkerConfig) (pgtransport.WorkerConfig, error) {
	if cfg.WorkerID == "" {
		cfg.WorkerID = defaultWorkerID()
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, pgtransport.DefaultConcurrency)
	cfg.Visibility = cmp.Or(cfg.Visibility, pgtransport.DefaultWorkerVisibility)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, pgtransport.DefaultShutdownTimeout)
	switch {
	case cfg.Concurrency < 0 || cfg.Concurrency > pgtransport.MaxBatch:
		return cfg, fmt.Errorf("work: %w: Concurrency %d, want 0 (default) to %d", pgtransport.ErrInvalidConfig, cfg.Concurrency, pgtransport.MaxBatch)
	case cfg.ShutdownTimeout < 0:
		return cfg, fmt.Errorf("work: %w: ShutdownTimeout %v is negative", pgtransport.ErrInvalidConfig, cfg.ShutdownTimeout)
	}
	if err := core.CheckClaim(cfg.WorkerID, cfg.Visibility, cfg.MinPriority); err != nil {
		return cfg, fmt.Errorf("work: %w", err)
	}
	return cfg, nil
}

// DefaultID is a WorkerConfig's or StreamConfig's WorkerID when it is "":
// hostname:pid.
func DefaultID() string { return defaultWorkerID() }

// defaultWorkerID is hostname:pid.
func defaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

// Handler is pgtransport.Handler.
type Handler = pgtransport.Handler

// settleTimeout bounds one settling round-trip (ack, fail, give-back).
// They run under a ctx detached from the caller's, so that a shutdown
// still settles what its handlers finished.
const settleTimeout = 30 * time.Second

// runtime is one Run.
type runtime struct {
	cfg       Config
	feed      Feed
	h         Handler
	tx        *txMode // WorkTx's: h is nil and this runs the handler in a transaction
	log       *slog.Logger
	obs       pgtransport.Observer // nil: none
	base      context.Context      // the caller's values, never cancelled: settling
	handlers  context.Context      // parent of every handler's ctx: cancelled at ShutdownTimeout
	stop      context.Context      // ends when claiming must stop
	halt      context.CancelCauseFunc
	abandoned atomic.Bool // Run returned without some slots: they settle nothing

	mu      stdsync.Mutex
	running map[*run]struct{} // handlers running, for the heartbeat
}

// run is one handler at work on its lease.
type run struct {
	lease  *pgtransport.Lease
	cancel context.CancelFunc
	until  time.Time   // the lease holds at least until then, by this process's clock
	lapse  *time.Timer // fires at until: the lease is lost unless a heartbeat moved it
	lost   bool        // lost (answered lost, or lapsed): its result is ignored
}

// Run runs h on leases from feed in cfg.Concurrency slots until ctx ends
// or the transport stops for good, then shuts down: no more claims; the
// running handlers get cfg.ShutdownTimeout to finish (their results are
// settled as usual), then their ctx is cancelled (an error then is a
// give-back, not a Fail) and they get cfg.Abandon
// more; a lease fetched but not started is given back. It returns nil
// after ctx ended, else the error that stopped the transport (ErrClosed
// after its Close). cfg must have been through Check.
func Run(ctx context.Context, cfg Config, feed Feed, h Handler) error {
	return runWith(ctx, cfg, feed, h, nil)
}

// runWith is Run, or RunTx with tx set.
func runWith(ctx context.Context, cfg Config, feed Feed, h Handler, tx *txMode) error {
	r := &runtime{
		cfg:     cfg,
		feed:    feed,
		h:       h,
		tx:      tx,
		log:     cmp.Or(cfg.Logger, slog.Default()),
		obs:     cfg.Observer,
		base:    context.WithoutCancel(ctx),
		running: map[*run]struct{}{},
	}
	handlers, cancelHandlers := context.WithCancel(r.base)
	defer cancelHandlers()
	r.handlers = handlers
	r.stop, r.halt = context.WithCancelCause(ctx)
	defer r.halt(nil)

	n := cfg.Concurrency
	exited := make(chan struct{}, n) // one send per slot, never blocking
	for range n {
		go r.slot(exited) // waited for below, through exited
	}
	beat := make(chan struct{})
	var wg stdsync.WaitGroup
	wg.Go(func() { r.heartbeat(beat) })
	defer func() {
		close(beat)
		wg.Wait()
	}()

	left := n
	wait := func(d time.Duration) bool { // false: d passed with slots left
		timer := time.NewTimer(d)
		defer timer.Stop()
		for left > 0 {
			select {
			case <-exited:
				left--
			case <-timer.C:
				return false
			}
		}
		return true
	}
	<-r.stop.Done() // a slot ends only once stop has ended (or Run has returned)
	if !wait(cfg.ShutdownTimeout) {
		r.log.Warn("pgtransport: shutdown timeout: cancelling the handlers still running",
			"worker", cfg.WorkerID, "handlers", r.count(), "timeout", cfg.ShutdownTimeout)
		cancelHandlers()
		if !wait(cfg.Abandon) {
			r.mu.Lock()
			r.abandoned.Store(true)
			r.mu.Unlock()
			r.log.Error("pgtransport: shutdown: slots still busy (handlers that ignore their cancelled ctx, or a settling call with no reply); abandoned, their leases will lapse",
				"worker", cfg.WorkerID, "handlers", r.count(), "waited", cfg.Abandon)
		}
	}
	if err := context.Cause(r.stop); ctx.Err() == nil && err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// slot is one slot's goroutine: it takes a lease, runs the handler, settles
// the result, and again, until stop ends.
func (r *runtime) slot(exited chan<- struct{}) {
	defer func() { exited <- struct{}{} }()
	var (
		l       *pgtransport.Lease
		pending <-chan error // the last ack, still on its way
		pause   = minPause
	)
	defer func() { r.settled(pending) }()
	for {
		if l == nil {
			if r.stop.Err() != nil {
				return
			}
			var err error
			if l, err = r.feed.Next(r.stop); err != nil {
				l = nil
				if r.stop.Err() != nil {
					return
				}
				if errors.Is(err, pgtransport.ErrClosed) || errors.Is(err, pgtransport.ErrSchemaMissing) {
					r.halt(err)
					return
				}
				r.log.Warn("pgtransport: claim failed; retrying", "worker", r.cfg.WorkerID, "err", err, "retry_in", pause)
				if !r.sleep(pause) {
					return
				}
				pause = min(2*pause, maxPause)
				continue
			}
			pause = minPause
		}
		if r.stop.Err() != nil { // fetched as the shutdown began: not started
			r.release(l)
			return
		}
		if !l.Expiry.IsZero() && !time.Now().Before(l.Expiry) {
			r.expired(l)
			l = nil
			continue
		}
		var p <-chan error
		l, p = r.handle(l)
		if p != nil {
			r.settled(pending) // one ack on its way per slot at most
			pending = p
		}
		if r.abandoned.Load() {
			return
		}
	}
}

// Backoff bounds after a claim fails.
const (
	minPause = 50 * time.Millisecond
	maxPause = 2 * time.Second
)

// sleep waits d or until stop ends (false).
func (r *runtime) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.stop.Done():
		return false
	}
}

// handle runs the handler on l and settles its result: ack, fail, or
// nothing for a lease found lost. It returns the slot's next lease if the
// ack brought one, and an ack still on its way.
func (r *runtime) handle(l *pgtransport.Lease) (*pgtransport.Lease, <-chan error) {
	ctx, cancel := context.WithCancel(r.handlers)
	w := &run{lease: l, cancel: cancel, until: l.Expiry}
	r.mu.Lock()
	r.running[w] = struct{}{}
	// The moment the lease lapses, its handler learns it: not at the next
	// heartbeat, a third of the visibility later, when another worker may
	// already hold the group.
	w.lapse = time.AfterFunc(time.Until(w.until), func() { r.lapsed(w) })
	r.mu.Unlock()

	finished := false
	defer func() {
		if !finished { // the handler called runtime.Goexit: its slot ends, its lease lapses
			r.mu.Lock()
			delete(r.running, w)
			w.lapse.Stop()
			r.mu.Unlock()
			cancel()
			r.log.Error("pgtransport: handler exited its goroutine (runtime.Goexit); its slot is gone and its lease will lapse",
				"worker", r.cfg.WorkerID, "group", l.Group, "seq", l.Seq)
		}
	}()
	start := time.Now()
	open, err := r.call(ctx, l)
	d := time.Since(start)
	finished = true

	r.mu.Lock()
	delete(r.running, w)
	w.lapse.Stop()
	lost := w.lost
	abandoned := r.abandoned.Load() // read under mu: Run sets it under mu
	r.mu.Unlock()
	cancel()
	if abandoned || lost {
		open.rollback(r.base) // nothing of a lost lease's attempt is applied
	}
	if abandoned {
		return nil, nil // Run has returned: its lease lapses
	}
	if r.obs != nil {
		r.obs.Handled(l, d, err)
	}
	if lost {
		r.feed.Lost(l)
		r.log.Debug("pgtransport: result of a lost lease ignored", "group", l.Group, "seq", l.Seq, "err", err)
		return nil, nil
	}
	sctx, done := context.WithTimeout(r.base, settleTimeout)
	defer done()
	if open != nil {
		return r.commit(sctx, l, open), nil
	}
	if err == nil {
		next, pending, aerr := r.feed.Ack(sctx, l, r.stop.Err() == nil)
		if aerr != nil {
			r.ackFailed(l, aerr)
		}
		return next, pending
	}
	if r.handlers.Err() != nil {
		// Cut short by the shutdown (its ShutdownTimeout passed): the
		// shutdown ended it, not the message, so it is given back, not
		// failed (no attempt used, no backoff, never dead-lettered for it).
		r.release(l)
		return nil, nil
	}
	r.fail(sctx, l, err)
	return nil, nil
}

// fail fails l's attempt with cause. The core logs what the queue did with
// it (a dead letter, a stopped group) and a lost lease, and tells the
// observer.
func (r *runtime) fail(ctx context.Context, l *pgtransport.Lease, cause error) {
	ferr := r.feed.Fail(ctx, l, cause)
	if errors.Is(ferr, pgtransport.ErrInvalidDelay) {
		// A handler's Snooze with a negative delay: failed as an error
		// instead, so the attempt ends now rather than its lease lapsing.
		ferr = r.feed.Fail(ctx, l, fmt.Errorf("%v: a negative delay, failed as an error", cause))
	}
	if ferr != nil && !errors.Is(ferr, pgtransport.ErrLeaseLost) {
		r.log.Warn("pgtransport: fail failed; the lease will lapse and the message be handled again",
			"worker", r.cfg.WorkerID, "group", l.Group, "seq", l.Seq, "err", ferr, "cause", cause)
	}
}

// call runs the handler, turning a panic into an error. A transactional
// handler's (WorkTx) transaction comes back open, to be acked and
// committed, only when it returned nil; otherwise it is rolled back.
func (r *runtime) call(ctx context.Context, l *pgtransport.Lease) (open *openTx, err error) {
	defer func() {
		if v := recover(); v != nil {
			stack := debug.Stack()
			err = &PanicError{Value: v, Stack: stack}
			r.log.Error("pgtransport: handler panicked", "group", l.Group, "seq", l.Seq,
				"attempt", l.Attempt, "panic", fmt.Sprint(v), "stack", string(stack))
		}
	}()
	if r.tx != nil {
		return r.tx.call(ctx, l)
	}
	return nil, r.h(ctx, l)
}

// PanicError is the cause a panicking handler's message is failed with.
// Its text, recorded on the message, is "panic: " and the panic's value.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// settled waits for an ack on its way and logs its failure.
func (r *runtime) settled(pending <-chan error) {
	if pending == nil {
		return
	}
	if err := <-pending; err != nil {
		r.ackFailed(nil, err)
	}
}

// ackFailed logs an ack that may not have applied. One that did not
// because the lease was lost the core has logged already.
func (r *runtime) ackFailed(l *pgtransport.Lease, err error) {
	if errors.Is(err, pgtransport.ErrLeaseLost) {
		return
	}
	args := []any{"worker", r.cfg.WorkerID, "err", err}
	if l != nil {
		args = append(args, "group", l.Group, "seq", l.Seq)
	}
	r.log.Warn("pgtransport: ack failed; the message may be handled again", args...)
}

// release gives back a lease no handler ran on.
func (r *runtime) release(l *pgtransport.Lease) {
	ctx, cancel := context.WithTimeout(r.base, settleTimeout)
	defer cancel()
	if err := r.feed.Release(ctx, l); err != nil && !errors.Is(err, pgtransport.ErrLeaseLost) {
		r.log.Warn("pgtransport: give-back failed; the lease will lapse", "group", l.Group, "seq", l.Seq, "err", err)
	}
}

// expired gives back a lease that ran out before its handler could start
// (a feed held it past its visibility: a stream whose round-trip hung,
// say): its group may be another worker's by now, and a handler run on it
// would see its message out of order, beside the new holder's. The give
// back is fenced, so it frees the group only if the lease still holds it.
func (r *runtime) expired(l *pgtransport.Lease) {
	r.log.Warn("pgtransport: lease ran out before its handler started; given back, not handled",
		"worker", r.cfg.WorkerID, "group", l.Group, "seq", l.Seq, "attempt", l.Attempt, "late", time.Since(l.Expiry))
	r.release(l)
}

// lapsed is w's lapse timer: its lease ran out with no heartbeat having
// moved it, so it is lost: its result will be ignored, and its handler's
// ctx is cancelled last, after the log and the observer, so that a Run
// that waits for the handler also waits for them (the timer's goroutine
// has no other owner).
func (r *runtime) lapsed(w *run) {
	r.mu.Lock()
	_, running := r.running[w]
	news := running && !w.lost && !time.Now().Before(w.until)
	if news {
		w.lost = true
	}
	r.mu.Unlock()
	if news {
		l := w.lease
		r.log.Warn("pgtransport: lease lapsed while its handler ran (the heartbeats failed); handler cancelled, its result will be ignored",
			"worker", r.cfg.WorkerID, "group", l.Group, "seq", l.Seq, "attempt", l.Attempt)
		if r.obs != nil {
			r.obs.LeaseLost(l)
		}
		w.cancel()
	}
}

// count is how many handlers run.
func (r *runtime) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.running)
}
