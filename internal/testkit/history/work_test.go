package history_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/history"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestFaultsWork is TestFaults with the handler runtime (Work) doing the
// claiming, settling and heartbeats: blocking runtimes (six of one slot,
// one of six slots) and an async one (eight slots on one stream), while
// the killer terminates their connections and the handlers panic, fail,
// run for 1.5 times the visibility (kept alive by the heartbeats, so never
// handed out again meanwhile), ignore their ctx, and poison messages
// (about 3%) fail or panic on every attempt. Halfway through every
// runtime is shut down (ctx ends; a short ShutdownTimeout cancels the slow
// handlers, and those that ignore their ctx are waited for) and started
// again; at the end the blocking runtimes stop with their ctx and the
// async one with its Transport's Close. Then the queue is drained and the
// history checked, and no goroutine of the runtime is left.
//
// The runtime's settles are recorded from its Observer: a one-slot
// runtime's ack follows its handler's return, so its outcome is known
// (Acked, or LeaseLost for its lease); the acks of the larger runtimes
// are recorded as of unknown outcome. Fails and dead letters come from
// Observer.Failed.
func TestFaultsWork(t *testing.T) {
	n := scale(t)
	r := newRig(t)
	const vis = pgtransport.MinVisibility
	var (
		groups  = 1000 * n
		phase   = time.Duration(n) * 4 * time.Second
		started = time.Now()
		logs    = &logCounter{}
		runs    = &runLog{}
		wg      stdsync.WaitGroup
	)
	ctx, end := context.WithTimeout(context.Background(), 2*phase)
	defer end()
	cfg := r.cfg
	cfg.Logger = slog.New(logs)

	// Publishers: as TestFaults's, each group published to by one.
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

	// The runtimes.
	type runtime struct {
		name string
		work func(context.Context, pgtransport.WorkerConfig, pgtransport.Handler) error
		conc int
		obs  *recorder
		stop func() // ends phase 2 instead of ctx: the Transport's Close
	}
	var rts []*runtime
	for i := range 7 {
		name, conc := fmt.Sprint("s", i), 1
		if i == 6 {
			conc = 6
		}
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
		c.Observer = obs
		at, err := async.New(context.Background(), r.pool, c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(at.Close)
		rts = append(rts, &runtime{name: "a", work: at.Work, conc: 8, obs: obs, stop: at.Close})
	}
	var shutdowns atomic.Int64
	for _, rt := range rts {
		wg.Go(func() {
			for ph := range 2 {
				wctx, cancel := context.WithCancel(context.Background())
				timer := time.AfterFunc(time.Until(started.Add(time.Duration(ph+1)*phase)), func() {
					if ph == 1 && rt.stop != nil {
						rt.stop()
					} else {
						cancel()
					}
				})
				workStart := time.Now()
				wcfg := pgtransport.WorkerConfig{WorkerID: rt.name, Concurrency: rt.conc, Visibility: vis, ShutdownTimeout: 300 * time.Millisecond}
				err := rt.work(wctx, wcfg, func(hctx context.Context, l *pgtransport.Lease) error {
					return r.handleWork(hctx, rt.name, workStart, l, vis, runs)
				})
				stopped := time.Now()
				timer.Stop()
				cancel()
				switch {
				case ph == 1 && rt.stop != nil:
					if !errors.Is(err, pgtransport.ErrClosed) {
						t.Errorf("%s: Work after Close returned %v, want ErrClosed", rt.name, err)
					}
				case err != nil:
					t.Errorf("%s: Work returned %v after its ctx ended, want nil", rt.name, err)
				}
				// Bounded: the shutdown timeout, a handler that ignores
				// its ctx (1.5 s), the settles, Close's grace.
				if late := stopped.Sub(started.Add(time.Duration(ph+1) * phase)); late > 10*time.Second {
					t.Errorf("%s: Work returned %v after it was told to stop", rt.name, late)
				}
				rt.obs.flush()
				shutdowns.Add(1)
			}
		})
	}

	// The killer, as TestFaults's.
	wg.Go(func() { r.kill(ctx, 40*time.Millisecond) })
	wg.Wait()

	if leak := pgtest.Leaked(5*time.Second, "github.com/pgtransport/pgtransport/internal/worker"); leak != "" {
		t.Errorf("runtime goroutines outlived Work:\n%s", leak)
	}
	if got := shutdowns.Load(); got != int64(2*len(rts)) {
		t.Errorf("%d runtime stops, want %d", got, 2*len(rts))
	}

	// Kept alive by heartbeats: a handler that ran past its visibility and
	// whose ctx was never cancelled had its group to itself throughout,
	// unless its runtime's heartbeats failed meanwhile (then its lease may
	// lapse before the runtime learns it).
	overlaps := runs.overlaps(logs)
	for _, o := range overlaps {
		t.Errorf("kept alive, yet handed out again: %s", o)
	}
	if len(overlaps) > 0 {
		t.Logf("started %v, phases of %v", started.Format(time.StampMicro), phase)
		logs.mu.Lock()
		for _, rec := range logs.records {
			t.Logf("log %v %s %s %s", rec.at.Format(time.StampMicro), rec.worker, rec.msg, rec.extra)
		}
		logs.mu.Unlock()
	}

	r.drain(t)
	msgs, grps, dead, healthyDead := r.leftovers(t)
	if healthyDead > 5 {
		t.Errorf("%d healthy messages dead-lettered: more than the killer explains", healthyDead)
	}
	r.checkSnoozes(t)
	errs, stats := history.Check(r.h.Ops(), history.End{Messages: msgs, Groups: grps, Dead: dead})
	t.Logf("%d messages over %d groups, %v, runtimes %d: %d connections killed, %d handlers (%d panicked, %d failed, %d past visibility, %d ignoring ctx, %d cancelled, %d slow ones kept alive); logged: %d lost leases, %d failed heartbeats, %d panics, %d dead letters, %d shutdown timeouts; %d deliveries, %d redeliveries, %d acked, %d dead-lettered, %d calls of unknown outcome; checker: %d violations",
		stats.Published, groups, time.Since(started).Round(time.Second), len(rts), r.f.kills.Load(), runs.total.Load(), runs.panics.Load(), runs.errs.Load(), runs.slow.Load(), runs.ignore.Load(), runs.cancelled.Load(), runs.keptAlive.Load(),
		logs.count("lease lost")+logs.count("lease lapsed"), logs.count("heartbeat failed"), logs.count("panicked"), logs.count("dead-lettered"), logs.count("shutdown timeout"),
		stats.Deliveries, stats.Redeliveries, stats.Acked, stats.DeadLettered, stats.Unknown, len(errs))
	if len(errs) > 0 {
		t.Fatalf("history violations:\n%v", history.Join(errs))
	}
	if r.f.kills.Load() == 0 || runs.panics.Load() == 0 || runs.keptAlive.Load() == 0 || runs.ignore.Load() == 0 || stats.DeadLettered == 0 {
		t.Fatalf("faults did not take effect: %d kills, %d panics, %d kept alive, %d ignoring ctx, %d dead-lettered",
			r.f.kills.Load(), runs.panics.Load(), runs.keptAlive.Load(), runs.ignore.Load(), stats.DeadLettered)
	}
}

// handleWork is a runtime's handler: it records the hand-out and plays a
// poison message (an error, or a panic) or a healthy one with a random
// fault. A healthy message's last attempt gets no fault.
func (r *rig) handleWork(ctx context.Context, worker string, workStart time.Time, l *pgtransport.Lease, vis time.Duration, runs *runLog) error {
	// The claim was sent after the runtime started: a bound on its start.
	r.record(history.Claim, worker, l, workStart, nil)
	w := runs.begin(worker, l)
	defer func() { runs.end(w, ctx.Err() != nil) }()
	switch how := r.poison(l); how {
	case "fail", "bury", "snooze":
		runs.errs.Add(1)
		return badHandlerResult(l, how)
	case "crash":
		runs.panics.Add(1)
		panic(fmt.Sprintf("poison %s (attempt %d)", l.Event, l.Attempt))
	}
	// Every hundred runs (in the order they start) hold each fault the
	// same number of times, however few runs a loaded machine allows.
	p := int(runs.faults.Add(1) % 100)
	if l.Attempt >= maxAttempts {
		p = 99
	}
	switch {
	case p < 3:
		runs.panics.Add(1)
		panic("a handler bug")
	case p < 6:
		runs.errs.Add(1)
		return errors.New("a transient failure")
	case p < 12: // past the visibility, minding ctx: the heartbeats keep the lease
		runs.slow.Add(1)
		w.slow = true
		t := time.NewTimer(vis * 3 / 2)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	case p < 13: // ignores ctx: a shutdown waits for it, a lost lease ignores its result
		runs.ignore.Add(1)
		time.Sleep(vis * 3 / 2) // kept: the fault is a handler deaf to its ctx
	}
	return nil
}

// drain hands every message left to a clean worker, which acks it (and
// Fails poison: a crash included, it catches it). ClaimWait wakes when the
// earliest lapsed lease or park runs out, so it waits for those without
// polling; a message no claim can reach (a lost group row) leaves it
// waiting until its deadline, and the checks after it report that.
func (r *rig) drain(t *testing.T) {
	drainer, err := pgsync.New(context.Background(), r.db.Pool, quiet(r.cfg))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		var left int
		if err := r.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM transport_messages`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		start := time.Now()
		l, err := drainer.ClaimWait(ctx, "drain", time.Minute, 0)
		if errors.Is(err, context.DeadlineExceeded) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		r.record(history.Claim, "drain", l, start, nil)
		if how := r.poison(l); how != "" {
			if how == "crash" {
				how = "fail" // the drainer catches it
			}
			r.settlePoison("drain", l, how, drainer.Fail)
			continue
		}
		start = time.Now()
		err = drainer.Ack(context.Background(), l)
		r.record(history.Ack, "drain", l, start, err)
		if err != nil {
			t.Fatal(err)
		}
	}
}

// leftovers reads what the tables hold after the drain: messages, group
// rows, the dead letters' seqs (each checked to have used its attempts),
// and how many of those were healthy.
func (r *rig) leftovers(t *testing.T) (msgs, grps int, dead []int64, healthyDead int) {
	if err := r.db.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM transport_messages), (SELECT count(*) FROM transport_groups WHERE drained_at IS NULL)`).Scan(&msgs, &grps); err != nil {
		t.Fatal(err)
	}
	reader, err := pgsync.New(context.Background(), r.db.Pool, quiet(r.cfg))
	if err != nil {
		t.Fatal(err)
	}
	for after := int64(0); ; {
		page, err := reader.DeadLetters(context.Background(), pgtransport.DeadLetterQuery{After: after, Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return msgs, grps, dead, healthyDead
		}
		for _, d := range page {
			dead = append(dead, d.Seq)
			checkDead(t, d)
			if r.poison(&pgtransport.Lease{Seq: d.Seq, Event: d.Event}) == "" {
				healthyDead++
			}
		}
		after = page[len(page)-1].Seq
	}
}

// recorder is a runtime's Observer: it records the runtime's settles in
// the history. With precise (a runtime of one slot, whose calls come one
// at a time), a handler's ack is the Acked that follows its Handled (of
// unknown outcome if LeaseLost names its lease meanwhile: see flush);
// otherwise an ack's outcome cannot be told apart from the others', and it
// is recorded as unknown.
type recorder struct {
	r       *rig
	worker  string
	precise bool

	mu      stdsync.Mutex
	pending *pgtransport.Lease // handled without error; its ack not yet recorded
	from    time.Time          // when its handler returned: its ack was sent after
	acked   bool               // an Acked came for it
	ackErr  error
	ackEnd  time.Time
	lost    bool // LeaseLost named it after its handler returned (the ack, or a heartbeat racing it)
}

func (o *recorder) Published(int, time.Duration, error) {}
func (o *recorder) Claimed(int, time.Duration, error)   {}

func (o *recorder) Acked(_ int, _ time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pending != nil && !o.acked {
		o.acked, o.ackErr, o.ackEnd = true, err, time.Now()
	}
}

func (o *recorder) LeaseLost(l *pgtransport.Lease) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if l == o.pending {
		o.lost = true
	}
}

