package history_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	stdsync "sync"
	"testing"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/history"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestFaultsPgBouncer is TestFaultsWork, shortened to one phase, through
// PgBouncer in transaction pooling mode (pgtest.BouncerPoolSize server
// connections, pgx in cache_describe mode): publishers, three blocking
// runtimes and an async one (listening straight to PostgreSQL through
// Config.Async.ListenDSN) share the pooler while the killer terminates the
// server connections it runs their transactions on (pgbouncer hands each
// client's application_name on to them) and the handlers panic, fail and
// outlive their visibility. At the end the queue is drained and the
// history checked.
func TestFaultsPgBouncer(t *testing.T) {
	n := scale(t)
	b := pgtest.Bouncer(t)
	r := newRig(t)
	r.pool = b.Pool(t, 48, "cache_describe", r.app)
	const vis = pgtransport.MinVisibility
	var (
		groups  = 500 * n
		length  = time.Duration(n) * 5 * time.Second
		started = time.Now()
		logs    = &logCounter{}
		runs    = &runLog{}
		wg      stdsync.WaitGroup
	)
	ctx, end := context.WithTimeout(context.Background(), length)
	defer end()
	cfg := r.cfg
	cfg.Logger = slog.New(logs)

	pick := func(p int) string { return fmt.Sprint("g", rand.IntN(groups/2)*2+p) }
	st, err := pgsync.New(context.Background(), r.pool, quiet(r.cfg))
	if err != nil {
		t.Fatal(err)
	}
	for p := range 2 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				start := time.Now()
				msgs := make([]pgtransport.Message, 1+9*(i%2))
				for j := range msgs {
					msgs[j] = pgtransport.Message{Group: pick(p), Event: poisonEvent(fmt.Sprintf("p%d-%d-%d", p, i, j))}
				}
				seqs, err := st.PublishMany(context.Background(), msgs)
				r.recordBatch(fmt.Sprint("p", p), msgs, seqs, start, err)
				time.Sleep(10 * time.Millisecond) // kept: paces the publishers so the workers keep up
			}
		})
	}

	type runtime struct {
		name string
		work func(context.Context, pgtransport.WorkerConfig, pgtransport.Handler) error
		conc int
		obs  *recorder
	}
	var rts []*runtime
	for i, conc := range []int{1, 1, 4} {
		name := fmt.Sprint("s", i)
		obs := &recorder{r: r, worker: name, precise: conc == 1}
		c := cfg
		c.Observer = obs
		tr, err := pgsync.New(context.Background(), r.pool, c)
		if err != nil {
			t.Fatal(err)
		}
		rts = append(rts, &runtime{name: name, work: tr.Work, conc: conc, obs: obs})
	}
	{
		obs := &recorder{r: r, worker: "a"}
		c := cfg
		c.Observer, c.Async.ListenDSN = obs, r.db.DSN
		at, err := async.New(context.Background(), r.pool, c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(at.Close)
		rts = append(rts, &runtime{name: "a", work: at.Work, conc: 8, obs: obs})
	}
	for _, rt := range rts {
		wg.Go(func() {
			workStart := time.Now()
			wcfg := pgtransport.WorkerConfig{WorkerID: rt.name, Concurrency: rt.conc, Visibility: vis, ShutdownTimeout: 300 * time.Millisecond}
			err := rt.work(ctx, wcfg, func(hctx context.Context, l *pgtransport.Lease) error {
				return r.handleWork(hctx, rt.name, workStart, l, vis, runs)
			})
			if err != nil {
				t.Errorf("%s: Work returned %v after its ctx ended, want nil", rt.name, err)
			}
			if late := time.Since(started.Add(length)); late > 10*time.Second {
				t.Errorf("%s: Work returned %v after it was told to stop", rt.name, late)
			}
			rt.obs.flush()
		})
	}

	// The killer: the server connections pgbouncer runs the rig's
	// transactions on carry the rig's application_name.
	wg.Go(func() {
		for ctx.Err() == nil {
			time.Sleep(150 * time.Millisecond) // kept: the kill rate is the fault's (2 server connections: a slower one than TestFaults', or little gets through)
			var killed int
			err := r.db.Pool.QueryRow(context.Background(), `
				SELECT count(pg_terminate_backend(pid))::int FROM (
				  SELECT pid FROM pg_stat_activity WHERE application_name = $1 ORDER BY random() LIMIT 1) AS victim`, r.app).Scan(&killed)
			if err == nil {
				r.f.kills.Add(int64(killed))
			}
		}
	})
	wg.Wait()

	overlaps := runs.overlaps(logs)
	for _, o := range overlaps {
		t.Errorf("kept alive, yet handed out again: %s", o)
	}
	r.drain(t)
	msgs, grps, dead, healthyDead := r.leftovers(t)
	if healthyDead > 5 {
		t.Errorf("%d healthy messages dead-lettered: more than the killer explains", healthyDead)
	}
	errs, stats := history.Check(r.h.Ops(), history.End{Messages: msgs, Groups: grps, Dead: dead})
	t.Logf("through pgbouncer (%d server connections): %d messages over %d groups, %v, runtimes %d: %d server connections killed, %d handlers (%d panicked, %d failed, %d past visibility, %d slow ones kept alive); logged: %d lost leases, %d failed heartbeats; %d deliveries, %d redeliveries, %d acked, %d dead-lettered, %d calls of unknown outcome; checker: %d violations",
		pgtest.BouncerPoolSize, stats.Published, groups, time.Since(started).Round(time.Second), len(rts), r.f.kills.Load(), runs.total.Load(), runs.panics.Load(), runs.errs.Load(), runs.slow.Load(), runs.keptAlive.Load(),
		logs.count("lease lost")+logs.count("lease lapsed"), logs.count("heartbeat failed"),
		stats.Deliveries, stats.Redeliveries, stats.Acked, stats.DeadLettered, stats.Unknown, len(errs))
	if len(errs) > 0 {
		t.Fatalf("history violations:\n%v", history.Join(errs))
	}
	if r.f.kills.Load() == 0 || stats.Acked == 0 || stats.DeadLettered == 0 {
		t.Fatalf("faults did not take effect: %d kills, %d acked, %d dead-lettered", r.f.kills.Load(), stats.Acked, stats.DeadLettered)
	}
}
