package metrics_test

import (
	"context"
	"errors"
	"fmt"
	stdsync "sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/metrics"
)

func opAttrs(queue, name, typ string, kvs ...attribute.KeyValue) attribute.Set {
	return attrs(queue, append([]attribute.KeyValue{
		attribute.String(metrics.AttrOperationName, name),
		attribute.String(metrics.AttrOperationType, typ),
	}, kvs...)...)
}

func errType(s string) attribute.KeyValue { return attribute.String(metrics.AttrErrorType, s) }

func name(s string) attribute.KeyValue { return attribute.String(metrics.AttrOperationName, s) }

// Every Observer method, called directly, lands in its instrument with
// its attributes, and the counts and durations add up.
func TestObserverRecords(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	mp, r := reader(t)
	obs, err := metrics.New(metrics.Config{MeterProvider: mp, Queue: "orders"})
	is.NoErr(err) // New
	const q = "orders"
	l := &pgtransport.Lease{Group: "g", Seq: 1}

	obs.Published(3, 10*time.Millisecond, nil)
	obs.Published(2, 20*time.Millisecond, nil)
	obs.Published(1, time.Millisecond, fmt.Errorf("publish: %w", pgtransport.ErrInvalidGroup))
	obs.Claimed(2, 5*time.Millisecond, nil)
	obs.Claimed(0, 5*time.Millisecond, nil) // nothing claimable: a claim, no message
	obs.Claimed(0, time.Millisecond, context.Canceled)
	obs.Acked(2, 3*time.Millisecond, nil)
	obs.Acked(1, 3*time.Millisecond, fmt.Errorf("ack: %w", pgtransport.ErrLeaseLost))
	obs.Failed(l, pgtransport.OutcomeRetry, 4*time.Millisecond, nil)
	obs.Failed(l, pgtransport.OutcomeRetry, 4*time.Millisecond, nil)
	obs.Failed(l, pgtransport.OutcomeDead, 4*time.Millisecond, nil)
	obs.Failed(l, pgtransport.OutcomeStopped, 4*time.Millisecond, nil)
	obs.Failed(l, "", 4*time.Millisecond, fmt.Errorf("fail: %w: %w", pgtransport.ErrOutcomeUnknown, context.DeadlineExceeded))
	obs.LeaseLost(l)
	obs.LeaseLost(l)
	obs.Handled(l, 2*time.Second, nil)
	obs.Handled(l, 30*time.Millisecond, errors.New("boom"))

	c := collect(t, r)
	count := func(metric string, s attribute.Set) int64 {
		v, ok := int64Point(c, metric, s)
		is.True(ok) // a data point with the attributes
		return v
	}
	is.Equal(count(metrics.SentMessages, attrs(q, name("publish"))), int64(5))
	is.Equal(count(metrics.SentMessages, attrs(q, name("publish"), errType("invalid_group"))), int64(1))
	is.Equal(points(c, metrics.SentMessages), 2)
	is.Equal(count(metrics.ConsumedMessages, attrs(q, name("claim"))), int64(2))
	is.Equal(points(c, metrics.ConsumedMessages), 1) // a failed claim delivered nothing
	is.Equal(count(metrics.AckedMessages, attrs(q, name("ack"))), int64(2))
	is.Equal(count(metrics.AckedMessages, attrs(q, name("ack"), errType("lease_lost"))), int64(1))
	outcome := func(s string) attribute.KeyValue { return attribute.String(metrics.AttrOutcome, s) }
	is.Equal(count(metrics.FailedMessages, attrs(q, name("fail"), outcome("retry"))), int64(2))
	is.Equal(count(metrics.FailedMessages, attrs(q, name("fail"), outcome("dead"))), int64(1))
	is.Equal(count(metrics.FailedMessages, attrs(q, name("fail"), outcome("stopped"))), int64(1))
	is.Equal(count(metrics.FailedMessages, attrs(q, name("fail"), errType("outcome_unknown"))), int64(1))
	is.Equal(points(c, metrics.FailedMessages), 4)
	is.Equal(count(metrics.DeadLetteredMessages, attrs(q)), int64(1))
	is.Equal(count(metrics.LostLeases, attrs(q)), int64(2))

	n, sum := hist(c, metrics.OperationDuration, opAttrs(q, "publish", "send"))
	is.Equal(n, uint64(2))      // two publishes succeeded
	is.True(almost(sum, 0.030)) // 10 ms + 20 ms, in seconds
	n, _ = hist(c, metrics.OperationDuration, opAttrs(q, "publish", "send", errType("invalid_group")))
	is.Equal(n, uint64(1))
	n, _ = hist(c, metrics.OperationDuration, opAttrs(q, "claim", "receive"))
	is.Equal(n, uint64(2)) // the empty claim is timed too
	n, _ = hist(c, metrics.OperationDuration, opAttrs(q, "claim", "receive", errType("canceled")))
	is.Equal(n, uint64(1))
	n, _ = hist(c, metrics.OperationDuration, opAttrs(q, "ack", "settle"))
	is.Equal(n, uint64(1))
	n, _ = hist(c, metrics.OperationDuration, opAttrs(q, "ack", "settle", errType("lease_lost")))
	is.Equal(n, uint64(1))
	n, sum = hist(c, metrics.OperationDuration, opAttrs(q, "fail", "settle"))
	is.Equal(n, uint64(4))
	is.True(almost(sum, 0.016))
	n, _ = hist(c, metrics.OperationDuration, opAttrs(q, "fail", "settle", errType("outcome_unknown")))
	is.Equal(n, uint64(1))
	is.Equal(points(c, metrics.OperationDuration), 8)
	n, sum = hist(c, metrics.ProcessDuration, opAttrs(q, "process", "process"))
	is.Equal(n, uint64(1))
	is.True(almost(sum, 2))
	n, _ = hist(c, metrics.ProcessDuration, opAttrs(q, "process", "process", errType(metrics.OtherError)))
	is.Equal(n, uint64(1))

	// Units and the semantic conventions' buckets.
	for metric, unit := range map[string]string{
		metrics.SentMessages: "{message}", metrics.ConsumedMessages: "{message}",
		metrics.AckedMessages: "{message}", metrics.FailedMessages: "{message}",
		metrics.DeadLetteredMessages: "{message}", metrics.LostLeases: "{lease}",
		metrics.OperationDuration: "s", metrics.ProcessDuration: "s",
	} {
		is.Equal(c[metric].Unit, unit) // unit of metric
	}
	h := c[metrics.OperationDuration].Data.(metricdata.Histogram[float64])
	is.Equal(h.DataPoints[0].Bounds, metrics.DurationBuckets)
	s := c[metrics.SentMessages].Data.(metricdata.Sum[int64])
	is.True(s.IsMonotonic) // a counter
}

