// Package workertest is the behaviour both front-ends' Work must show, as a
// table of cases over real PostgreSQL: package sync runs it against the
// blocking runtime, package async against the stream-fed one.
package workertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// Worker is the runtime under test: a transport's Work, and its Close.
type Worker interface {
	Work(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.Handler) error
	Close()
}

// Open returns a transport under test on pool with cfg; Close is the
// test's (it is safe to call twice, so a case may close it early).
type Open func(t *testing.T, pool *pgxpool.Pool, cfg pgtransport.Config) Worker

// WorkerPkg is the runtime's import path, for leak checks.
const WorkerPkg = "github.com/pgtransport/pgtransport/internal/worker"

type testCase struct {
	name string
	run  func(is *is.I, e *env)
	cfg  func(*pgtransport.Config) // the transport's, if the case needs more than the default
}

var cases = []testCase{
	{"AckOnNil", ackOnNil, nil},
	{"FailOnError", failOnError, nil},
	{"PanicFails", panicFails, nil},
	{"DeadLetterNowBuriesAtOnce", deadLetterNowBuriesAtOnce, nil},
	{"SnoozeParksUncounted", snoozeParksUncounted, nil},
	{"NegativeSnoozeFails", negativeSnoozeFails, nil},
	{"BoundedConcurrency", boundedConcurrency, nil},
	{"HeartbeatKeepsLease", heartbeatKeepsLease, nil},
	{"LostLeaseCancels", lostLeaseCancels, nil},
	{"ShutdownWaits", shutdownWaits, nil},
	{"ShutdownTimeoutCancels", shutdownTimeoutCancels, nil},
	{"UnstartedGivenBack", unstartedGivenBack, nil},
	{"CloseEndsWork", closeEndsWork, nil},
	{"InvalidConfig", invalidConfig, nil},
	{"HotGroupKept", hotGroupKept, func(c *pgtransport.Config) { c.MaxKeep = 3 }},
	{"AcksShareRoundTrips", acksShareRoundTrips, nil},
}

// Run runs every case against open, in parallel, and then fails if a
// goroutine of the runtime, or of pkgs, is left.
func Run(t *testing.T, open Open, pkgs ...string) {
	t.Run("cases", func(t *testing.T) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				c.run(is.New(t), newEnv(t, open, c.cfg))
			})
		}
	})
	if leak := pgtest.Leaked(5*time.Second, append(pkgs, WorkerPkg)...); leak != "" {
		t.Fatalf("goroutines left after Work returned:\n%s", leak)
	}
}

// env is one case's world: a fresh schema, the transport under test, a
// core on the same schema for publishing and looking, a log and an
// observer that record.
type env struct {
	t   *testing.T
	db  *pgtest.DB
	w   Worker
	c   *core.Core
	log *logs
	obs *observer
}

func newEnv(t *testing.T, open Open, tweak func(*pgtransport.Config)) *env {
	db := pgtest.New(t, 24)
	e := &env{t: t, db: db, log: &logs{}, obs: &observer{}}
	cfg := pgtransport.Config{Schema: db.Schema, Logger: slog.New(e.log), Observer: e.obs, Policy: &pgtransport.Policy{RetryBackoffMin: time.Millisecond, RetryBackoffMax: time.Millisecond}}
	if tweak != nil {
		tweak(&cfg)
	}
	e.w = open(t, db.Pool, cfg)
	c, err := core.New(context.Background(), db.Pool, pgtransport.Config{Schema: db.Schema, SkipApply: true})
	if err != nil {
		t.Fatalf("core: %v", err)
	}
	e.c = c
	return e
}

// maxAttempts sets the queue's attempt limit (the queue's policy, kept in
// the database), with the env's backoff.
func (e *env) maxAttempts(n int) {
	e.t.Helper()
	p := pgtransport.Policy{MaxAttempts: n, RetryBackoffMin: time.Millisecond, RetryBackoffMax: time.Millisecond} // the env's backoff kept
	if err := e.c.SetPolicy(e.ctx(), p); err != nil {
		e.t.Fatalf("policy: %v", err)
	}
}

