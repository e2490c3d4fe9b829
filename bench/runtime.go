package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// The handler runtime (Work), with no-op handlers, against
// what it is measured by, all in one suite whose runs take turns (one run
// of each, then the next round), so that a noisy machine's slow spell
// falls on all of them alike:
//   - postgres: the server's commit rate, 16 clients committing single-row
//     inserts; a blocking claim+ack is two commits a message, so half of
//     it is the blocking path's ceiling (the goal: the blocking runtime at
//     1.0x it or more);
//   - sync: the hand-written loop, ClaimWait then Ack, one goroutine per
//     worker (the goal: the blocking runtime at 1.5x it or more);
//   - sync-work: sync.Transport.Work, Concurrency 16;
//   - async-work: async.Transport.Work, Concurrency 64;
//   - river: River, 64 workers running no-op jobs (a handler too: the goal
//     is async-work at 2x it or more).
//
// The runtimes count a message when its handler returns, and their run
// ends when Work has returned (its shutdown: handlers finished, the last
// acks sent, leases not started given back); the check after each run
// finds every counted message acked.
const (
	runtimeGroups      = 10_000
	runtimeSyncWorkers = 16
	runtimeAsyncConc   = 64
	runtimeRiver       = 64
)

func (r *runner) runtime(ctx context.Context) error {
	type drainCase struct {
		system  string
		workers int
		d       drainer
		db      *pgtest.DB
		res     result
	}
	var cases []*drainCase
	defer func() {
		for _, c := range cases {
			c.d.close()
			_ = c.db.Drop()
		}
	}()
	for _, c := range []struct {
		system  string
		workers int
	}{{"sync", runtimeSyncWorkers}, {"sync-work", runtimeSyncWorkers}, {"async-work", runtimeAsyncConc}} {
		d, db, err := openDrainer(ctx, c.system, c.workers)
		if err != nil {
			if db != nil {
				_ = db.Drop()
			}
			return err
		}
		cases = append(cases, &drainCase{system: c.system, workers: c.workers, d: d, db: db,
			res: result{suite: "runtime", system: c.system, workers: c.workers, groups: runtimeGroups, unit: "msgs/s"}})
	}
	commitDB, err := openCommits(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = commitDB.Drop() }()
	commits := result{suite: "runtime", system: "postgres", workers: 16, unit: "commits/s"}
	rb, err := openRiver(ctx, runtimeRiver)
	if err != nil {
		return err
	}
	defer rb.close()
	r.progress("runtime    river      workers=%-4d pilot", runtimeRiver)
	pilot, _, err := rb.run(ctx, runtimeRiver, 1000)
	if err != nil {
		return err
	}
	jobs := int(min(max(1000/pilot.Seconds()*r.s.window.Seconds(), 500), 200_000))
	river := result{suite: "runtime", system: "river", workers: runtimeRiver, unit: "jobs/s"}

	for run := range r.s.runs {
		r.progress("runtime    postgres   16 clients, single-row inserts, run %d/%d", run+1, r.s.runs)
		rate, cpu, err := r.commitsOnce(ctx, commitDB)
		if err != nil {
			return err
		}
		commits.runs = append(commits.runs, rate)
		commits.addCPU(cpu)
		for _, c := range cases {
			r.progress("runtime    %-10s workers=%-4d groups=%-6d run %d/%d", c.system, c.workers, runtimeGroups, run+1, r.s.runs)
			rate, cpu, err := r.drainOnce(ctx, c.d, c.db, c.workers, runtimeGroups)
			if err != nil {
				return fmt.Errorf("runtime %s: %w", c.system, err)
			}
			c.res.runs = append(c.res.runs, rate)
			c.res.addCPU(cpu)
		}
		r.progress("runtime    river      workers=%-4d jobs=%d run %d/%d", runtimeRiver, jobs, run+1, r.s.runs)
		elapsed, cpu, err := rb.run(ctx, runtimeRiver, jobs)
		if err != nil {
			return err
		}
		river.runs = append(river.runs, float64(jobs)/elapsed.Seconds())
		river.addCPU(cpu)
	}
	r.add(commits)
	for _, c := range cases {
		r.add(c.res)
	}
	r.add(river)
	return nil
}

// workDrainer runs a transport's handler runtime (Work) with a no-op
// handler that counts each message it is handed, until the run stops.
type workDrainer struct {
	work func(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.Handler) error
	stop func() // the transport's Close
}

func (d workDrainer) close() { d.stop() }

func (d workDrainer) drain(ctx context.Context, workers int, stop <-chan struct{}, c *checker) error {
	ctx, cancel := stopCtx(ctx, stop, c)
	defer cancel()
	cfg := pgtransport.WorkerConfig{WorkerID: "w", Concurrency: workers, Visibility: time.Minute}
	return d.work(ctx, cfg, func(_ context.Context, l *pgtransport.Lease) error {
		c.claimed(l.Group, l.Seq)
		c.ack()
		return nil
	})
}

// openWork opens a drainer on system's Work: "sync-work" or "async-work".
func openWork(ctx context.Context, system string, db *pgtest.DB) (drainer, error) {
	cfg := pgtransport.Config{Schema: db.Schema}
	switch system {
	case "sync-work":
		tr, err := pgsync.New(ctx, db.Pool, cfg)
		if err != nil {
			return nil, err
		}
		return workDrainer{work: tr.Work, stop: tr.Close}, nil
	case "async-work":
		tr, err := async.New(ctx, db.Pool, cfg)
		if err != nil {
			return nil, err
		}
		return workDrainer{work: tr.Work, stop: tr.Close}, nil
	}
	return nil, fmt.Errorf("unknown system %q", system)
}

// runtimeTable renders the runtime suite: each figure, and the ratios its
// goals name.
func runtimeTable(r *runner) string {
	var b strings.Builder
	commits, cok := r.find("runtime", "postgres", "", 16, 0)
	loop, lok := r.find("runtime", "sync", "", runtimeSyncWorkers, runtimeGroups)
	river, rok := r.find("runtime", "river", "", runtimeRiver, 0)
	ceiling := result{runs: []float64{commits.median() / 2}}
	fmt.Fprintf(&b, "\n### The handler runtime (Work, no-op handlers, %s groups; River: jobs/s)\n\n", count(runtimeGroups))
	b.WriteString("Measured in turns, one run of each then the next round. ceiling: the server's commit rate at 16 clients (single-row inserts) over two, as a blocking claim+ack commits twice. sync: the hand-written loop, ClaimWait then Ack per message.\n\n")
	b.WriteString("| system | workers | msgs/s | CPU µs/msg | vs ceiling | vs sync loop | vs River 64 |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	if cok {
		fmt.Fprintf(&b, "| ceiling (commits/s: %s) | 16 | %s | - | 1.00x | - | - |\n", figure(commits), num(ceiling.median()))
	}
	for _, res := range r.results {
		if res.suite != "runtime" || res.system == "postgres" {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s |\n", res.system, res.workers, figure(res), res.cpuFigure(),
			ratio(res, ceiling, cok && res.system != "river"),
			ratio(res, loop, lok && res.system != "river" && res.system != "sync"),
			ratio(res, river, rok && res.system != "river"))
	}
	b.WriteString("\nGoals (bench/README.md, \"The handler runtime\"): sync-work ≥ 1.0x the ceiling and ≥ 1.5x the sync loop; async-work ≥ 2x River 64.\n")
	return b.String()
}
