package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// The proxy suite: a plain-SQL client's loop, as a client in
// another language writes it (harel_claim, then harel_ack, one message at
// a time), at 16 clients over 10,000 groups:
//   - direct: on one database;
//   - routed/N: on N partition databases (2, 4) with no proxy, the client
//     routing itself as the Go transports are to: each worker claims from
//     its own partition (worker w from w mod N) and from the others in
//     turn only when that has nothing, and acks on the partition its
//     lease came from; a pool per partition, so about 16/N connections
//     of each are busy;
//   - proxy/N: through a PL/Proxy proxy database over N partition
//     databases (1, 2, 4).
//
// All on the same server.
//
// On this one machine the partitions share one CPU budget, so the figure
// that carries to separate machines is the CPU per message, not the rate:
// it says what the proxy's second hop costs, and whether a message costs
// more as partitions are added.
//
// Each case's schemas (in pgtest's partition and proxy databases) are made
// for its run and dropped after it, with its pools: a proxy's 16 backends
// hold a connection to every partition, so only one case's connections are
// open at a time. Those connections, and each
// partition backend's first calls (which compile the functions), cost
// more than a short run's messages: so each case first drains for a
// second untimed, then for the timed window (at least 2 s). The cases
// take turns, one run of each, then the next round.
var proxyParts = []int{1, 2, 4}

const (
	proxyWorkers = 16
	proxyGroups  = 10_000
)

// sqlQueue is where one case sends its SQL (client; nil: to the partitions
// themselves, routed by the client) and where its messages live (parts:
// the one database, or the partitions).
type sqlQueue struct {
	client *pgxpool.Pool
	parts  []*pgxpool.Pool
	drop   func() error
}

// proxyCase is one case of the suite: parts partitions (0: one database),
// through the proxy or routed by the client.
type proxyCase struct {
	parts  int
	routed bool
}

func (c proxyCase) system() string {
	switch {
	case c.parts == 0:
		return "direct"
	case c.routed:
		return fmt.Sprintf("routed/%d", c.parts)
	}
	return fmt.Sprintf("proxy/%d", c.parts)
}

func openSQLQueue(ctx context.Context, c proxyCase) (*sqlQueue, error) {
	parts := c.parts
	if parts == 0 {
		db, err := pgtest.Open(proxyWorkers + 2)
		if err != nil {
			return nil, err
		}
		if err := schema.Apply(ctx, db.Pool, db.Schema); err != nil {
			return nil, errors.Join(err, db.Drop())
		}
		return &sqlQueue{client: db.Pool, parts: []*pgxpool.Pool{db.Pool}, drop: db.Drop}, nil
	}
	p, err := pgtest.OpenPartitions(parts, proxyWorkers+2)
	if err != nil {
		return nil, err
	}
	if c.routed {
		return &sqlQueue{parts: p.Parts, drop: p.Drop}, nil
	}
	return &sqlQueue{client: p.Proxy, parts: p.Parts, drop: p.Drop}, nil
}

