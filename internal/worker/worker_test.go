package worker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// The runtime's parts that need no database, on a fake feed. The behaviour
// over PostgreSQL, through both front-ends, is in workertest.

// fake is a Feed that hands out the leases sent on next and records what
// the runtime does with them.
type fake struct {
	next      chan *pgtransport.Lease
	extendErr error // what every Extend returns

	mu       stdsync.Mutex
	acked    []*pgtransport.Lease
	failed   map[*pgtransport.Lease]error
	released []*pgtransport.Lease
	lost     []*pgtransport.Lease
}

func newFake() *fake {
	return &fake{next: make(chan *pgtransport.Lease, 16), failed: map[*pgtransport.Lease]error{}}
}

func (f *fake) Next(stop context.Context) (*pgtransport.Lease, error) {
	select {
	case l := <-f.next:
		return l, nil
	case <-stop.Done():
		return nil, stop.Err()
	}
}

func (f *fake) Ack(_ context.Context, l *pgtransport.Lease, _ bool) (*pgtransport.Lease, <-chan error, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acked = append(f.acked, l)
	return nil, nil, nil
}

func (f *fake) Fail(_ context.Context, l *pgtransport.Lease, cause error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed[l] = cause
	return nil
}

func (f *fake) Release(_ context.Context, l *pgtransport.Lease) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released = append(f.released, l)
	return nil
}

func (f *fake) Lost(l *pgtransport.Lease) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lost = append(f.lost, l)
}

func (f *fake) Extend(context.Context, []*pgtransport.Lease, time.Duration) ([]error, error) {
	return nil, f.extendErr
}

// counts returns how many leases were acked, failed, released and lost.
func (f *fake) counts() (acked, failed, released, lost int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.acked), len(f.failed), len(f.released), len(f.lost)
}

func lease(group string, visibility time.Duration) *pgtransport.Lease {
	return &pgtransport.Lease{Group: group, Seq: 1, Token: "w:1", Attempt: 1, Expiry: time.Now().Add(visibility)}
}

// logs keeps the messages of every record.
type logs struct {
	mu   stdsync.Mutex
	msgs []string
}

func (h *logs) Enabled(context.Context, slog.Level) bool { return true }
func (h *logs) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Level.String()+" "+r.Message)
	return nil
}
func (h *logs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logs) WithGroup(string) slog.Handler      { return h }

func (h *logs) has(s string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

func config(t *testing.T, log *logs, wc pgtransport.WorkerConfig) Config {
	t.Helper()
	wc, err := Check(wc, func(context.Context, *pgtransport.Lease) error { return nil })
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	return Config{WorkerConfig: wc, Logger: slog.New(log), Abandon: 100 * time.Millisecond}
}

// start starts Run; the returned channel delivers its result.
func start(ctx context.Context, cfg Config, f Feed, h Handler) <-chan error {
	res := make(chan error, 1)
	go func() { res <- Run(ctx, cfg, f, h) }()
	return res
}

func within[T any](t *testing.T, c <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
		var zero T
		return zero
	}
}

// TestAbandon: a handler that ignores its cancelled ctx is abandoned
// after Config.Abandon: Run returns without it, logs it, and when the
// handler returns at last its result settles nothing and its slot ends.
func TestAbandon(t *testing.T) {
	is := is.New(t)
	f, log := newFake(), &logs{}
	f.next <- lease("g", time.Minute)
	started, unblock := make(chan struct{}), make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	res := start(ctx, config(t, log, pgtransport.WorkerConfig{Concurrency: 1, ShutdownTimeout: 10 * time.Millisecond}), f,
		func(context.Context, *pgtransport.Lease) error {
			close(started)
			<-unblock // ignores ctx
			return nil
		})
	within(t, started, 5*time.Second, "the handler")
	cancel()
	is.NoErr(within(t, res, 5*time.Second, "Run to return without the handler"))
	is.True(log.has("ERROR pgtransport: shutdown: slots still busy (handlers that ignore their cancelled ctx")) // logged as an error
	close(unblock)
	if leak := pgtest.Leaked(5*time.Second, "github.com/pgtransport/pgtransport/internal/worker.(*runtime)"); leak != "" {
		t.Fatalf("the abandoned slot did not end once its handler returned:\n%s", leak)
	}
	acked, failed, _, _ := f.counts()
	is.Equal(acked+failed, 0) // its late result settled nothing
}

