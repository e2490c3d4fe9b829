package contract

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// attemptsCases: the attempts the server counts, Fail and its backoff,
// and what happens to a head that used its attempts: dead-lettered, or
// its group stopped until a restart.
var attemptsCases = []testCase{
	{"AttemptsCountEveryHandOut", attemptsCountEveryHandOut},
	{"FailRecordsCauseAndParksWithinBackoff", failRecordsCauseAndParksWithinBackoff},
	{"FailCauseIsCleanedAndCut", failCauseIsCleanedAndCut},
	{"FailOfLostLeaseChangesNothing", failOfLostLeaseChangesNothing},
	{"FailDeadLettersAfterMaxAttempts", failDeadLettersAfterMaxAttempts},
	{"LapsedLeasesDeadLetterAtClaim", lapsedLeasesDeadLetterAtClaim},
	{"StopGroupPolicyStopsAndRestarts", stopGroupPolicyStopsAndRestarts},
	{"DeadLetterNowBuriesAtOnce", deadLetterNowBuriesAtOnce},
	{"SnoozeParksUncounted", snoozeParksUncounted},
}

// deadLetterNowBuriesAtOnce: a Fail whose cause is DeadLetterNow(err)
// moves the head to the dead letters on its first attempt, with err's
// text as its cause, even under the StopGroup policy with attempts to
// spare; the group goes on at once. Fenced: a lease no longer held is
// ErrLeaseLost and buries nothing.
func deadLetterNowBuriesAtOnce(is *is.I, e *env) {
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 5, OnExhausted: pgtransport.StopGroup}})
	seq, err := e.tr.Publish(e.ctx(), "g", "malformed", 1)
	is.NoErr(err)
	e.publish("g", "fine", 0)
	l := e.claim("w", 0)
	is.Equal(l.Event, "malformed")
	stale := *l
	stale.Token = "w:forged"
	is.True(errors.Is(e.tr.Fail(e.ctx(), &stale, pgtransport.DeadLetterNow(errors.New("x"))), pgtransport.ErrLeaseLost)) // fenced
	is.Equal(e.count(`SELECT count(*) FROM transport_dead_letters`), 0)                                                  // nothing buried
	is.NoErr(e.tr.Fail(e.ctx(), l, pgtransport.DeadLetterNow(errors.New("cannot parse"))))
	next := e.claim("w", 0) // no backoff: the group went on
	is.True(next != nil)
	is.Equal(next.Event, "fine")
	ds := e.deadLetters(pgtransport.DeadLetterQuery{})
	is.Equal(len(ds), 1)
	is.Equal(ds[0].Seq, seq)
	is.Equal(ds[0].LastError, "cannot parse") // the cause, unwrapped
	is.Equal(ds[0].Attempts, 1)               // on its first attempt
	is.Equal(ds[0].Priority, 1)
	is.True(errors.Is(e.tr.Ack(e.ctx(), l), pgtransport.ErrLeaseLost)) // the lease is over
	e.ack(next)
}

// snoozeParksUncounted: a Fail whose cause is Snooze(d) parks the group
// for d, uncounted: nothing of it is claimable before d, and after d its
// head comes back with the attempt number it had; the lease is over.
// Snooze(0) frees it at once; a negative d is ErrInvalidDelay and a lease
// no longer held ErrLeaseLost, each changing nothing.
func snoozeParksUncounted(is *is.I, e *env) {
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1}})
	e.publish("g", "not yet", 0)
	e.publish("g", "after", 0)
	l := e.claim("w", 0)
	is.Equal(l.Attempt, 1)
	is.True(errors.Is(e.tr.Fail(e.ctx(), l, pgtransport.Snooze(-time.Second)), pgtransport.ErrInvalidDelay)) // refused
	stale := *l
	stale.Token = "w:forged"
	is.True(errors.Is(e.tr.Fail(e.ctx(), &stale, pgtransport.Snooze(time.Minute)), pgtransport.ErrLeaseLost)) // fenced
	is.NoErr(e.tr.Fail(e.ctx(), l, pgtransport.Snooze(time.Minute)))
	is.True(errors.Is(e.tr.Ack(e.ctx(), l), pgtransport.ErrLeaseLost)) // the lease is over
	is.Equal(e.claim("w", 0), nil)                                     // parked: "after" waits behind its head
	e.clock.Advance(59 * time.Second)
	is.Equal(e.claim("w", 0), nil) // not before the minute
	e.clock.Advance(2 * time.Second)
	l = e.claim("w", 0)
	is.Equal(l.Event, "not yet")
	is.Equal(l.Attempt, 1) // uncounted, though MaxAttempts is 1: not dead-lettered
	is.NoErr(e.tr.Fail(e.ctx(), l, pgtransport.Snooze(0)))
	l = e.claim("w", 0) // free at once
	is.Equal(l.Event, "not yet")
	is.Equal(l.Attempt, 1)
	is.Equal(e.count(`SELECT count(*) FROM transport_dead_letters`), 0)
	e.ack(l)
	is.Equal(e.claim("w", 0).Event, "after")
}

