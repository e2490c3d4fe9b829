package history_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
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

// TestFailover runs publishers and consumers (blocking Work runtimes, an
// async Work runtime and a bare async stream) against a primary with a
// synchronous streaming standby, through one multi-host DSN
// (target_session_attrs=read-write). Mid-run the primary crashes (every
// process of it SIGKILLed at once) and, after a short outage
// (PGTRANSPORT_FAILOVER_OUTAGE, 500 ms unless set), the standby is
// promoted. Every consumer must find the new primary by itself and ack
// there; then the queue is drained and the history checked: no message
// whose publish returned success is lost, no order broken, no group held
// twice. It prints the time from the kill to the first ack on the new
// primary.
//
// PGTRANSPORT_FAILOVER_RUNS (default 1) repeats it on fresh clusters and
// prints the medians; PGTRANSPORT_FAULT_SCALE lengthens each run.
func TestFailover(t *testing.T) {
	requireReplication(t)
	runs := envInt("PGTRANSPORT_FAILOVER_RUNS", 1)
	var all []failoverTimes
	for i := range runs {
		t.Run(fmt.Sprint("run", i+1), func(t *testing.T) {
			all = append(all, runFailover(t, pgtest.ReplicaConfig{Sync: true}, false))
		})
	}
	if len(all) > 1 {
		t.Logf("medians of %d runs: %s", len(all), medianTimes(all))
	}
}

// TestFailoverAsyncReplication is TestFailover with asynchronous
// replication over a link that delays the WAL by PGTRANSPORT_FAILOVER_LAG
// (100 ms unless set), which loses what the standby had not received at
// the kill:
// publishes that returned success (their messages are gone), acks (their
// messages are handed out again) and claims (harmless: a lapsed lease).
// It measures what was lost and fails on nothing but a consumer that did
// not recover. Off by default (make failover runs it): it is a
// measurement, not a check.
func TestFailoverAsyncReplication(t *testing.T) {
	if os.Getenv("PGTRANSPORT_FAILOVER_ASYNC") == "" {
		t.Skip("a measurement, not a check: run with PGTRANSPORT_FAILOVER_ASYNC=1 (make failover does)")
	}
	requireReplication(t)
	runs := envInt("PGTRANSPORT_FAILOVER_RUNS", 1)
	lag := envDuration(t, "PGTRANSPORT_FAILOVER_LAG", 100*time.Millisecond)
	var all []failoverTimes
	for i := range runs {
		t.Run(fmt.Sprint("run", i+1), func(t *testing.T) {
			all = append(all, runFailover(t, pgtest.ReplicaConfig{Lag: lag}, false))
		})
	}
	if len(all) > 1 {
		t.Logf("medians of %d runs: %s", len(all), medianTimes(all))
	}
}

// TestFailoverFrozenPrimary is TestFailover where the old primary does
// not die but hangs (SIGSTOP) and stays hung: its connections stay open
// and answer nothing, and new ones to it are accepted and then hang, as
// when a host drops off the network. Clients give up on it only by their
// own timeouts.
func TestFailoverFrozenPrimary(t *testing.T) {
	if os.Getenv("PGTRANSPORT_FAILOVER_FROZEN") == "" {
		t.Skip("run with PGTRANSPORT_FAILOVER_FROZEN=1 (make failover does)")
	}
	requireReplication(t)
	runs := envInt("PGTRANSPORT_FAILOVER_RUNS", 1)
	var all []failoverTimes
	for i := range runs {
		t.Run(fmt.Sprint("run", i+1), func(t *testing.T) {
			all = append(all, runFailover(t, pgtest.ReplicaConfig{Sync: true}, true))
		})
	}
	if len(all) > 1 {
		t.Logf("medians of %d runs: %s", len(all), medianTimes(all))
	}
}

