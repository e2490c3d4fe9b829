package history_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/history"
	"github.com/pgtransport/pgtransport/internal/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

func TestMain(m *testing.M) {
	pgtest.MainNoLeaks(m, "github.com/pgtransport/pgtransport/async", "github.com/pgtransport/pgtransport/notify")
}

// scale is PGTRANSPORT_FAULT_SCALE (default 1): the fault run's size and
// length grow with it. make test runs 1 (about 10 s); see the README for
// longer runs.
func scale(t *testing.T) int {
	s, err := strconv.Atoi(os.Getenv("PGTRANSPORT_FAULT_SCALE"))
	if err != nil || s < 1 {
		return 1
	}
	t.Logf("PGTRANSPORT_FAULT_SCALE=%d", s)
	return s
}

// outcome classifies a call's error: definite failures changed nothing;
// anything else (a killed connection, a timeout, a cancelled context) may
// or may not have taken effect.
func outcome(err error) history.Outcome {
	switch {
	case err == nil:
		return history.OK
	case errors.Is(err, pgtransport.ErrLeaseLost), errors.Is(err, pgtransport.ErrNilLease):
		return history.Failed
	default:
		return history.Unknown
	}
}

type faults struct {
	kills, abandoned, slow, extended, timeouts, nacks atomic.Int64
}

// rig is the system under test: one schema, one pool whose connections
// carry an application_name of their own (so the killer kills only them).
type rig struct {
	t    *testing.T
	db   *pgtest.DB
	pool *pgxpool.Pool
	app  string
	h    history.History
	f    faults
	cfg  pgtransport.Config
}

func newRig(t *testing.T) *rig {
	db := pgtest.New(t, 4)
	app := "faults_" + db.Schema
	pcfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 48
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg := pgtransport.Config{Schema: db.Schema, IdleSweep: 200 * time.Millisecond}
	return &rig{t: t, db: db, pool: pool, app: app, cfg: cfg}
}

// transports opens a blocking and an async transport on the rig's pool;
// the async one closes with the test.
func (r *rig) transports() (*pgsync.Transport, *async.Transport) {
	st, err := pgsync.New(context.Background(), r.pool, r.cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	at, err := async.New(context.Background(), r.pool, r.cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(at.Close)
	return st, at
}

func (r *rig) record(kind history.Kind, worker string, l *pgtransport.Lease, start time.Time, err error) {
	r.h.Add(history.Op{Kind: kind, Worker: worker, Group: l.Group, Seq: l.Seq, Token: l.Token, Outcome: outcome(err), Start: start, End: time.Now()})
}

// handle plays one handler with a random fault, settling through the
// given calls.
func (r *rig) handle(worker string, l *pgtransport.Lease, vis time.Duration, ack, nack func(context.Context, *pgtransport.Lease, time.Duration) error, extend func(context.Context, *pgtransport.Lease, time.Duration) error) (abandon bool) {
	ctx := context.Background()
	switch p := rand.IntN(100); {
	case p < 2: // the goroutine just stops: the lease lapses
		r.f.abandoned.Add(1)
		return true
	case p < 4: // slower than the visibility, no Extend: the ack is fenced off
		r.f.slow.Add(1)
		// Kept, as the two below: the fault is a handler that takes real
		// time while the server's clock runs the lease out; an injected
		// clock would take the race with the other workers out of the test.
		time.Sleep(vis + 50*time.Millisecond)
	case p < 6: // slower than the visibility, with Extend
		r.f.extended.Add(1)
		for range 3 {
			time.Sleep(vis / 2)
			start := time.Now()
			err := extend(ctx, l, vis)
			r.record(history.Extend, worker, l, start, err)
		}
	case p < 10:
		r.f.nacks.Add(1)
		start := time.Now()
		err := nack(ctx, l, time.Duration(rand.IntN(2))*20*time.Millisecond)
		r.record(history.Nack, worker, l, start, err)
		return false
	case p < 13: // a statement timeout or a cancelled context at a random point
		r.f.timeouts.Add(1)
		c, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(1500))*time.Microsecond)
		defer cancel()
		ctx = c
	}
	start := time.Now()
	err := ack(ctx, l, 0)
	r.record(history.Ack, worker, l, start, err)
	return false
}

