package main

import (
	"context"
	"errors"
	"fmt"
	stdsync "sync"
	"sync/atomic"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// The poison suite's shape: one hot group and poisonGroups more, a backlog
// of settings.depth messages each (the hot group 1,000 times that), 1 in
// poisonEvery a poison message whose handler always Fails it, drained by
// poisonWorkers on one async stream under the policy below.
const (
	poisonGroups   = 10_000
	poisonEvery    = 100
	poisonWorkers  = 64
	poisonAttempts = 3
	poisonBackoff  = 10 * time.Millisecond // min
	poisonBackMax  = 50 * time.Millisecond // max
	// poisonSlack is the hold's allowance beyond attempts × backoff max:
	// the three claim+Fail round-trips and the park's end to the next
	// claim, on a busy 2-core machine.
	poisonSlack = 100 * time.Millisecond
)

var errPoison = errors.New("bench: poison message")

// poisonRun is one window's figures.
type poisonRun struct {
	rate  float64         // settled (acked or dead-lettered) per second
	holds []time.Duration // per poison message: first hand-out to the Fail that dead-lettered it
	turns []time.Duration // per group: between consecutive hand-outs of its messages
}

// poison: the backlog with 1% poison messages against the same backlog
// clean, alternating runs in one schema. Throughput counts messages
// settled (acked, or dead-lettered on their last Fail); a poison message's
// hold is how long it kept its group from the next message.
func (r *runner) poison(ctx context.Context) error {
	db, err := pgtest.Open(poisonWorkers + 8)
	if err != nil {
		return err
	}
	defer func() { _ = db.Drop() }()
	cfg := pgtransport.Config{Schema: db.Schema, Policy: &pgtransport.Policy{MaxAttempts: poisonAttempts, RetryBackoffMin: poisonBackoff, RetryBackoffMax: poisonBackMax}}
	tr, err := async.New(ctx, db.Pool, cfg)
	if err != nil {
		return err
	}
	defer tr.Close()
	groups := poisonGroups + 1
	res := map[string]*result{}
	get := func(variant, unit string) *result {
		if res[variant] == nil {
			res[variant] = &result{suite: "poison", system: "async", variant: variant, workers: poisonWorkers, groups: groups, unit: unit}
		}
		return res[variant]
	}
	for run := range r.s.poisonN {
		for _, poisoned := range []bool{false, true} {
			variant := "clean"
			if poisoned {
				variant = "poison"
			}
			r.progress("poison     %-6s workers=%d groups=%d run %d/%d", variant, poisonWorkers, groups, run+1, r.s.poisonN)
			pr, err := r.poisonOnce(ctx, tr, db, poisoned)
			if err != nil {
				return fmt.Errorf("poison %s: %w", variant, err)
			}
			r.progress("poison     %-6s %s msgs/s, %d dead-lettered, turn p50 %.0f ms", variant, num(pr.rate), len(pr.holds), ms(percentile(pr.turns, 50)))
			get(variant, "msgs/s").runs = append(get(variant, "msgs/s").runs, pr.rate)
			get(variant+"/turn p50", "ms").runs = append(get(variant+"/turn p50", "ms").runs, ms(percentile(pr.turns, 50)))
			get(variant+"/turn p99", "ms").runs = append(get(variant+"/turn p99", "ms").runs, ms(percentile(pr.turns, 99)))
			if poisoned && len(pr.holds) > 0 { // none when no group had 3 turns in the window
				get("hold p50", "ms").runs = append(get("hold p50", "ms").runs, ms(percentile(pr.holds, 50)))
				get("hold max", "ms").runs = append(get("hold max", "ms").runs, ms(percentile(pr.holds, 100)))
			}
		}
	}
	for _, v := range []string{"clean", "poison", "clean/turn p50", "clean/turn p99", "poison/turn p50", "poison/turn p99", "hold p50", "hold max"} {
		if res[v] != nil {
			r.add(*res[v])
		}
	}
	return nil
}

// poisonLoad preloads the backlog: the hot group's messages and the
// others' interleaved in seq order, 1 in poisonEvery poison when poisoned
// (chosen by a hash of the position, so spread over the groups).
func poisonLoad(ctx context.Context, db *pgtest.DB, depth int, poisoned bool) (int, error) {
	hot := 1000 * depth
	n := hot + poisonGroups*depth
	every := poisonEvery
	if !poisoned {
		every = 0 // never
	}
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO transport_messages (group_id, event)
		SELECT CASE WHEN i % $2 = 0 THEN 'hot' ELSE 'g' || (i % $3) END,
		       CASE WHEN $4 > 0 AND abs(hashint4(i) % greatest($4, 1)) = 0 THEN 'poison' ELSE i::text END
		  FROM generate_series(0, $1 - 1) AS i ORDER BY i`,
		n, n/hot, poisonGroups, every)
	if err != nil {
		return 0, err
	}
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO transport_groups (group_id) SELECT DISTINCT group_id FROM transport_messages
		ON CONFLICT DO NOTHING;
		ANALYZE transport_groups; ANALYZE transport_messages`)
	return n, err
}