func (e *env) ctx() context.Context { return pgtest.Context(e.t) }

func (e *env) publish(group, event string) int64 {
	e.t.Helper()
	seq, err := e.c.Publish(e.ctx(), group, event, 0)
	if err != nil {
		e.t.Fatalf("publish %s/%s: %v", group, event, err)
	}
	return seq
}

func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(e.ctx(), query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// start runs Work on its own goroutine; stop cancels its ctx and returns
// what Work returned, failing the test if it does not return within 20 s.
// done is closed when Work has returned.
func (e *env) start(cfg pgtransport.WorkerConfig, h pgtransport.Handler) (stop func() error, done <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	return e.startCtx(ctx, cancel, cfg, h)
}

// startCtx is start with Work's ctx and its cancel given.
func (e *env) startCtx(ctx context.Context, cancel context.CancelFunc, cfg pgtransport.WorkerConfig, h pgtransport.Handler) (stop func() error, done <-chan struct{}) {
	w := e.w
	var (
		err error
		fin = make(chan struct{})
	)
	go func() { // waited for by stop, registered as a cleanup
		defer close(fin)
		err = w.Work(ctx, cfg, h)
	}()
	var once stdsync.Once
	stop = func() error {
		e.t.Helper()
		once.Do(cancel)
		select {
		case <-fin:
			return err
		case <-time.After(20 * time.Second):
			e.t.Fatal("Work did not return within 20s of its ctx's end")
			return nil
		}
	}
	e.t.Cleanup(func() { once.Do(cancel); <-fin })
	return stop, fin
}

// wait receives from c, failing the test after d.
func wait[T any](e *env, c <-chan T, d time.Duration, what string) T {
	e.t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(d):
		e.t.Fatalf("timed out after %v waiting for %s", d, what)
		var zero T
		return zero
	}
}

// ackOnNil: nil acks; every message is handled once, in order per group.
func ackOnNil(is *is.I, e *env) {
	const groups, per = 5, 8
	for i := range per {
		for g := range groups {
			e.publish(fmt.Sprintf("g%d", g), fmt.Sprint(i))
		}
	}
	got := make(chan *pgtransport.Lease, groups*per)
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: 4, Visibility: 10 * time.Second}, func(ctx context.Context, l *pgtransport.Lease) error {
		got <- l
		return nil
	})
	last := map[string]int64{}
	for range groups * per {
		l := wait(e, got, 20*time.Second, "a message")
		is.True(l.Seq > last[l.Group]) // FIFO within the group, each once
		last[l.Group] = l.Seq
		is.Equal(l.Attempt, 1) // first delivery
	}
	is.NoErr(stop())                                                // a graceful stop returns nil
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 0) // all acked
	is.Equal(len(got), 0)                                           // none handled twice
	is.Equal(e.obs.failed.Load(), int64(0))                         // nothing failed
	is.Equal(e.obs.handled.Load(), int64(groups*per))               // Handled per message
}

// failOnError: an error Fails the message (the queue's policy: retried,
// then dead-lettered with the error's text).
func failOnError(is *is.I, e *env) {
	e.maxAttempts(2)
	e.publish("g", "bad")
	attempts := make(chan int, 4)
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: 2, Visibility: 10 * time.Second}, func(ctx context.Context, l *pgtransport.Lease) error {
		attempts <- l.Attempt
		return errors.New("boom")
	})
	is.Equal(wait(e, attempts, 20*time.Second, "attempt 1"), 1)
	is.Equal(wait(e, attempts, 20*time.Second, "attempt 2"), 2) // failed, retried after the backoff
	e.waitFor("the dead letter", func() bool { return e.count(`SELECT count(*) FROM transport_dead_letters`) == 1 })
	is.NoErr(stop())
	dead, err := e.c.DeadLetters(e.ctx(), pgtransport.DeadLetterQuery{})
	is.NoErr(err)
	is.Equal(len(dead), 1)
	is.Equal(dead[0].LastError, "boom") // the handler's error, recorded
	is.Equal(dead[0].Attempts, 2)
	is.Equal(len(attempts), 0) // not handed out a third time
}