// attemptsCountEveryHandOut: a hand-out counts whatever ends it: a Fail,
// a nack, a lease that lapses. The count is the head's: the next message
// starts at 1, and a kept lease's hand-out counts too.
func attemptsCountEveryHandOut(is *is.I, e *env) {
	e.publish("g", "m1", 0)
	e.publish("g", "m2", 0)
	l := e.claim("w", 0)
	is.Equal(l.Event, "m1")
	is.Equal(l.Attempt, 1) // the first hand-out
	e.fail(e.tr, l, "boom")
	e.clock.Advance(pgtransport.DefaultRetryBackoffMax + time.Second) // past any backoff of a new queue
	ls, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 10)
	is.NoErr(err)
	is.Equal(len(ls), 1)
	is.Equal(ls[0].Event, "m1")
	is.Equal(ls[0].Attempt, 2) // the failed hand-out counted
	is.NoErr(e.tr.Nack(e.ctx(), ls[0], 0))
	l, err = e.tr.ClaimWait(e.ctx(), "w", 10*time.Second, 0)
	is.NoErr(err)
	is.Equal(l.Event, "m1")
	is.Equal(l.Attempt, 3)            // the nacked one too
	e.clock.Advance(11 * time.Second) // the lease lapses: its worker died
	l = e.claim("w", 0)
	is.Equal(l.Event, "m1")
	is.Equal(l.Attempt, 4) // and the lapsed one
	next, err := e.tr.AckNext(e.ctx(), l, time.Minute)
	is.NoErr(err)
	is.Equal(next.Event, "m2")
	is.Equal(next.Attempt, 1) // the next message starts afresh
	is.NoErr(e.tr.Nack(e.ctx(), next, 0))
	l = e.claim("w", 0)
	is.Equal(l.Event, "m2")
	is.Equal(l.Attempt, 2) // the kept lease's hand-out counted
	e.ack(l)
}

// failRecordsCauseAndParksWithinBackoff: Fail records the cause on the
// message and parks the group for a backoff between the queue's minimum
// and its maximum (equal jitter, never below the minimum), growing with
// the attempt. The
// failed lease is over: a late Ack or Extend of it is ErrLeaseLost.
func failRecordsCauseAndParksWithinBackoff(is *is.I, e *env) {
	const lo, hi = 10 * time.Second, 40 * time.Second
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: lo, RetryBackoffMax: hi}})
	seq, err := e.tr.Publish(e.ctx(), "g", "m", 0)
	is.NoErr(err)
	for attempt := 1; attempt <= 5; attempt++ {
		l := e.claim("w", 0)
		is.True(l != nil) // claimable once the park ends
		is.Equal(l.Attempt, attempt)
		cause := fmt.Sprintf("cause %d", attempt)
		e.fail(e.tr, l, cause)
		is.Equal(e.textAt("g", `SELECT last_error FROM transport_messages WHERE seq = $1`, seq), cause) // recorded on the message
		park := e.leaseSeconds("g")
		if park < lo.Seconds() || park > hi.Seconds() {
			e.t.Errorf("attempt %d: parked %.3f s, want %v to %v", attempt, park, lo, hi)
		}
		if attempt == 5 && park < (hi/2).Seconds() {
			e.t.Errorf("attempt 5: parked %.3f s, want at least %v: the backoff grows to the maximum", park, hi/2)
		}
		is.True(errors.Is(e.tr.Ack(e.ctx(), l), pgtransport.ErrLeaseLost))                 // the failed lease is over: no late ack
		is.True(errors.Is(e.tr.Extend(e.ctx(), l, time.Minute), pgtransport.ErrLeaseLost)) // nor extend
		e.clock.Advance(lo - time.Millisecond)
		is.Equal(e.claim("w", 0), nil) // parked
		e.clock.Advance(hi - lo + 2*time.Millisecond)
	}
	e.ack(e.claim("w", 0))
	m, g := e.rows()
	is.Equal(m+g, 0)
}

