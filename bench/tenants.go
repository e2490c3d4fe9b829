package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
// A workload with a hot tenant also reports how much of one lease that
// tenant's one group held, and the 99th percentile of its waits. Every
// drain checks that each group's messages come in seq order, each once;
// a run that breaks it fails.
func (r *runner) tenants(ctx context.Context) error {
	db, err := pgtest.Open(fairInFlight + 4)
	if err != nil {
		return err
	}
	defer func() { _ = db.Drop() }()
	queues := map[int]tenantQueue{0: {
		pools: []*pgxpool.Pool{db.Pool},
		open: func(ctx context.Context) (*async.Transport, error) {
			return async.New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema})
		},
	}}
	var ws []tenantWorkload
	for _, w := range tenantWorkloads {
		if _, ok := queues[w.parts]; !ok {
			p, err := pgtest.OpenPartitions(w.parts, int32(fairInFlight/w.parts+4))
			if errors.Is(err, pgtest.ErrNoPLProxy) {
				r.progress("tenants    %s skipped: %v (Debian: apt-get install postgresql-<version>-plproxy)", w.name, err)
				continue
			}
			if err != nil {
				return err
			}
			defer func() { _ = p.Drop() }()
			queues[w.parts] = tenantQueue{
				pools: p.Parts,
				open: func(ctx context.Context) (*async.Transport, error) {
					return async.NewCluster(ctx, p.Parts, pgtransport.Config{SkipApply: true})
				},
			}
		}
		ws = append(ws, w)
	}
	res := map[string]*result{}
	for _, w := range ws {
		for _, m := range w.metrics() {
			v := w.name + "/" + m
			res[v] = &result{suite: "tenants", system: "async", variant: v, workers: fairInFlight, groups: w.groups(), unit: m}
		}
	}
	for run := range r.s.runs {
		for _, w := range ws {
			if err := r.tenantsOnce(ctx, queues[w.parts], w, res, run); err != nil {
				return err
			}
		}
	}
	for _, w := range ws {
		for _, m := range w.metrics() {
			r.add(*res[w.name+"/"+m])
		}
	}
	return nil
}

// tenantQueue is where a workload runs: one database, or partition
// databases (pools[i] partition i's) behind the cluster front-end.
type tenantQueue struct {
	pools []*pgxpool.Pool
	open  func(ctx context.Context) (*async.Transport, error)
}

// tenantLoad is one tenant of a workload: its groups, each depth messages
// deep, its weight, and whether its waits count as a light tenant's.
type tenantLoad struct {
	name                  string
	groups, depth, weight int
	light                 bool
}

// tenantWorkload is a queue of tenants and the hand-outs measured, on one
// database or over parts partition databases. hot, where set, is a tenant
// whose one group can hold one lease at a time, so that it cannot take
// its weight's share of fairInFlight leases: its hand-outs are reported
// apart (as a fraction of one lease's), and the others' shares are of
// what they took between them.
type tenantWorkload struct {
	name    string
	what    string
	tenants []tenantLoad
	window  int
	parts   int
	hot     string
}

func (w tenantWorkload) groups() int {
	n := 0
	for _, t := range w.tenants {
		n += t.groups
	}
	return n
}

func (w tenantWorkload) metrics() []string {
	if w.hot != "" {
		return append(slices.Clone(tenantMetrics), hotMetrics...)
	}
	return tenantMetrics
}

