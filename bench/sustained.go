package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// sustained runs the async claim+ack of goal 1 (one stream, 64 workers,
// 10,000 groups) for d while one publisher keeps the backlog topped up
// with PublishMany, and reports acks per minute, the tables' size and
// dead rows at the start and the end. The transport vacuums its tables
// (Config.Async.Vacuum), since autovacuum may be off. Run by -sustained, not by
// default. With hold, another session holds a snapshot open for that long
// from the start; with fresh, the run is on a throwaway cluster with
// autovacuum on, and each minute also reports that cluster's CPU per
// message. BENCH_EXPLAIN=1 (for looking into a run) adds, at each minute,
// the plan and buffers of one claim of 64, the claim's floors, and the
// index entries each index has returned so far.
//
// workers is the stream's in-flight leases (and handler goroutines),
// backlog the messages kept queued over the 10,000 groups; with
// noVacuum on the test server nothing vacuums the tables (the tables must
// stay small by themselves: HOT updates pruned in place). Every 10 s it
// prints the rate, the groups table's size and the HOT share of its
// updates so far.
//
// With rate > 0 the publisher is paced instead: rate messages a second
// from an empty queue, each carrying its publish time, and every 10 s and
// every minute the run also prints the pickup latency (publish to receive)
// at p50 and p99.
func sustained(ctx context.Context, d, hold time.Duration, fresh bool, pgconf []string, workers, backlog, rate int, noVacuum bool) error {
	const groups = 10_000
	cfg := pgtransport.Config{Async: pgtransport.AsyncConfig{Vacuum: 10 * time.Second}} // this machine's server runs with autovacuum off
	if noVacuum {
		cfg.Async.Vacuum = 0
		fmt.Println("nothing vacuums the tables")
	}
	serverCPU := func() (time.Duration, error) { return 0, nil }
	if fresh {
		c, err := pgtest.StartCluster(pgconf...)
		if err != nil {
			return err
		}
		defer c.Stop()
		serverCPU = c.CPU
		os.Setenv("TEST_DATABASE_URL", c.DSN())
		cfg.Async.Vacuum = 0 // autovacuum is on, at its defaults
		fmt.Println("a throwaway cluster, autovacuum on at its defaults")
		if len(pgconf) > 0 {
			fmt.Printf("its settings otherwise PostgreSQL's defaults but %s\n", strings.Join(pgconf, ", "))
		}
	}
	db, err := pgtest.Open(int32(min(workers, 64)) + 8)
	if err != nil {
		return err
	}
	defer func() { _ = db.Drop() }()
	cfg.Schema = db.Schema
	pubCfg := cfg
	pubCfg.Async = pgtransport.AsyncConfig{} // the blocking publisher takes no async settings
	pub, err := pgsync.New(ctx, db.Pool, pubCfg)
	if err != nil {
		return err
	}
	tr, err := async.New(ctx, db.Pool, cfg)
	if err != nil {
		return err
	}
	defer tr.Close()
	if rate > 0 {
		backlog = 0
	} else if err := preload(ctx, db, backlog, groups); err != nil {
		return err
	}
	stats := func(when string) error {
		var msgs, grps, deadM, deadG int64
		err := db.Pool.QueryRow(context.Background(), `
			SELECT pg_total_relation_size('transport_messages'), pg_total_relation_size('transport_groups'),
			       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'transport_messages'::regclass),
			       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'transport_groups'::regclass)`).Scan(&msgs, &grps, &deadM, &deadG)
		if err != nil {
			return err
		}
		fmt.Printf("%s: transport_messages %d kB (%d dead rows), transport_groups %d kB (%d dead rows)\n", when, msgs/1024, deadM, grps/1024, deadG)
		if os.Getenv("BENCH_EXPLAIN") != "" {
			// What one claim of 64 costs now, in buffers and time (rolled back).
			tx, err := db.Pool.Begin(context.Background())
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			var plan []string
			rows, err := tx.Query(context.Background(), `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT * FROM harel_claim_leases(extract(epoch from clock_timestamp()), extract(epoch from clock_timestamp()) + 60, 'explain', 0, 64)`)
			if err != nil {
				return err
			}
			for rows.Next() {
				var line string
				_ = rows.Scan(&line)
				plan = append(plan, line)
			}
			rows.Close()
			var dbg string
			_ = tx.QueryRow(context.Background(), `SELECT format('cursor %s; free rows %s, held %s, held ended %s',
				(SELECT last_value FROM transport_claim_cursor),
				count(*) FILTER (WHERE locked_by IS NULL), count(*) FILTER (WHERE locked_by <> '' AND lock_expiry >= extract(epoch from now())),
				count(*) FILTER (WHERE locked_by <> '' AND lock_expiry < extract(epoch from now())))
				FROM transport_groups`).Scan(&dbg)
			fmt.Printf("    claim of 64: %s\n    %s\n", strings.Join(plan, " | "), dbg)
			var reads string
			_ = tx.QueryRow(context.Background(), `SELECT string_agg(indexrelname || ' ' || idx_tup_read || '/' || idx_scan, ', ' ORDER BY indexrelname)
				FROM pg_stat_user_indexes WHERE schemaname = current_schema()`).Scan(&reads)
			fmt.Printf("    index entries read/scans so far: %s\n", reads)
		}
		return nil
	}
	if err := stats("start"); err != nil {
		return err
	}
	var published, acked atomic.Int64
	published.Store(int64(backlog))
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	c := newChecker(1 << 62)
	errs := make(chan error, 2)
	var pickups pickupLog
	go func() { // the publisher: keep the backlog near its start, or the pace
		if rate > 0 {
			errs <- pacedPublish(ctx, pub, rate, groups, &published)
			return
		}
		msgs := make([]pgtransport.Message, 500)
		for i := 0; ctx.Err() == nil; i++ {
			if published.Load()-acked.Load() > int64(backlog) {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			for j := range msgs {
				msgs[j] = pgtransport.Message{Group: fmt.Sprint("g", (i*len(msgs)+j)%groups), Event: "e"}
			}
			if _, err := pub.PublishMany(context.WithoutCancel(ctx), msgs); err != nil {
				errs <- err
				return
			}
			published.Add(int64(len(msgs)))
		}
		errs <- nil
	}()
	s, err := tr.Stream(ctx, async.StreamConfig{WorkerID: "w", Visibility: time.Minute, MaxInFlight: workers})
	if err != nil {
		return err
	}
	go func() {
		errs <- parallel(workers, func(int) error {
			for l := range s.C() {
				c.claimed(l.Group, l.Seq)
				if rate > 0 {
					pickups.add(l.Event)
				}
				if err := <-tr.Ack(context.WithoutCancel(ctx), l); err != nil {
					return err
				}
				c.ack()
				acked.Add(1)
			}
			return nil
		})
	}()
	released := make(chan struct{})
	if hold > 0 {
		// Another session's long report: a snapshot held open, so vacuum
		// can remove nothing deleted or updated after it began.
		conn, err := db.Pool.Acquire(ctx)
		if err != nil {
			return err
		}
		tx, err := conn.Begin(ctx)
		if err == nil {
			_, err = tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
		}
		if err == nil {
			_, err = tx.Exec(ctx, "SELECT count(*) FROM pg_class")
		}
		if err != nil {
			conn.Release()
			return err
		}
		fmt.Printf("a snapshot is held for %s\n", hold)
		timer := time.AfterFunc(hold, func() {
			_ = tx.Rollback(context.Background())
			conn.Release()
			fmt.Fprintf(os.Stderr, "snapshot released\n")
			close(released)
		})
		defer func() {
			if timer.Stop() {
				_ = tx.Rollback(context.Background())
				conn.Release()
			}
		}()
	}
	start := time.Now()
	sampled := make(chan struct{})
	defer func() { cancel(); <-sampled }()
	go func() { // 10-second samples, to see the shape within a minute
		defer close(sampled)
		last := int64(0)
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				n := acked.Load()
				var size, upd, hot int64
				_ = db.Pool.QueryRow(ctx, `SELECT pg_total_relation_size('transport_groups'), n_tup_upd, n_tup_hot_upd
					FROM pg_stat_user_tables WHERE relid = 'transport_groups'::regclass`).Scan(&size, &upd, &hot)
				fmt.Fprintf(os.Stderr, "  [%s] %.0f msgs/s; transport_groups %d kB, %.1f%% of %d updates HOT%s\n",
					time.Since(start).Round(time.Second), float64(n-last)/10, size/1024, 100*float64(hot)/float64(max(upd, 1)), upd, pickups.take(rate > 0))
				last = n
			case <-ctx.Done():
				return
			}
		}
	}()
	var perMinute []int64
	last := int64(0)
	lastCPU, err := serverCPU()
	if err != nil {
		return err
	}
	for t := time.NewTicker(time.Minute); ; {
		select {
		case <-t.C:
			n := acked.Load()
			perMinute = append(perMinute, n-last)
			last = n
			cpu, err := serverCPU()
			if err != nil {
				return err
			}
			perMsg := ""
			if fresh && n > 0 {
				// The throwaway cluster's own CPU: other load on the machine
				// slows it but does not count.
				perMsg = fmt.Sprintf(", server CPU %.0f µs/msg", float64((cpu-lastCPU).Microseconds())/float64(perMinute[len(perMinute)-1]))
			}
			lastCPU = cpu
			fmt.Fprintf(os.Stderr, "[%s] minute %d: %d acked (%.0f msgs/s%s)\n", time.Since(start).Round(time.Second), len(perMinute), perMinute[len(perMinute)-1], float64(perMinute[len(perMinute)-1])/60, perMsg)
			if err := stats(fmt.Sprintf("minute %d", len(perMinute))); err != nil {
				return err
			}
			continue
		case <-ctx.Done():
			t.Stop()
		}
		break
	}
	for range 2 {
		if err := <-errs; err != nil {
			return err
		}
	}
	if err := stats("end"); err != nil {
		return err
	}
	if err := c.verify(context.Background(), db, published.Load()); err != nil {
		return err
	}
	if len(perMinute) >= 2 {
		first, lastMin := perMinute[0], perMinute[len(perMinute)-1]
		fmt.Printf("first minute %.0f msgs/s, last minute %.0f msgs/s: %+.1f%%; %d acked in all, per-group order held, none lost\n",
			float64(first)/60, float64(lastMin)/60, 100*(float64(lastMin)-float64(first))/float64(first), acked.Load())
	}
	return nil
}