// deadLetterNowBuriesAtOnce: a handler that returns DeadLetterNow(err) on
// its message's first attempt, with attempts to spare, has it
// dead-lettered at once with err as its cause (logged at Warn), and the
// group goes on with its next message.
func deadLetterNowBuriesAtOnce(is *is.I, e *env) {
	e.maxAttempts(5)
	e.publish("g", "malformed")
	e.publish("g", "fine")
	handled := make(chan *pgtransport.Lease, 4)
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: 2, Visibility: 10 * time.Second}, func(ctx context.Context, l *pgtransport.Lease) error {
		handled <- l
		if l.Event == "malformed" {
			return pgtransport.DeadLetterNow(errors.New("cannot parse"))
		}
		return nil
	})
	first := wait(e, handled, 20*time.Second, "the malformed message")
	is.Equal(first.Event, "malformed")
	is.Equal(first.Attempt, 1)
	next := wait(e, handled, 20*time.Second, "the next message")
	is.Equal(next.Event, "fine") // the group went on, not held by a backoff
	e.waitFor("the ack", func() bool { return e.count(`SELECT count(*) FROM transport_messages`) == 0 })
	is.NoErr(stop())
	dead, err := e.c.DeadLetters(e.ctx(), pgtransport.DeadLetterQuery{})
	is.NoErr(err)
	is.Equal(len(dead), 1)
	is.Equal(dead[0].Event, "malformed")
	is.Equal(dead[0].LastError, "cannot parse") // the cause, not the wrapper's words
	is.Equal(dead[0].Attempts, 1)               // at once: four attempts to spare
	rec, ok := e.log.find("its handler said it can never succeed")
	is.True(ok)                         // logged
	is.Equal(rec.level, slog.LevelWarn) // for an operator to look at
	is.Equal(len(handled), 0)           // not handed out again
}

// snoozeParksUncounted: a handler that returns Snooze(d) has its message
// handed out again after d, not before, with the same attempt number,
// while its group's next message waits behind it.
func snoozeParksUncounted(is *is.I, e *env) {
	e.maxAttempts(2)
	e.publish("g", "not yet")
	e.publish("g", "after")
	handled := make(chan *pgtransport.Lease, 8)
	var snoozes atomic.Int32
	const d = 300 * time.Millisecond
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: 2, Visibility: 10 * time.Second}, func(ctx context.Context, l *pgtransport.Lease) error {
		handled <- l
		if l.Event == "not yet" && snoozes.Add(1) <= 3 {
			return pgtransport.Snooze(d)
		}
		return nil
	})
	var last time.Time
	for i := range 4 { // three snoozes, then the ack: more than MaxAttempts hand-outs, none counted
		l := wait(e, handled, 20*time.Second, fmt.Sprintf("hand-out %d", i+1))
		now := time.Now()
		is.Equal(l.Event, "not yet") // the head, again: "after" waits behind it
		is.Equal(l.Attempt, 1)       // a snooze burns no attempt
		if i > 0 {
			is.True(now.Sub(last) >= d-50*time.Millisecond) // not before d
		}
		last = now
	}
	is.Equal(wait(e, handled, 20*time.Second, "the next message").Event, "after") // in order
	e.waitFor("the acks", func() bool { return e.count(`SELECT count(*) FROM transport_messages`) == 0 })
	is.NoErr(stop())
	is.Equal(e.count(`SELECT count(*) FROM transport_dead_letters`), 0) // never dead-lettered
}

