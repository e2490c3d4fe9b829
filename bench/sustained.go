package main

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// sustained runs the async claim+ack of goal 1 (one stream, 64 workers,
// 10,000 groups) for d while one publisher keeps the backlog topped up
// with PublishMany, and reports acks per minute, the tables' size and
// dead rows at the start and the end. The transport vacuums its tables
// (Config.Vacuum), since autovacuum may be off. Run by -sustained, not by
// default.
func sustained(ctx context.Context, d time.Duration) error {
	const workers, groups, backlog = 64, 10_000, 40_000
	db, err := pgtest.Open(workers + 8)
	if err != nil {
		return err
	}
	defer func() { _ = db.Drop() }()
	// Vacuum: this machine's server runs with autovacuum off.
	cfg := pgtransport.Config{Schema: db.Schema, Vacuum: 10 * time.Second}
	pub, err := pgsync.New(ctx, db.Pool, cfg)
	if err != nil {
		return err
	}
	tr, err := async.New(ctx, db.Pool, cfg)
	if err != nil {
		return err
	}
	defer tr.Close()
	if err := preload(ctx, db, backlog, groups); err != nil {
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
		return nil
	}
	if err := stats("start"); err != nil {
		return err
	}
	var published, acked atomic.Int64
	published.Store(backlog)
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	c := newChecker(1 << 62)
	errs := make(chan error, 2)
	go func() { // the publisher: keep the backlog near its start
		msgs := make([]pgtransport.Message, 500)
		for i := 0; ctx.Err() == nil; i++ {
			if published.Load()-acked.Load() > backlog {
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
				if err := <-tr.Ack(context.WithoutCancel(ctx), l); err != nil {
					return err
				}
				c.ack()
				acked.Add(1)
			}
			return nil
		})
	}()
	start := time.Now()
	var perMinute []int64
	last := int64(0)
	for t := time.NewTicker(time.Minute); ; {
		select {
		case <-t.C:
			n := acked.Load()
			perMinute = append(perMinute, n-last)
			last = n
			fmt.Fprintf(os.Stderr, "[%s] minute %d: %d acked (%.0f msgs/s)\n", time.Since(start).Round(time.Second), len(perMinute), perMinute[len(perMinute)-1], float64(perMinute[len(perMinute)-1])/60)
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