func almost(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// An error with an SQLSTATE is recorded with the code as error.type.
func TestObserverSQLState(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	mp, r := reader(t)
	obs, err := metrics.New(metrics.Config{MeterProvider: mp})
	is.NoErr(err)
	pgErr := fmt.Errorf("publish: %w", &pgconn.PgError{Code: "40P01"})
	obs.Published(4, time.Millisecond, pgErr)
	obs.Failed(nil, "", time.Millisecond, pgErr)
	obs.Handled(nil, time.Millisecond, pgErr)

	c := collect(t, r)
	q := metrics.DefaultQueue // Config.Queue ""
	v, ok := int64Point(c, metrics.SentMessages, attrs(q, name("publish"), errType("40P01")))
	is.True(ok)
	is.Equal(v, int64(4))
	v, ok = int64Point(c, metrics.FailedMessages, attrs(q, name("fail"), errType("40P01")))
	is.True(ok)
	is.Equal(v, int64(1))
	n, _ := hist(c, metrics.OperationDuration, opAttrs(q, "publish", "send", errType("40P01")))
	is.Equal(n, uint64(1))
	n, _ = hist(c, metrics.ProcessDuration, opAttrs(q, "process", "process", errType("40P01")))
	is.Equal(n, uint64(1))
}

func TestErrorType(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("ack: %w", pgtransport.ErrLeaseLost), "lease_lost"},
		{fmt.Errorf("x: %w: %w", pgtransport.ErrOutcomeUnknown, context.Canceled), "outcome_unknown"},
		{fmt.Errorf("x: %w", context.Canceled), "canceled"},
		{context.DeadlineExceeded, "deadline_exceeded"},
		{pgtransport.ErrClosed, "closed"},
		{pgtransport.ErrEventTooLarge, "event_too_large"},
		{pgtransport.ErrInvalidDedupKey, "invalid_dedup_key"},
		{pgtransport.ErrUnknownGroup, "unknown_group"},
		{&pgconn.PgError{Code: "23505"}, "23505"},
		{errors.New("handler says no"), metrics.OtherError},
	} {
		t.Run(fmt.Sprint(c.err), func(t *testing.T) {
			is := is.New(t)
			is.Equal(metrics.ErrorType(c.err), c.want)
		})
	}
}

// New's zero Config: the global MeterProvider, the queue "default".
// Not parallel: it sets the global provider.
func TestNewDefaults(t *testing.T) {
	is := is.New(t)
	mp, r := reader(t)
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(mp)
	t.Cleanup(func() { otel.SetMeterProvider(prev) })

	obs, err := metrics.New(metrics.Config{})
	is.NoErr(err)
	is.Equal(obs.Queue(), metrics.DefaultQueue)
	obs.LeaseLost(nil)
	v, ok := int64Point(collect(t, r), metrics.LostLeases, attrs(metrics.DefaultQueue))
	is.True(ok) // recorded through the global provider
	is.Equal(v, int64(1))
}

func TestNewInvalid(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	_, err := metrics.New(metrics.Config{Queue: "bad\xff"})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // a Queue that is not UTF-8
}

// Concurrent calls from many goroutines, as a transport makes them, lose
// nothing (and pass -race).
func TestObserverConcurrent(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	mp, r := reader(t)
	obs, err := metrics.New(metrics.Config{MeterProvider: mp, Queue: "q"})
	is.NoErr(err)
	const goroutines, each = 8, 1000
	var wg stdsync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				obs.Published(1, time.Microsecond, nil)
				obs.Claimed(1, time.Microsecond, nil)
				obs.Acked(1, time.Microsecond, nil)
				obs.Handled(nil, time.Microsecond, nil)
			}
		})
	}
	// Collections while recording: a reader scrapes whenever it likes.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 10 {
			var rm metricdata.ResourceMetrics
			_ = r.Collect(context.Background(), &rm)
		}
	}()
	wg.Wait()
	<-done
	c := collect(t, r)
	for _, m := range []string{metrics.SentMessages, metrics.ConsumedMessages, metrics.AckedMessages} {
		v, _ := int64Point(c, m, attrs("q", name(map[string]string{
			metrics.SentMessages: "publish", metrics.ConsumedMessages: "claim", metrics.AckedMessages: "ack",
		}[m])))
		is.Equal(v, int64(goroutines*each)) // every call counted
	}
	n, _ := hist(c, metrics.ProcessDuration, opAttrs("q", "process", "process"))
	is.Equal(n, uint64(goroutines*each))
}