// failCauseIsCleanedAndCut: the recorded cause is valid UTF-8 without
// NULs, at most MaxErrorBytes, cut at a rune boundary; a nil cause
// records no text.
func failCauseIsCleanedAndCut(is *is.I, e *env) {
	seq, err := e.tr.Publish(e.ctx(), "g", "m", 0)
	is.NoErr(err)
	lastError := func(cause error) string {
		e.t.Helper()
		l := e.claim("w", 0)
		is.True(l != nil)
		is.NoErr(e.tr.Fail(e.ctx(), l, cause))
		e.clock.Advance(pgtransport.DefaultRetryBackoffMax + time.Second)
		return e.textAt("g", `SELECT last_error FROM transport_messages WHERE seq = $1`, seq)
	}
	is.Equal(lastError(errors.New("first")), "first")
	is.Equal(lastError(nil), "") // nil: no text
	long := "\x00" + strings.Repeat("€", pgtransport.MaxErrorBytes)
	is.Equal(lastError(errors.New(long)), strings.Repeat("€", pgtransport.MaxErrorBytes/3)) // NUL dropped, cut to whole runes
	got := lastError(errors.New("bad \xff byte"))
	is.True(utf8.ValidString(got))                                             // made valid
	is.True(strings.HasPrefix(got, "bad ") && strings.HasSuffix(got, " byte")) // the rest kept
}

// failOfLostLeaseChangesNothing: a Fail of a lease that lapsed and was
// taken, was forged, was settled, or names a message its token was not
// handed (a kept lease's earlier one) is ErrLeaseLost and changes nothing.
func failOfLostLeaseChangesNothing(is *is.I, e *env) {
	e.publish("g", "m1", 0)
	e.publish("g", "m2", 0)
	old, err := e.tr.Claim(e.ctx(), "old", 10*time.Second, 0)
	is.NoErr(err)
	e.clock.Advance(11 * time.Second)
	other := e.open()
	taken, err := other.Claim(e.ctx(), "new", time.Minute, 0)
	is.NoErr(err)
	is.Equal(taken.Event, "m1")
	before := e.snapshot()
	lost := func(tr Transport, l *pgtransport.Lease, what string) {
		e.t.Helper()
		if err := tr.Fail(e.ctx(), l, errors.New("late")); !errors.Is(err, pgtransport.ErrLeaseLost) {
			e.t.Errorf("Fail of %s: got %v, want ErrLeaseLost", what, err)
		}
		if after := e.snapshot(); after != before {
			e.t.Errorf("Fail of %s changed\n%s\ninto\n%s", what, before, after)
		}
	}
	lost(e.tr, old, "a lapsed and taken lease")
	forged := *taken
	forged.Token = "new:forged"
	lost(e.tr, &forged, "a forged token")
	is.Equal(e.textAt("g", `SELECT last_error FROM transport_messages WHERE event = 'm1'`), "") // no cause recorded
	next, err := other.AckNext(e.ctx(), taken, time.Minute)                                     // the holder still holds
	is.NoErr(err)
	is.Equal(next.Event, "m2")
	before = e.snapshot()
	lost(other, taken, "a kept lease's earlier message")
	is.NoErr(other.Ack(e.ctx(), next))
	before = e.snapshot()
	lost(other, next, "a settled lease")
}