// negativeSnoozeFails: a handler's Snooze with a negative delay is a bug
// of the handler's: its message is failed as an ordinary error (retried
// after the backoff, its attempt counted), not left to lapse.
func negativeSnoozeFails(is *is.I, e *env) {
	e.maxAttempts(2)
	e.publish("g", "m")
	attempts := make(chan int, 4)
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: 1, Visibility: time.Minute}, func(ctx context.Context, l *pgtransport.Lease) error {
		attempts <- l.Attempt
		return pgtransport.Snooze(-time.Second)
	})
	is.Equal(wait(e, attempts, 20*time.Second, "attempt 1"), 1)
	is.Equal(wait(e, attempts, 20*time.Second, "attempt 2"), 2) // failed and retried at once, not after the minute's visibility
	e.waitFor("the dead letter", func() bool { return e.count(`SELECT count(*) FROM transport_dead_letters`) == 1 })
	is.NoErr(stop())
	dead, err := e.c.DeadLetters(e.ctx(), pgtransport.DeadLetterQuery{})
	is.NoErr(err)
	is.Equal(len(dead), 1)
	is.True(strings.Contains(dead[0].LastError, "a negative delay")) // the cause says why
}

// panicFails: a panic is recovered, logged with its stack, and fails the
// message with the panic as its cause; the runtime keeps running.
func panicFails(is *is.I, e *env) {
	e.maxAttempts(1)
	e.publish("g", "poison")
	handled := make(chan string, 4)
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: 1, Visibility: 10 * time.Second}, func(ctx context.Context, l *pgtransport.Lease) error {
		handled <- l.Event
		if l.Event == "poison" {
			panic("kaboom")
		}
		return nil
	})
	is.Equal(wait(e, handled, 20*time.Second, "the poison"), "poison")
	e.publish("g2", "fine")
	is.Equal(wait(e, handled, 20*time.Second, "the next message"), "fine") // still running, on its one slot
	e.waitFor("the ack", func() bool { return e.count(`SELECT count(*) FROM transport_messages`) == 0 })
	is.NoErr(stop())
	dead, err := e.c.DeadLetters(e.ctx(), pgtransport.DeadLetterQuery{})
	is.NoErr(err)
	is.Equal(len(dead), 1)
	is.Equal(dead[0].LastError, "panic: kaboom") // the panic, as the cause
	rec, ok := e.log.find("handler panicked")
	is.True(ok)                                                            // logged
	is.Equal(rec.level, slog.LevelError)                                   // as an error
	is.True(strings.Contains(rec.attrs["stack"], "workertest.panicFails")) // with the stack of the panic
}

// boundedConcurrency: never more than Concurrency handlers at once, and
// that many when there is work for them.
func boundedConcurrency(is *is.I, e *env) {
	const n = 3
	for g := range 4 * n {
		e.publish(fmt.Sprintf("g%d", g), "x")
	}
	var now, peak atomic.Int64
	done := make(chan struct{}, 4*n)
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: n, Visibility: 10 * time.Second}, func(ctx context.Context, l *pgtransport.Lease) error {
		c := now.Add(1)
		for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
		}
		time.Sleep(50 * time.Millisecond) // the work: long enough for the others to start
		now.Add(-1)
		done <- struct{}{}
		return nil
	})
	for range 4 * n {
		wait(e, done, 20*time.Second, "a handler")
	}
	is.NoErr(stop())
	is.Equal(peak.Load(), int64(n)) // at most Concurrency, and all of them used
}

// acksShareRoundTrips: handlers that finish together have their acks
// settled together, several in one round-trip (the blocking runtime's
// combiner, the async stream's batches), each message acked once.
func acksShareRoundTrips(is *is.I, e *env) {
	const n, msgs = 8, 32
	for g := range msgs {
		e.publish(fmt.Sprintf("g%d", g), "x")
	}
	var running atomic.Int64
	all := make(chan struct{})
	var once stdsync.Once
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: n, Visibility: 10 * time.Second}, func(ctx context.Context, l *pgtransport.Lease) error {
		if running.Add(1) == n {
			once.Do(func() { close(all) })
		}
		select { // the first n wait for each other, then all return at once
		case <-all:
		case <-time.After(10 * time.Second):
		}
		return nil
	})
	e.waitFor("every message acked", func() bool { return e.count(`SELECT count(*) FROM transport_messages`) == 0 })
	is.NoErr(stop())
	is.Equal(e.obs.acked.Load(), int64(msgs))   // each once
	is.Equal(e.obs.handled.Load(), int64(msgs)) // each handled once
	is.True(e.obs.batch.Load() >= 2)            // some acks shared a round-trip
}