func (r *runner) proxy(ctx context.Context) error {
	cases := []proxyCase{{}}
	for _, n := range proxyParts {
		if n > 1 {
			cases = append(cases, proxyCase{parts: n, routed: true})
		}
	}
	for _, n := range proxyParts {
		cases = append(cases, proxyCase{parts: n})
	}
	var results []*result
	for _, c := range cases {
		results = append(results, &result{suite: "proxy", system: c.system(), workers: proxyWorkers, groups: proxyGroups, unit: "msgs/s"})
	}
	for run := range r.s.runs {
		for i, c := range cases {
			res := results[i]
			r.progress("proxy      %-10s workers=%-4d groups=%-6d run %d/%d", res.system, proxyWorkers, proxyGroups, run+1, r.s.runs)
			q, err := openSQLQueue(ctx, c)
			if errors.Is(err, pgtest.ErrNoPLProxy) {
				r.progress("proxy      skipped: %v (Debian: apt-get install postgresql-<version>-plproxy)", err)
				return nil
			}
			if err != nil {
				return fmt.Errorf("proxy %s: %w", res.system, err)
			}
			_, _, err = r.sqlDrainOnce(ctx, q, time.Second)
			var rate, cpu float64
			if err == nil {
				rate, cpu, err = r.sqlDrainOnce(ctx, q, max(r.s.window, 2*time.Second))
			}
			err = errors.Join(err, q.drop())
			if err != nil {
				return fmt.Errorf("proxy %s: %w", res.system, err)
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

// sqlDrainOnce preloads the backlog (each group's messages in its home
// partition, in seq order) and drains it with the plain-SQL loop for
// window: the acks per second and the machine's CPU per ack. The checker
// sees each group's messages handed out in order; afterwards no queued
// message comes before a handed-out one of its group, and every message is
// either acked once or still queued.
func (r *runner) sqlDrainOnce(ctx context.Context, q *sqlQueue, window time.Duration) (rate, cpu float64, err error) {
	n := max(r.s.backlog, 2*proxyGroups)
	if err := preloadParts(ctx, q.parts, n, proxyGroups); err != nil {
		return 0, 0, err
	}
	c := newChecker(int64(n))
	stop := make(chan struct{})
	timer := time.AfterFunc(window, func() { close(stop) })
	defer timer.Stop()
	before, start := readCPU(), time.Now()
	const claimSQL = `SELECT group_id, seq FROM harel_claim(extract(epoch FROM clock_timestamp()), extract(epoch FROM clock_timestamp()) + 60, $1)`
	err = parallel(proxyWorkers, func(w int) error {
		for i := 0; !finished(stop, c); i++ {
			token := fmt.Sprintf("w%d:%d", w, i)
			var group string
			var seq int64
			db := q.client
			err := pgx.ErrNoRows
			if db != nil {
				err = db.QueryRow(ctx, claimSQL, token).Scan(&group, &seq)
			} else { // routed: the partitions in turn from the worker's own
				start := w % len(q.parts)
				for k := range q.parts {
					db = q.parts[(start+k)%len(q.parts)]
					if err = db.QueryRow(ctx, claimSQL, token).Scan(&group, &seq); !errors.Is(err, pgx.ErrNoRows) {
						break
					}
				}
			}
			if errors.Is(err, pgx.ErrNoRows) {
				time.Sleep(time.Millisecond) // the other clients hold what is left
				continue
			}
			if err != nil {
				return err
			}
			c.claimed(group, seq)
			var acked bool
			if err := db.QueryRow(ctx, `SELECT harel_ack($1, $2, $3, extract(epoch FROM clock_timestamp()))`, group, seq, token).Scan(&acked); err != nil {
				return err
			}
			if !acked {
				return fmt.Errorf("ack of %s/%d refused", group, seq)
			}
			c.ack()
		}
		return nil
	})
	elapsed, after := time.Since(start), readCPU()
	if err != nil {
		return 0, 0, err
	}
	if err := c.verifyParts(ctx, q.parts, n); err != nil {
		return 0, 0, err
	}
	cpu, _ = perOp(before, after, c.acked.Load())
	return float64(c.acked.Load()) / elapsed.Seconds(), cpu, nil
}

// preloadParts empties parts and loads n messages over groups groups,
// each group's on its home partition (hashtext(group) & (N-1)), in seq
// order.
func preloadParts(ctx context.Context, parts []*pgxpool.Pool, n, groups int) error {
	for i, part := range parts {
		if err := emptyQueue(ctx, part); err != nil {
			return err
		}
		if _, err := part.Exec(ctx, `
			INSERT INTO transport_messages (group_id, event)
			SELECT 'g' || (i % $1), i::text FROM generate_series(0, $2 - 1) AS i
			 WHERE hashtext('g' || (i % $1)) & ($3 - 1) = $4
			 ORDER BY i`, groups, n, len(parts), i); err != nil {
			return err
		}
		if _, err := part.Exec(ctx, `
			INSERT INTO transport_groups (group_id) SELECT DISTINCT group_id FROM transport_messages;
			ANALYZE transport_groups; ANALYZE transport_messages`); err != nil {
			return err
		}
	}
	return nil
}

// verifyParts is checker.verify over partitions: the order the checker
// saw, no head skipped on any partition, and every one of the n messages
// acked once or still queued.
func (c *checker) verifyParts(ctx context.Context, parts []*pgxpool.Pool, n int) error {
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return err
	}
	left := 0
	for _, part := range parts {
		if err := c.skipped(ctx, part); err != nil {
			return err
		}
		var m int
		if err := part.QueryRow(ctx, `SELECT count(*) FROM transport_messages`).Scan(&m); err != nil {
			return err
		}
		left += m
	}
	if acked := c.acked.Load(); acked+int64(left) != int64(n) {
		return fmt.Errorf("published %d, acked %d, %d still queued: %d lost or acked twice", n, acked, left, int64(n)-acked-int64(left))
	}
	return nil
}

// proxyTable renders the proxy suite, each case against direct.
func proxyTable(r *runner) string {
	direct, ok := r.find("proxy", "direct", "", proxyWorkers, proxyGroups)
	if !ok {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### A plain-SQL client through a PL/Proxy proxy (harel_claim + harel_ack per message, %d clients, %s groups)\n\n", proxyWorkers, count(proxyGroups))
	b.WriteString("Measured in turns, one run of each then the next round. direct: one database; routed/N: N partition databases, the client routing itself (each worker claims from its own partition first, the others in turn when it is empty; each ack to its lease's); proxy/N: a proxy database over N partition databases. All on this machine (one CPU budget: compare the CPU per message).\n\n")
	b.WriteString("| system | msgs/s | CPU µs/msg | rate vs direct | CPU vs direct |\n| --- | ---: | ---: | ---: | ---: |\n")
	for _, res := range r.results {
		if res.suite != "proxy" {
			continue
		}
		cpuRatio := "-"
		if len(res.cpu) > 0 && len(direct.cpu) > 0 {
			cpuRatio = fmt.Sprintf("%.2fx", median(res.cpu)/median(direct.cpu))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", res.system, figure(res), res.cpuFigure(), ratio(res, direct, res.system != "direct"), cpuRatio)
	}
	return b.String()
}
