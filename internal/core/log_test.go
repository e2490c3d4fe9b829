package core

import (
	"errors"
	"log/slog"
	stdsync "sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// testClock is a Config.Clock the test moves by hand.
type testClock struct {
	mu  stdsync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestObserverSeesEachCall: publish, claim, ack (alone and in an
// exchange), fail and a lost lease each reach the observer once, with the
// count and a duration.
func TestObserverSeesEachCall(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	ctx := pgtest.Context(t)
	obs := &pgtest.Observer{}
	c, err := New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema, Observer: obs, Logger: (&pgtest.Logs{}).Logger()})
	is.NoErr(err)
	one := func(method string) pgtest.ObservedCall {
		t.Helper()
		calls := obs.Calls(method)
		if len(calls) != 1 {
			t.Fatalf("%s: %d calls, want 1: %+v", method, len(calls), obs.Calls(""))
		}
		if calls[0].Method != "LeaseLost" && calls[0].D <= 0 {
			t.Fatalf("%s: duration %v", method, calls[0].D)
		}
		obs.Reset()
		return calls[0]
	}

	_, err = c.Publish(ctx, "g", "e1", 0)
	is.NoErr(err)
	is.Equal(one("Published").N, 1) // Publish
	_, err = c.PublishMany(ctx, []pgtransport.Message{{Group: "g", Event: "e2"}, {Group: "g", Event: "e3"}})
	is.NoErr(err)
	is.Equal(one("Published").N, 2) // PublishMany counts its messages

	l, err := c.Claim(ctx, "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l.Event, "e1")
	is.Equal(one("Claimed").N, 1) // a claim that got a lease

	next, err := c.AckNext(ctx, l, time.Minute)
	is.NoErr(err)
	is.Equal(next.Event, "e2")
	is.Equal(len(obs.Calls("")), 2) // AckNext: an ack...
	is.Equal(obs.Calls("Acked")[0].N, 1)
	is.Equal(one("Claimed").N, 1)        // ...and the kept lease, a hand-out
	_, err = c.Publish(ctx, "h", "x", 0) // after the keep: a keep yields to a waiting group
	is.NoErr(err)
	is.Equal(one("Published").N, 1)

	settled, claimed, err := c.Exchange(ctx, []*pgtransport.Lease{next}, false, "w", time.Minute, 0, 2)
	is.NoErr(err)
	is.NoErr(settled[0].Err)
	is.Equal(len(claimed), 2)       // g (e3) and h
	is.Equal(len(obs.Calls("")), 2) // one ack and one claim
	is.Equal(obs.Calls("Acked")[0].N, 1)
	is.Equal(one("Claimed").N, 2)
	obs.Reset()
	g, h := claimed[0], claimed[1]
	if g.Group != "g" {
		g, h = h, g
	}

	is.NoErr(c.Ack(ctx, g))
	is.Equal(one("Acked").N, 1) // Ack

	out, err := c.Fail(ctx, h, errors.New("boom"))
	is.NoErr(err)
	is.Equal(out, FailRetry)
	f := one("Failed")
	is.Equal(f.Outcome, pgtransport.OutcomeRetry) // Failed says what the queue did
	is.Equal(f.Lease, h)

	err = c.Ack(ctx, g) // acked already: its token holds nothing
	is.True(errors.Is(err, pgtransport.ErrLeaseLost))
	is.Equal(len(obs.Calls("Acked")), 1)
	is.Equal(obs.Calls("LeaseLost")[0].Lease, g) // the lost lease, by name
	obs.Reset()

	l, err = c.Claim(ctx, "w", time.Minute, 0) // nothing claimable: h is parked for its retry
	is.NoErr(err)
	if l == nil {
		is.Equal(one("Claimed").N, 0) // an empty claim is a claim of 0
	}
}

// TestSettledLeaseNotWarned: a second ack of a lease this process
// settled, before the lease's expiry, is ErrLeaseLost as ever, but logged
// at Debug, not at Warn: no other worker can hold a lease that has not
// lapsed, so there is nothing for an operator to look at.
func TestSettledLeaseNotWarned(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	ctx := pgtest.Context(t)
	logs := &pgtest.Logs{Level: slog.LevelDebug}
	c, err := New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema, Logger: logs.Logger()})
	is.NoErr(err)
	_, err = c.Publish(ctx, "g", "e", 0)
	is.NoErr(err)
	l, err := c.Claim(ctx, "w", time.Minute, 0)
	is.NoErr(err)
	is.NoErr(c.Ack(ctx, l))
	err = c.Ack(ctx, l)
	is.True(errors.Is(err, pgtransport.ErrLeaseLost))               // the second ack changed nothing
	is.Equal(len(logs.Find(slog.LevelWarn, "lease lost")), 0)       // not a warning
	is.Equal(len(logs.Find(slog.LevelDebug, "settled already")), 1) // but said, for whoever looks
}

