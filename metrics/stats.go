package metrics

import (
	"context"
	"errors"
	"fmt"
	stdsync "sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/pgtransport/pgtransport"
)

// Defaults of StatsOptions' zero fields.
const (
	// DefaultMinInterval is StatsOptions.MinInterval's value when it is 0.
	DefaultMinInterval = time.Second
	// DefaultStatsTimeout is StatsOptions.Timeout's value when it is 0.
	DefaultStatsTimeout = 5 * time.Second
)

// ErrObserving: ObserveStats was called while an earlier registration of
// the same Observer is live (unregister it first). Nothing was registered.
var ErrObserving = errors.New("metrics: stats already observed")

// StatsOptions configures ObserveStats. The zero value works.
type StatsOptions struct {
	// MinInterval is the least time between two calls of the stats
	// function: a collection sooner than that after the last call reuses
	// its result (or, if it failed, records nothing again), so many
	// readers or frequent scrapes do not each cost a round-trip. 0 means
	// DefaultMinInterval; negative is invalid.
	MinInterval time.Duration
	// Timeout bounds each call of the stats function (a reader's context
	// may have no deadline: Prometheus's exporter passes none). 0 means
	// DefaultStatsTimeout; negative is invalid.
	Timeout time.Duration
}

// StatsFunc reads the queue's stats: a transport's Stats method
// (sync.Transport's, or a wrapper of async.Transport's).
type StatsFunc func(context.Context) (pgtransport.Stats, error)

// ObserveStats registers the Stats gauges (QueueMessages, QueueGroups,
// OldestHeadAge, DeadLetters, WaitingConsumers) with a callback that
// calls f, and returns unregister, which stops them (safe to call twice;
// the instruments stay, with no data points).
//
// Each collection calls f at most once, and calls within
// opts.MinInterval of the last call reuse its result; concurrent
// collections wait for one call rather than making their own. Every
// measurement is per priority (MinPriority..MaxPriority, zeros
// included): sum them for the queue's total. A failing f records nothing
// for that collection (no stale or zero values: the series are absent
// from it) and its error goes to Config.ErrorHandler (otel.Handle if
// nil), once per call; the collection itself does not fail.
//
// A nil f or a negative option returns pgtransport.ErrInvalidConfig; a
// second call while a registration is live returns ErrObserving.
func (o *Observer) ObserveStats(f StatsFunc, opts StatsOptions) (unregister func() error, err error) {
	if f == nil {
		return nil, fmt.Errorf("metrics: ObserveStats: %w: nil stats function", pgtransport.ErrInvalidConfig)
	}
	if opts.MinInterval < 0 || opts.Timeout < 0 {
		return nil, fmt.Errorf("metrics: ObserveStats: %w: negative MinInterval or Timeout", pgtransport.ErrInvalidConfig)
	}
	if opts.MinInterval == 0 {
		opts.MinInterval = DefaultMinInterval
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultStatsTimeout
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.observing {
		return nil, ErrObserving
	}
	src := &statsSource{o: o, f: f, opts: opts, now: time.Now}
	reg, err := o.meter.RegisterCallback(src.callback, o.qMessages, o.qGroups, o.qAge, o.qDead, o.qWaiting)
	if err != nil {
		return nil, fmt.Errorf("metrics: ObserveStats: %w", err)
	}
	o.observing = true
	var once stdsync.Once
	return func() error {
		var err error
		once.Do(func() {
			err = reg.Unregister()
			o.mu.Lock()
			o.observing = false
			o.mu.Unlock()
		})
		return err
	}, nil
}

// statsSource is one registration's stats function and its cache.
type statsSource struct {
	o    *Observer
	f    StatsFunc
	opts StatsOptions
	now  func() time.Time

	mu     stdsync.Mutex // held across f: concurrent collections share a call
	called time.Time     // when f was last called; zero: never
	last   pgtransport.Stats
	ok     bool // the last call succeeded
}

// get returns the stats to record, and false for none.
func (s *statsSource) get(ctx context.Context) (pgtransport.Stats, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if !s.called.IsZero() && now.Sub(s.called) < s.opts.MinInterval {
		return s.last, s.ok
	}
	s.called = now
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	st, err := s.f(ctx)
	if err != nil {
		s.last, s.ok = pgtransport.Stats{}, false
		s.o.handle(fmt.Errorf("metrics: stats: %w", err))
		return s.last, false
	}
	s.last, s.ok = st, true
	return st, true
}

func (s *statsSource) callback(ctx context.Context, ob metric.Observer) error {
	st, ok := s.get(ctx)
	if !ok {
		return nil // reported by get; failing the collection would drop the other metrics too
	}
	o := s.o
	for _, p := range st.ByPriority {
		po, known := o.prio[p.Priority]
		if !known { // a priority this build does not know: build its sets now
			po = o.priorityOpts(p.Priority)
		}
		ob.ObserveInt64(o.qMessages, p.Messages, po.prio...)
		ob.ObserveInt64(o.qDead, p.DeadLetters, po.prio...)
		ob.ObserveFloat64(o.qAge, p.OldestHeadAge.Seconds(), po.prio...)
		for _, g := range [...]struct {
			state pgtransport.GroupState
			n     int64
		}{
			{pgtransport.GroupFree, p.Free},
			{pgtransport.GroupLeased, p.Leased},
			{pgtransport.GroupParked, p.Parked},
			{pgtransport.GroupStopped, p.Stopped},
			{pgtransport.GroupPaused, p.Paused},
		} {
			ob.ObserveInt64(o.qGroups, g.n, po.states[g.state]...)
		}
	}
	ob.ObserveInt64(o.qWaiting, st.Waiting, o.waitOpts...)
	return nil
}
