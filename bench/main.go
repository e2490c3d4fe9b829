// Command bench measures pgtransport against the design it replaced and
// against River, on one PostgreSQL server in one run, and writes a table,
// a CSV and an SVG chart. `make bench` runs it; `make bench-full` runs it
// longer. It finds or starts a server the way the tests do
// (TEST_DATABASE_URL, DATABASE_URL, a local server, or a throwaway cluster).
//
// Every run checks what it measured: per-group order of every ack, and that
// acked plus still-queued equals published (nothing lost, nothing twice). A
// run that fails a check stops the program instead of printing a number.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// settings are a run's sizes: the default fits in 3 minutes on 2 cores.
type settings struct {
	runs     int           // runs per figure; medians and min-max over them
	window   time.Duration // how long one claim+ack run drains
	backlog  int           // messages preloaded per claim+ack run
	samples  int           // latency samples per run
	maxCost  int           // the largest group count of the claim-cost suite
	workers  []int         // claim+ack worker counts
	riverExt []int         // River's and the async transport's extra worker counts
	groups   []int         // claim+ack group counts
	jobs     time.Duration // how long one run of the jobs workload is measured
	poison   time.Duration // how long one run of the poison suite drains (3 of a group's turns at least)
	depth    int           // the poison suite's backlog per group (the hot group: 1,000 times it)
	poisonN  int           // runs of the poison suite (each is long)
}

var (
	quick = settings{runs: 3, window: 400 * time.Millisecond, backlog: 20_000, samples: 200, maxCost: 1_000_000,
		workers: []int{1, 4, 16, 64}, riverExt: []int{256, 1024}, groups: []int{1, 100, 10_000}, jobs: 4 * time.Second, poison: 7 * time.Second, depth: 5, poisonN: 1}
	full = settings{runs: 5, window: 3 * time.Second, backlog: 150_000, samples: 1000, maxCost: 1_000_000,
		workers: []int{1, 4, 16, 64}, riverExt: []int{256, 1024}, groups: []int{1, 100, 10_000}, jobs: 20 * time.Second, poison: 20 * time.Second, depth: 25, poisonN: 3}
)

func main() {
	var (
		long     = flag.Bool("full", false, "longer runs, more of them (make bench-full)")
		out      = flag.String("out", "results", "folder for bench.csv, throughput.svg and table.md")
		only     = flag.String("only", "", "run only the suites whose name matches this regexp (commits, claimack, river, runtime, worktx, proxy, hotgroup, publish, jobs, claimcost, claimwalk, fairness, tenants, latency, poison, dedup; stats only when named: it loads 10M messages)")
		prof     = flag.String("cpuprofile", "", "write a CPU profile of this process to the file")
		sust     = flag.Duration("sustained", 0, "instead of the suites: a sustained async claim+ack run this long (e.g. 10m)")
		hold     = flag.Duration("hold", 0, "with -sustained: another session holds a snapshot open for this long from the start (e.g. 5m)")
		inflight = flag.Int("inflight", 64, "with -sustained: the stream's leases in flight (and handlers)")
		backlog  = flag.Int("backlog", 40_000, "with -sustained: the messages kept queued over its 10,000 groups (fewer a group: groups drain and come back more often)")
		rate     = flag.Int("rate", 0, "with -sustained: publish this many messages a second from an empty queue and report the pickup latency (0: keep -backlog queued)")
		noVac    = flag.Bool("novacuum", false, "with -sustained on the test server (autovacuum off): nothing vacuums the tables")
		fresh    = flag.Bool("cluster", false, "with -sustained: run on a throwaway cluster with autovacuum on (production-like) instead of the test server")
		pgconf   = flag.String("pgconf", "", "with -cluster: server settings for the throwaway cluster, comma-separated name=value (e.g. shared_buffers=2GB); PostgreSQL's defaults otherwise")
		cases    = flag.String("case", "", "run only the claim+ack cases whose system/wW/gG (e.g. async/w64/g10000) matches this regexp")
	)
	flag.Parse()
	s := quick
	if *long {
		s = full
	}
	filter, err := regexp.Compile(*only)
	if err != nil {
		fail(err)
	}
	caseFilter, err := regexp.Compile(*cases)
	if err != nil {
		fail(err)
	}
	if *pgconf != "" && (!*fresh || *sust == 0) {
		fail(fmt.Errorf("-pgconf sets the throwaway cluster of -sustained ... -cluster; it is given without them"))
	}
	defer pgtest.Shutdown()
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	if *sust > 0 {
		if err := sustained(context.Background(), *sust, *hold, *fresh, serverSettings(*pgconf), *inflight, *backlog, *rate, *noVac); err != nil {
			pgtest.Shutdown()
			fail(err)
		}
		return
	}
	r := &runner{s: s, filter: filter, cases: caseFilter, start: time.Now()}
	if err := r.all(context.Background()); err != nil {
		pgtest.Shutdown()
		fail(err)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fail(err)
	}
	table := r.table()
	fmt.Print(table)
	files := map[string]string{"bench.csv": r.csv(), "throughput.svg": r.svg(), "table.md": table}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(*out, name), []byte(body), 0o644); err != nil {
			fail(err)
		}
	}
	abs, _ := filepath.Abs(*out)
	fmt.Fprintf(os.Stderr, "bench: %s: results in %s (bench.csv, throughput.svg, table.md)\n", r.elapsed(), abs)
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "bench: %v\n", err)
	os.Exit(1)
}

// result is one figure: a value per run.
type result struct {
	suite, system, variant string
	workers, groups        int
	unit                   string // "msgs/s" or "ms"
	runs                   []float64
	cpu                    []float64 // machine CPU microseconds per message, per run; empty where unknown
	hot                    float64   // the HOT share of the runs' group-row updates, where hotOK
	hotOK                  bool
}

// hotFigure is the HOT share in percent, or "-".
func (res result) hotFigure() string {
	if !res.hotOK {
		return "-"
	}
	return strconv.FormatFloat(100*res.hot, 'f', 1, 64) + "%"
}

// addCPU records a run's CPU cost; 0 (unknown) drops the column.
func (res *result) addCPU(us float64) {
	if us > 0 {
		res.cpu = append(res.cpu, us)
	}
}

type runner struct {
	s       settings
	filter  *regexp.Regexp
	cases   *regexp.Regexp
	start   time.Time
	results []result
}

func (r *runner) elapsed() string { return time.Since(r.start).Round(time.Second).String() }

func (r *runner) progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%6s] %s\n", r.elapsed(), fmt.Sprintf(format, args...))
}

func (r *runner) add(res result) { r.results = append(r.results, res) }

func (r *runner) all(ctx context.Context) error {
	suites := []struct {
		name string
		run  func(context.Context) error
	}{
		{"commits", r.commits},
		{"claimack", r.claimAck},
		{"river", r.river},
		{"runtime", r.runtime},
		{"worktx", r.workTx},
		{"proxy", r.proxy},
		{"partitions", r.partitions},
		{"hotgroup", r.hotGroup},
		{"publish", r.publish},
		{"jobs", r.jobs},
		{"claimcost", r.claimCost},
		{"claimwalk", r.claimWalk},
		{"fairness", r.fairness},
		{"tenants", r.tenants},
		{"latency", r.latency},
		{"poison", r.poison},
		{"dedup", r.dedup},
		{"stats", r.stats},
	}
	for _, s := range suites {
		if !r.filter.MatchString(s.name) || optIn[s.name] && r.filter.String() == "" {
			continue
		}
		if err := s.run(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	if len(r.results) == 0 {
		return errors.New("no suite matched -only")
	}
	return nil
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