// hotgroup's window is two-thirds of the 9,000 hand-outs after which the
// other tenants, sharing what the hot group leaves, would run out;
// sybil-4parts is sybil's queue and window over partitions, each group on
// its home partition, the stream's 64 leases 16 a partition.
var (
	tenantWorkloads = []tenantWorkload{
		{name: "sybil", what: "a tenant with 10,000 ready groups beside 9 with 10 each", tenants: sybil(), window: 20_000},
		{name: "zipf", what: "100 tenants of equal weight whose 10,000 ready groups of 8 follow Zipf's law (1,928 to 19)", tenants: zipfTenants, window: contended(zipfTenants) * 2 / 3},
		{name: "weights", what: "two busy tenants weighted 3:1, 1,000 groups each", tenants: []tenantLoad{{"heavy", 1_000, 20, 3, false}, {"light", 1_000, 20, 1, true}}, window: 16_000},
		{name: "hotgroup", what: "a tenant with one group of 2,000 messages beside 9 with 10 groups of 100", tenants: append([]tenantLoad{{"hot", 1, 2_000, 1, false}}, lights(9, 10, 100)...), window: 6_000, hot: "hot"},
		{name: "sybil-4parts", what: "sybil over 4 partition databases (the cluster front-end, 16 in flight on each)", tenants: sybil(), window: 20_000, parts: 4},
	}
	tenantMetrics = []string{"jain", "max-deviation", "light-p99-ms", "vs-one-tenant"}
	hotMetrics    = []string{"hot-leases", "hot-p99-ms"}

	// zipfTenants: 100 tenants, the k-th with 10,000/(k·H(100)) groups of
	// 8 messages, two turns of 4 (the keep quantum) each, so that every
	// tenant's turns are as long and shares of turns are shares of
	// messages. The small ones run out first: the smallest's 19 groups
	// last 38 rounds of the 100 tenants' turns. Past that the window would
	// count hand-outs they no longer compete for, which the others share,
	// and shares would fall off their weights' for want of messages rather
	// than by the claims. So the window is two-thirds of the hand-outs
	// before the first would run out at exact shares (the sybil's and the
	// weights' are two-thirds and 0.6 of theirs): a tenant may take up to
	// 1.5 times its share and still have a backlog at its end, and
	// tenantsOnce says so where one ran out. Within it the smallest fifth
	// are on their groups' second turns, from entries placed as the drain
	// goes, the big ones still on their first, placed at the load.
	zipfTenants = zipf(100, 10_000, 8)
)

func sybil() []tenantLoad {
	return append([]tenantLoad{{"sybil", 10_000, 3, 1, false}}, lights(9, 10, 300)...)
}

func lights(n, groups, depth int) []tenantLoad {
	var ts []tenantLoad
	for i := range n {
		ts = append(ts, tenantLoad{fmt.Sprintf("light%d", i), groups, depth, 1, true})
	}
	return ts
}

// zipf is n tenants of weight 1 whose groups follow Zipf's law with s = 1:
// the k-th has total/(k·H(n)) groups of depth (at least one), H(n) the
// n-th harmonic number. The smaller half are light.
func zipf(n, total, depth int) []tenantLoad {
	h := 0.0
	for k := 1; k <= n; k++ {
		h += 1 / float64(k)
	}
	var ts []tenantLoad
	for k := 1; k <= n; k++ {
		g := max(1, int(math.Round(float64(total)/(float64(k)*h))))
		ts = append(ts, tenantLoad{fmt.Sprintf("zipf%d", k), g, depth, 1, k > n/2})
	}
	return ts
}

// contended is how many hand-outs come, at exact shares by weight, before
// the first of ts runs out of messages.
func contended(ts []tenantLoad) int {
	weights := 0
	for _, t := range ts {
		weights += t.weight
	}
	n := math.MaxInt
	for _, t := range ts {
		n = min(n, t.groups*t.depth*weights/t.weight)
	}
	return n
}

