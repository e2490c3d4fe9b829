package metrics_test

import (
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/metrics"
)

// BenchmarkObserver is the cost of one Observer call, as a transport
// makes it on its hot path, with the SDK behind it (the cost a real
// program pays before export) and with the no-op provider (the
// Observer's own cost).
func BenchmarkObserver(b *testing.B) {
	l := &pgtransport.Lease{Group: "g", Seq: 1}
	lost := errors.Join(pgtransport.ErrLeaseLost)
	calls := []struct {
		name string
		call func(o *metrics.Observer)
	}{
		{"Published", func(o *metrics.Observer) { o.Published(1, time.Millisecond, nil) }},
		{"Claimed", func(o *metrics.Observer) { o.Claimed(1, time.Millisecond, nil) }},
		{"Acked", func(o *metrics.Observer) { o.Acked(1, time.Millisecond, nil) }},
		{"Failed", func(o *metrics.Observer) { o.Failed(l, pgtransport.OutcomeRetry, time.Millisecond, nil) }},
		{"LeaseLost", func(o *metrics.Observer) { o.LeaseLost(l) }},
		{"Handled", func(o *metrics.Observer) { o.Handled(l, time.Millisecond, nil) }},
		{"Acked_error", func(o *metrics.Observer) { o.Acked(1, time.Millisecond, lost) }},
	}
	for _, p := range []struct {
		name string
		mp   func(b *testing.B) metric.MeterProvider
	}{
		{"sdk", func(b *testing.B) metric.MeterProvider { mp, _ := reader(b); return mp }},
		{"noop", func(*testing.B) metric.MeterProvider { return noop.NewMeterProvider() }},
	} {
		for _, c := range calls {
			b.Run("provider="+p.name+"/call="+c.name, func(b *testing.B) {
				obs, err := metrics.New(metrics.Config{MeterProvider: p.mp(b), Queue: "q"})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					c.call(obs)
				}
			})
		}
	}
}
