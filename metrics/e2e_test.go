package metrics_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"
	"go.opentelemetry.io/otel/attribute"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/metrics"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// A real transport on the test database: publishes, a Work run whose
// handler fails one message once and another for good, a lost lease; the
// counters, histograms and Stats gauges read back through the SDK's
// manual reader.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	dsn, schema := newSchema(t)
	mp, r := reader(t)
	var handled errs
	obs, err := metrics.New(metrics.Config{MeterProvider: mp, Queue: schema, ErrorHandler: handled.handle})
	is.NoErr(err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, err := pgsync.FromDSN(ctx, dsn, pgtransport.Config{Schema: schema, Observer: obs, Logger: slog.New(slog.DiscardHandler), Policy: &pgtransport.Policy{MaxAttempts: 2, RetryBackoffMin: time.Millisecond, RetryBackoffMax: time.Millisecond}})
	is.NoErr(err) // open the transport
	defer tr.Close()
	unregister, err := obs.ObserveStats(tr.Stats, metrics.StatsOptions{MinInterval: time.Nanosecond})
	is.NoErr(err)
	defer unregister()
	q := schema

	// One message per group keeps the expected counts plain.
	for _, m := range []pgtransport.Message{{Group: "a", Event: "ok", Priority: 0}, {Group: "b", Event: "fail-once", Priority: 1}, {Group: "c", Event: "ok", Priority: 2}} {
		_, err := tr.Publish(ctx, m.Group, m.Event, m.Priority)
		is.NoErr(err) // publish
	}
	_, err = tr.PublishMany(ctx, []pgtransport.Message{{Group: "d", Event: "fail", Priority: 3}, {Group: "e", Event: "ok", Priority: 0}})
	is.NoErr(err) // publish a batch
	_, err = tr.Publish(ctx, "", "x", 0)
	is.True(errors.Is(err, pgtransport.ErrInvalidGroup)) // refused, and reported

	c := collect(t, r)
	v, _ := int64Point(c, metrics.SentMessages, attrs(q, name("publish")))
	is.Equal(v, int64(5)) // messages sent
	v, _ = int64Point(c, metrics.SentMessages, attrs(q, name("publish"), errType("invalid_group")))
	is.Equal(v, int64(1)) // the refused publish
	n, _ := hist(c, metrics.OperationDuration, opAttrs(q, "publish", "send"))
	is.Equal(n, uint64(4)) // three publishes and a batch
	depth := map[int]int64{0: 2, 1: 1, 2: 1, 3: 1, 4: 0}
	for p, want := range depth {
		v, ok := int64Point(c, metrics.QueueMessages, attrs(q, prio(p)))
		is.True(ok)
		is.Equal(v, want) // depth of priority p
		v, _ = int64Point(c, metrics.QueueGroups, attrs(q, prio(p), state(pgtransport.GroupFree)))
		is.Equal(v, want) // one free group per message
		v, _ = int64Point(c, metrics.DeadLetters, attrs(q, prio(p)))
		is.Equal(v, int64(0))
		age, ok := float64Point(c, metrics.OldestHeadAge, attrs(q, prio(p)))
		is.True(ok)
		is.True(age >= 0 && age < 60) // seconds since the publish
		if want == 0 {
			is.Equal(age, 0.0) // no message: 0
		}
	}
	v, ok := int64Point(c, metrics.WaitingConsumers, attrs(q))
	is.True(ok)
	is.Equal(v, int64(0))

	// Work: a1, b1 (fails), b2, c1, d1 (fails), d2 (fails: dead), e1.
	const calls = 7
	var seen atomic.Int32
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	err = tr.Work(wctx, pgtransport.WorkerConfig{Concurrency: 2, Visibility: 30 * time.Second},
		func(ctx context.Context, l *pgtransport.Lease) error {
			if seen.Add(1) == calls {
				stop() // the last hand-out: Work settles it and returns
			}
			switch {
			case l.Event == "fail", l.Event == "fail-once" && l.Attempt == 1:
				return errors.New("handler failed")
			}
			return nil
		})
	is.NoErr(err) // Work
	is.Equal(seen.Load(), int32(calls))

	c = collect(t, r)
	v, _ = int64Point(c, metrics.ConsumedMessages, attrs(q, name("claim")))
	is.Equal(v, int64(calls)) // every hand-out
	v, _ = int64Point(c, metrics.AckedMessages, attrs(q, name("ack")))
	is.Equal(v, int64(4)) // a, b, c, e
	outcome := func(s string) attribute.KeyValue { return attribute.String(metrics.AttrOutcome, s) }
	v, _ = int64Point(c, metrics.FailedMessages, attrs(q, name("fail"), outcome(pgtransport.OutcomeRetry)))
	is.Equal(v, int64(2)) // b1, d1
	v, _ = int64Point(c, metrics.FailedMessages, attrs(q, name("fail"), outcome(pgtransport.OutcomeDead)))
	is.Equal(v, int64(1)) // d2
	v, _ = int64Point(c, metrics.DeadLetteredMessages, attrs(q))
	is.Equal(v, int64(1))
	is.Equal(points(c, metrics.LostLeases), 0) // none lost yet
	n, _ = hist(c, metrics.ProcessDuration, opAttrs(q, "process", "process"))
	is.Equal(n, uint64(4)) // handler runs that returned nil
	n, _ = hist(c, metrics.ProcessDuration, opAttrs(q, "process", "process", errType(metrics.OtherError)))
	is.Equal(n, uint64(3)) // and those that failed
	n, _ = hist(c, metrics.OperationDuration, opAttrs(q, "fail", "settle"))
	is.Equal(n, uint64(3))
	n, _ = hist(c, metrics.OperationDuration, opAttrs(q, "claim", "receive"))
	is.True(n >= calls) // the claims that handed out leases, and any that found none
	n, _ = hist(c, metrics.OperationDuration, opAttrs(q, "ack", "settle"))
	is.Equal(n, uint64(4))
	for p := range depth {
		v, _ := int64Point(c, metrics.QueueMessages, attrs(q, prio(p)))
		is.Equal(v, int64(0)) // drained
		want := int64(0)
		if p == 3 {
			want = 1 // d
		}
		v, _ = int64Point(c, metrics.DeadLetters, attrs(q, prio(p)))
		is.Equal(v, want) // dead letters of priority p
		for _, s := range []pgtransport.GroupState{pgtransport.GroupFree, pgtransport.GroupLeased,
			pgtransport.GroupParked, pgtransport.GroupStopped, pgtransport.GroupPaused} {
			v, ok := int64Point(c, metrics.QueueGroups, attrs(q, prio(p), state(s)))
			is.True(ok)
			is.Equal(v, int64(0)) // a drained group's row is gone
		}
	}

	// A lease acked twice: the second ack finds it lost.
	_, err = tr.Publish(ctx, "f", "ok", 4)
	is.NoErr(err)
	l, err := tr.Claim(ctx, "w", time.Minute, 0)
	is.NoErr(err)
	is.True(l != nil) // claimed f
	is.NoErr(tr.Ack(ctx, l))
	err = tr.Ack(ctx, l)
	is.True(errors.Is(err, pgtransport.ErrLeaseLost))
	c = collect(t, r)
	v, _ = int64Point(c, metrics.LostLeases, attrs(q))
	is.Equal(v, int64(1))
	v, _ = int64Point(c, metrics.AckedMessages, attrs(q, name("ack"), errType("lease_lost")))
	is.Equal(v, int64(1))
	v, _ = int64Point(c, metrics.AckedMessages, attrs(q, name("ack")))
	is.Equal(v, int64(5))
	is.Equal(len(handled.get()), 0) // Stats never failed
}