func (r *runner) poisonOnce(ctx context.Context, tr *async.Transport, db *pgtest.DB, poisoned bool) (poisonRun, error) {
	var pr poisonRun
	if _, err := db.Pool.Exec(ctx, `TRUNCATE transport_messages, transport_groups, transport_dead_letters`); err != nil {
		return pr, err
	}
	n, err := poisonLoad(ctx, db, r.s.depth, poisoned)
	if err != nil {
		return pr, err
	}
	var (
		c     = newChecker(int64(n))
		dead  atomic.Int64
		mu    stdsync.Mutex
		first = map[int64]time.Time{}  // poison seq -> its first hand-out
		last  = map[string]time.Time{} // group -> its last hand-out
	)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := tr.Stream(runCtx, async.StreamConfig{WorkerID: "w", Visibility: time.Minute, MaxInFlight: poisonWorkers})
	if err != nil {
		return pr, err
	}
	stop := make(chan struct{})
	timer := time.AfterFunc(r.s.poison, func() { close(stop) })
	defer timer.Stop()
	start := time.Now()
	err = parallel(poisonWorkers, func(int) error {
		for {
			var l *pgtransport.Lease
			select {
			case <-stop:
				return nil
			case <-c.done:
				return nil
			case got, ok := <-s.C():
				if !ok {
					return s.Err()
				}
				l = got
			}
			now := time.Now()
			c.claimed(l.Group, l.Seq)
			mu.Lock()
			if prev, ok := last[l.Group]; ok {
				pr.turns = append(pr.turns, now.Sub(prev))
			}
			last[l.Group] = now
			if l.Event == "poison" && l.Attempt == 1 {
				first[l.Seq] = now
			}
			from, known := first[l.Seq]
			mu.Unlock()
			if l.Event != "poison" {
				if err := <-tr.Ack(ctx, l); err != nil {
					return err
				}
				c.ack()
				continue
			}
			if err := <-tr.Fail(ctx, l, errPoison); err != nil {
				return err
			}
			if l.Attempt >= poisonAttempts {
				dead.Add(1)
				c.ack() // settled
				if known {
					mu.Lock()
					pr.holds = append(pr.holds, time.Since(from))
					mu.Unlock()
				}
			}
		}
	})
	elapsed := time.Since(start)
	s.Close()
	if err != nil {
		return pr, err
	}
	// Every message acked, dead-lettered (poison only, each on its last
	// Fail: no lease lapses here), or still queued.
	var rows, healthy int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE event <> 'poison') FROM transport_dead_letters`).Scan(&rows, &healthy); err != nil {
		return pr, err
	}
	if int64(rows) != dead.Load() || healthy != 0 {
		return pr, fmt.Errorf("%d dead letters (%d healthy), %d dead-lettering Fails", rows, healthy, dead.Load())
	}
	if err := c.verify(ctx, db, int64(n)); err != nil { // c counts dead letters as acks
		return pr, err
	}
	pr.rate = float64(c.acked.Load()) / elapsed.Seconds()
	return pr, nil
}

// dedup: the cost of a DedupKey on publish: one message per call
// (PublishMessage, 16 publishers) and PublishMany batches of 1,000 (4
// publishers), each message to a new group, every key new (each stores a
// dedup row: the most a key costs), against the same without keys.
func (r *runner) dedup(ctx context.Context) error {
	for _, c := range []struct{ batch, publishers int }{{1, 16}, {1000, 4}} {
		for _, keyed := range []bool{false, true} {
			variant := fmt.Sprintf("batch=%d key=off", c.batch)
			if keyed {
				variant = fmt.Sprintf("batch=%d key=on", c.batch)
			}
			res := result{suite: "dedup", system: "sync", variant: variant, workers: c.publishers, unit: "msgs/s"}
			for run := range r.s.runs {
				r.progress("dedup      publishers=%-2d %s run %d/%d", c.publishers, variant, run+1, r.s.runs)
				rate, err := r.dedupOnce(ctx, c.publishers, c.batch, keyed)
				if err != nil {
					return err
				}
				res.runs = append(res.runs, rate)
			}
			r.add(res)
		}
	}
	return nil
}

func (r *runner) dedupOnce(ctx context.Context, publishers, batch int, keyed bool) (float64, error) {
	db, err := pgtest.Open(int32(publishers) + 4)
	if err != nil {
		return 0, err
	}
	defer func() { _ = db.Drop() }()
	pub, err := pgsync.New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema})
	if err != nil {
		return 0, err
	}
	var published atomic.Int64
	stop := make(chan struct{})
	timer := time.AfterFunc(r.s.window, func() { close(stop) })
	defer timer.Stop()
	start := time.Now()
	err = parallel(publishers, func(p int) error {
		msgs := make([]pgtransport.Message, batch)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return nil
			default:
			}
			for j := range msgs {
				msgs[j] = pgtransport.Message{Group: fmt.Sprintf("wf-%d-%d-%d", p, i, j), Event: "e"}
				if keyed {
					msgs[j].DedupKey = fmt.Sprintf("k-%d-%d-%d", p, i, j)
				}
			}
			if batch == 1 {
				if _, err := pub.PublishMessage(ctx, msgs[0]); err != nil {
					return err
				}
			} else if _, err := pub.PublishMany(ctx, msgs); err != nil {
				return err
			}
			published.Add(int64(batch))
		}
	})
	elapsed := time.Since(start)
	if err != nil {
		return 0, err
	}
	left, _, err := leftover(ctx, db)
	if err != nil {
		return 0, err
	}
	var keys int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM transport_dedup`).Scan(&keys); err != nil {
		return 0, err
	}
	want := 0
	if keyed {
		want = int(published.Load())
	}
	if int64(left) != published.Load() || keys != want {
		return 0, fmt.Errorf("dedup: %d published, %d in the table, %d keys (want %d)", published.Load(), left, keys, want)
	}
	return float64(published.Load()) / elapsed.Seconds(), nil
}