// heartbeatKeepsLease: a handler that runs several times its visibility
// keeps its lease (heartbeats), so its message is delivered once.
func heartbeatKeepsLease(is *is.I, e *env) {
	e.publish("g", "slow")
	calls := make(chan error, 4)
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: 2, Visibility: time.Second}, func(ctx context.Context, l *pgtransport.Lease) error {
		select {
		case <-time.After(3500 * time.Millisecond): // 3.5 visibilities
		case <-ctx.Done():
		}
		calls <- ctx.Err()
		return nil
	})
	is.NoErr(wait(e, calls, 20*time.Second, "the slow handler")) // never cancelled
	e.waitFor("the ack", func() bool { return e.count(`SELECT count(*) FROM transport_messages`) == 0 })
	is.NoErr(stop())
	is.Equal(len(calls), 0)               // delivered once: the idle slot never got it
	is.Equal(e.obs.lost.Load(), int64(0)) // no lease lost
}

// lostLeaseCancels: a lease that another token took cancels its handler's
// ctx at once, and the handler's late nil neither acks nor fails.
func lostLeaseCancels(is *is.I, e *env) {
	e.publish("g", "x")
	started := make(chan struct{}, 4)
	ended := make(chan error, 4)
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: 1, Visibility: time.Second}, func(ctx context.Context, l *pgtransport.Lease) error {
		started <- struct{}{}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
		}
		ended <- ctx.Err()
		return nil // late: must change nothing
	})
	wait(e, started, 20*time.Second, "the handler")
	// Another worker takes the group, for an hour.
	_, err := e.db.Pool.Exec(e.ctx(), `UPDATE transport_groups SET locked_by = 'foreign:1', lock_expiry = lock_expiry + 3600 WHERE group_id = 'g'`)
	is.NoErr(err)
	took := time.Now()
	is.True(errors.Is(wait(e, ended, 5*time.Second, "the cancellation"), context.Canceled)) // cancelled
	is.True(time.Since(took) < 2*time.Second)                                               // within a heartbeat or two
	is.NoErr(stop())
	is.Equal(e.obs.acked.Load(), int64(0))                                                      // the late nil acked nothing
	is.Equal(e.obs.failed.Load(), int64(0))                                                     // nor failed it
	is.True(e.obs.lost.Load() >= 1)                                                             // reported lost
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 1)                             // still queued
	is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE locked_by = 'foreign:1'`), 1) // still the other's
	is.Equal(len(started), 0)                                                                   // not handled again here
}

// shutdownWaits: after ctx ends, running handlers finish (and are acked)
// before Work returns; nothing new starts.
func shutdownWaits(is *is.I, e *env) {
	e.publish("a", "x")
	e.publish("b", "x")
	e.publish("c", "x")
	started := make(chan string, 4)
	release := make(chan struct{})
	stop, done := e.start(pgtransport.WorkerConfig{Concurrency: 2, Visibility: 10 * time.Second, ShutdownTimeout: time.Minute}, func(ctx context.Context, l *pgtransport.Lease) error {
		started <- l.Group
		<-release
		return ctx.Err() // nil unless cancelled
	})
	wait(e, started, 20*time.Second, "handler 1")
	wait(e, started, 20*time.Second, "handler 2")
	res := make(chan error, 1)
	go func() { res <- stop() }()
	select {
	case <-done:
		e.t.Fatal("Work returned while its handlers ran")
	case <-time.After(300 * time.Millisecond): // it waits
	}
	close(release)
	is.NoErr(wait(e, res, 20*time.Second, "Work"))
	is.Equal(len(started), 0)                                                                                                             // the third never started
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 1)                                                                       // the two acked
	is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE locked_by IS NOT NULL AND lock_expiry > extract(epoch FROM now())`), 0) // nothing held
}