// TestLostLeaseLogged: a lease that lapsed and went to another worker is
// logged at Warn by the call that finds it lost (here an ack), naming its
// group, and reported to the observer; ExtendMany reports nothing, its
// caller does (the runtime's heartbeat, when the handler still runs).
func TestLostLeaseLogged(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	ctx := pgtest.Context(t)
	logs := &pgtest.Logs{Level: slog.LevelDebug}
	obs := &pgtest.Observer{}
	clock := &testClock{now: time.Now()}
	c, err := New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema, Clock: clock.Now, Logger: logs.Logger(), Observer: obs})
	is.NoErr(err)
	for _, g := range []string{"a", "b"} {
		_, err = c.Publish(ctx, g, "e", 0)
		is.NoErr(err)
	}
	first, err := c.ClaimMany(ctx, "w1", time.Minute, 0, 2)
	is.NoErr(err)
	is.Equal(len(first), 2)
	clock.Add(2 * time.Minute) // both leases lapse
	second, err := c.ClaimMany(ctx, "w2", time.Minute, 0, 2)
	is.NoErr(err)
	is.Equal(len(second), 2) // another worker holds both groups now
	is.Equal(len(logs.Records()), 0)

	err = c.Ack(ctx, first[0])
	is.True(errors.Is(err, pgtransport.ErrLeaseLost))
	errs, err := c.ExtendMany(ctx, first[1:], time.Minute)
	is.NoErr(err)
	is.True(errors.Is(errs[0], pgtransport.ErrLeaseLost))

	warns := logs.Find(slog.LevelWarn, "lease lost")
	is.Equal(len(warns), 1) // the ack's; ExtendMany leaves its lost leases to its caller (a heartbeat may race an ack)
	v, _ := pgtest.Attr(warns[0], "op")
	is.Equal(v.String(), "ack")
	v, _ = pgtest.Attr(warns[0], "group")
	is.Equal(v.String(), first[0].Group)
	lost := obs.Calls("LeaseLost")
	is.Equal(len(lost), 1)
	is.Equal(lost[0].Lease, first[0])
	is.Equal(len(logs.Records()), 1) // nothing else was logged
}

// TestFailOutcomesLogged: a Fail that dead-letters its message, or stops
// its group, is logged at Warn with the cause; one that leaves a retry
// only at Debug.
func TestFailOutcomesLogged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		attempts int
		policy   pgtransport.Exhausted
		want     FailOutcome
		level    slog.Level
		msg      string
	}{
		{"Dead", 1, pgtransport.DeadLetterHead, FailDead, slog.LevelWarn, "dead-lettered"},
		{"Stopped", 1, pgtransport.StopGroup, FailStopped, slog.LevelWarn, "group stopped"},
		{"Retry", 5, pgtransport.DeadLetterHead, FailRetry, slog.LevelDebug, "retried"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			db := pgtest.New(t, 2)
			ctx := pgtest.Context(t)
			logs := &pgtest.Logs{Level: slog.LevelDebug}
			obs := &pgtest.Observer{}
			c, err := New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema, Logger: logs.Logger(), Observer: obs, Policy: &pgtransport.Policy{MaxAttempts: tc.attempts, OnExhausted: tc.policy}})
			is.NoErr(err)
			_, err = c.Publish(ctx, "g", "e", 0)
			is.NoErr(err)
			l, err := c.Claim(ctx, "w", time.Minute, 0)
			is.NoErr(err)
			out, err := c.Fail(ctx, l, errors.New("card declined"))
			is.NoErr(err)
			is.Equal(out, tc.want)

			recs := logs.Records()
			is.Equal(len(recs), 1) // the Fail's one record
			is.Equal(recs[0].Level, tc.level)
			is.True(len(logs.Find(tc.level, tc.msg)) == 1) // the message says what happened
			v, _ := pgtest.Attr(recs[0], "cause")
			is.Equal(v.String(), "card declined")
			v, _ = pgtest.Attr(recs[0], "group")
			is.Equal(v.String(), "g")
			failed := obs.Calls("Failed")
			is.Equal(len(failed), 1)
			is.Equal(failed[0].Outcome, string(tc.want))
		})
	}
}