func (o *recorder) Failed(l *pgtransport.Lease, out string, d time.Duration, err error) {
	end := time.Now()
	start := end.Add(-d)
	o.r.h.Add(history.Op{Kind: history.Fail, Worker: o.worker, Group: l.Group, Seq: l.Seq, Token: l.Token, Outcome: outcome(err), Start: start, End: end})
	if err == nil && out == pgtransport.OutcomeDead {
		o.r.h.Add(history.Op{Kind: history.Dead, Worker: o.worker, Group: l.Group, Seq: l.Seq, Token: l.Token, Outcome: history.OK, Start: start, End: end})
	}
	if err == nil && out == pgtransport.OutcomeSnoozed {
		o.r.f.snoozed.Add(1)
		o.r.snoozes.Store(l.Seq, l.Attempt)
	}
}

func (o *recorder) Handled(l *pgtransport.Lease, _ time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.flushLocked()
	if err != nil {
		return // failed: Failed records it
	}
	if !o.precise {
		now := time.Now()
		o.r.h.Add(history.Op{Kind: history.Ack, Worker: o.worker, Group: l.Group, Seq: l.Seq, Token: l.Token, Outcome: history.Unknown, Start: now, End: now})
		return
	}
	o.pending, o.from = l, time.Now()
}

// flush records the pending ack, if one was sent (none is for a lease the
// runtime found lost while its handler ran).
func (o *recorder) flush() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.flushLocked()
}

