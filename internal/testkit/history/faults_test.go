package history_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/history"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
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
	fails, crashes, redriven, healed, shortRedrives   atomic.Int64
	buried, snoozed, snoozeKept, snoozeCounted        atomic.Int64
}

// The poison policy: a poison message's handler fails it, or crashes on
// it, every time, so it ends in the dead letters after maxAttempts
// hand-outs, parked between Fails for 10-50 ms.
const (
	maxAttempts = 3
	backoffMin  = 10 * time.Millisecond
	backoffMax  = 50 * time.Millisecond
)

// poisonEvent marks about 3% of events as poison: half of them fail in
// the handler ("!fail"), half crash the worker ("!crash": the lease is
// abandoned and lapses). About 1% more are a handler's special results:
// "!bury" (DeadLetterNow: dead-lettered at its first Fail) and "!snooze"
// (Snooze, once: handed out again, uncounted, then healthy).
func poisonEvent(event string) string {
	switch rand.IntN(200) {
	case 0, 1, 2:
		return event + "!fail"
	case 3, 4, 5:
		return event + "!crash"
	case 6:
		return event + "!bury"
	case 7:
		return event + "!snooze"
	}
	return event
}

// snoozeFor is how long a "!snooze" message's group is parked.
const snoozeFor = 20 * time.Millisecond

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
	// healed: seqs the operator redrove after fixing their handler; they
	// are handled as healthy from then on.
	healed stdsync.Map
	// snoozes: the attempt of each "!snooze" message's snoozed hand-out
	// (a snooze that applied); it is healthy after, and its next hand-out
	// is checked to carry the same attempt (checked, once).
	snoozes, checked stdsync.Map
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
	cfg := pgtransport.Config{Schema: db.Schema, IdleSweep: 200 * time.Millisecond, Policy: &pgtransport.Policy{MaxAttempts: maxAttempts, RetryBackoffMin: backoffMin, RetryBackoffMax: backoffMax}}
	return &rig{t: t, db: db, pool: pool, app: app, cfg: cfg}
}