// tenantsOnce runs workload w on q with its tenants, then with one tenant,
// and adds its figures to res.
func (r *runner) tenantsOnce(ctx context.Context, q tenantQueue, w tenantWorkload, res map[string]*result, run int) error {
	var shared, one tenantRun
	for _, tenants := range []bool{true, false} {
		r.progress("tenants    %s tenants=%v run %d/%d", w.name, tenants, run+1, r.s.runs)
		tr, err := q.open(ctx)
		if err != nil {
			return err
		}
		got, err := tenantsLoadAndRun(ctx, q.pools, tr, w, tenants)
		tr.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", w.name, err)
		}
		if tenants {
			shared = got
		} else {
			one = got
		}
	}
	for _, t := range w.tenants {
		if shared.handed[t.name] >= t.groups*t.depth {
			r.progress("tenants    %s: %s ran out of messages inside the window: its share is undercounted", w.name, t.name)
		}
	}
	counted, weights := w.window-shared.handed[w.hot], 0
	for _, t := range w.tenants {
		if t.name != w.hot {
			weights += t.weight
		}
	}
	var xs []float64
	dev := 0.0
	var lightWaits []float64
	for _, t := range w.tenants {
		if t.name == w.hot {
			continue
		}
		share := float64(shared.handed[t.name]) / float64(counted)
		want := float64(t.weight) / float64(weights)
		xs = append(xs, share/want)
		dev = math.Max(dev, math.Abs(share/want-1))
		if t.light {
			lightWaits = append(lightWaits, shared.waits[t.name]...)
		}
	}
	var sum, sq float64
	for _, x := range xs {
		sum, sq = sum+x, sq+x*x
	}
	figures := map[string]float64{
		"jain":          sum * sum / (float64(len(xs)) * sq),
		"max-deviation": dev,
		"light-p99-ms":  p99(lightWaits),
		"vs-one-tenant": shared.rate / one.rate,
	}
	if w.hot != "" {
		// hot-leases: the hot group's hand-outs over the window's, times
		// the leases in flight: 1 would be a lease held the whole window
		// at the pace of every other.
		figures["hot-leases"] = float64(shared.handed[w.hot]) / float64(w.window) * fairInFlight
		figures["hot-p99-ms"] = p99(shared.waits[w.hot])
	}
	for m, v := range figures {
		res[w.name+"/"+m].runs = append(res[w.name+"/"+m].runs, v)
	}
	return nil
}

// p99 is the 99th percentile of waits (sorted in place), 0 for none.
func p99(waits []float64) float64 {
	if len(waits) == 0 {
		return 0
	}
	slices.Sort(waits)
	return waits[len(waits)*99/100]
}

// tenantRun is what one drain measured: hand-outs per tenant in the
// window, each tenant's waits (ms), and the window's rate (msgs/s).
type tenantRun struct {
	handed map[string]int
	waits  map[string][]float64
	rate   float64
}

// tenantsLoadAndRun loads w's queue (with its tenants and weights, or all
// in the default tenant) into pools, each group on its home partition
// (hashtext(group) & (N-1), as the cluster routes it), and drains
// w.window hand-outs through tr.
func tenantsLoadAndRun(ctx context.Context, pools []*pgxpool.Pool, tr *async.Transport, w tenantWorkload, tenants bool) (tenantRun, error) {
	for _, pool := range pools {
		if err := emptyQueue(ctx, pool); err != nil {
			return tenantRun{}, err
		}
		if _, err := pool.Exec(ctx, `TRUNCATE transport_tenants, transport_ready`); err != nil {
			return tenantRun{}, err
		}
	}
	for _, t := range w.tenants {
		if tenants && t.weight != 1 {
			if err := <-tr.SetTenantWeight(ctx, t.name, t.weight); err != nil {
				return tenantRun{}, err
			}
		}
		tenant := pgtransport.DefaultTenant
		if tenants {
			tenant = t.name
		}
		for i, pool := range pools {
			if _, err := pool.Exec(ctx, `
				INSERT INTO transport_messages (group_id, event)
				SELECT $1 || '/' || g, i::text FROM generate_series(1, $2) AS i, generate_series(1, $3) AS g
				 WHERE hashtext($1 || '/' || g) & ($4 - 1) = $5 ORDER BY i, g`,
				t.name, t.depth, t.groups, len(pools), i); err != nil {
				return tenantRun{}, err
			}
			if _, err := pool.Exec(ctx, `INSERT INTO transport_groups (group_id, tenant)
				SELECT $1 || '/' || g, $2 FROM generate_series(1, $3) AS g
				 WHERE hashtext($1 || '/' || g) & ($4 - 1) = $5`, t.name, tenant, t.groups, len(pools), i); err != nil {
				return tenantRun{}, err
			}
		}
	}
	for _, pool := range pools {
		if _, err := pool.Exec(ctx, `ANALYZE transport_groups; ANALYZE transport_messages`); err != nil {
			return tenantRun{}, err
		}
	}
	return tenantsDrain(ctx, tr, w.window)
}