func requireReplication(t *testing.T) {
	if why := pgtest.HaveReplicationBinaries(); why != "" {
		msg := "FAILOVER NOT TESTED: a primary and a standby need PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup; apt-get install postgresql): " + why
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Logf("%s=%v", name, d)
	return d
}

func envInt(name string, def int) int {
	n, err := strconv.Atoi(os.Getenv(name))
	if err != nil || n < 1 {
		return def
	}
	return n
}

// failoverTimes are one run's moments, as durations since the kill
// (the moment the primary froze; zero: never happened).
type failoverTimes struct {
	killed, promoted         time.Duration // the primary's processes were gone; pg_ctl promote returned
	firstAck, firstPublish   time.Duration // the first success of each after the kill
	syncWork, asyncWork, raw time.Duration // the first ack of each kind of consumer after the kill
	listener                 time.Duration // the stream's listener was back
}

func (f failoverTimes) String() string {
	ms := func(d time.Duration) string { return fmt.Sprint(d.Round(time.Millisecond)) }
	return fmt.Sprintf("kill took %s, promoted at %s; first ack on the new primary at %s (blocking Work %s, async Work %s, stream %s), first publish at %s, listener back at %s (all from the kill)",
		ms(f.killed), ms(f.promoted), ms(f.firstAck), ms(f.syncWork), ms(f.asyncWork), ms(f.raw), ms(f.firstPublish), ms(f.listener))
}

func medianTimes(all []failoverTimes) failoverTimes {
	med := func(get func(failoverTimes) time.Duration) time.Duration {
		var ds []time.Duration
		for _, f := range all {
			ds = append(ds, get(f))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	return failoverTimes{
		killed:       med(func(f failoverTimes) time.Duration { return f.killed }),
		promoted:     med(func(f failoverTimes) time.Duration { return f.promoted }),
		firstAck:     med(func(f failoverTimes) time.Duration { return f.firstAck }),
		firstPublish: med(func(f failoverTimes) time.Duration { return f.firstPublish }),
		syncWork:     med(func(f failoverTimes) time.Duration { return f.syncWork }),
		asyncWork:    med(func(f failoverTimes) time.Duration { return f.asyncWork }),
		raw:          med(func(f failoverTimes) time.Duration { return f.raw }),
		listener:     med(func(f failoverTimes) time.Duration { return f.listener }),
	}
}

// clock keeps the kill's moment and the first success of each kind after
// it.
type clock struct {
	mu     stdsync.Mutex
	kill   time.Time // when the primary froze, answering nothing after
	killed time.Time // when its processes were gone
	first  map[string]time.Time
}

// ok notes a success of kind that ended now.
func (c *clock) ok(kind string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.killed.IsZero() || !now.After(c.killed) {
		return
	}
	if _, ok := c.first[kind]; !ok {
		c.first[kind] = now
	}
}

func (c *clock) since(kind string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.first[kind]
	if !ok {
		return 0
	}
	return at.Sub(c.kill)
}

// ackClock is a runtime's recorder that also tells the clock of its
// successful acks.
type ackClock struct {
	*recorder
	c    *clock
	kind string
}

func (a *ackClock) Acked(n int, d time.Duration, err error) {
	a.recorder.Acked(n, d, err)
	if err == nil && n > 0 {
		a.c.ok(a.kind)
		a.c.ok("ack")
	}
}

// ledger follows each message by its event (unique per publish), which,
// unlike its seq, survives a failover that loses the sequence's last
// advance (asynchronous replication can hand a seq out twice).
type ledger struct {
	mu        stdsync.Mutex
	published map[string]published // event -> its publish, which returned success
	claims    map[string][]claimed // event -> its hand-outs
	byToken   map[string]string    // token+seq -> event
}

type published struct {
	seq int64
	at  time.Time // when it returned
}

type claimed struct {
	seq int64
	at  time.Time
}

func (l *ledger) publish(event string, seq int64) {
	l.mu.Lock()
	l.published[event] = published{seq, time.Now()}
	l.mu.Unlock()
}

func (l *ledger) claim(lease *pgtransport.Lease) {
	l.mu.Lock()
	l.claims[lease.Event] = append(l.claims[lease.Event], claimed{lease.Seq, time.Now()})
	l.byToken[lease.Token+"\x00"+fmt.Sprint(lease.Seq)] = lease.Event
	l.mu.Unlock()
}

// runFailover is one run on a fresh primary and standby; freeze leaves
// the old primary hung instead of killing it.
func runFailover(t *testing.T, rcfg pgtest.ReplicaConfig, freeze bool) failoverTimes {
	n := scale(t)
	sync := rcfg.Sync
	setup := time.Now()
	rc, err := pgtest.StartReplicated(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Stop)
	t.Logf("a primary and a standby (%s) started in %v", rcfg, time.Since(setup).Round(time.Millisecond))
	const schema = "failover"
	pcfg, err := pgxpool.ParseConfig(rc.DSN())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 40
	pcfg.ConnConfig.RuntimeParams["search_path"] = schema // for the drain's plain SQL
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	logs := &logCounter{}
	cfg := pgtransport.Config{Schema: schema, IdleSweep: 200 * time.Millisecond, Logger: slog.New(logs)}
	r := &rig{t: t, db: &pgtest.DB{Schema: schema, DSN: rc.DSN(), Pool: pool}, pool: pool, cfg: cfg}
	led := &ledger{published: map[string]published{}, claims: map[string][]claimed{}, byToken: map[string]string{}}
	clk := &clock{first: map[string]time.Time{}}

	const (
		vis    = 2 * time.Second
		groups = 200
		// callTimeout bounds the test's own calls, as an application
		// would: a call to a server that hangs otherwise waits for ever.
		callTimeout = 5 * time.Second
	)
	var (
		before   = time.Duration(n) * 2 * time.Second                                           // running before the kill
		outage   = envDuration(t, "PGTRANSPORT_FAILOVER_OUTAGE", 500*time.Millisecond)          // no primary at all: the kill to the promotion
		after    = envDuration(t, "PGTRANSPORT_FAILOVER_AFTER", time.Duration(n)*4*time.Second) // running after the promotion
		wg       stdsync.WaitGroup
		ctx, end = context.WithCancel(context.Background())
	)
	defer end()
	if freeze && os.Getenv("PGTRANSPORT_FAILOVER_AFTER") == "" {
		after = 40 * time.Second // past the library's 30 s bound on a call to a hung server
	}

	// Publishers: one publishing one at a time, one in batches of 5; each
	// group published to by one of them. A publish that fails is of unknown
	// outcome (the commit may have happened before the kill) and is not
	// retried: its message may or may not exist.
	st, err := pgsync.New(context.Background(), pool, quiet(cfg))
	if err != nil {
		t.Fatal(err)
	}
	pick := func(p int) string { return fmt.Sprint("g", rand.IntN(groups/2)*2+p) }
	for p := range 2 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				start := time.Now()
				msgs := []pgtransport.Message{{Group: pick(p), Event: fmt.Sprintf("p%d-%d", p, i), Priority: 1}}
				var seqs []int64
				var err error
				if p == 1 {
					for j := 1; j < 5; j++ {
						msgs = append(msgs, pgtransport.Message{Group: pick(p), Event: fmt.Sprintf("p%d-%d-%d", p, i, j), Priority: 1})
					}
					cctx, cancel := context.WithTimeout(context.Background(), callTimeout)
					seqs, err = st.PublishMany(cctx, msgs)
					cancel()
				} else {
					var seq int64
					cctx, cancel := context.WithTimeout(context.Background(), callTimeout)
					seq, err = st.Publish(cctx, msgs[0].Group, msgs[0].Event, 1)
					cancel()
					seqs = []int64{seq}
				}
				r.recordBatch(fmt.Sprint("p", p), msgs, seqs, start, err)
				if err == nil {
					for j, m := range msgs {
						led.publish(m.Event, seqs[j])
					}
					clk.ok("publish")
				}
				time.Sleep(time.Duration(3*len(msgs)) * time.Millisecond) // kept: paces the publishers so the consumers keep up
				if err != nil {
					time.Sleep(20 * time.Millisecond) // kept: a retry's pause while there is no primary
				}
			}
		})
	}

	// The backlog: one message at a time to groups of priority 0, which no
	// consumer takes before the drain, so that a message lost with its
	// publish is missed by the drain too (the others are mostly consumed
	// within milliseconds, and lost with their ack as well).
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			start := time.Now()
			group, event := fmt.Sprint("b", i%groups), fmt.Sprint("b-", i)
			cctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			seq, err := st.Publish(cctx, group, event, 0)
			cancel()
			r.h.Add(history.Op{Kind: history.Publish, Worker: "b", Group: group, Seq: seq, Outcome: outcome(err), Start: start, End: time.Now()})
			if err == nil {
				led.publish(event, seq)
			}
			time.Sleep(5 * time.Millisecond) // kept: paces the backlog
		}
	})

	// Consumers (of priority 1 and up): four blocking Work runtimes of one slot (their acks'
	// outcomes are exact), one of four slots, an async Work runtime of
	// eight slots, and a bare stream whose acks are recorded one by one.
	type runtime struct {
		name string
		kind string
		work func(context.Context, pgtransport.WorkerConfig, pgtransport.Handler) error
		conc int
		obs  *ackClock
	}
	var rts []*runtime
	for i := range 5 {
		name, conc := fmt.Sprint("s", i), 1
		if i == 4 {
			conc = 4
		}
		obs := &ackClock{recorder: &recorder{r: r, worker: name, precise: conc == 1}, c: clk, kind: "sync"}
		c := cfg
		c.Observer = obs
		tr, err := pgsync.New(context.Background(), pool, c)
		if err != nil {
			t.Fatal(err)
		}
		rts = append(rts, &runtime{name: name, kind: "sync", work: tr.Work, conc: conc, obs: obs})
	}
	{
		obs := &ackClock{recorder: &recorder{r: r, worker: "a"}, c: clk, kind: "async"}
		c := cfg
		c.Observer = obs
		at, err := async.New(context.Background(), pool, c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(at.Close)
		rts = append(rts, &runtime{name: "a", kind: "async", work: at.Work, conc: 8, obs: obs})
	}
	for _, rt := range rts {
		wg.Go(func() {
			workStart := time.Now()
			wcfg := pgtransport.WorkerConfig{WorkerID: rt.name, Concurrency: rt.conc, Visibility: vis, ShutdownTimeout: time.Second, MinPriority: 1}
			err := rt.work(ctx, wcfg, func(_ context.Context, l *pgtransport.Lease) error {
				r.record(history.Claim, rt.name, l, workStart, nil)
				led.claim(l)
				time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond) // kept: the handler's work
				return nil
			})
			if err != nil {
				t.Errorf("%s: Work returned %v, want nil once its ctx ended", rt.name, err)
			}
			rt.obs.flush()
		})
	}
	at, err := async.New(context.Background(), pool, quiet(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(at.Close)
	opened := time.Now()
	s, err := at.Stream(ctx, async.StreamConfig{WorkerID: "stream", Visibility: vis, MaxInFlight: 8, MinPriority: 1})
	if err != nil {
		t.Fatal(err)
	}
	streamEnded := make(chan time.Time, 1)
	var staleLeases atomic.Int64 // received from C after their expiry
	var streamWG stdsync.WaitGroup
	for w := range 4 {
		worker := fmt.Sprint("stream-", w)
		streamWG.Go(func() {
			for l := range s.C() {
				if !time.Now().Before(l.Expiry) {
					staleLeases.Add(1)
				}
				r.record(history.Claim, worker, l, opened, nil)
				led.claim(l)
				start := time.Now()
				cctx, cancel := context.WithTimeout(context.Background(), callTimeout)
				err := <-at.Ack(cctx, l)
				cancel()
				r.record(history.Ack, worker, l, start, err)
				if err == nil {
					clk.ok("stream")
					clk.ok("ack")
				}
			}
		})
	}
	wg.Go(func() {
		streamWG.Wait()
		streamEnded <- time.Now()
	})

	// The failover.
	time.Sleep(before) // kept: the run's first phase, on the old primary
	if conn, err := pgx.Connect(context.Background(), rc.Primary.DSN()); err == nil {
		var lags string
		err := conn.QueryRow(context.Background(), `SELECT format('client %s:%s, write lag %s, flush lag %s, replay lag %s, %s', client_addr, client_port, write_lag, flush_lag, replay_lag, sync_state) FROM pg_stat_replication`).Scan(&lags)
		t.Logf("the standby before the kill: %s %v", lags, err)
		conn.Close(context.Background())
	}
	kill := rc.Kill
	if freeze {
		kill = rc.Freeze
	}
	// Closed while the stream's listener listens on the old primary. Every
	// outage of the listener replaces it with a new channel, so after the
	// kill only a new one, closed, shows it listening on the new primary;
	// a frozen primary is noticed only by the listener's ping.
	wasReady := s.Ready()
	select {
	case <-wasReady:
	default:
		wasReady = nil // not listening yet: any Ready that closes will do
	}
	frozen, err := kill()
	if err != nil {
		t.Fatal(err)
	}
	clk.mu.Lock()
	clk.kill, clk.killed = frozen, time.Now()
	clk.mu.Unlock()
	time.Sleep(outage) // kept: the time a failover manager takes to decide
	promoteStart := time.Now()
	if err := rc.Promote(); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	var listener time.Duration
	giveUp := time.After(after)
	tick := time.NewTicker(10 * time.Millisecond)
	for listener == 0 {
		ready := s.Ready()
		if ready == wasReady {
			ready = nil // the old primary's, still: not back yet
		}
		select {
		case <-ready:
			listener = time.Since(clk.kill)
		case <-tick.C:
		case <-giveUp:
			t.Errorf("the stream's listener was not back on the new primary %v after the promotion", after)
			listener = -1
		}
	}
	tick.Stop()
	time.Sleep(time.Until(promoted.Add(after))) // kept: the run's second phase, on the new primary
	end()
	wg.Wait()
	select {
	case at := <-streamEnded:
		if at.Before(promoted.Add(after)) {
			t.Errorf("the stream ended %v before the run did: %v", promoted.Add(after).Sub(at), s.Err())
		}
	default:
	}
	if err := s.Err(); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("the stream ended with %v", err)
	}
	if n := staleLeases.Load(); n > 0 {
		// A lease must not reach a receiver past its expiry: the stream
		// gives back one unreceived for half its visibility even while a
		// round-trip hangs on the frozen primary, and a lease's expiry
		// counts from when its claim left, not from a wait for a
		// connection to the hung host.
		t.Errorf("%d leases received from the stream after their expiry: their groups may be another worker's by then", n)
	}
	at.Close()

	times := failoverTimes{
		killed:       clk.killed.Sub(clk.kill),
		promoted:     promoted.Sub(clk.kill),
		firstAck:     clk.since("ack"),
		firstPublish: clk.since("publish"),
		syncWork:     clk.since("sync"),
		asyncWork:    clk.since("async"),
		raw:          clk.since("stream"),
		listener:     listener,
	}
	t.Logf("failover (%s replication): %s", map[bool]string{true: "synchronous", false: "asynchronous"}[sync], times)
	for kind, d := range map[string]time.Duration{"blocking Work": times.syncWork, "async Work": times.asyncWork, "stream": times.raw, "publish": times.firstPublish} {
		if d == 0 {
			t.Errorf("%s: no success on the new primary", kind)
		}
	}
	// Nothing succeeded with no primary: between the kill and the
	// promotion no server accepted writes.
	for _, o := range r.h.Ops() {
		if o.Outcome == history.OK && o.Kind != history.Claim && o.End.After(clk.killed) && o.End.Before(promoteStart) {
			t.Errorf("%s by %s succeeded at %v, with no primary", o.Kind, o.Worker, o.End.Sub(clk.kill))
		}
	}

	// The drain, on the new primary, then the checks.
	drainStart := time.Now()
	drainFailover(t, r, led)
	t.Logf("drained in %v", time.Since(drainStart).Round(time.Millisecond))
	msgs, grps, dead, _ := r.leftovers(t)
	lost, reacked, reused := led.losses(r.h.Ops(), clk.kill)
	errs, stats := history.Check(r.h.Ops(), history.End{Messages: msgs, Groups: grps, Dead: dead})
	t.Logf("%d messages over %d groups, %d deliveries, %d redeliveries, %d acked, %d calls of unknown outcome; logged %d claim retries, %d listener reconnects, %d expired leases not handled; lost: %d acknowledged publishes never handed out, %d acknowledged publishes handed out before the kill (their seqs reused), %d acknowledged acks (handed out again); checker: %d violations",
		stats.Published, groups, stats.Deliveries, stats.Redeliveries, stats.Acked, stats.Unknown, logs.count("claim failed"), logs.count("reconnect"), logs.count("ran out before its handler started"),
		len(lost), len(reused), len(reacked), len(errs))
	if len(dead) > 0 {
		t.Errorf("%d messages dead-lettered", len(dead))
	}
	if !sync {
		if len(errs) > 0 {
			t.Logf("with asynchronous replication the checker finds:\n%v", history.Join(errs))
		}
		for _, l := range [][]string{lost, reacked, reused} {
			if len(l) > 0 {
				t.Logf("%s", strings.Join(l, "\n"))
			}
		}
		return times
	}
	if len(errs) > 0 {
		t.Errorf("history violations:\n%v", history.Join(errs))
		logGroups(t, r.h.Ops(), errs, clk.kill)
	}
	for _, l := range [][]string{lost, reacked, reused} {
		if len(l) > 0 {
			t.Errorf("%s", strings.Join(l, "\n"))
		}
	}
	return times
}