// shutdownTimeoutCancels: a handler still running at ShutdownTimeout has
// its ctx cancelled; an error it then returns gives its message back (the
// shutdown cut it short, not the message): no Fail, no attempt used, free
// at once.
func shutdownTimeoutCancels(is *is.I, e *env) {
	e.publish("g", "x")
	started := make(chan struct{}, 2)
	ended := make(chan error, 2)
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: 1, Visibility: 10 * time.Second, ShutdownTimeout: 200 * time.Millisecond}, func(ctx context.Context, l *pgtransport.Lease) error {
		started <- struct{}{}
		select {
		case <-ctx.Done():
		case <-time.After(30 * time.Second):
		}
		ended <- ctx.Err()
		return ctx.Err()
	})
	wait(e, started, 20*time.Second, "the handler")
	begun := time.Now()
	is.NoErr(stop())
	is.True(time.Since(begun) < 5*time.Second)                                                             // bounded by the timeout
	is.True(errors.Is(wait(e, ended, time.Second, "the handler's end"), context.Canceled))                 // cancelled
	is.Equal(e.obs.failed.Load(), int64(0))                                                                // not failed
	is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE last_error IS NULL`), 1)               // no cause recorded
	is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE locked_by IS NULL AND attempts = 0`), 1) // given back, uncounted
	rec, ok := e.log.find("shutdown timeout")
	is.True(ok)                         // logged
	is.Equal(rec.level, slog.LevelWarn) // as a warning
}

// unstartedGivenBack: a lease claimed as the shutdown begins (the ack's
// round-trip claims the slot's next) is given back unstarted: claimable at
// once, its hand-out not counted.
func unstartedGivenBack(is *is.I, e *env) {
	e.publish("g1", "x")
	e.publish("g2", "x")
	started := make(chan string, 4)
	proceed := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	stop, _ := e.startCtx(ctx, cancel, pgtransport.WorkerConfig{Concurrency: 1, Visibility: time.Minute}, func(ctx context.Context, l *pgtransport.Lease) error {
		started <- l.Group
		<-proceed
		return nil
	})
	first := wait(e, started, 20*time.Second, "the first handler")
	// Hold first's group row so that the ack's round-trip (which also
	// claims the next lease) waits, then end Work while it does.
	lock := e.db.Conn(e.t)
	tx, err := lock.Begin(e.ctx())
	is.NoErr(err)
	_, err = tx.Exec(e.ctx(), `SELECT 1 FROM transport_groups WHERE group_id = $1 FOR UPDATE`, first)
	is.NoErr(err)
	close(proceed)
	e.waitFor("the ack to wait on the lock", func() bool {
		return e.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, e.db.Schema) > 0
	})
	cancel() // the runtime's stop ends with it, before it returns
	is.NoErr(tx.Rollback(e.ctx()))
	is.NoErr(stop())
	is.Equal(len(started), 0) // the next one was not started
	other := "g1"
	if first == "g1" {
		other = "g2"
	}
	l, err := e.c.Claim(e.ctx(), "check", time.Minute, 0)
	is.NoErr(err)
	is.True(l != nil)                                               // claimable at once: given back, not held
	is.Equal(l.Group, other)                                        // the one left
	is.Equal(l.Attempt, 1)                                          // the give-back not counted
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 1) // first was acked
}

// closeEndsWork: Close during Work ends it, with ErrClosed.
func closeEndsWork(is *is.I, e *env) {
	stop, done := e.start(pgtransport.WorkerConfig{Concurrency: 2, Visibility: 10 * time.Second}, func(ctx context.Context, l *pgtransport.Lease) error {
		return nil
	})
	e.publish("g", "x")
	e.waitFor("the ack", func() bool { return e.count(`SELECT count(*) FROM transport_messages`) == 0 })
	e.w.Close()
	wait(e, done, 20*time.Second, "Work to end after Close")
	is.True(errors.Is(stop(), pgtransport.ErrClosed)) // it says why
	err := e.w.Work(e.ctx(), pgtransport.WorkerConfig{}, func(context.Context, *pgtransport.Lease) error { return nil })
	is.True(errors.Is(err, pgtransport.ErrClosed)) // and a closed transport refuses Work
}