// TestHeartbeatLapse: when the heartbeats fail until a running handler's
// lease lapses, its ctx is cancelled and its result ignored.
func TestHeartbeatLapse(t *testing.T) {
	is := is.New(t)
	f, log := newFake(), &logs{}
	f.extendErr = errors.New("database down")
	f.next <- lease("g", time.Second)
	ended := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	began := time.Now()
	res := start(ctx, config(t, log, pgtransport.WorkerConfig{Concurrency: 1, Visibility: time.Second}), f,
		func(ctx context.Context, _ *pgtransport.Lease) error {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
			}
			ended <- ctx.Err()
			return nil
		})
	is.True(errors.Is(within(t, ended, 5*time.Second, "the cancellation"), context.Canceled))
	is.True(time.Since(began) >= time.Second) // not before the lease lapsed
	cancel()
	is.NoErr(within(t, res, 5*time.Second, "Run"))
	acked, failed, _, lost := f.counts()
	is.Equal(acked+failed, 0)                                                // the result ignored
	is.Equal(lost, 1)                                                        // the feed told
	is.True(log.has("WARN pgtransport: heartbeat failed"))                   // each failed heartbeat logged
	is.True(log.has("WARN pgtransport: lease lapsed while its handler ran")) // and the lapse
}

// TestPanicCause: a panic fails the lease with a PanicError whose text is
// the panic's, and the slot goes on to the next lease.
func TestPanicCause(t *testing.T) {
	is := is.New(t)
	f, log := newFake(), &logs{}
	poison, fine := lease("a", time.Minute), lease("b", time.Minute)
	f.next <- poison
	f.next <- fine
	var calls atomic.Int32
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := start(ctx, config(t, log, pgtransport.WorkerConfig{Concurrency: 1}), f,
		func(_ context.Context, l *pgtransport.Lease) error {
			if calls.Add(1) == 1 {
				panic(errors.New("kaboom"))
			}
			close(done)
			return nil
		})
	within(t, done, 5*time.Second, "the next lease")
	cancel()
	is.NoErr(within(t, res, 5*time.Second, "Run"))
	f.mu.Lock()
	cause := f.failed[poison]
	acked := f.acked
	f.mu.Unlock()
	var p *PanicError
	is.True(errors.As(cause, &p))               // failed with the panic
	is.Equal(cause.Error(), "panic: kaboom")    // its text
	is.True(len(p.Stack) > 0)                   // and its stack
	is.Equal(acked, []*pgtransport.Lease{fine}) // the runtime went on
	is.True(log.has("ERROR pgtransport: handler panicked"))
}

// TestUnstartedReleased: a lease the feed comes by as the shutdown
// begins (a claim that lands after it) is given back, not run.
func TestUnstartedReleased(t *testing.T) {
	is := is.New(t)
	f, log := newFake(), &logs{}
	late := &lateFeed{fake: f, l: lease("g", time.Minute), asked: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	var ran atomic.Bool
	res := start(ctx, config(t, log, pgtransport.WorkerConfig{Concurrency: 1}), late,
		func(context.Context, *pgtransport.Lease) error { ran.Store(true); return nil })
	within(t, late.asked, 5*time.Second, "the slot to ask for a lease")
	cancel()
	is.NoErr(within(t, res, 5*time.Second, "Run"))
	_, _, released, _ := f.counts()
	is.True(!ran.Load())  // never started
	is.Equal(released, 1) // given back
}

// TestExpiredNotHandled: a lease the feed hands out after its expiry (a
// stream that held it in its buffer while a round-trip hung) is given back
// unhandled: its group may already be another worker's, and its handler
// would run out of order. The next, live one is handled.
func TestExpiredNotHandled(t *testing.T) {
	is := is.New(t)
	f, log := newFake(), &logs{}
	stale, live := lease("g", -time.Millisecond), lease("g", time.Minute)
	live.Seq = 2
	f.next <- stale
	f.next <- live
	handled := make(chan int64, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := start(ctx, config(t, log, pgtransport.WorkerConfig{Concurrency: 1}), f,
		func(_ context.Context, l *pgtransport.Lease) error { handled <- l.Seq; return nil })
	is.Equal(within(t, handled, 5*time.Second, "the live lease's handler"), int64(2)) // the expired one skipped
	cancel()
	is.NoErr(within(t, res, 5*time.Second, "Run"))
	acked, _, released, _ := f.counts()
	is.Equal(released, 1)                                  // the expired lease given back
	is.Equal(acked, 1)                                     // the live one acked
	is.True(log.has("ran out before its handler started")) // and logged
}

// lateFeed's Next waits for stop to end, then hands out l anyway.
type lateFeed struct {
	*fake
	l     *pgtransport.Lease
	asked chan struct{}
}

func (f *lateFeed) Next(stop context.Context) (*pgtransport.Lease, error) {
	close(f.asked)
	<-stop.Done()
	return f.l, nil
}

// TestCheck: defaults filled in one place.
func TestCheck(t *testing.T) {
	is := is.New(t)
	_, err := Check(pgtransport.WorkerConfig{}, nil)
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // a nil handler
	cfg, err := Check(pgtransport.WorkerConfig{}, func(context.Context, *pgtransport.Lease) error { return nil })
	is.NoErr(err)
	is.Equal(cfg.Concurrency, pgtransport.DefaultConcurrency)
	is.Equal(cfg.Visibility, pgtransport.DefaultWorkerVisibility)
	is.Equal(cfg.ShutdownTimeout, pgtransport.DefaultShutdownTimeout)
	is.True(strings.Contains(cfg.WorkerID, ":")) // hostname:pid
}
