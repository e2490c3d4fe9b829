package metrics_test

import (
	"context"
	"errors"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/metrics"
)

func prio(p int) attribute.KeyValue { return attribute.Int(metrics.AttrPriority, p) }

func state(s pgtransport.GroupState) attribute.KeyValue {
	return attribute.String(metrics.AttrGroupState, string(s))
}

// sampleStats has distinct numbers everywhere, so a value read from the
// wrong field or priority shows.
func sampleStats() pgtransport.Stats {
	st := pgtransport.Stats{At: time.Now(), Waiting: 7}
	for p := pgtransport.MinPriority; p <= pgtransport.MaxPriority; p++ {
		b := int64(100 * (p + 1))
		st.ByPriority = append(st.ByPriority, pgtransport.PriorityStats{
			Priority: p, Free: b + 1, Leased: b + 2, Parked: b + 3, Stopped: b + 4, Paused: b + 5,
			Groups: 5*b + 15, Messages: b + 50, MessagesExact: true,
			OldestHeadAge: time.Duration(p+1) * 1500 * time.Millisecond, OldestHeadExact: true,
			DeadLetters: b + 60, DeadLettersExact: true,
		})
	}
	st.Total = pgtransport.PriorityStats{Priority: -1, Messages: 99999} // must not be recorded
	return st
}

// stub is a stats function that counts its calls and returns what err
// says.
type stub struct {
	calls atomic.Int32
	err   atomic.Pointer[error]
	block chan struct{} // if not nil, each call waits for it (or ctx)
}

func (s *stub) stats(ctx context.Context) (pgtransport.Stats, error) {
	s.calls.Add(1)
	if s.block != nil {
		select {
		case <-s.block:
		case <-ctx.Done():
			return pgtransport.Stats{}, ctx.Err()
		}
	}
	if e := s.err.Load(); e != nil {
		return pgtransport.Stats{}, *e
	}
	return sampleStats(), nil
}

// errs collects what an ErrorHandler receives.
type errs struct {
	mu   stdsync.Mutex
	list []error
}

func (e *errs) handle(err error) { e.mu.Lock(); e.list = append(e.list, err); e.mu.Unlock() }

func (e *errs) get() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.list...)
}

var gauges = []string{metrics.QueueMessages, metrics.QueueGroups, metrics.OldestHeadAge, metrics.DeadLetters, metrics.WaitingConsumers}

func TestObserveStats(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	mp, r := reader(t)
	var handled errs
	obs, err := metrics.New(metrics.Config{MeterProvider: mp, Queue: "q", ErrorHandler: handled.handle})
	is.NoErr(err)
	c := collect(t, r)
	for _, g := range gauges {
		is.Equal(points(c, g), 0) // nothing before ObserveStats
	}
	var f stub
	unregister, err := obs.ObserveStats(f.stats, metrics.StatsOptions{})
	is.NoErr(err)

	c = collect(t, r)
	is.Equal(f.calls.Load(), int32(1)) // one call for the collection
	for p := pgtransport.MinPriority; p <= pgtransport.MaxPriority; p++ {
		b := int64(100 * (p + 1))
		v, ok := int64Point(c, metrics.QueueMessages, attrs("q", prio(p)))
		is.True(ok)
		is.Equal(v, b+50) // messages of priority p
		v, _ = int64Point(c, metrics.DeadLetters, attrs("q", prio(p)))
		is.Equal(v, b+60) // dead letters of priority p
		age, ok := float64Point(c, metrics.OldestHeadAge, attrs("q", prio(p)))
		is.True(ok)
		is.True(almost(age, 1.5*float64(p+1))) // seconds
		for i, s := range []pgtransport.GroupState{pgtransport.GroupFree, pgtransport.GroupLeased,
			pgtransport.GroupParked, pgtransport.GroupStopped, pgtransport.GroupPaused} {
			v, ok := int64Point(c, metrics.QueueGroups, attrs("q", prio(p), state(s)))
			is.True(ok)
			is.Equal(v, b+int64(i)+1) // groups of priority p in state s
		}
	}
	is.Equal(points(c, metrics.QueueMessages), 5) // per priority only: no total
	is.Equal(points(c, metrics.QueueGroups), 25)
	v, ok := int64Point(c, metrics.WaitingConsumers, attrs("q"))
	is.True(ok)
	is.Equal(v, int64(7))
	sum := c[metrics.QueueMessages].Data.(metricdata.Sum[int64])
	is.True(!sum.IsMonotonic) // an up-down counter: a gauge to Prometheus
	is.Equal(c[metrics.OldestHeadAge].Unit, "s")
	is.Equal(c[metrics.QueueGroups].Unit, "{group}")

	// Within MinInterval (1 s by default) a collection reuses the result.
	c = collect(t, r)
	is.Equal(f.calls.Load(), int32(1))
	v, _ = int64Point(c, metrics.QueueMessages, attrs("q", prio(0)))
	is.Equal(v, int64(150)) // cached, still recorded

	_, err = obs.ObserveStats(f.stats, metrics.StatsOptions{})
	is.True(errors.Is(err, metrics.ErrObserving)) // one registration at a time

	is.NoErr(unregister())
	is.NoErr(unregister()) // twice is fine
	c = collect(t, r)
	for _, g := range gauges {
		is.Equal(points(c, g), 0) // unregistered: no data points
	}
	is.Equal(f.calls.Load(), int32(1))
	is.Equal(len(handled.get()), 0)

	// And again, once unregistered.
	unregister, err = obs.ObserveStats(f.stats, metrics.StatsOptions{MinInterval: time.Nanosecond})
	is.NoErr(err)
	defer unregister()
	collect(t, r)
	collect(t, r)
	is.Equal(f.calls.Load(), int32(3)) // a call per collection once MinInterval has passed
}