func (o *recorder) flushLocked() {
	if o.pending != nil && o.acked {
		res := history.OK
		switch {
		case o.lost:
			// The ack's own loss, or a heartbeat's extend that raced the
			// ack and found the lease gone because the ack had applied:
			// the observer cannot tell them apart.
			res = history.Unknown
		case o.ackErr != nil:
			res = outcome(o.ackErr)
		}
		l := o.pending
		o.r.h.Add(history.Op{Kind: history.Ack, Worker: o.worker, Group: l.Group, Seq: l.Seq, Token: l.Token, Outcome: res, Start: o.from, End: o.ackEnd})
	}
	o.pending, o.acked, o.ackErr, o.lost = nil, false, nil, false
}

// runLog records every handler run, for the kept-alive check.
type runLog struct {
	mu                                                      stdsync.Mutex
	all                                                     []*workRun
	total, panics, errs, slow, ignore, cancelled, keptAlive atomic.Int64
	faults                                                  atomic.Int64 // runs that drew a fault by turn
}

type workRun struct {
	worker     string
	group      string
	seq        int64
	token      string
	attempt    int
	start, end time.Time
	slow       bool // ran past the visibility, minding its ctx
	cancelled  bool // its ctx was cancelled by the time it returned
}

func (rl *runLog) begin(worker string, l *pgtransport.Lease) *workRun {
	rl.total.Add(1)
	w := &workRun{worker: worker, group: l.Group, seq: l.Seq, token: l.Token, attempt: l.Attempt, start: time.Now()}
	rl.mu.Lock()
	rl.all = append(rl.all, w)
	rl.mu.Unlock()
	return w
}