// failDeadLettersAfterMaxAttempts: the Fail that uses the last attempt
// moves the head to the dead letters, whole, and the group goes on with
// its next message at once. The limit is the queue's: the transport that
// applies it is not the one that set it.
func failDeadLettersAfterMaxAttempts(is *is.I, e *env) {
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 3, RetryBackoffMin: time.Second, RetryBackoffMax: time.Second}})
	before := time.Now()
	seq, err := e.tr.Publish(e.ctx(), "g", "m1", 2)
	is.NoErr(err)
	after := time.Now()
	e.publish("g", "m2", 0)
	for attempt := 1; attempt <= 3; attempt++ {
		l := e.claim("w", 0)
		is.Equal(l.Event, "m1")
		is.Equal(l.Attempt, attempt)
		e.fail(e.tr, l, fmt.Sprintf("e%d", attempt))
		if attempt < 3 {
			is.Equal(e.count(`SELECT count(*) FROM transport_dead_letters`), 0) // attempts left: retried
			e.clock.Advance(2 * time.Second)
		}
	}
	l := e.claim("w", 0) // no backoff after a death
	is.True(l != nil)
	is.Equal(l.Event, "m2") // the group went on
	is.Equal(l.Attempt, 1)
	is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE seq = $1`, seq), 0) // moved, not copied
	ds := e.deadLetters(pgtransport.DeadLetterQuery{})
	is.Equal(len(ds), 1)
	d := ds[0]
	is.Equal(d.Group, "g")
	is.Equal(d.Seq, seq)
	is.Equal(d.Event, "m1")
	is.Equal(d.Priority, 2)
	is.Equal(d.Attempts, 3)
	is.Equal(d.LastError, "e3")
	if d.PublishedAt.Before(before.Add(-5*time.Second)) || d.PublishedAt.After(after.Add(5*time.Second)) {
		e.t.Errorf("PublishedAt %v, want near %v", d.PublishedAt, before)
	}
	is.True(!d.DiedAt.IsZero())
	is.True(!d.DiedAt.Before(d.PublishedAt))
	e.ack(l)
	m, g := e.rows()
	is.Equal(m+g, 0)
}

// lapsedLeasesDeadLetterAtClaim: a head whose attempts went to leases that
// lapsed (a worker crash loop) is dead-lettered by the claim that finds
// it, and that claim hands out the group's next message; a group left
// empty is deleted.
func lapsedLeasesDeadLetterAtClaim(is *is.I, e *env) {
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 3}})
	e.publish("g", "m1", 0)
	e.publish("g", "m2", 0)
	var old *pgtransport.Lease
	for attempt := 1; attempt <= 3; attempt++ {
		l, err := e.tr.Claim(e.ctx(), "w", 10*time.Second, 0)
		is.NoErr(err)
		is.Equal(l.Event, "m1")
		is.Equal(l.Attempt, attempt)
		e.clock.Advance(11 * time.Second) // the worker crashed
		old = l
	}
	l := e.claim("w", 0)
	is.True(l != nil)
	is.Equal(l.Event, "m2") // m1 died at this claim
	is.Equal(l.Attempt, 1)
	ds := e.deadLetters(pgtransport.DeadLetterQuery{})
	is.Equal(len(ds), 1)
	is.Equal(ds[0].Event, "m1")
	is.Equal(ds[0].Attempts, 3)
	is.Equal(ds[0].LastError, "")                                        // never failed
	is.True(errors.Is(e.tr.Ack(e.ctx(), old), pgtransport.ErrLeaseLost)) // the last lapsed lease is gone
	e.ack(l)

	// ClaimMany too.
	e.publish("a", "a1", 0)
	e.publish("a", "a2", 0)
	e.publish("b", "b1", 0)
	for attempt := 1; attempt <= 3; attempt++ {
		ls, err := e.tr.ClaimMany(e.ctx(), "w", 10*time.Second, 0, 10)
		is.NoErr(err)
		is.Equal(len(ls), 2)
		for _, l := range ls {
			is.Equal(l.Attempt, attempt)
		}
		e.clock.Advance(11 * time.Second)
	}
	ls, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 10)
	is.NoErr(err)
	is.Equal(len(ls), 1) // b drained: nothing of it
	is.Equal(ls[0].Event, "a2")
	is.Equal(ls[0].Attempt, 1)
	is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE group_id = 'b'`), 0) // b's row deleted
	is.Equal(len(e.deadLetters(pgtransport.DeadLetterQuery{})), 3)
	e.ack(ls[0])
	m, g := e.rows()
	is.Equal(m+g, 0)
}