// kill terminates a random connection of the rig every period until ctx
// ends, counting the kills.
func (r *rig) kill(ctx context.Context, period time.Duration) {
	for ctx.Err() == nil {
		time.Sleep(period) // kept: the kill rate is the fault's
		var killed int
		err := r.db.Pool.QueryRow(context.Background(), `
			SELECT count(pg_terminate_backend(pid))::int FROM (
			  SELECT pid FROM pg_stat_activity WHERE application_name = $1 ORDER BY random() LIMIT 1) AS victim`, r.app).Scan(&killed)
		if err == nil {
			r.f.kills.Add(int64(killed))
		}
	}
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

// recordBatch records a PublishMany of msgs, which began at start: one
// publish per message, each with its seq unless the batch failed.
func (r *rig) recordBatch(worker string, msgs []pgtransport.Message, seqs []int64, start time.Time, err error) {
	for j, m := range msgs {
		op := history.Op{Kind: history.Publish, Worker: worker, Group: m.Group, Outcome: outcome(err), Start: start, End: time.Now()}
		if err == nil {
			op.Seq = seqs[j]
		}
		r.h.Add(op)
	}
}

// poison says how l's handler breaks: "fail", "crash", or "" (healthy,
// or healed by the operator before a redrive).
func (r *rig) poison(l *pgtransport.Lease) string {
	if _, ok := r.healed.Load(l.Seq); ok {
		return ""
	}
	_, how, _ := strings.Cut(l.Event, "!")
	if how == "snooze" {
		if a, ok := r.snoozes.Load(l.Seq); ok {
			if _, again := r.checked.LoadOrStore(l.Seq, true); !again && l.Attempt != 0 {
				if l.Attempt == a.(int) {
					r.f.snoozeKept.Add(1)
				} else {
					r.f.snoozeCounted.Add(1) // another hand-out lapsed in between, or the snooze counted
				}
			}
			return ""
		}
	}
	return how
}

// badHandlerResult is what a poison message's handler returns: a plain
// error ("fail"), DeadLetterNow ("bury") or Snooze ("snooze").
func badHandlerResult(l *pgtransport.Lease, how string) error {
	cause := fmt.Errorf("poison %s (attempt %d)", l.Event, l.Attempt)
	switch how {
	case "bury":
		return pgtransport.DeadLetterNow(cause)
	case "snooze":
		return pgtransport.Snooze(snoozeFor)
	}
	return cause
}

// settled records what a poison message's Fail, which err answered, did:
// a Dead op when it dead-lettered the message (its last attempt, or
// DeadLetterNow), and a snooze's attempt.
func (r *rig) settled(worker string, l *pgtransport.Lease, how string, start time.Time, err error) {
	if err != nil {
		return
	}
	switch {
	case how == "bury":
		r.f.buried.Add(1)
		r.record(history.Dead, worker, l, start, nil)
	case how == "snooze":
		r.f.snoozed.Add(1)
		r.snoozes.Store(l.Seq, l.Attempt)
	case l.Attempt >= maxAttempts:
		r.record(history.Dead, worker, l, start, nil)
	}
}

// checkDead checks a dead letter: it used its attempts, or was buried at
// once by its handler (DeadLetterNow) with its cause recorded.
func checkDead(t *testing.T, d pgtransport.DeadLetter) {
	t.Helper()
	if strings.HasSuffix(d.Event, "!bury") {
		if d.Attempts < 1 || d.Attempts > maxAttempts || !strings.Contains(d.LastError, "poison") {
			t.Errorf("dead letter %d of %s, buried by its handler: %d attempts, cause %q", d.Seq, d.Group, d.Attempts, d.LastError)
		}
		return
	}
	if d.Attempts != maxAttempts {
		t.Errorf("dead letter %d of %s: %d attempts, want %d", d.Seq, d.Group, d.Attempts, maxAttempts)
	}
}

// checkSnoozes fails the test when the snoozed messages came back with
// their attempt counted more often than not (a hand-out that lapsed in
// between may count one, so a few may), or when snoozes applied and none
// came back.
func (r *rig) checkSnoozes(t *testing.T) {
	t.Helper()
	kept, counted := r.f.snoozeKept.Load(), r.f.snoozeCounted.Load()
	if r.f.snoozed.Load() > 0 && kept == 0 || counted > kept {
		t.Errorf("snoozes: %d applied, %d handed out again with the same attempt, %d with it counted", r.f.snoozed.Load(), kept, counted)
	}
}

// settlePoison plays a poison message's handler: it Fails l (recording a
// Dead op when the Fail was of its last attempt, which the queue's policy
// dead-letters) or crashes, leaving the lease to lapse.
func (r *rig) settlePoison(worker string, l *pgtransport.Lease, how string, fail func(context.Context, *pgtransport.Lease, error) error) {
	if how == "crash" {
		r.f.crashes.Add(1)
		return
	}
	r.f.fails.Add(1)
	start := time.Now()
	err := fail(context.Background(), l, badHandlerResult(l, how))
	r.record(history.Fail, worker, l, start, err)
	r.settled(worker, l, how, start, err)
}

// handle plays one handler: a poison message's (see settlePoison), or a
// healthy one's with a random fault, settling through the given calls. A
// healthy message's last attempt is handled without a fault, so only the
// killer's faults (a lost reply leaves a lease to lapse) can use up its
// attempts.
func (r *rig) handle(worker string, l *pgtransport.Lease, vis time.Duration, ack, nack func(context.Context, *pgtransport.Lease, time.Duration) error, extend func(context.Context, *pgtransport.Lease, time.Duration) error, fail func(context.Context, *pgtransport.Lease, error) error) (abandon bool) {
	ctx := context.Background()
	if how := r.poison(l); how != "" {
		r.settlePoison(worker, l, how, fail)
		return false // a crashed worker is restarted
	}
	p := rand.IntN(100)
	if l.Attempt >= maxAttempts {
		p = 99
	}
	switch {
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
// visibility with and without Extend, nack, and time out. About 3% of the
// messages are poison (their handler fails them, or crashes on them, every
// time): with MaxAttempts 3 they go to the dead letters, by a Fail or at a
// claim after lapses, while their groups go on; an operator redrives some
// of them (healing half first). Then everything left is drained and the
// history is checked: each message acked or dead-lettered exactly once per
// lifetime, in order.
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
						msgs[j] = pgtransport.Message{Group: pick(p), Event: poisonEvent(fmt.Sprintf("p%d-%d-%d", p, i, j))}
					}
					seqs, err := st.PublishMany(context.Background(), msgs)
					r.recordBatch(fmt.Sprint("p", p), msgs, seqs, start, err)
					continue
				}
				group := pick(p)
				seq, err := st.Publish(context.Background(), group, poisonEvent(fmt.Sprintf("p%d-%d", p, i)), 0)
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
					ls = slices.DeleteFunc(ls, func(l *pgtransport.Lease) bool {
						how := r.poison(l)
						if how != "" {
							r.settlePoison(worker, l, how, st.Fail)
						}
						return how != ""
					})
					if len(ls) == 0 {
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
						if how := r.poison(l); how != "" {
							r.settlePoison(worker, l, how, st.Fail)
							break // this lease is done with; claim afresh
						}
						if rand.IntN(50) == 0 && l.Attempt < maxAttempts {
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
					if r.handle(worker, l, vis, syncAck, st.Nack, st.Extend, st.Fail) {
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
	asyncFail := func(ctx context.Context, l *pgtransport.Lease, cause error) error { return <-at.Fail(ctx, l, cause) }
	for sn := range 2 {
		opened := time.Now() // a bound on when each of its claims was sent
		s, err := at.Stream(ctx, async.StreamConfig{WorkerID: fmt.Sprint("a", sn), Visibility: vis, MaxInFlight: 8})
		if err != nil {
			t.Fatal(err)
		}
		for w := range 8 {
			worker := fmt.Sprintf("a%d-%d", sn, w)
			wg.Go(func() {
				for l := range s.C() {
					r.record(history.Claim, worker, l, opened, nil)
					if r.handle(worker, l, vis, asyncAck, asyncNack, asyncExtend, asyncFail) {
						return
					}
				}
			})
		}
	}

	// The killer: terminates a random connection of the rig every 40 ms.
	wg.Go(func() { r.kill(ctx, 40*time.Millisecond) })
	// The operator: every 300 ms, redrives a few dead letters it has not
	// redriven before, healing half of them first. Its connections are
	// not the rig's, so the killer leaves it alone.
	operator, err := pgsync.New(context.Background(), r.db.Pool, r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		done := map[int64]bool{}
		for ctx.Err() == nil {
			time.Sleep(300 * time.Millisecond) // kept: the operator's pace
			dls, err := operator.DeadLetters(context.Background(), pgtransport.DeadLetterQuery{})
			if err != nil {
				continue
			}
			var seqs []int64
			for _, d := range dls {
				if !done[d.Seq] && len(seqs) < 5 {
					done[d.Seq] = true
					seqs = append(seqs, d.Seq)
					if rand.IntN(2) == 0 {
						r.healed.Store(d.Seq, true)
						r.f.healed.Add(1)
					}
				}
			}
			if len(seqs) == 0 {
				continue
			}
			start := time.Now()
			n, err := operator.Redrive(context.Background(), pgtransport.DeadLetterFilter{Seqs: seqs})
			if err == nil && n != int64(len(seqs)) {
				r.f.shortRedrives.Add(1)
			}
			r.f.redriven.Add(n)
			for _, seq := range seqs {
				group := ""
				for _, d := range dls {
					if d.Seq == seq {
						group = d.Group
					}
				}
				r.h.Add(history.Op{Kind: history.Redrive, Worker: "operator", Group: group, Seq: seq, Outcome: outcome(err), Start: start, End: time.Now()})
			}
		}
	})
	wg.Wait()
	at.Close()

	// Drain: a clean worker takes everything left (lapsed leases included)
	// and acks it, but Fails poison (a crash included: it catches it).
	r.drain(t)
	drainer, err := pgsync.New(context.Background(), r.db.Pool, r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var msgs, grps int
	if err := r.db.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM transport_messages), (SELECT count(*) FROM transport_groups WHERE drained_at IS NULL)`).Scan(&msgs, &grps); err != nil {
		t.Fatal(err)
	}
	// The dead letters: each used its attempts, and a healthy one is there
	// only because the killer's faults ended all of its attempts.
	var dead []int64
	var healthyDead int
	for after := int64(0); ; {
		page, err := drainer.DeadLetters(context.Background(), pgtransport.DeadLetterQuery{After: after, Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, d := range page {
			dead = append(dead, d.Seq)
			checkDead(t, d)
			if !strings.Contains(d.Event, "!") {
				healthyDead++
			} else if _, ok := r.healed.Load(d.Seq); ok {
				t.Errorf("dead letter %d of %s: healed before its redrive, yet dead again", d.Seq, d.Group)
			}
		}
		after = page[len(page)-1].Seq
	}
	if healthyDead > 5 {
		t.Errorf("%d healthy messages dead-lettered: more than the killer explains", healthyDead)
	}
	r.checkSnoozes(t)
	t.Logf("handlers' results: %d buried at once (DeadLetterNow), %d snoozed (%d back with the same attempt, %d counted)",
		r.f.buried.Load(), r.f.snoozed.Load(), r.f.snoozeKept.Load(), r.f.snoozeCounted.Load())
	if r.f.shortRedrives.Load() > 0 {
		t.Errorf("%d redrives put back fewer dead letters than asked", r.f.shortRedrives.Load())
	}
	errs, stats := history.Check(r.h.Ops(), history.End{Messages: msgs, Groups: grps, Dead: dead})
	t.Logf("%d messages over %d groups, 36 workers (16 blocking: 12 one at a time, 2 keeping hot groups, 2 in batches; 16 async; 4 publishers), %v: %d connections killed, %d leases abandoned, %d handlers past visibility (%d more kept alive by Extend), %d nacks, %d timeouts; poison: %d Fails, %d crashes, %d redriven (%d healed first); %d deliveries, %d redeliveries, %d acked, %d dead-lettered (%d healthy, at the end), %d calls of unknown outcome; checker: %d violations",
		stats.Published, groups, time.Since(started).Round(time.Second), r.f.kills.Load(), r.f.abandoned.Load(), r.f.slow.Load(), r.f.extended.Load(), r.f.nacks.Load(), r.f.timeouts.Load(),
		r.f.fails.Load(), r.f.crashes.Load(), r.f.redriven.Load(), r.f.healed.Load(), stats.Deliveries, stats.Redeliveries, stats.Acked, stats.DeadLettered, healthyDead, stats.Unknown, len(errs))
	if len(errs) > 0 {
		t.Fatalf("history violations:\n%v", history.Join(errs))
	}
	if r.f.kills.Load() == 0 || stats.Redeliveries == 0 || stats.DeadLettered == 0 || stats.Redriven == 0 {
		t.Fatalf("no faults took effect: %d kills, %d redeliveries, %d dead-lettered, %d redriven", r.f.kills.Load(), stats.Redeliveries, stats.DeadLettered, stats.Redriven)
	}
}
