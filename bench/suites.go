package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

var drainSystems = []string{"sync", "async", "baseline"}

// claimAck: a preloaded backlog over G groups, drained by W workers for a
// fixed window; msgs/s is acks over the time until the window ended or the
// backlog ran out.
func (r *runner) claimAck(ctx context.Context) error {
	for _, system := range drainSystems {
		workers := r.s.workers
		if system == "async" { // scales with workers, as River does
			workers = append(slices.Clone(workers), r.s.riverExt...)
		}
		for _, w := range workers {
			for _, g := range r.s.groups {
				if !r.cases.MatchString(fmt.Sprintf("%s/w%d/g%d", system, w, g)) {
					continue
				}
				if err := r.drainRuns(ctx, "claimack", system, w, g); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// drainRuns measures system with w workers over g groups, runs times, in a
// schema of its own, and records the result under suite.
func (r *runner) drainRuns(ctx context.Context, suite, system string, w, g int) error {
	res := result{suite: suite, system: system, workers: w, groups: g, unit: "msgs/s"}
	d, db, err := openDrainer(ctx, system, w)
	if err != nil {
		if db != nil {
			_ = db.Drop()
		}
		return err
	}
	defer func() { _ = db.Drop() }()
	closed := false
	defer func() {
		if !closed {
			d.close()
		}
	}()
	before, err := groupUpdates(ctx, db, false)
	if err != nil {
		return err
	}
	for run := range r.s.runs {
		r.progress("%-10s %-9s workers=%-4d groups=%-6d run %d/%d", suite, system, w, g, run+1, r.s.runs)
		rate, cpu, err := r.drainOnce(ctx, d, db, w, g)
		if err != nil {
			return fmt.Errorf("%s %s workers=%d groups=%d: %w", suite, system, w, g, err)
		}
		res.runs = append(res.runs, rate)
		res.addCPU(cpu)
	}
	d.close()
	closed = true
	after, err := groupUpdates(ctx, db, true)
	if err != nil {
		return err
	}
	if n := after.upd - before.upd; n > 0 {
		res.hot, res.hotOK = float64(after.hot-before.hot)/float64(n), true
	}
	r.add(res)
	return nil
}

// updates counts the updates of a queue's transport_groups and how many of
// them were HOT (pg_stat_user_tables).
type updates struct{ upd, hot int64 }

// groupUpdates reads db's group-row update counts. With flush, it first
// closes the pool's idle connections, whose backends report their counts
// as they exit (an idle backend may hold them for 10 s), and reads until
// two reads 200 ms apart agree.
func groupUpdates(ctx context.Context, db *pgtest.DB, flush bool) (updates, error) {
	if flush {
		db.Pool.Reset()
	}
	read := func() (updates, error) {
		var u updates
		err := db.Pool.QueryRow(ctx, `SELECT COALESCE(sum(n_tup_upd), 0)::bigint, COALESCE(sum(n_tup_hot_upd), 0)::bigint
			  FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'transport_groups'`, db.Schema).Scan(&u.upd, &u.hot)
		return u, err
	}
	last, err := read()
	for i := 0; flush && err == nil && i < 25; i++ {
		time.Sleep(200 * time.Millisecond)
		var u updates
		if u, err = read(); err == nil && u == last {
			break
		}
		last = u
	}
	return last, err
}

// drainOnce returns msgs/s and the machine's CPU microseconds per message
// (0 where it cannot tell).
func (r *runner) drainOnce(ctx context.Context, d drainer, db *pgtest.DB, workers, groups int) (rate, cpu float64, err error) {
	n := max(r.s.backlog, 2*groups)
	if err := emptyQueue(ctx, db.Pool); err != nil {
		return 0, 0, err
	}
	if err := preload(ctx, db, n, groups); err != nil {
		return 0, 0, err
	}
	c := newChecker(int64(n))
	stop := make(chan struct{})
	timer := time.AfterFunc(r.s.window, func() { close(stop) })
	before, start := readCPU(), time.Now()
	err = d.drain(ctx, workers, stop, c)
	elapsed, after := time.Since(start), readCPU()
	timer.Stop()
	if err != nil {
		return 0, 0, err
	}
	if err := c.verify(ctx, db, int64(n)); err != nil {
		return 0, 0, err
	}
	cpu, _ = perOp(before, after, c.acked.Load())
	return float64(c.acked.Load()) / elapsed.Seconds(), cpu, nil
}

// river: the same worker counts and more, since River scales with workers.
func (r *runner) river(ctx context.Context) error {
	for _, w := range append(slices.Clone(r.s.workers), r.s.riverExt...) {
		res := result{suite: "claimack", system: "river", workers: w, unit: "jobs/s"}
		rb, err := openRiver(ctx, w)
		if err != nil {
			return err
		}
		// A pilot run sizes the batch so a run lasts about the window.
		r.progress("river      workers=%-4d pilot", w)
		pilot, _, err := rb.run(ctx, w, 1000)
		if err != nil {
			rb.close()
			return err
		}
		n := int(min(max(1000/pilot.Seconds()*r.s.window.Seconds(), 500), 200_000))
		for run := range r.s.runs {
			r.progress("river      workers=%-4d jobs=%d run %d/%d", w, n, run+1, r.s.runs)
			elapsed, cpu, err := rb.run(ctx, w, n)
			if err != nil {
				rb.close()
				return err
			}
			res.runs = append(res.runs, float64(n)/elapsed.Seconds())
			res.addCPU(cpu)
		}
		rb.close()
		r.add(res)
	}
	return nil
}

// publish: publishers publishing for the window, one message per call or
// batches of 1,000 (PublishMany), each message to a new group (each
// workflow its own group), while one async consumer works through a
// backlog and acks, with notifications off and on.
func (r *runner) publish(ctx context.Context) error {
	for _, batch := range []int{1, 1000} {
		for _, publishers := range []int{1, 16} {
			for _, notify := range []bool{false, true} {
				if err := r.publishCase(ctx, batch, publishers, notify); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (r *runner) publishCase(ctx context.Context, batch, publishers int, notify bool) error {
	variant := fmt.Sprintf("batch=%d notify=off", batch)
	if notify {
		variant = fmt.Sprintf("batch=%d notify=on", batch)
	}
	res := result{suite: "publish", system: "sync", variant: variant, workers: publishers, unit: "msgs/s"}
	for run := range r.s.runs {
		r.progress("publish    publishers=%-2d %s run %d/%d", publishers, variant, run+1, r.s.runs)
		publish := r.publishOnce
		if batch > 1 {
			publish = r.publishBatchOnce
		}
		rate, err := publish(ctx, publishers, batch, notify)
		if err != nil {
			return err
		}
		res.runs = append(res.runs, rate)
	}
	r.add(res)
	return nil
}

func (r *runner) publishOnce(ctx context.Context, publishers, _ int, notify bool) (float64, error) {
	db, err := pgtest.Open(int32(publishers) + 8)
	if err != nil {
		return 0, err
	}
	defer func() { _ = db.Drop() }()
	cfg := pgtransport.Config{Schema: db.Schema, Async: pgtransport.AsyncConfig{DisableNotify: !notify}}
	pub, err := pgsync.New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema}) // the blocking publisher takes no async settings
	if err != nil {
		return 0, err
	}
	cons, err := async.New(ctx, db.Pool, cfg)
	if err != nil {
		return 0, err
	}
	defer cons.Close()
	// The consumer: busy with a backlog when the timing starts, so it does
	// the same work whether notifications are on or off.
	if err := preload(ctx, db, 1000, 1000); err != nil {
		return 0, err
	}
	s, err := cons.Stream(ctx, async.StreamConfig{WorkerID: "consumer", Visibility: time.Minute, MaxInFlight: 8})
	if err != nil {
		return 0, err
	}
	c := newChecker(1 << 62)
	consumed := make(chan error, 1)
	go func() {
		for l := range s.C() {
			c.claimed(l.Group, l.Seq)
			if err := <-cons.Ack(ctx, l); err != nil {
				consumed <- err
				return
			}
			c.ack()
		}
		consumed <- nil
	}()
	for c.acked.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	published, elapsed, err := r.publishFor(ctx, pub, publishers, 1)
	s.Close()
	if err := <-consumed; err != nil {
		return 0, err
	}
	if err != nil {
		return 0, err
	}
	if err := c.verify(ctx, db, 1000+published); err != nil {
		return 0, err
	}
	return float64(published) / elapsed.Seconds(), nil
}

// hotGroup: one group with a deep backlog, 1 worker against 64: idle
// workers must wait, not spin, so 64 should drain it about as fast as 1.
// sync: ClaimWait and AckNext (keeps the group up to MaxKeep in a row).
func (r *runner) hotGroup(ctx context.Context) error {
	for _, system := range []string{"sync-keep", "async"} {
		for _, w := range []int{1, 64} {
			if err := r.drainRuns(ctx, "hotgroup", system, w, 1); err != nil {
				return err
			}
		}
	}
	return nil
}

// commits: what the server's commit rate allows, measured beside the rest:
// 16 clients each committing single-row inserts for the window. A blocking
// claim+ack is two commits per message, so half this rate is its ceiling.
func (r *runner) commits(ctx context.Context) error {
	res := result{suite: "commits", system: "postgres", workers: 16, unit: "commits/s"}
	db, err := openCommits(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = db.Drop() }()
	for run := range r.s.runs {
		r.progress("commits    16 clients, single-row insert transactions, run %d/%d", run+1, r.s.runs)
		rate, cpu, err := r.commitsOnce(ctx, db)
		if err != nil {
			return err
		}
		res.runs = append(res.runs, rate)
		res.addCPU(cpu)
	}
	r.add(res)
	return nil
}

// openCommits opens a schema with the table commitsOnce inserts into.
func openCommits(ctx context.Context) (*pgtest.DB, error) {
	db, err := pgtest.Open(20)
	if err != nil {
		return nil, err
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE commits (id bigserial PRIMARY KEY, v text)`); err != nil {
		_ = db.Drop()
		return nil, err
	}
	return db, nil
}

// commitsOnce is one run of 16 clients committing single-row inserts for
// the window: commits/s and CPU microseconds per commit.
func (r *runner) commitsOnce(ctx context.Context, db *pgtest.DB) (rate, cpu float64, err error) {
	var n atomic.Int64
	stop := make(chan struct{})
	timer := time.AfterFunc(r.s.window, func() { close(stop) })
	before, start := readCPU(), time.Now()
	err = parallel(16, func(int) error {
		for {
			select {
			case <-stop:
				return nil
			default:
			}
			if _, err := db.Pool.Exec(ctx, `INSERT INTO commits (v) VALUES ('x')`); err != nil {
				return err
			}
			n.Add(1)
		}
	})
	elapsed, after := time.Since(start), readCPU()
	timer.Stop()
	if err != nil {
		return 0, 0, err
	}
	cpu, _ = perOp(before, after, n.Load())
	return float64(n.Load()) / elapsed.Seconds(), cpu, nil
}

// publishFor publishes from publishers goroutines for the window, each
// message to a new group: one Publish per message, or PublishMany batches.
func (r *runner) publishFor(ctx context.Context, pub *pgsync.Transport, publishers, batch int) (int64, time.Duration, error) {
	var published atomic.Int64
	stop := make(chan struct{})
	timer := time.AfterFunc(r.s.window, func() { close(stop) })
	defer timer.Stop()
	start := time.Now()
	err := parallel(publishers, func(p int) error {
		msgs := make([]pgtransport.Message, batch)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return nil
			default:
			}
			if batch == 1 {
				if _, err := pub.Publish(ctx, fmt.Sprintf("wf-%d-%d", p, i), "e", 0); err != nil {
					return err
				}
				published.Add(1)
				continue
			}
			for j := range msgs {
				msgs[j] = pgtransport.Message{Group: fmt.Sprintf("wf-%d-%d-%d", p, i, j), Event: "e"}
			}
			if _, err := pub.PublishMany(ctx, msgs); err != nil {
				return err
			}
			published.Add(int64(batch))
		}
	})
	return published.Load(), time.Since(start), err
}

// publishBatchOnce: PublishMany batches of batch messages, each to a new
// group. notify on: a consumer waits the whole time (a waiter row that
// never lapses), so every batch sends a notification; off: none waits.
func (r *runner) publishBatchOnce(ctx context.Context, publishers, batch int, notify bool) (float64, error) {
	db, err := pgtest.Open(int32(publishers) + 4)
	if err != nil {
		return 0, err
	}
	defer func() { _ = db.Drop() }()
	pub, err := pgsync.New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema})
	if err != nil {
		return 0, err
	}
	if notify {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO transport_waiters VALUES ('bench', 0, 'infinity')`); err != nil {
			return 0, err
		}
	}
	notes := listen(ctx, db)
	published, elapsed, err := r.publishFor(ctx, pub, publishers, batch)
	if err != nil {
		return 0, err
	}
	n, err := notes()
	if err != nil {
		return 0, err
	}
	batches := published / int64(batch)
	if notify && int64(n) != batches || !notify && n != 0 {
		return 0, fmt.Errorf("publish: %d notifications for %d batches (notify %v)", n, batches, notify)
	}
	left, _, err := leftover(ctx, db)
	if err != nil {
		return 0, err
	}
	if int64(left) != published {
		return 0, fmt.Errorf("publish: %d published, %d in the table", published, left)
	}
	return float64(published) / elapsed.Seconds(), nil
}

// listen counts the notifications on db's queue channel on a connection
// of its own; the returned function stops and tells the count.
func listen(ctx context.Context, db *pgtest.DB) func() (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		cancel()
		return func() (int, error) { return 0, err }
	}
	var channel string
	if err := conn.QueryRow(ctx, `SELECT harel_channel()`).Scan(&channel); err != nil {
		conn.Release()
		cancel()
		return func() (int, error) { return 0, err }
	}
	if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{channel}.Sanitize()); err != nil {
		conn.Release()
		cancel()
		return func() (int, error) { return 0, err }
	}
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
				return
			}
			n++
		}
	}()
	return func() (int, error) {
		time.Sleep(100 * time.Millisecond) // the last ones in flight
		cancel()
		<-done
		conn.Hijack().Close(context.Background()) // it listened: never back into the pool
		return n, nil
	}
}