// A failing stats function records nothing (no stale values, no zeros),
// reports its error, and leaves the other metrics alone.
func TestObserveStatsError(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	mp, r := reader(t)
	var handled errs
	obs, err := metrics.New(metrics.Config{MeterProvider: mp, Queue: "q", ErrorHandler: handled.handle})
	is.NoErr(err)
	var f stub
	unregister, err := obs.ObserveStats(f.stats, metrics.StatsOptions{MinInterval: time.Nanosecond})
	is.NoErr(err)
	defer unregister()

	c := collect(t, r)
	is.Equal(points(c, metrics.QueueMessages), 5) // a good collection first

	boom := errors.New("database down")
	f.err.Store(&boom)
	obs.LeaseLost(nil)
	c = collect(t, r) // no error: the collection goes on without the gauges
	for _, g := range gauges {
		is.Equal(points(c, g), 0) // nothing recorded, not the last values
	}
	v, _ := int64Point(c, metrics.LostLeases, attrs("q"))
	is.Equal(v, int64(1)) // the rest of the collection is there
	got := handled.get()
	is.Equal(len(got), 1)
	is.True(errors.Is(got[0], boom)) // the stats function's error, reported

	f.err.Store(nil)
	c = collect(t, r)
	is.Equal(points(c, metrics.QueueMessages), 5) // back once it works
	is.Equal(len(handled.get()), 1)
}

// A failure is cached for MinInterval as a result is: the database is not
// asked again, and the error is reported once.
func TestObserveStatsErrorCached(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	mp, r := reader(t)
	var handled errs
	obs, err := metrics.New(metrics.Config{MeterProvider: mp, ErrorHandler: handled.handle})
	is.NoErr(err)
	var f stub
	boom := errors.New("database down")
	f.err.Store(&boom)
	unregister, err := obs.ObserveStats(f.stats, metrics.StatsOptions{MinInterval: time.Hour})
	is.NoErr(err)
	defer unregister()
	for range 3 {
		c := collect(t, r)
		is.Equal(points(c, metrics.QueueMessages), 0)
	}
	is.Equal(f.calls.Load(), int32(1))
	is.Equal(len(handled.get()), 1)
}

// Timeout bounds a stats function that hangs.
func TestObserveStatsTimeout(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	mp, r := reader(t)
	var handled errs
	obs, err := metrics.New(metrics.Config{MeterProvider: mp, ErrorHandler: handled.handle})
	is.NoErr(err)
	f := stub{block: make(chan struct{})} // never closed
	unregister, err := obs.ObserveStats(f.stats, metrics.StatsOptions{Timeout: 50 * time.Millisecond})
	is.NoErr(err)
	defer unregister()
	start := time.Now()
	c := collect(t, r)
	is.True(time.Since(start) < 10*time.Second) // bounded by Timeout
	is.Equal(points(c, metrics.QueueMessages), 0)
	got := handled.get()
	is.Equal(len(got), 1)
	is.True(errors.Is(got[0], context.DeadlineExceeded))
}

// Many readers collecting at once share one call of the stats function.
func TestObserveStatsConcurrent(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	var readers []*sdkmetric.ManualReader
	var opts []sdkmetric.Option
	for range 4 {
		r := sdkmetric.NewManualReader()
		readers = append(readers, r)
		opts = append(opts, sdkmetric.WithReader(r))
	}
	mp := sdkmetric.NewMeterProvider(opts...)
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := metrics.New(metrics.Config{MeterProvider: mp, Queue: "q"})
	is.NoErr(err)
	f := stub{block: make(chan struct{})}
	unregister, err := obs.ObserveStats(f.stats, metrics.StatsOptions{})
	is.NoErr(err)
	defer unregister()

	results := make(chan int64, 2*len(readers))
	var wg stdsync.WaitGroup
	for _, r := range readers {
		for range 2 {
			wg.Go(func() {
				var rm metricdata.ResourceMetrics
				if err := r.Collect(context.Background(), &rm); err != nil {
					results <- -1
					return
				}
				c := collected{}
				for _, sm := range rm.ScopeMetrics {
					for _, m := range sm.Metrics {
						c[m.Name] = m
					}
				}
				v, _ := int64Point(c, metrics.WaitingConsumers, attrs("q"))
				results <- v
			})
		}
	}
	// Let the first call through once it has started; the others wait on it.
	deadline := time.After(10 * time.Second)
	for f.calls.Load() == 0 {
		select {
		case <-deadline:
			t.Fatal("the stats function was never called")
		case <-time.After(time.Millisecond):
		}
	}
	close(f.block)
	wg.Wait()
	close(results)
	for v := range results {
		is.Equal(v, int64(7)) // every collection recorded the one result
	}
	is.Equal(f.calls.Load(), int32(1)) // one call for eight collections
}

func TestObserveStatsInvalid(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	mp, r := reader(t)
	obs, err := metrics.New(metrics.Config{MeterProvider: mp})
	is.NoErr(err)
	_, err = obs.ObserveStats(nil, metrics.StatsOptions{})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // nil f
	var f stub
	_, err = obs.ObserveStats(f.stats, metrics.StatsOptions{MinInterval: -time.Second})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // negative MinInterval
	_, err = obs.ObserveStats(f.stats, metrics.StatsOptions{Timeout: -time.Second})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // negative Timeout
	c := collect(t, r)
	is.Equal(points(c, metrics.QueueMessages), 0) // nothing registered
	is.Equal(f.calls.Load(), int32(0))
	unregister, err := obs.ObserveStats(f.stats, metrics.StatsOptions{})
	is.NoErr(err) // the refusals left no registration behind
	is.NoErr(unregister())
}
