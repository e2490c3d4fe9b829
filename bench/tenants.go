package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// tenants: shares across tenants (docs/design.md, "Shares across
// tenants"). Each workload's queue is loaded with every group ready, then
// drained by one stream of fairInFlight whose handlers ack at once, for
// its window of hand-outs, while every tenant still has a backlog; then
// the same queue with every group in one tenant, for the throughput the
// shares cost. Reported per workload: Jain's fairness index over the
// tenants' hand-outs divided by their weights (1: exactly by weight), the
// largest deviation of a tenant's share from its weight's, the 99th
// percentile of the light tenants' waits (from the ack that left a group
// claimable to its next lease), and the throughput against one tenant.
func (r *runner) tenants(ctx context.Context) error {
	db, err := pgtest.Open(fairInFlight + 4)
	if err != nil {
		return err
	}
	defer func() { _ = db.Drop() }()
	res := map[string]*result{}
	for _, w := range tenantWorkloads {
		for _, m := range tenantMetrics {
			v := w.name + "/" + m
			res[v] = &result{suite: "tenants", system: "async", variant: v, workers: fairInFlight, groups: w.groups(), unit: m}
		}
	}
	for run := range r.s.runs {
		for _, w := range tenantWorkloads {
			if err := r.tenantsOnce(ctx, db, w, res, run); err != nil {
				return err
			}
		}
	}
	for _, w := range tenantWorkloads {
		for _, m := range tenantMetrics {
			r.add(*res[w.name+"/"+m])
		}
	}
	return nil
}

// tenantLoad is one tenant of a workload: its groups, each depth messages
// deep, and its weight.
type tenantLoad struct {
	name                  string
	groups, depth, weight int
}

// tenantWorkload is a queue of tenants and the hand-outs measured.
type tenantWorkload struct {
	name    string
	what    string
	tenants []tenantLoad
	window  int
}

func (w tenantWorkload) groups() int {
	n := 0
	for _, t := range w.tenants {
		n += t.groups
	}
	return n
}

var (
	tenantWorkloads = []tenantWorkload{
		{"sybil", "a tenant with 10,000 ready groups beside 9 with 10 each", append([]tenantLoad{{"sybil", 10_000, 3, 1}}, lights(9, 10, 300)...), 20_000},
		{"weights", "two busy tenants weighted 3:1, 1,000 groups each", []tenantLoad{{"heavy", 1_000, 20, 3}, {"light", 1_000, 20, 1}}, 16_000},
	}
	tenantMetrics = []string{"jain", "max-deviation", "light-p99-ms", "vs-one-tenant"}
)

func lights(n, groups, depth int) []tenantLoad {
	var ts []tenantLoad
	for i := range n {
		ts = append(ts, tenantLoad{fmt.Sprintf("light%d", i), groups, depth, 1})
	}
	return ts
}

// tenantsOnce runs workload w with its tenants, then with one tenant, and
// adds its figures to res.
func (r *runner) tenantsOnce(ctx context.Context, db *pgtest.DB, w tenantWorkload, res map[string]*result, run int) error {
	var shared, one tenantRun
	for _, tenants := range []bool{true, false} {
		r.progress("tenants    %s tenants=%v run %d/%d", w.name, tenants, run+1, r.s.runs)
		tr, err := async.New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema})
		if err != nil {
			return err
		}
		got, err := tenantsLoadAndRun(ctx, db, tr, w, tenants)
		tr.Close()
		if err != nil {
			return err
		}
		if tenants {
			shared = got
		} else {
			one = got
		}
	}
	weights := 0
	for _, t := range w.tenants {
		weights += t.weight
	}
	var xs []float64
	dev := 0.0
	var lightWaits []float64
	for _, t := range w.tenants {
		share := float64(shared.handed[t.name]) / float64(w.window)
		want := float64(t.weight) / float64(weights)
		xs = append(xs, share/want)
		dev = math.Max(dev, math.Abs(share/want-1))
		if t.name != "sybil" && t.name != "heavy" {
			lightWaits = append(lightWaits, shared.waits[t.name]...)
		}
	}
	var sum, sq float64
	for _, x := range xs {
		sum, sq = sum+x, sq+x*x
	}
	slices.Sort(lightWaits)
	p99 := 0.0
	if len(lightWaits) > 0 {
		p99 = lightWaits[len(lightWaits)*99/100]
	}
	for m, v := range map[string]float64{
		"jain":          sum * sum / (float64(len(xs)) * sq),
		"max-deviation": dev,
		"light-p99-ms":  p99,
		"vs-one-tenant": shared.rate / one.rate,
	} {
		res[w.name+"/"+m].runs = append(res[w.name+"/"+m].runs, v)
	}
	return nil
}