// tenantsDrain takes window hand-outs through one stream of fairInFlight,
// acking each at once. It fails if a group's messages come out of seq
// order or one comes twice.
func tenantsDrain(ctx context.Context, tr *async.Transport, window int) (tenantRun, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	s, err := tr.Stream(ctx, async.StreamConfig{WorkerID: "tenants", Visibility: time.Minute, MaxInFlight: fairInFlight})
	if err != nil {
		return tenantRun{}, err
	}
	var (
		mu     sync.Mutex
		start  = time.Now()
		end    time.Duration
		out    = tenantRun{handed: map[string]int{}, waits: map[string][]float64{}}
		n      int
		freed  = map[string]time.Duration{}
		last   = map[string]int64{}
		broken error
	)
	err = parallel(fairInFlight, func(int) error {
		for l := range s.C() {
			tenant, _, _ := strings.Cut(l.Group, "/")
			mu.Lock()
			now := time.Since(start)
			if p, ok := last[l.Group]; ok && l.Seq <= p && broken == nil {
				broken = fmt.Errorf("tenants: group %s: message %d handed out after %d", l.Group, l.Seq, p)
				cancel()
			}
			last[l.Group] = l.Seq
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
	if broken != nil {
		return tenantRun{}, broken
	}
	if err != nil && ctx.Err() == nil {
		return tenantRun{}, err
	}
	if n < window {
		return tenantRun{}, fmt.Errorf("tenants: %d of %d hand-outs", n, window)
	}
	out.rate = float64(window) / end.Seconds()
	return out, nil
}

// tenantsTable renders the tenants suite: a row per workload that ran,
// then what each hot tenant's group took.
func tenantsTable(r *runner) string {
	var b strings.Builder
	b.WriteString("\n### Shares across tenants (one stream, 64 in flight, handlers that ack at once)\n\n")
	b.WriteString("Over a window of hand-outs while every tenant has a backlog. Jain: Jain's fairness index of the tenants' hand-outs over their weights (1: exactly by weight); deviation: the largest of a tenant's share over its weight's, less 1; light p99: the light tenants' waits, from the ack that left a group claimable to its next lease; vs one tenant: the window's rate over the same queue's with every group in one tenant. Where a tenant has one hot group, the others' shares are of what they took between them.\n\n")
	b.WriteString("| workload | Jain | max deviation | light p99 ms | vs one tenant |\n| --- | ---: | ---: | ---: | ---: |\n")
	var hot []string
	for _, w := range tenantWorkloads {
		if _, ok := r.find("tenants", "async", w.name+"/jain", fairInFlight, w.groups()); !ok {
			continue
		}
		cells := []string{w.name + ": " + w.what}
		for _, m := range tenantMetrics {
			res, _ := r.find("tenants", "async", w.name+"/"+m, fairInFlight, w.groups())
			if m == "light-p99-ms" {
				cells = append(cells, figure(res))
				continue
			}
			lo, hi := res.spread()
			cells = append(cells, fmt.Sprintf("%.3f (%.3f-%.3f)", res.median(), lo, hi))
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
		if w.hot != "" {
			leases, _ := r.find("tenants", "async", w.name+"/hot-leases", fairInFlight, w.groups())
			waits, _ := r.find("tenants", "async", w.name+"/hot-p99-ms", fairInFlight, w.groups())
			lo, hi := leases.spread()
			hot = append(hot, fmt.Sprintf("%s: the hot group took %.3f (%.3f-%.3f) of one lease's hand-outs (its hand-outs' share times the %d in flight), its waits p99 %s ms", w.name, leases.median(), lo, hi, fairInFlight, figure(waits)))
		}
	}
	for _, h := range hot {
		fmt.Fprintf(&b, "\n%s.\n", h)
	}
	return b.String()
}