// invalidConfig: a bad config is refused at once, with its sentinel.
func invalidConfig(is *is.I, e *env) {
	h := func(context.Context, *pgtransport.Lease) error { return nil }
	for _, c := range []struct {
		cfg  pgtransport.WorkerConfig
		want error
	}{
		{pgtransport.WorkerConfig{Concurrency: -1}, pgtransport.ErrInvalidConfig},
		{pgtransport.WorkerConfig{Concurrency: pgtransport.MaxBatch + 1}, pgtransport.ErrInvalidConfig},
		{pgtransport.WorkerConfig{ShutdownTimeout: -1}, pgtransport.ErrInvalidConfig},
		{pgtransport.WorkerConfig{Visibility: time.Millisecond}, pgtransport.ErrInvalidVisibility},
		{pgtransport.WorkerConfig{MinPriority: 9}, pgtransport.ErrInvalidPriority},
		{pgtransport.WorkerConfig{WorkerID: "a\x00b"}, pgtransport.ErrInvalidWorkerID},
	} {
		err := e.w.Work(e.ctx(), c.cfg, h)
		is.True(errors.Is(err, c.want)) // refused with its sentinel
	}
	err := e.w.Work(e.ctx(), pgtransport.WorkerConfig{}, nil)
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // a nil handler
}

// hotGroupKept: a hot group is served under one lease, each ack keeping
// it for the next message (no claim in between), up to MaxKeep in a row,
// and then goes back to the round-robin.
func hotGroupKept(is *is.I, e *env) {
	const n = 7
	for i := range n {
		e.publish("hot", fmt.Sprint(i))
	}
	got := make(chan *pgtransport.Lease, n)
	stop, _ := e.start(pgtransport.WorkerConfig{Concurrency: 1, Visibility: 10 * time.Second}, func(ctx context.Context, l *pgtransport.Lease) error {
		got <- l
		return nil
	})
	var kept []int
	for i := range n {
		l := wait(e, got, 20*time.Second, "a message")
		is.Equal(l.Event, fmt.Sprint(i)) // in order
		kept = append(kept, l.Kept)
	}
	is.NoErr(stop())
	is.Equal(kept, []int{0, 1, 2, 0, 1, 2, 0}) // kept MaxKeep (3) in a row, then claimed afresh
}

// waitFor polls cond until it holds, failing the test after 20 s.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// observer counts what the transport reports.
type observer struct {
	acked, failed, lost, handled atomic.Int64
	batch                        atomic.Int64 // the largest ack seen, in leases
}

func (o *observer) Published(int, time.Duration, error) {}
func (o *observer) Claimed(int, time.Duration, error)   {}
func (o *observer) Acked(n int, _ time.Duration, err error) {
	o.acked.Add(int64(n))
	for b := o.batch.Load(); int64(n) > b && !o.batch.CompareAndSwap(b, int64(n)); b = o.batch.Load() {
	}
}
func (o *observer) Failed(*pgtransport.Lease, string, time.Duration, error) { o.failed.Add(1) }
func (o *observer) LeaseLost(*pgtransport.Lease)                            { o.lost.Add(1) }
func (o *observer) Handled(*pgtransport.Lease, time.Duration, error)        { o.handled.Add(1) }

// logs is a slog.Handler that keeps every record.
type logs struct {
	mu   stdsync.Mutex
	recs []record
}

type record struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (h *logs) Enabled(context.Context, slog.Level) bool { return true }
func (h *logs) Handle(_ context.Context, r slog.Record) error {
	rec := record{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	h.recs = append(h.recs, rec)
	h.mu.Unlock()
	return nil
}
func (h *logs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logs) WithGroup(string) slog.Handler      { return h }

// find returns the first record whose message holds s.
func (h *logs) find(s string) (record, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if strings.Contains(r.msg, s) {
			return r, true
		}
	}
	return record{}, false
}
