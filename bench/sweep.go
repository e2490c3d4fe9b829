package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// claimWalk: what one claim costs when most group rows cannot be claimed:
// 1,000,000 group rows, 99% leased or failed and waiting out a backoff, 1%
// free with a message. A claim of 1 and of 64, each in a transaction rolled
// back (so every sample sees the same rows): its time, the shared buffers
// it touched, and the group rows it fetched through an index
// (pg_stat_xact_user_tables.idx_tup_fetch) per group taken.
func (r *runner) claimWalk(ctx context.Context) error {
	const rows, every = 1_000_000, 100
	db, err := pgtest.Open(4)
	if err != nil {
		return err
	}
	defer func() { _ = db.Drop() }()
	if _, err := pgsync.New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema}); err != nil { // applies the schema
		return err
	}
	r.progress("claimwalk  loading %d group rows", rows)
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil { // a bulk load: no publisher races it
			return err
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO transport_groups (group_id, locked_by, lock_expiry)
			SELECT 'g' || i, CASE WHEN i % $1 = 0 THEN NULL WHEN i % 2 = 0 THEN 'w:held' ELSE '' END,
			       CASE WHEN i % $1 = 0 THEN NULL ELSE 1e10 END
			  FROM generate_series(1, $2) AS i`, every, rows); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO transport_messages (group_id, event) SELECT 'g' || i, 'e' FROM generate_series(1, $1) AS i`, rows)
		return err
	})
	if err != nil {
		return err
	}
	// A failed group's backoff is due before the sweep where the schema
	// has the column (version 16).
	_, _ = db.Pool.Exec(ctx, `UPDATE transport_groups SET retry_at = lock_expiry WHERE locked_by = ''`)
	for _, t := range []string{"transport_groups", "transport_messages"} {
		if _, err := db.Pool.Exec(ctx, "VACUUM ANALYZE "+t); err != nil {
			return err
		}
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	for _, limit := range []int{1, 64} {
		var lat, bufs, fetched []float64
		for i := range r.s.runs + 2 {
			r.progress("claimwalk  limit=%d sample %d/%d", limit, i+1, r.s.runs+2)
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			var before int64
			if err := tx.QueryRow(ctx, `SELECT COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables WHERE relid = 'transport_groups'::regclass`).Scan(&before); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			plan, err := explain(ctx, tx, `SELECT * FROM harel_claim_leases(extract(epoch from clock_timestamp()), extract(epoch from clock_timestamp()) + 60, 'walk', 0, $1)`, limit)
			var after int64
			if err == nil {
				err = tx.QueryRow(ctx, `SELECT COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables WHERE relid = 'transport_groups'::regclass`).Scan(&after)
			}
			_ = tx.Rollback(ctx)
			if err != nil {
				return err
			}
			if plan.rows != limit {
				return fmt.Errorf("claimwalk: a claim of %d took %d groups of %d claimable", limit, plan.rows, rows/every)
			}
			if i < 2 {
				continue // the connection's first plans
			}
			lat = append(lat, plan.ms)
			bufs = append(bufs, float64(plan.buffers))
			fetched = append(fetched, float64(after-before)/float64(limit))
		}
		for _, m := range []struct {
			variant string
			v       []float64
			unit    string
		}{{"ms", lat, "ms"}, {"buffers", bufs, "buffers"}, {"rows/taken", fetched, "rows"}} {
			r.add(result{suite: "claimwalk", system: "sync", variant: m.variant, workers: limit, groups: rows, unit: m.unit, runs: m.v})
		}
	}
	return nil
}

// explained is what EXPLAIN ANALYZE says of a statement's top node.
type explained struct {
	ms      float64
	buffers int64
	rows    int
}

// explain runs q under EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) in tx.
func explain(ctx context.Context, tx pgx.Tx, q string, args ...any) (explained, error) {
	var out []map[string]any
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q, args...).Scan(&out); err != nil {
		return explained{}, err
	}
	if len(out) == 0 {
		return explained{}, fmt.Errorf("explain: no plan")
	}
	plan, _ := out[0]["Plan"].(map[string]any)
	num := func(k string) float64 { f, _ := plan[k].(float64); return f }
	e := explained{rows: int(num("Actual Rows")), buffers: int64(num("Shared Hit Blocks") + num("Shared Read Blocks"))}
	e.ms, _ = out[0]["Execution Time"].(float64)
	return e, nil
}

// fairness: how long a claimable group waits. 1,000 groups with 30
// messages each and 20 of them hot (300 messages each), drained by one
// stream with 64 in flight whose handlers ack at once: for every hand-out
// after a group's first, the wait from the ack that left it claimable
// with messages (its previous lease's end) to its next lease, in ms and in
// hand-outs of other groups meanwhile (from the ack's start, so a wait
// includes the ack's round-trip). A kept lease (the stream's keep,
// up to Config.MaxKeep messages in a row) is a hand-out with no wait. Run
// with Config.KeepWhileWaiting at each of fairnessKeeps: the default, 1,
// and MaxKeep (keeps never yield: the order before version 26).
func (r *runner) fairness(ctx context.Context) error {
	db, err := pgtest.Open(fairInFlight + 4)
	if err != nil {
		return err
	}
	defer func() { _ = db.Drop() }()
	res := map[string]*result{}
	for _, kw := range fairnessKeeps {
		for _, m := range fairnessMetrics {
			v := fairnessVariant(m, kw)
			res[v] = &result{suite: "fairness", system: "async", variant: v, workers: fairInFlight, groups: fairGroups, unit: strings.SplitN(m, "-", 2)[1]}
		}
	}
	for run := range r.s.runs {
		for _, kw := range fairnessKeeps {
			if err := r.fairnessOnce(ctx, db, kw, res, run); err != nil {
				return err
			}
		}
	}
	for _, kw := range fairnessKeeps {
		for _, m := range fairnessMetrics {
			r.add(*res[fairnessVariant(m, kw)])
		}
	}
	return nil
}