// claimCost: the median latency of one claim+ack by one blocking worker,
// with 1,000 to 1,000,000 groups bulk-loaded (one message each). It must
// stay flat: the claim walks an index.
func (r *runner) claimCost(ctx context.Context) error {
	db, err := pgtest.Open(4)
	if err != nil {
		return err
	}
	defer func() { _ = db.Drop() }()
	tr, err := pgsync.New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema})
	if err != nil {
		return err
	}
	loaded := 0
	for _, groups := range []int{1_000, 100_000, r.s.maxCost} {
		r.progress("claimcost  loading %d groups", groups)
		// Bulk-load the difference in one transaction, triggers off (this
		// is a load of fresh groups, no publisher races it).
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			for _, q := range []string{
				`SET LOCAL session_replication_role = replica`,
				`INSERT INTO transport_messages (group_id, event) SELECT 'g' || i, 'e' FROM generate_series($1::int, $2::int - 1) AS i`,
				`INSERT INTO transport_groups (group_id) SELECT 'g' || i FROM generate_series($1::int, $2::int - 1) AS i`,
			} {
				args := []any{loaded, groups}
				if !strings.Contains(q, "$1") {
					args = nil
				}
				if _, err := tx.Exec(ctx, q, args...); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE transport_groups`); err != nil {
			return err
		}
		if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE transport_messages`); err != nil {
			return err
		}
		loaded = groups
		res := result{suite: "claimcost", system: "sync", groups: groups, workers: 1, unit: "ms"}
		for run := range r.s.runs {
			r.progress("claimcost  groups=%-7d run %d/%d", groups, run+1, r.s.runs)
			lat := make([]time.Duration, 0, r.s.samples)
			for range r.s.samples {
				start := time.Now()
				l, err := tr.Claim(ctx, "w", time.Minute, 0)
				if err != nil {
					return err
				}
				if l == nil {
					return fmt.Errorf("nothing claimable at %d groups", groups)
				}
				// Put it back as it was (a group with one message), so the
				// group count holds: ack it and publish it again.
				if err := tr.Ack(ctx, l); err != nil {
					return err
				}
				lat = append(lat, time.Since(start))
				if _, err := tr.Publish(ctx, l.Group, "e", 0); err != nil {
					return err
				}
			}
			res.runs = append(res.runs, ms(percentile(lat, 50)))
		}
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM transport_groups`).Scan(&n); err != nil {
			return err
		}
		if n != groups {
			return fmt.Errorf("claimcost: %d groups, want %d", n, groups)
		}
		r.add(res)
	}
	return nil
}

// latency: publish (by another transport, so only a notification can wake
// it) to lease received, into an idle async consumer; p50 and p99, each
// measured from two origins. Samples alternate two publishers: this
// library's Publish (one round-trip, SELECT harel_publish) and the
// design's plain-SQL publish as a client in another language sends it
// (BEGIN, two INSERTs, COMMIT: four round-trips). Each is measured from
// the start of the publish and from its commit's reply: the wake-up
// itself is the second, what a publisher sees is the first.
func (r *runner) latency(ctx context.Context) error {
	db, err := pgtest.Open(8)
	if err != nil {
		return err
	}
	defer func() { _ = db.Drop() }()
	cfg := pgtransport.Config{Schema: db.Schema, IdleSweep: time.Minute}
	pub, err := pgsync.New(ctx, db.Pool, cfg)
	if err != nil {
		return err
	}
	consDB, err := pgtest.Open(4) // its own pool, so its own listener
	if err != nil {
		return err
	}
	defer func() { _ = consDB.Drop() }()
	cons, err := async.New(ctx, consDB.Pool, cfg)
	if err != nil {
		return err
	}
	defer cons.Close()
	s, err := cons.Stream(ctx, async.StreamConfig{WorkerID: "idle", Visibility: time.Minute})
	if err != nil {
		return err
	}
	<-s.Ready()
	publishers := []struct {
		name    string
		publish func(group string) error
	}{
		{"go", func(group string) error { _, err := pub.Publish(ctx, group, "e", 0); return err }},
		{"sql", func(group string) error { return plainPublish(ctx, db.Pool, group) }},
	}
	type origin struct{ fromStart, fromCommit []time.Duration }
	results := map[string]*result{}
	res := func(variant string) *result {
		if results[variant] == nil {
			results[variant] = &result{suite: "latency", system: "async", variant: variant, unit: "ms"}
		}
		return results[variant]
	}
	for run := range r.s.runs {
		r.progress("latency    publish to receive, run %d/%d", run+1, r.s.runs)
		lat := map[string]*origin{}
		for i := range 2 * r.s.samples {
			p := publishers[i%2]
			if err := awaitIdle(ctx, db); err != nil {
				return err
			}
			group := fmt.Sprintf("r%d-%d", run, i)
			start := time.Now()
			if err := p.publish(group); err != nil {
				return err
			}
			committed := time.Now()
			var l *pgtransport.Lease
			select {
			case l = <-s.C():
			case <-time.After(30 * time.Second):
				return fmt.Errorf("latency: no wake-up for %s in 30 s", group)
			}
			got := time.Now()
			if l == nil || l.Group != group {
				return fmt.Errorf("latency: got %+v, want group %s", l, group)
			}
			if lat[p.name] == nil {
				lat[p.name] = &origin{}
			}
			lat[p.name].fromStart = append(lat[p.name].fromStart, got.Sub(start))
			lat[p.name].fromCommit = append(lat[p.name].fromCommit, got.Sub(committed))
			if err := <-cons.Ack(ctx, l); err != nil {
				return err
			}
		}
		for _, p := range publishers {
			for from, d := range map[string][]time.Duration{"start": lat[p.name].fromStart, "commit": lat[p.name].fromCommit} {
				for _, pc := range []int{50, 99} {
					v := res(fmt.Sprintf("%s/%s/p%d", p.name, from, pc))
					v.runs = append(v.runs, ms(percentile(d, pc)))
				}
			}
		}
	}
	for _, p := range publishers {
		for _, from := range []string{"start", "commit"} {
			for _, pc := range []int{50, 99} {
				r.add(*res(fmt.Sprintf("%s/%s/p%d", p.name, from, pc)))
			}
		}
	}
	return nil
}

// plainPublish is the design's publish in plain SQL, as docs/protocol.md
// gives it to other languages: one transaction, four round-trips.
func plainPublish(ctx context.Context, pool *pgxpool.Pool, group string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO transport_messages (group_id, event) VALUES ($1, 'e')`, group); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
  VALUES ($1, NULL, NULL, 0) ON CONFLICT (group_id) DO NOTHING`, group)
		return err
	})
}

// awaitIdle waits until a consumer of db's queue has said it waits.
func awaitIdle(ctx context.Context, db *pgtest.DB) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM transport_waiters`).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
	}
	return fmt.Errorf("the consumer never went idle")
}

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
