package history_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/history"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestFaultsWorkTx is the effect view under faults: transactional
// runtimes (WorkTx: two blocking ones of four slots, an async one of eight,
// and a blocking one of two slots whose connections go through a proxy
// that loses the replies of COMMITs after they committed) and a rogue
// worker (AckStateTx by hand, with leases it lets lapse, so that another
// worker takes the group while it still writes) apply every message of a
// few hundred groups: each handler inserts one effect row per message into
// a table of its own inside its transaction, and folds the message's value
// into its group's state (the decimal running sum). Meanwhile a killer
// terminates one of their connections every 150 ms, handlers panic, fail after
// their insert, outlive the visibility (kept alive by heartbeats) or
// ignore their ctx, and halfway through every runtime is shut down and
// started again. After a drain, every published message's effect row
// must exist exactly once, per group in publish order, and each group's
// state must be the sum of its values in order.
func TestFaultsWorkTx(t *testing.T) {
	n := scale(t)
	r := newRig(t)
	// The killer must not dead-letter a message (every one has an effect),
	// and a drained group's state is kept to be checked.
	r.cfg.Policy = &pgtransport.Policy{MaxAttempts: pgtransport.Unlimited, RetryBackoffMin: backoffMin, RetryBackoffMax: backoffMax, StateRetention: time.Hour}
	const vis = pgtransport.MinVisibility
	var (
		groups  = 300 * n
		phase   = time.Duration(n) * 5 * time.Second
		started = time.Now()
		logs    = &logCounter{}
		wg      stdsync.WaitGroup
		f       txFaults
	)
	ctx, end := context.WithTimeout(context.Background(), 2*phase)
	defer end()
	cfg := r.cfg
	cfg.Logger = slog.New(logs)
	// The rig's pool has no search_path: the handlers name the table whole.
	effects := pgx.Identifier{r.db.Schema, "effects"}.Sanitize()
	groupTable := pgx.Identifier{r.db.Schema, "transport_groups"}.Sanitize()
	if _, err := r.db.Pool.Exec(context.Background(),
		`CREATE TABLE `+effects+` (id BIGSERIAL PRIMARY KEY, group_id TEXT NOT NULL, seq BIGINT NOT NULL, value BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// The publisher, on the clean pool: every publish's outcome is known.
	publisher, err := pgsync.New(context.Background(), r.db.Pool, quiet(r.cfg))
	if err != nil {
		t.Fatal(err)
	}
	var (
		pubMu     stdsync.Mutex
		published []history.Message
	)
	wg.Go(func() {
		for ctx.Err() == nil {
			msgs := make([]pgtransport.Message, 10)
			for j := range msgs {
				msgs[j] = pgtransport.Message{Group: fmt.Sprint("acct-", rand.IntN(groups)), Event: strconv.Itoa(1 + rand.IntN(1000))}
			}
			seqs, err := publisher.PublishMany(context.Background(), msgs)
			if err != nil {
				t.Errorf("publish: %v", err)
				return
			}
			pubMu.Lock()
			for j, m := range msgs {
				published = append(published, history.Message{Group: m.Group, Seq: seqs[j], Event: m.Event})
			}
			pubMu.Unlock()
			time.Sleep(10 * time.Millisecond) // kept: paces the publisher so the workers keep up
		}
	})

	// The runtimes.
	proxy := pgtest.NewProxy(t)
	proxied := proxy.Pool(t, r.db, 8)
	type runtime struct {
		name string
		work func(context.Context, pgtransport.WorkerConfig, pgtransport.TxHandler) error
		conc int
	}
	var rts []runtime
	for i, pool := range []int{0, 0, 1} {
		p := r.pool
		if pool == 1 {
			p = proxied
		}
		tr, err := pgsync.New(context.Background(), p, cfg)
		if err != nil {
			t.Fatal(err)
		}
		rts = append(rts, runtime{name: fmt.Sprint("s", i), work: tr.WorkTx, conc: 4 - 2*pool})
	}
	at, err := async.New(context.Background(), r.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(at.Close)
	rts = append(rts, runtime{name: "a", work: at.WorkTx, conc: 8})
	for _, rt := range rts {
		wg.Go(func() {
			for ph := range 2 {
				wctx, cancel := context.WithDeadline(context.Background(), started.Add(time.Duration(ph+1)*phase))
				err := rt.work(wctx, pgtransport.WorkerConfig{WorkerID: rt.name, Concurrency: rt.conc, Visibility: vis, ShutdownTimeout: 300 * time.Millisecond},
					func(hctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte) ([]byte, error) {
						return f.handle(hctx, tx, effects, l, state, vis)
					})
				cancel()
				if err != nil {
					t.Errorf("%s: WorkTx returned %v after its ctx ended, want nil", rt.name, err)
				}
				f.restarts.Add(1)
			}
		})
	}

	// The rogue: claims by hand and settles in its own transaction, letting
	// every other lease lapse first (so another worker may take the group
	// and apply the message meanwhile: its ack must then be refused).
	rogue, err := pgsync.New(context.Background(), r.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				l, err := rogue.ClaimWait(ctx, "rogue", vis, 0)
				if err != nil {
					continue // ctx's end, or a killed connection
				}
				f.rogueRun(ctx, r.pool, rogue, effects, groupTable, l, i%2 == 0, vis)
			}
		})
	}

	// The killer, as TestFaults's but slower (a handler's transaction holds
	// its connection for the whole handler, and these runtimes have fewer
	// connections between them: at TestFaults's rate nearly every call
	// would fail), and the lost COMMIT replies.
	wg.Go(func() { r.kill(ctx, 150*time.Millisecond) })
	wg.Go(func() {
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond) // kept: the rate of lost replies is the fault's
			proxy.CutAfterCommit("commit\x00") // the simple query COMMIT (a claim's text names synchronous_commit)
		}
	})
	wg.Wait()

	// The drain: a clean runtime, with no fault, until nothing is queued.
	drainer, err := pgsync.New(context.Background(), r.db.Pool, quiet(r.cfg))
	if err != nil {
		t.Fatal(err)
	}
	dctx, stop := context.WithTimeout(context.Background(), time.Minute)
	drained := make(chan error, 1)
	go func() {
		drained <- drainer.WorkTx(dctx, pgtransport.WorkerConfig{WorkerID: "drain", Concurrency: 16},
			func(hctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte) ([]byte, error) {
				return apply(hctx, tx, effects, l, state)
			})
	}()
	for left := -1; left != 0 && dctx.Err() == nil; time.Sleep(50 * time.Millisecond) {
		if err := r.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM transport_messages`).Scan(&left); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}

	// The effect view.
	rows, err := r.db.Pool.Query(context.Background(), `SELECT id, group_id, seq FROM `+effects)
	if err != nil {
		t.Fatal(err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowToStructByPos[history.Effect])
	if err != nil {
		t.Fatal(err)
	}
	states := map[string][]byte{}
	for _, m := range published {
		if _, ok := states[m.Group]; ok {
			continue
		}
		s, err := drainer.State(context.Background(), m.Group)
		if err != nil {
			t.Fatal(err)
		}
		states[m.Group] = s
	}
	errs, stats := history.CheckEffects(history.EffectView{Published: published, Effects: applied, States: states, Fold: sum})
	t.Logf("%d messages over %d groups, %v: %d connections killed, %d COMMIT replies lost, %d restarts; %d handler runs (%d panicked, %d failed after their insert, %d past visibility, %d ignoring ctx); rogue: %d acked, %d refused (lease lost), %d of unknown outcome; logged: %d lost leases, %d commits of unknown outcome; %d effect rows; checker: %d violations",
		stats.Messages, stats.Groups, time.Since(started).Round(time.Second), r.f.kills.Load(), proxy.Lost(), f.restarts.Load(),
		f.runs.Load(), f.panics.Load(), f.errs.Load(), f.slow.Load(), f.deaf.Load(), f.rogueAcked.Load(), f.rogueLost.Load(), f.rogueUnknown.Load(),
		logs.count("lease lost")+logs.count("lease lapsed"), logs.count("outcome unknown"), stats.Effects, len(errs))
	if len(errs) > 0 {
		t.Fatalf("effect view violations:\n%v", history.Join(errs))
	}
	if r.f.kills.Load() == 0 || proxy.Lost() == 0 || f.panics.Load() == 0 || f.rogueLost.Load() == 0 || f.rogueAcked.Load() == 0 {
		logs.mu.Lock()
		for _, rec := range logs.records {
			t.Logf("log %v %s %s %s", rec.at.Format(time.StampMicro), rec.worker, rec.msg, rec.extra)
		}
		logs.mu.Unlock()
		t.Fatalf("faults did not take effect: %d kills, %d lost replies, %d panics, %d rogue acks refused, %d rogue acks",
			r.f.kills.Load(), proxy.Lost(), f.panics.Load(), f.rogueLost.Load(), f.rogueAcked.Load())
	}
}

