package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// The partitions suite: the async claim+ack (one stream of
// MaxInFlight W drained by W goroutines that ack, as suite claimack's
// async) through an async.Transport over N partition databases (1, 2, 4),
// over 10,000 groups. The Cluster talks to each partition directly: a
// stream per partition with its share of the stream's MaxInFlight,
// merged. Two ways to grow:
//   - split: W = 64 or 1,024 in all, W/N per partition: the same load
//     spread thinner, so each partition's round-trips carry fewer acks;
//   - each: W per partition, N·W in all: the load grows with the
//     partitions, as it does when partitions are added for throughput.
//
// On this one machine the partitions share one CPU budget, so the figure
// that carries to separate machines is the CPU per message: whether a
// message costs more as partitions are added. Cases take turns, one run
// of each, then the next round; each drains untimed for a second first
// (connections, listeners, the partitions' first calls), then for the
// timed window (at least 2 s).
var (
	partitionCounts  = []int{1, 2, 4}
	partitionWorkers = []int{64, 1024}
)

const partitionGroups = 10_000

func (r *runner) partitions(ctx context.Context) error {
	type pcase struct{ parts, workers int } // workers: the stream's MaxInFlight, in all
	var (
		cases   []pcase
		results []*result
	)
	for _, w := range partitionWorkers {
		for _, variant := range []string{"split", "each"} {
			for _, n := range partitionCounts {
				if n == 1 && variant == "each" {
					continue // the same as split
				}
				c := pcase{n, w}
				if variant == "each" {
					c.workers = n * w
				}
				cases = append(cases, c)
				results = append(results, &result{suite: "partitions", system: fmt.Sprintf("cluster/%d", n), variant: variant, workers: w, groups: partitionGroups, unit: "msgs/s"})
			}
		}
	}
	for run := range r.s.runs {
		for i, c := range cases {
			res := results[i]
			r.progress("partitions %-10s workers=%-4d groups=%-6d run %d/%d", res.system, c.workers, partitionGroups, run+1, r.s.runs)
			rate, cpu, err := r.clusterDrain(ctx, c.parts, c.workers)
			if errors.Is(err, pgtest.ErrNoPLProxy) {
				r.progress("partitions skipped: %v (Debian: apt-get install postgresql-<version>-plproxy)", err)
				return nil
			}
			if err != nil {
				return fmt.Errorf("partitions %s workers=%d: %w", res.system, c.workers, err)
			}
			res.runs = append(res.runs, rate)
			res.addCPU(cpu)
		}
	}
	for _, res := range results {
		r.add(*res)
	}
	return nil
}

// clusterDrain runs one case on a fresh queue over parts partitions (made
// for it and dropped after): an untimed drain of a second, then the timed
// one. It returns the timed drain's msgs/s and CPU µs per message.
func (r *runner) clusterDrain(ctx context.Context, parts, workers int) (rate, cpu float64, err error) {
	p, err := pgtest.OpenPartitions(parts, 8)
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.Join(err, p.Drop()) }()
	cl, err := async.NewCluster(ctx, p.Parts, pgtransport.Config{SkipApply: true})
	if err != nil {
		return 0, 0, err
	}
	d := clusterDrainer(cl)
	defer d.close()
	n := max(r.s.backlog, 2*partitionGroups)
	for _, window := range []time.Duration{time.Second, max(r.s.window, 2*time.Second)} {
		if err := preloadParts(ctx, p.Parts, n, partitionGroups); err != nil {
			return 0, 0, err
		}
		c := newChecker(int64(n))
		stop := make(chan struct{})
		timer := time.AfterFunc(window, func() { close(stop) })
		before, start := readCPU(), time.Now()
		err := d.drain(ctx, workers, stop, c)
		elapsed, after := time.Since(start), readCPU()
		timer.Stop()
		if err != nil {
			return 0, 0, err
		}
		if err := c.verifyParts(ctx, p.Parts, n); err != nil {
			return 0, 0, err
		}
		cpu, _ = perOp(before, after, c.acked.Load())
		rate = float64(c.acked.Load()) / elapsed.Seconds()
	}
	return rate, cpu, nil
}

// partitionsTable renders the partitions suite, each case against one
// partition at the same W.
func partitionsTable(r *runner) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### The async claim+ack over partitions (async.Transport, %s groups)\n\n", count(partitionGroups))
	b.WriteString("One stream drained by as many goroutines as it holds leases, over N partition databases, each partition's stream with its share; measured in turns. split: W leases in flight in all (W/N per partition); each: W per partition (N·W in all). All partitions on this machine (one CPU budget): the CPU per message is the figure that carries to separate machines.\n\n")
	b.WriteString("| partitions | W | in flight per partition | msgs/s | CPU µs/msg | CPU vs 1 partition |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, res := range r.results {
		if res.suite != "partitions" {
			continue
		}
		one, ok := r.find("partitions", "cluster/1", "split", res.workers, res.groups)
		n, _ := strconv.Atoi(strings.TrimPrefix(res.system, "cluster/"))
		per := res.workers
		if res.variant == "split" {
			per = res.workers / n
		}
		cpuRatio := "-"
		if ok && len(res.cpu) > 0 && len(one.cpu) > 0 {
			cpuRatio = fmt.Sprintf("%.2fx", median(res.cpu)/median(one.cpu))
		}
		fmt.Fprintf(&b, "| %d | %d | %d | %s | %s | %s |\n", n, res.workers, per, figure(res), res.cpuFigure(), cpuRatio)
	}
	return b.String()
}