func (rl *runLog) end(w *workRun, cancelled bool) {
	rl.mu.Lock()
	w.end, w.cancelled = time.Now(), cancelled
	rl.mu.Unlock()
	if cancelled {
		rl.cancelled.Add(1)
	} else if w.slow {
		rl.keptAlive.Add(1)
	}
}

// overlaps lists the slow runs that were never cancelled and yet saw their
// group handed to another run while they ran, except where their
// runtime's heartbeat failed meanwhile.
func (rl *runLog) overlaps(logs *logCounter) []string {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	byGroup := map[string][]*workRun{}
	for _, w := range rl.all {
		byGroup[w.group] = append(byGroup[w.group], w)
	}
	var out []string
	for _, w := range rl.all {
		if !w.slow || w.cancelled || w.end.IsZero() {
			continue
		}
		for _, o := range byGroup[w.group] {
			if o == w || !o.start.After(w.start) || !o.start.Before(w.end) {
				continue
			}
			if logs.heartbeatFailed(w.worker, w.start, w.end) {
				continue
			}
			out = append(out, fmt.Sprintf("group %s: message %d handled by %s (%s, attempt %d) from %v to %v, and message %d by %s (%s, attempt %d) from %v",
				w.group, w.seq, w.worker, w.token, w.attempt, w.start.Format(time.StampMicro), w.end.Format(time.StampMicro), o.seq, o.worker, o.token, o.attempt, o.start.Format(time.StampMicro)))
		}
	}
	slices.Sort(out)
	return out
}

// logCounter is a slog.Handler that keeps every record's message, time
// and worker attribute, to count what the runtime logged.
type logCounter struct {
	mu      stdsync.Mutex
	records []logRecord
}

type logRecord struct {
	msg    string
	worker string
	at     time.Time
	extra  string
}

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logCounter) WithGroup(string) slog.Handler            { return h }

func (h *logCounter) Handle(_ context.Context, rec slog.Record) error {
	lr := logRecord{msg: rec.Message, at: rec.Time}
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "worker" {
			lr.worker = a.Value.String()
		}
		if a.Key != "stack" {
			lr.extra += " " + a.String()
		}
		return true
	})
	h.mu.Lock()
	h.records = append(h.records, lr)
	h.mu.Unlock()
	return nil
}

// count is how many records' messages hold s.
func (h *logCounter) count(s string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.records {
		if strings.Contains(r.msg, s) {
			n++
		}
	}
	return n
}

// heartbeatFailed reports whether worker's runtime logged a failed
// heartbeat, or a lease it lost, between from and to.
func (h *logCounter) heartbeatFailed(worker string, from, to time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if r.worker == worker && !r.at.Before(from) && !r.at.After(to) && (strings.Contains(r.msg, "heartbeat failed") || strings.Contains(r.msg, "lapsed")) {
			return true
		}
	}
	return false
}

// quiet is cfg logging nothing: the drain's dead letters are expected.
func quiet(cfg pgtransport.Config) pgtransport.Config {
	cfg.Logger = slog.New(slog.DiscardHandler)
	return cfg
}