// txFaults counts what the transactional handlers and the rogue did.
type txFaults struct {
	runs, faults, panics, errs, slow, deaf atomic.Int64
	rogueAcked, rogueLost, rogueUnknown    atomic.Int64
	restarts                               atomic.Int64
}

// apply is a message's effect and fold, inside tx: one effect row, and
// the state plus the message's value.
func apply(ctx context.Context, tx pgx.Tx, effects string, l *pgtransport.Lease, state []byte) ([]byte, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` (group_id, seq, value) VALUES ($1, $2, $3::bigint)`, l.Group, l.Seq, l.Event); err != nil {
		return nil, err
	}
	return sum(state, l.Event), nil
}

// handle is the runtimes' TxHandler: apply, then a fault by turn (every
// hundred runs hold each fault the same number of times).
func (f *txFaults) handle(ctx context.Context, tx pgx.Tx, effects string, l *pgtransport.Lease, state []byte, vis time.Duration) ([]byte, error) {
	f.runs.Add(1)
	next, err := apply(ctx, tx, effects, l, state)
	if err != nil {
		return nil, err
	}
	switch p := f.faults.Add(1) % 100; {
	case p < 3:
		f.panics.Add(1)
		panic("a handler bug, after its insert")
	case p < 6:
		f.errs.Add(1)
		return nil, errors.New("a transient failure, after its insert")
	case p < 8: // past the visibility, minding ctx: the heartbeats keep the lease
		f.slow.Add(1)
		t := time.NewTimer(vis * 3 / 2)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	case p < 9: // ignores ctx: a lost lease's result is rolled back
		f.deaf.Add(1)
		time.Sleep(vis * 3 / 2) // kept: the fault is a handler deaf to its ctx
	}
	return next, nil
}