// pacedPublish publishes rate messages a second over groups, in batches
// every 10 ms, each message's event its publish time (Unix nanoseconds),
// until ctx ends.
func pacedPublish(ctx context.Context, pub *pgsync.Transport, rate, groups int, published *atomic.Int64) error {
	const tick = 10 * time.Millisecond
	start := time.Now()
	for i := 0; ctx.Err() == nil; {
		due := int(time.Since(start).Seconds()*float64(rate)) - i
		if due <= 0 {
			time.Sleep(tick)
			continue
		}
		msgs := make([]pgtransport.Message, due)
		now := strconv.FormatInt(time.Now().UnixNano(), 10)
		for j := range msgs {
			msgs[j] = pgtransport.Message{Group: fmt.Sprint("g", (i+j)%groups), Event: now}
		}
		if _, err := pub.PublishMany(context.WithoutCancel(ctx), msgs); err != nil {
			return err
		}
		i += due
		published.Add(int64(due))
	}
	return nil
}

// pickupLog gathers pickup latencies (publish to receive) between reports.
type pickupLog struct {
	mu sync.Mutex
	d  []time.Duration
}

// add records the pickup of a message whose event is its publish time.
func (p *pickupLog) add(event string) {
	ns, err := strconv.ParseInt(event, 10, 64)
	if err != nil {
		return
	}
	d := time.Since(time.Unix(0, ns))
	p.mu.Lock()
	p.d = append(p.d, d)
	p.mu.Unlock()
}

// take reports p50 and p99 of the pickups since the last take, and
// forgets them ("" when not asked for).
func (p *pickupLog) take(on bool) string {
	if !on {
		return ""
	}
	p.mu.Lock()
	d := p.d
	p.d = nil
	p.mu.Unlock()
	if len(d) == 0 {
		return "; no pickups"
	}
	return fmt.Sprintf("; pickup p50 %.1f ms, p99 %.1f ms (%d)", ms(percentile(d, 50)), ms(percentile(d, 99)), len(d))
}

// serverSettings splits -pgconf's comma-separated name=value list.
func serverSettings(list string) []string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
