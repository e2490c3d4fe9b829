package metrics_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtransport/pgtransport/metrics"
)

// reader returns a MeterProvider and the ManualReader that reads it.
func reader(tb testing.TB) (*sdkmetric.MeterProvider, *sdkmetric.ManualReader) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	tb.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return mp, r
}

// collected is one collection's metrics, by name.
type collected map[string]metricdata.Metrics

func collect(tb testing.TB, r *sdkmetric.ManualReader) collected {
	tb.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		tb.Fatalf("collect: %v", err)
	}
	c := collected{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != metrics.ScopeName {
			tb.Fatalf("scope %q, want %q", sm.Scope.Name, metrics.ScopeName)
		}
		for _, m := range sm.Metrics {
			c[m.Name] = m
		}
	}
	return c
}

// attrs is queue's base attributes plus kvs.
func attrs(queue string, kvs ...attribute.KeyValue) attribute.Set {
	return attribute.NewSet(append([]attribute.KeyValue{
		attribute.String(metrics.AttrSystem, metrics.System),
		attribute.String(metrics.AttrDestination, queue),
	}, kvs...)...)
}

// int64Point is the value of name's data point whose attributes are
// exactly want, and whether there is one.
func int64Point(c collected, name string, want attribute.Set) (int64, bool) {
	var pts []metricdata.DataPoint[int64]
	switch d := c[name].Data.(type) {
	case metricdata.Sum[int64]:
		pts = d.DataPoints
	case metricdata.Gauge[int64]:
		pts = d.DataPoints
	}
	for _, p := range pts {
		if p.Attributes.Equals(&want) {
			return p.Value, true
		}
	}
	return 0, false
}

func float64Point(c collected, name string, want attribute.Set) (float64, bool) {
	if d, ok := c[name].Data.(metricdata.Gauge[float64]); ok {
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&want) {
				return p.Value, true
			}
		}
	}
	return 0, false
}

// hist is the count and sum of name's histogram point with attributes
// exactly want (0, 0 if none).
func hist(c collected, name string, want attribute.Set) (uint64, float64) {
	if d, ok := c[name].Data.(metricdata.Histogram[float64]); ok {
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&want) {
				return p.Count, p.Sum
			}
		}
	}
	return 0, 0
}

// points is how many data points name has.
func points(c collected, name string) int {
	switch d := c[name].Data.(type) {
	case metricdata.Sum[int64]:
		return len(d.DataPoints)
	case metricdata.Gauge[int64]:
		return len(d.DataPoints)
	case metricdata.Gauge[float64]:
		return len(d.DataPoints)
	case metricdata.Histogram[float64]:
		return len(d.DataPoints)
	}
	return 0
}

// The database: TEST_DATABASE_URL, else the local server, as the root
// module's internal/testkit/pgtest finds it (which this module cannot import).
// Schemas carry pgtest's stamp and connections its application_name, so
// its sweep drops what a killed run leaves behind, and never a live one.

var owner = func() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

func baseDSN() string {
	return cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
}

// withAppName adds pgtest's application_name to a URL dsn.
func withAppName(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return dsn + " application_name='pgtest " + owner + "'"
	}
	q := u.Query()
	q.Set("application_name", "pgtest "+owner)
	u.RawQuery = q.Encode()
	return u.String()
}

// openSchema creates a fresh schema and returns the dsn to reach the
// server and the schema's name, and drop, which drops it. A missing server
// is an error, never a skip.
func openSchema() (dsn, schema string, drop func() error, err error) {
	dsn = withAppName(baseDSN())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", "", nil, fmt.Errorf("no PostgreSQL for the tests (set TEST_DATABASE_URL): %w", err)
	}
	defer conn.Close(ctx)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema = "t_" + hex.EncodeToString(b[:])
	id := pgx.Identifier{schema}.Sanitize()
	stamp := fmt.Sprintf("pgtest owner=%s created=%d", owner, time.Now().Unix())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+id+"; COMMENT ON SCHEMA "+id+" IS '"+stamp+"'"); err != nil {
		return "", "", nil, fmt.Errorf("create schema: %w", err)
	}
	return dsn, schema, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "DROP SCHEMA "+id+" CASCADE")
		return err
	}, nil
}

// newSchema is openSchema for a test: dropped in t.Cleanup.
func newSchema(t *testing.T) (dsn, schema string) {
	t.Helper()
	dsn, schema, drop, err := openSchema()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return dsn, schema
}