// rogueRun handles l by hand in its own transaction: the state read, the
// effect, and, with lapse, a wait past the lease's end (no heartbeat)
// before AckStateTx, which must refuse the ack if another worker took the
// group meanwhile; the transaction commits only an ack that held.
func (f *txFaults) rogueRun(ctx context.Context, pool *pgxpool.Pool, tr *pgsync.Transport, effects, groups string, l *pgtransport.Lease, lapse bool, vis time.Duration) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return // its lease lapses
	}
	defer tx.Rollback(context.Background())
	state, err := tr.StateTx(ctx, tx, l.Group)
	if err != nil {
		return
	}
	next, err := apply(ctx, tx, effects, l, state)
	if err != nil {
		return
	}
	if lapse { // past the lease's end, and until another worker holds the group (3 s at most)
		time.Sleep(time.Until(l.Expiry) + vis/10) // kept: the fault is a lease left to lapse
		// Put the lapsed group first in line, where a lapse leaves it
		// last: a nack under the stale token still holds until taken.
		_ = tr.Nack(ctx, l, 0)
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			var holder *string
			err := pool.QueryRow(ctx, `SELECT locked_by FROM `+groups+` WHERE group_id = $1`, l.Group).Scan(&holder)
			if err != nil || holder != nil && *holder != l.Token {
				break // taken (or drained: a rogue ack then finds nothing)
			}
		}
	}
	switch err := tr.AckStateTx(ctx, tx, l, next); {
	case errors.Is(err, pgtransport.ErrLeaseLost):
		f.rogueLost.Add(1)
		return // rolled back: nothing of this attempt is applied
	case err != nil:
		return
	}
	if err := tx.Commit(ctx); err != nil {
		f.rogueUnknown.Add(1)
		return
	}
	f.rogueAcked.Add(1)
}