// TestFaults: publishers and 32 workers (16 blocking, 16 on async streams)
// over thousands of groups, while a killer terminates random connections
// of theirs (listener included) and handlers abandon leases, outlive their
// visibility with and without Extend, nack, and time out. Then everything
// left is drained and the history is checked.
func TestFaults(t *testing.T) {
	n := scale(t)
	r := newRig(t)
	const vis = pgtransport.MinVisibility // the shortest lease, so lapses come often in a short run
	var (
		groups   = 2000 * n
		duration = time.Duration(n) * 6 * time.Second
		ctx, end = context.WithTimeout(context.Background(), duration)
		wg       stdsync.WaitGroup
		started  = time.Now()
	)
	defer end()
	st, at := r.transports()

	// Publishers: single publishes and batches of 10, random groups, each
	// group published to by one publisher (so its messages have one
	// publish order; see history.Check).
	pick := func(p int) string { return fmt.Sprint("g", rand.IntN(groups/4)*4+p) }
	for p := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				start := time.Now()
				if i%4 == 0 {
					msgs := make([]pgtransport.Message, 10)
					for j := range msgs {
						msgs[j] = pgtransport.Message{Group: pick(p), Event: fmt.Sprintf("p%d-%d-%d", p, i, j)}
					}
					seqs, err := st.PublishMany(context.Background(), msgs)
					for j, m := range msgs {
						op := history.Op{Kind: history.Publish, Worker: fmt.Sprint("p", p), Group: m.Group, Outcome: outcome(err), Start: start, End: time.Now()}
						if err == nil {
							op.Seq = seqs[j]
						}
						r.h.Add(op)
					}
					continue
				}
				group := pick(p)
				seq, err := st.Publish(context.Background(), group, fmt.Sprintf("p%d-%d", p, i), 0)
				r.h.Add(history.Op{Kind: history.Publish, Worker: fmt.Sprint("p", p), Group: group, Seq: seq, Outcome: outcome(err), Start: start, End: time.Now()})
				time.Sleep(time.Millisecond) // kept: paces the publishers so the workers keep up
			}
		})
	}

	// Blocking workers: 12 ClaimWait loops with the random faults, 2 that
	// keep hot groups with AckNext, 2 that claim and ack in batches.
	syncAck := func(ctx context.Context, l *pgtransport.Lease, _ time.Duration) error { return st.Ack(ctx, l) }
	for w := range 16 {
		worker := fmt.Sprint("s", w)
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				switch {
				case w >= 14: // batches
					ls, err := st.ClaimMany(ctx, worker, vis, 0, 8)
					if err != nil {
						continue
					}
					for _, l := range ls {
						r.record(history.Claim, worker, l, start, nil)
					}
					if len(ls) == 0 {
						time.Sleep(5 * time.Millisecond) // kept: ClaimMany has no waiting form; a poll's pause
						continue
					}
					start = time.Now()
					errs, err := st.AckMany(context.Background(), ls)
					for i, l := range ls {
						if err == nil {
							r.record(history.Ack, worker, l, start, errs[i])
						} else {
							r.record(history.Ack, worker, l, start, err)
						}
					}
				case w >= 12: // a hot group kept under one lease
					l, err := st.ClaimWait(ctx, worker, vis, 0)
					if err != nil {
						continue
					}
					r.record(history.Claim, worker, l, start, nil)
					for l != nil {
						if rand.IntN(50) == 0 {
							r.f.abandoned.Add(1)
							break // walk away from the kept lease: it lapses
						}
						start := time.Now()
						next, err := st.AckNext(context.Background(), l, vis)
						r.record(history.Ack, worker, l, start, err)
						if next != nil {
							r.record(history.Claim, worker, next, time.Now(), nil)
						}
						l = next
					}
				default:
					l, err := st.ClaimWait(ctx, worker, vis, 0)
					if err != nil {
						continue // ctx ended, or a connection killed: nothing was handed out that we know of
					}
					r.record(history.Claim, worker, l, start, nil)
					if r.handle(worker, l, vis, syncAck, st.Nack, st.Extend) {
						return // abandoned: this worker is gone
					}
				}
			}
		})
	}

	// Async workers: 2 streams, 8 leases each, 8 goroutines per stream.
	asyncAck := func(ctx context.Context, l *pgtransport.Lease, _ time.Duration) error { return <-at.Ack(ctx, l) }
	asyncNack := func(ctx context.Context, l *pgtransport.Lease, d time.Duration) error { return <-at.Nack(ctx, l, d) }
	asyncExtend := func(ctx context.Context, l *pgtransport.Lease, d time.Duration) error { return <-at.Extend(ctx, l, d) }
	for sn := range 2 {
		s, err := at.Stream(ctx, async.StreamConfig{WorkerID: fmt.Sprint("a", sn), Visibility: vis, MaxInFlight: 8})
		if err != nil {
			t.Fatal(err)
		}
		for w := range 8 {
			worker := fmt.Sprintf("a%d-%d", sn, w)
			wg.Go(func() {
				for l := range s.C() {
					r.record(history.Claim, worker, l, time.Now(), nil)
					if r.handle(worker, l, vis, asyncAck, asyncNack, asyncExtend) {
						return
					}
				}
			})
		}
	}

	// The killer: terminates a random connection of the rig every 40 ms.
	wg.Go(func() {
		for ctx.Err() == nil {
			time.Sleep(40 * time.Millisecond) // kept: the kill rate is the fault's
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
	at.Close()

	// Drain: a clean worker takes everything left (lapsed leases included)
	// and acks it.
	drainer, err := pgsync.New(context.Background(), r.db.Pool, r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	// ClaimWait wakes when the earliest lapsed lease or park runs out, so
	// the drain waits for those without polling. A message no claim can
	// reach (a lost group row) leaves it waiting until the deadline; the
	// check below then reports it.
	drainCtx, drained := context.WithTimeout(context.Background(), time.Minute)
	defer drained()
	for {
		var left int
		if err := r.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM transport_messages`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		start := time.Now()
		l, err := drainer.ClaimWait(drainCtx, "drain", time.Minute, 0)
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		r.record(history.Claim, "drain", l, start, nil)
		start = time.Now()
		err = drainer.Ack(context.Background(), l)
		r.record(history.Ack, "drain", l, start, err)
		if err != nil {
			t.Fatal(err)
		}
	}
	var msgs, grps int
	if err := r.db.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM transport_messages), (SELECT count(*) FROM transport_groups)`).Scan(&msgs, &grps); err != nil {
		t.Fatal(err)
	}
	errs, stats := history.Check(r.h.Ops(), msgs, grps)
	t.Logf("%d messages over %d groups, 36 workers (16 blocking: 12 one at a time, 2 keeping hot groups, 2 in batches; 16 async; 4 publishers), %v: %d connections killed, %d leases abandoned, %d handlers past visibility (%d more kept alive by Extend), %d nacks, %d timeouts; %d deliveries, %d redeliveries, %d calls of unknown outcome; checker: %d violations",
		stats.Published, groups, time.Since(started).Round(time.Second), r.f.kills.Load(), r.f.abandoned.Load(), r.f.slow.Load(), r.f.extended.Load(), r.f.nacks.Load(), r.f.timeouts.Load(), stats.Deliveries, stats.Redeliveries, stats.Unknown, len(errs))
	if len(errs) > 0 {
		t.Fatalf("history violations:\n%v", history.Join(errs))
	}
	if r.f.kills.Load() == 0 || stats.Redeliveries == 0 {
		t.Fatalf("no faults took effect: %d kills, %d redeliveries", r.f.kills.Load(), stats.Redeliveries)
	}
}