// The fairness suite's queue: fairGroups groups of fairDepth messages, the
// first fairHot of them fairHotDepth deep, drained by one stream of
// fairInFlight.
const fairGroups, fairDepth, fairHot, fairHotDepth, fairInFlight = 1_000, 30, 20, 300, 64

// fairnessKeeps are the Config.KeepWhileWaiting values the fairness suite
// compares, and fairnessMetrics what it reports of each.
var (
	fairnessKeeps   = []int{pgtransport.DefaultKeepWhileWaiting, 1, pgtransport.DefaultMaxKeep}
	fairnessMetrics = []string{"p99-ms", "max-ms", "p99-claims", "max-claims"}
)

func fairnessVariant(metric string, keepWhileWaiting int) string {
	return fmt.Sprintf("%s/kw%d", metric, keepWhileWaiting)
}

// fairnessOnce is one run of the fairness suite through a transport of
// its own (none other open) whose KeepWhileWaiting is kw: its figures are
// added to res.
func (r *runner) fairnessOnce(ctx context.Context, db *pgtest.DB, kw int, res map[string]*result, run int) error {
	r.progress("fairness   KeepWhileWaiting=%d run %d/%d", kw, run+1, r.s.runs)
	pool := db.Pool
	tr, err := async.New(ctx, pool, pgtransport.Config{Schema: db.Schema, KeepWhileWaiting: kw})
	if err != nil {
		return err
	}
	defer tr.Close()
	if err := emptyQueue(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO transport_messages (group_id, event)
		SELECT 'g' || g, i::text FROM generate_series(1, $1) AS i, generate_series(0, $2 - 1) AS g
		 WHERE i <= $3 OR g < $4 ORDER BY i, g`, fairHotDepth, fairGroups, fairDepth, fairHot); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO transport_groups (group_id) SELECT DISTINCT group_id FROM transport_messages ON CONFLICT DO NOTHING; ANALYZE transport_groups`); err != nil {
		return err
	}
	waits, err := fairnessRun(ctx, tr, fairInFlight, int64(fairGroups*fairDepth+fairHot*(fairHotDepth-fairDepth)))
	if err != nil {
		return err
	}
	ms := make([]float64, len(waits))
	claims := make([]float64, len(waits))
	for i, w := range waits {
		ms[i], claims[i] = float64(w.d)/float64(time.Millisecond), float64(w.others)
	}
	slices.Sort(ms)
	slices.Sort(claims)
	p99 := func(v []float64) float64 { return v[len(v)*99/100] }
	for m, v := range map[string]float64{"p99-ms": p99(ms), "max-ms": ms[len(ms)-1], "p99-claims": p99(claims), "max-claims": claims[len(claims)-1]} {
		res[fairnessVariant(m, kw)].runs = append(res[fairnessVariant(m, kw)].runs, v)
	}
	return nil
}

// wait is one group's wait for its next lease.
type wait struct {
	d      time.Duration
	others int64 // hand-outs of other groups meanwhile
}

// fairnessRun drains total messages through one stream and returns the
// waits of every hand-out after a group's first.
func fairnessRun(ctx context.Context, tr *async.Transport, inFlight int, total int64) ([]wait, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	s, err := tr.Stream(ctx, async.StreamConfig{WorkerID: "fair", Visibility: time.Minute, MaxInFlight: inFlight})
	if err != nil {
		return nil, err
	}
	type mark struct {
		at     time.Duration // since start
		handed int64
	}
	var (
		mu      sync.Mutex
		start   = time.Now()
		handed  int64
		freed   = map[string]mark{} // when each group's last lease began its ack, and the hand-outs then
		waits   []wait
		acked   atomic.Int64
		lastSeq = map[string]int64{}
	)
	err = parallel(inFlight, func(int) error {
		for l := range s.C() {
			mu.Lock()
			handed++
			if f, ok := freed[l.Group]; ok {
				waits = append(waits, wait{d: time.Since(start) - f.at, others: handed - 1 - f.handed})
				delete(freed, l.Group)
			}
			if l.Seq <= lastSeq[l.Group] {
				mu.Unlock()
				return fmt.Errorf("group %s: seq %d after %d", l.Group, l.Seq, lastSeq[l.Group])
			}
			lastSeq[l.Group] = l.Seq
			// Claimable again from its ack (if it has messages left: a
			// group that drained is never handed out again, so its entry
			// is never read), or kept: then its next lease comes from the
			// ack itself, before the ack returns.
			freed[l.Group] = mark{at: time.Since(start), handed: handed}
			mu.Unlock()
			if err := <-tr.Ack(context.WithoutCancel(ctx), l); err != nil {
				return err
			}
			if acked.Add(1) == total {
				cancel()
			}
		}
		return nil
	})
	s.Close()
	if err != nil && ctx.Err() == nil {
		return nil, err
	}
	if acked.Load() != total {
		return nil, fmt.Errorf("fairness: %d of %d acked", acked.Load(), total)
	}
	if len(waits) == 0 {
		return nil, fmt.Errorf("fairness: no group was handed out twice")
	}
	return waits, nil
}