// drainFailover is rig.drain that also keeps the ledger.
func drainFailover(t *testing.T, r *rig, led *ledger) {
	drainer, err := pgsync.New(context.Background(), r.pool, quiet(r.cfg))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		var left int
		if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM transport_messages`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		start := time.Now()
		l, err := drainer.ClaimWait(ctx, "drain", time.Minute, 0)
		if err != nil {
			t.Fatalf("drain: %v (%d messages left)", err, left)
		}
		r.record(history.Claim, "drain", l, start, nil)
		led.claim(l)
		start = time.Now()
		err = drainer.Ack(context.Background(), l)
		r.record(history.Ack, "drain", l, start, err)
		if err != nil {
			t.Fatal(err)
		}
	}
}

// losses reads the ledger and the history, by event: publishes that
// returned success and whose message was never handed out; messages acked
// with success before the kill and handed out again after it; seqs that
// named two different messages (the first one's publish was lost, after
// it was handed out).
func (l *ledger) losses(ops []history.Op, kill time.Time) (lost, reacked, reused []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ev, p := range l.published {
		if len(l.claims[ev]) == 0 {
			lost = append(lost, fmt.Sprintf("lost publish: %s (seq %d, returned %v before the kill), never handed out", ev, p.seq, kill.Sub(p.at).Round(time.Millisecond)))
		}
	}
	for _, o := range ops {
		if o.Kind != history.Ack || o.Outcome != history.OK || !o.End.Before(kill) {
			continue
		}
		ev := l.byToken[o.Token+"\x00"+fmt.Sprint(o.Seq)]
		for _, c := range l.claims[ev] {
			if c.at.After(kill) {
				reacked = append(reacked, fmt.Sprintf("lost ack: %s (seq %d) acked %v before the kill, handed out again", ev, o.Seq, kill.Sub(o.End).Round(time.Millisecond)))
				break
			}
		}
	}
	bySeq := map[int64][]string{}
	for ev, p := range l.published {
		bySeq[p.seq] = append(bySeq[p.seq], ev)
	}
	for seq, evs := range bySeq {
		if len(evs) > 1 {
			slices.SortFunc(evs, func(a, b string) int { return l.published[a].at.Compare(l.published[b].at) })
			p := l.published[evs[0]]
			reused = append(reused, fmt.Sprintf("lost publish: %s (seq %d, returned %v before the kill), handed out before the kill; its seq then named %s",
				evs[0], seq, kill.Sub(p.at).Round(time.Millisecond), strings.Join(evs[1:], ", ")))
		}
	}
	slices.Sort(lost)
	slices.Sort(reacked)
	slices.Sort(reused)
	return lost, reacked, reused
}

// logGroups logs the ops of the first few groups the violations name, for
// the diagnosis (times from the kill).
func logGroups(t *testing.T, ops []history.Op, errs []error, kill time.Time) {
	var groups []string
	for _, err := range errs {
		if g, ok := strings.CutPrefix(err.Error(), "group "); ok {
			g, _, _ = strings.Cut(g, ":")
			if !slices.Contains(groups, g) && len(groups) < 3 {
				groups = append(groups, g)
			}
		}
	}
	for _, g := range groups {
		var lines []string
		for _, o := range ops {
			if o.Group == g {
				lines = append(lines, fmt.Sprintf("  %8v..%8v %-7s %-9s seq %d outcome %d token %s", o.Start.Sub(kill).Round(time.Millisecond), o.End.Sub(kill).Round(time.Millisecond), o.Kind, o.Worker, o.Seq, o.Outcome, o.Token))
			}
		}
		t.Logf("group %s:\n%s", g, strings.Join(lines, "\n"))
	}
}