// stopGroupPolicyStopsAndRestarts: under StopGroup a head that used its
// attempts stays, and nothing of its group is handed out until
// RestartGroup, which gives it fresh attempts or dead-letters it.
func stopGroupPolicyStopsAndRestarts(is *is.I, e *env) {
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 2, OnExhausted: pgtransport.StopGroup, RetryBackoffMin: time.Second, RetryBackoffMax: time.Second}})
	for _, ev := range []string{"g1", "g2", "g3"} {
		e.publish("g", ev, 0)
	}
	stopped := func() int {
		return e.count(`SELECT count(*) FROM transport_groups WHERE group_id = 'g' AND locked_by = '' AND lock_expiry = 'Infinity'`)
	}
	l := e.claim("w", 0)
	e.fail(e.tr, l, "e1")
	e.clock.Advance(2 * time.Second)
	l = e.claim("w", 0)
	is.Equal(l.Attempt, 2)
	e.fail(e.tr, l, "e2")
	is.Equal(stopped(), 1) // stopped by the Fail
	e.clock.Advance(24 * time.Hour)
	is.Equal(e.claim("w", 0), nil) // nothing of g, however long
	ls, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 10)
	is.NoErr(err)
	is.Equal(len(ls), 0)
	e.publish("h", "h1", 0)
	h1 := e.claim("w", 0)
	is.Equal(h1.Event, "h1") // other groups go on
	e.ack(h1)
	is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE group_id = 'g'`), 3) // the head stayed
	is.Equal(e.count(`SELECT count(*) FROM transport_dead_letters`), 0)
	is.True(errors.Is(e.tr.Fail(e.ctx(), l, errors.New("again")), pgtransport.ErrLeaseLost))

	is.NoErr(e.tr.RestartGroup(e.ctx(), "g", false))
	is.True(errors.Is(e.tr.RestartGroup(e.ctx(), "g", false), pgtransport.ErrGroupNotStopped)) // once
	l, err = e.tr.Claim(e.ctx(), "w", 10*time.Second, 0)
	is.NoErr(err)
	is.Equal(l.Event, "g1")
	is.Equal(l.Attempt, 1)                                                                    // fresh attempts
	is.True(errors.Is(e.tr.RestartGroup(e.ctx(), "g", true), pgtransport.ErrGroupNotStopped)) // held, not stopped

	// Attempts used by lapsed leases stop it at the claim.
	e.clock.Advance(11 * time.Second)
	l, err = e.tr.Claim(e.ctx(), "w", 10*time.Second, 0)
	is.NoErr(err)
	is.Equal(l.Attempt, 2)
	e.clock.Advance(11 * time.Second)
	is.Equal(e.claim("w", 0), nil)
	is.Equal(stopped(), 1) // stopped by the claim

	is.NoErr(e.tr.RestartGroup(e.ctx(), "g", true)) // skip the head
	l = e.claim("w", 0)
	is.Equal(l.Event, "g2")
	is.Equal(l.Attempt, 1)
	ds := e.deadLetters(pgtransport.DeadLetterQuery{})
	is.Equal(len(ds), 1)
	is.Equal(ds[0].Event, "g1") // the skipped head
	is.Equal(ds[0].Attempts, 2)
	is.True(errors.Is(e.tr.RestartGroup(e.ctx(), "nope", false), pgtransport.ErrGroupNotStopped))
	e.ack(l)
	e.ack(e.claim("w", 0))
	m, g := e.rows()
	is.Equal(m+g, 0)
}

// leaseSeconds is how long group's park or lease has left by the case's
// clock, in seconds.
func (e *env) leaseSeconds(group string) float64 {
	e.t.Helper()
	var left float64
	now := float64(e.clock.Now().UnixNano()) / 1e9
	if err := e.poolAt(group).QueryRow(e.ctx(), `SELECT lock_expiry - $2::float8 FROM transport_groups WHERE group_id = $1`, group, now).Scan(&left); err != nil {
		e.t.Fatalf("lock_expiry of %s: %v", group, err)
	}
	return left
}