// TestBusySystemLogsNothingPerMessage: publishing, claiming, acking in
// batches and one by one, and failing with retries left, logs nothing at
// Info or above.
func TestBusySystemLogsNothingPerMessage(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	ctx := pgtest.Context(t)
	logs := &pgtest.Logs{Level: slog.LevelInfo}
	c, err := New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema, Logger: logs.Logger(), Policy: &pgtransport.Policy{RetryBackoffMin: time.Millisecond, RetryBackoffMax: time.Millisecond}})
	is.NoErr(err)
	var msgs []pgtransport.Message
	for i := range 200 {
		msgs = append(msgs, pgtransport.Message{Group: string(rune('a' + i%20)), Event: "e"})
	}
	_, err = c.PublishMany(ctx, msgs)
	is.NoErr(err)
	failed, acked := 0, 0
	var acks []*pgtransport.Lease
	for acked < len(msgs) {
		settled, claimed, err := c.Exchange(ctx, acks, true, "w", time.Minute, 0, 8)
		is.NoErr(err)
		acks = acks[:0]
		for _, s := range settled {
			is.NoErr(s.Err)
			acked++
			if s.Next != nil {
				claimed = append(claimed, s.Next)
			}
		}
		for _, l := range claimed {
			if failed < 20 && l.Attempt == 1 {
				_, err := c.Fail(ctx, l, errors.New("transient"))
				is.NoErr(err)
				failed++
				continue
			}
			acks = append(acks, l)
		}
		if len(claimed) == 0 && len(acks) == 0 {
			time.Sleep(2 * time.Millisecond) // kept: the retries' 1 ms parks must run out
		}
	}
	is.Equal(failed, 20)
	is.Equal(len(logs.Records()), 0) // a healthy system: nothing per message
}

// BenchmarkObserver measures what the observer hook adds to a call site
// (hooked, shaped as Ack's: timer before the call, observeAcked after),
// against the same call site without the hook (bare). With
// Config.Observer unset the hook is two inlined nil checks of one field
// and no clock read: about 3 ns over "none" on the development machine
// (the zero start time kept across the call), where the database
// round-trip it wraps takes tens of microseconds, so 0.01% or less. With
// an observer set, even a no-op one, it adds two clock reads and an
// interface call: about 120 ns there.
func BenchmarkObserver(b *testing.B) {
	for _, bc := range []struct {
		name string
		obs  pgtransport.Observer
		call func(*Core) error
	}{
		{"observer=none", nil, bare},
		{"observer=unset", nil, hooked},
		{"observer=noop", noObserver{}, hooked},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := &Core{cfg: pgtransport.Config{Observer: bc.obs}}
			for b.Loop() {
				_ = bc.call(c)
			}
		})
	}
}

//go:noinline
func roundTrip() error { return nil } // stands for the database call

//go:noinline
func bare(c *Core) error { return roundTrip() }

//go:noinline
func hooked(c *Core) error {
	t0 := c.timer()
	err := roundTrip()
	c.observeAcked(t0, 1, err)
	return err
}