// tenantRun is what one drain measured: hand-outs per tenant in the
// window, each tenant's waits (ms), and the window's rate (msgs/s).
type tenantRun struct {
	handed map[string]int
	waits  map[string][]float64
	rate   float64
}

// tenantsLoadAndRun loads w's queue (with its tenants and weights, or all
// in the default tenant) and drains w.window hand-outs through tr.
func tenantsLoadAndRun(ctx context.Context, db *pgtest.DB, tr *async.Transport, w tenantWorkload, tenants bool) (tenantRun, error) {
	pool := db.Pool
	if err := emptyQueue(ctx, pool); err != nil {
		return tenantRun{}, err
	}
	if _, err := pool.Exec(ctx, `TRUNCATE transport_tenants, transport_ready`); err != nil {
		return tenantRun{}, err
	}
	for _, t := range w.tenants {
		if tenants && t.weight != 1 {
			if err := <-tr.SetTenantWeight(ctx, t.name, t.weight); err != nil {
				return tenantRun{}, err
			}
		}
		if _, err := pool.Exec(ctx, `
			INSERT INTO transport_messages (group_id, event)
			SELECT $1 || '/' || g, i::text FROM generate_series(1, $2) AS i, generate_series(1, $3) AS g ORDER BY i, g`,
			t.name, t.depth, t.groups); err != nil {
			return tenantRun{}, err
		}
		tenant := pgtransport.DefaultTenant
		if tenants {
			tenant = t.name
		}
		if _, err := pool.Exec(ctx, `INSERT INTO transport_groups (group_id, tenant)
			SELECT $1 || '/' || g, $2 FROM generate_series(1, $3) AS g`, t.name, tenant, t.groups); err != nil {
			return tenantRun{}, err
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE transport_groups; ANALYZE transport_messages`); err != nil {
		return tenantRun{}, err
	}
	return tenantsDrain(ctx, tr, w.window)
}

// tenantsDrain takes window hand-outs through one stream of fairInFlight,
// acking each at once.
func tenantsDrain(ctx context.Context, tr *async.Transport, window int) (tenantRun, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	s, err := tr.Stream(ctx, async.StreamConfig{WorkerID: "tenants", Visibility: time.Minute, MaxInFlight: fairInFlight})
	if err != nil {
		return tenantRun{}, err
	}
	var (
		mu    sync.Mutex
		start = time.Now()
		end   time.Duration
		out   = tenantRun{handed: map[string]int{}, waits: map[string][]float64{}}
		n     int
		freed = map[string]time.Duration{}
	)
	err = parallel(fairInFlight, func(int) error {
		for l := range s.C() {
			tenant, _, _ := strings.Cut(l.Group, "/")
			mu.Lock()
			now := time.Since(start)
			if n < window {
				n++
				out.handed[tenant]++
				if f, ok := freed[l.Group]; ok {
					out.waits[tenant] = append(out.waits[tenant], float64(now-f)/float64(time.Millisecond))
				}
				if n == window {
					end = now
					cancel()
				}
			}
			freed[l.Group] = now
			mu.Unlock()
			if err := <-tr.Ack(context.WithoutCancel(ctx), l); err != nil {
				return err
			}
		}
		return nil
	})
	s.Close()
	if err != nil && ctx.Err() == nil {
		return tenantRun{}, err
	}
	if n < window {
		return tenantRun{}, fmt.Errorf("tenants: %d of %d hand-outs", n, window)
	}
	out.rate = float64(window) / end.Seconds()
	return out, nil
}
