package metrics_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/metrics"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// Wiring: an Observer into the transport's Config, and its Stats into the
// gauges. A real program passes the MeterProvider of its exporter
// (Prometheus, OTLP); here a manual reader reads the metrics back.
func Example() {
	dsn, schema, drop, err := openSchema() // a fresh schema on the test database
	if err != nil {
		log.Fatal(err)
	}
	defer drop()
	ctx := context.Background()

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(ctx)

	obs, err := metrics.New(metrics.Config{MeterProvider: provider, Queue: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	tr, err := pgsync.FromDSN(ctx, dsn, pgtransport.Config{Schema: schema, Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	unregister, err := obs.ObserveStats(tr.Stats, metrics.StatsOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer unregister()

	for _, event := range []string{"created", "paid", "shipped"} {
		if _, err := tr.Publish(ctx, "order-42", event, 0); err != nil {
			log.Fatal(err)
		}
	}
	lease, err := tr.Claim(ctx, "worker-1", 30*time.Second, 0)
	if err != nil {
		log.Fatal(err)
	}
	if err := tr.Ack(ctx, lease); err != nil {
		log.Fatal(err)
	}

	// What an exporter would see: the counters, and the gauges not zero.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range sum.DataPoints {
					if p.Value == 0 {
						continue
					}
					line := m.Name
					if v, ok := p.Attributes.Value(metrics.AttrPriority); ok {
						line += fmt.Sprintf(" priority=%d", v.AsInt64())
					}
					if v, ok := p.Attributes.Value(metrics.AttrGroupState); ok {
						line += " state=" + v.AsString()
					}
					lines = append(lines, fmt.Sprintf("%s: %d", line, p.Value))
				}
			}
		}
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// messaging.client.consumed.messages: 1
	// messaging.client.sent.messages: 3
	// pgtransport.client.acked.messages: 1
	// pgtransport.queue.groups priority=0 state=free: 1
	// pgtransport.queue.messages priority=0: 2
}
