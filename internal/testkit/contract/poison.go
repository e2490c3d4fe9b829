package contract

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	stdsync "sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// The cases of issue 13: attempts counted by the server, Fail and its
// backoff, dead letters and stopped groups, redrive and purge, when a
// message was published, and idempotent publish.
func init() { cases = append(cases, poisonCases...) }

var poisonCases = []testCase{
	{"AttemptsCountEveryHandOut", attemptsCountEveryHandOut},
	{"FailRecordsCauseAndParksWithinBackoff", failRecordsCauseAndParksWithinBackoff},
	{"FailCauseIsCleanedAndCut", failCauseIsCleanedAndCut},
	{"FailDeadLettersAfterMaxAttempts", failDeadLettersAfterMaxAttempts},
	{"LapsedLeasesDeadLetterAtClaim", lapsedLeasesDeadLetterAtClaim},
	{"StopGroupPolicyStopsAndRestarts", stopGroupPolicyStopsAndRestarts},
	{"RedrivePutsBackAtTheHeadInOrder", redrivePutsBackAtTheHeadInOrder},
	{"RedriveRacesPublishAndDrain", redriveRacesPublishAndDrain},
	{"PurgeDeadLetters", purgeDeadLetters},
	{"DeadLettersPaging", deadLettersPaging},
	{"PublishedAtIsByTheLocalClock", publishedAtIsByTheLocalClock},
	{"DedupKeyStoresOnce", dedupKeyStoresOnce},
	{"DedupKeyConcurrentPublishesStoreOnce", dedupKeyConcurrentPublishesStoreOnce},
	{"DedupKeyInPublishMany", dedupKeyInPublishMany},
	{"DedupKeyInCallersTransaction", dedupKeyInCallersTransaction},
	{"DedupKeyExpiresAfterWindow", dedupKeyExpiresAfterWindow},
	{"PolicyConfigIsValidatedAndStored", policyConfigIsValidatedAndStored},
	{"BadDedupKeyWritesNothing", badDedupKeyWritesNothing},
	{"FailOfLostLeaseChangesNothing", failOfLostLeaseChangesNothing},
	{"AckOfSeqNotHandedOutIsLost", ackOfSeqNotHandedOutIsLost},
}

// with opens another transport on the case's schema and clock with cfg's
// other fields: its policy fields become the queue's, for every
// transport on the schema.
func (e *env) with(cfg pgtransport.Config) Transport {
	e.t.Helper()
	tr, err := e.openCfg(cfg)
	if err != nil {
		e.t.Fatalf("open with %+v: %v", cfg, err)
	}
	return tr
}

// text runs a query of one text value over the test's schema ("" for NULL).
func (e *env) text(query string, args ...any) string {
	e.t.Helper()
	var s *string
	if err := e.db.Pool.QueryRow(e.ctx(), query, args...).Scan(&s); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	if s == nil {
		return ""
	}
	return *s
}

// snapshot is every queued message and group row as text: equal
// snapshots mean nothing changed.
func (e *env) snapshot() string {
	return e.text(`SELECT string_agg(r, ' | ' ORDER BY r) FROM (
  SELECT 'g ' || g::text AS r FROM transport_groups g
  UNION ALL SELECT 'm ' || m::text FROM transport_messages m
  UNION ALL SELECT 'd ' || d::text FROM transport_dead_letters d) s`)
}

// fail fails l with cause through tr.
func (e *env) fail(tr Transport, l *pgtransport.Lease, cause string) {
	e.t.Helper()
	if l == nil {
		e.t.Fatal("fail: no lease")
	}
	if err := tr.Fail(e.ctx(), l, errors.New(cause)); err != nil {
		e.t.Fatalf("fail %s/%d: %v", l.Group, l.Seq, err)
	}
}

func (e *env) deadLetters(q pgtransport.DeadLetterQuery) []pgtransport.DeadLetter {
	e.t.Helper()
	ds, err := e.tr.DeadLetters(e.ctx(), q)
	if err != nil {
		e.t.Fatalf("dead letters %+v: %v", q, err)
	}
	return ds
}

// killAll claims and fails every message there is, under a policy of
// MaxAttempts 1, so that each dies at once; it returns their seqs.
func (e *env) killAll() []int64 {
	e.t.Helper()
	var seqs []int64
	for {
		l := e.claim("killer", 0)
		if l == nil {
			return seqs
		}
		e.fail(e.tr, l, "killed")
		seqs = append(seqs, l.Seq)
	}
}

// leaseSeconds is how long group's park or lease has left by the case's
// clock, in seconds.
func (e *env) leaseSeconds(group string) float64 {
	e.t.Helper()
	var left float64
	now := float64(e.clock.Now().UnixNano()) / 1e9
	if err := e.db.Pool.QueryRow(e.ctx(), `SELECT lock_expiry - $2::float8 FROM transport_groups WHERE group_id = $1`, group, now).Scan(&left); err != nil {
		e.t.Fatalf("lock_expiry of %s: %v", group, err)
	}
	return left
}

type policy struct {
	MaxAttempts            int
	OnExhausted            string
	BackoffMin, BackoffMax float64
}

func (e *env) policy() policy {
	e.t.Helper()
	var p policy
	if err := e.db.Pool.QueryRow(e.ctx(), `SELECT max_attempts, on_exhausted, backoff_min, backoff_max FROM transport_policy`).Scan(&p.MaxAttempts, &p.OnExhausted, &p.BackoffMin, &p.BackoffMax); err != nil {
		e.t.Fatalf("transport_policy: %v", err)
	}
	return p
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
		is.Equal(e.text(`SELECT last_error FROM transport_messages WHERE seq = $1`, seq), cause) // recorded on the message
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
		return e.text(`SELECT last_error FROM transport_messages WHERE seq = $1`, seq)
	}
	is.Equal(lastError(errors.New("first")), "first")
	is.Equal(lastError(nil), "") // nil: no text
	long := "\x00" + strings.Repeat("€", pgtransport.MaxErrorBytes)
	is.Equal(lastError(errors.New(long)), strings.Repeat("€", pgtransport.MaxErrorBytes/3)) // NUL dropped, cut to whole runes
	got := lastError(errors.New("bad \xff byte"))
	is.True(utf8.ValidString(got))                                             // made valid
	is.True(strings.HasPrefix(got, "bad ") && strings.HasSuffix(got, " byte")) // the rest kept
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

// redrivePutsBackAtTheHeadInOrder: redriven messages go back to the head
// of their group in seq order, under their own seq, recreating a drained
// group's row with its priority, and are delivered as new (Attempt 1).
func redrivePutsBackAtTheHeadInOrder(is *is.I, e *env) {
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1}})
	seqs := make([]int64, 4)
	for i := range seqs {
		s, err := e.tr.Publish(e.ctx(), "g", event("g", i), 0)
		is.NoErr(err)
		seqs[i] = s
	}
	for i := range 2 {
		l := e.claim("w", 0)
		is.Equal(l.Seq, seqs[i])
		e.fail(e.tr, l, "dead")
	}
	expect := func(i int) {
		e.t.Helper()
		l := e.claim("w", 0)
		is.True(l != nil)
		is.Equal(l.Seq, seqs[i]) // its own seq, in order
		is.Equal(l.Event, event("g", i))
		is.Equal(l.Attempt, 1) // delivered as new
		e.ack(l)
	}

	// By group: both, before g-2.
	n, err := e.tr.Redrive(e.ctx(), pgtransport.DeadLetterFilter{Group: "g"})
	is.NoErr(err)
	is.Equal(n, int64(2))
	expect(0)
	expect(1)
	expect(2)

	// By seq, into a drained group.
	l := e.claim("w", 0)
	e.fail(e.tr, l, "dead")
	m, g := e.rows()
	is.Equal(m+g, 0) // drained: the row is gone
	n, err = e.tr.Redrive(e.ctx(), pgtransport.DeadLetterFilter{Seqs: []int64{seqs[3]}})
	is.NoErr(err)
	is.Equal(n, int64(1))
	expect(3)

	// All, recreating each group with its priority; an empty seq list
	// selects nothing.
	e.publish("h", "h1", 3)
	e.publish("k", "k1", 0)
	is.Equal(len(e.killAll()), 2)
	n, err = e.tr.Redrive(e.ctx(), pgtransport.DeadLetterFilter{Seqs: []int64{}})
	is.NoErr(err)
	is.Equal(n, int64(0))
	n, err = e.tr.Redrive(e.ctx(), pgtransport.DeadLetterFilter{})
	is.NoErr(err)
	is.Equal(n, int64(2))
	is.Equal(e.count(`SELECT priority FROM transport_groups WHERE group_id = 'h'`), 3)
	ls, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 10)
	is.NoErr(err)
	is.Equal(len(ls), 2)
	for _, l := range ls {
		is.Equal(l.Attempt, 1)
		e.ack(l)
	}

	// Under a live lease: the holder's ack of what it was handed holds,
	// and the redriven head comes next.
	e.publish("x", "x1", 0)
	e.publish("x", "x2", 0)
	e.fail(e.tr, e.claim("w", 0), "dead")
	held := e.claim("w", 0)
	is.Equal(held.Event, "x2")
	n, err = e.tr.Redrive(e.ctx(), pgtransport.DeadLetterFilter{Group: "x"})
	is.NoErr(err)
	is.Equal(n, int64(1))
	is.Equal(e.claim("w2", 0), nil) // x is held
	e.ack(held)
	is.Equal(e.claim("w", 0).Event, "x1")

	n, err = e.tr.Redrive(e.ctx(), pgtransport.DeadLetterFilter{})
	is.NoErr(err)
	is.Equal(n, int64(0)) // nothing left to redrive
	is.Equal(e.count(`SELECT count(*) FROM transport_dead_letters`), 0)
}

// redriveRacesPublishAndDrain: a redrive into a group whose last message
// is being acked while another is published strands nothing (the
// lost-publish guard).
func redriveRacesPublishAndDrain(is *is.I, e *env) {
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1}})
	ctx := e.ctx()
	for r := range 300 {
		group := fmt.Sprintf("r-%d", r)
		_, err := e.tr.Publish(ctx, group, "m1", 0)
		is.NoErr(err)
		e.fail(e.tr, e.claim("w", 0), "dead") // m1 dead, the group deleted
		_, err = e.tr.Publish(ctx, group, "m2", 0)
		is.NoErr(err)
		held := e.claim("w", 0)
		is.Equal(held.Event, "m2")
		errs := make(chan error, 2)
		go func() { errs <- e.tr.Ack(ctx, held) }() // drains the group
		go func() {
			_, err := e.tr.Publish(ctx, group, "m3", 0)
			errs <- err
		}()
		n, err := e.tr.Redrive(ctx, pgtransport.DeadLetterFilter{Group: group})
		is.NoErr(err)
		is.Equal(n, int64(1))
		is.NoErr(<-errs)
		is.NoErr(<-errs)
		for _, want := range []string{"m1", "m3"} {
			l := e.claim("w", 0)
			if l == nil {
				e.t.Fatalf("round %d: %s stranded; tables: %s", r, want, e.snapshot())
			}
			is.Equal(l.Group+"/"+l.Event, group+"/"+want)
			e.ack(l)
		}
	}
	m, g := e.rows()
	is.Equal(m+g, 0)
}

// purgeDeadLetters: purge by seq, by group, all; an empty seq list
// purges nothing.
func purgeDeadLetters(is *is.I, e *env) {
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1}})
	a1, err := e.tr.Publish(e.ctx(), "a", "a1", 0)
	is.NoErr(err)
	e.publish("a", "a2", 0)
	e.publish("b", "b1", 0)
	is.Equal(len(e.killAll()), 3)
	purge := func(f pgtransport.DeadLetterFilter) int64 {
		e.t.Helper()
		n, err := e.tr.PurgeDeadLetters(e.ctx(), f)
		is.NoErr(err)
		return n
	}
	is.Equal(purge(pgtransport.DeadLetterFilter{Seqs: []int64{}}), int64(0))
	is.Equal(purge(pgtransport.DeadLetterFilter{Seqs: []int64{a1}}), int64(1))
	is.Equal(purge(pgtransport.DeadLetterFilter{Group: "zzz"}), int64(0))
	is.Equal(purge(pgtransport.DeadLetterFilter{Group: "a"}), int64(1)) // a2
	is.Equal(len(e.deadLetters(pgtransport.DeadLetterQuery{})), 1)
	is.Equal(purge(pgtransport.DeadLetterFilter{}), int64(1)) // b1
	is.Equal(len(e.deadLetters(pgtransport.DeadLetterQuery{})), 0)
	n, err := e.tr.Redrive(e.ctx(), pgtransport.DeadLetterFilter{})
	is.NoErr(err)
	is.Equal(n, int64(0)) // purged for good
	m, g := e.rows()
	is.Equal(m+g, 0)
}

// deadLettersPaging: pages in seq order after a seq, per group or all.
func deadLettersPaging(is *is.I, e *env) {
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1}})
	var all, ofA []int64
	for i, g := range []string{"a", "b", "a", "b", "a"} {
		s, err := e.tr.Publish(e.ctx(), g, event(g, i), 0)
		is.NoErr(err)
		all = append(all, s)
		if g == "a" {
			ofA = append(ofA, s)
		}
	}
	is.Equal(len(e.killAll()), 5)
	seqs := func(ds []pgtransport.DeadLetter) []int64 {
		var s []int64
		for _, d := range ds {
			s = append(s, d.Seq)
		}
		return s
	}
	is.Equal(seqs(e.deadLetters(pgtransport.DeadLetterQuery{})), all) // Limit 0: the default page
	var paged []int64
	pages := 0
	for after := int64(0); ; pages++ {
		p := e.deadLetters(pgtransport.DeadLetterQuery{After: after, Limit: 2})
		if len(p) == 0 {
			break
		}
		is.True(len(p) <= 2)
		paged = append(paged, seqs(p)...)
		after = p[len(p)-1].Seq
	}
	is.Equal(paged, all) // every one once, in seq order
	is.Equal(pages, 3)
	is.Equal(seqs(e.deadLetters(pgtransport.DeadLetterQuery{Group: "a"})), ofA)
	is.Equal(seqs(e.deadLetters(pgtransport.DeadLetterQuery{Group: "a", After: ofA[0], Limit: 1})), ofA[1:2])
	is.Equal(len(e.deadLetters(pgtransport.DeadLetterQuery{Group: "zzz"})), 0)
}

// publishedAtIsByTheLocalClock: a lease's PublishedAt is when the message
// was published by this process's clock, whatever the clock the
// statements use (the case's is years off); zero when unknown.
func publishedAtIsByTheLocalClock(is *is.I, e *env) {
	before := time.Now()
	e.publish("g", "g1", 0)
	e.publish("g", "g2", 0)
	e.publish("h", "h1", 0)
	_, err := e.db.Pool.Exec(e.ctx(), `INSERT INTO transport_messages (group_id, event) VALUES ('p', 'plain')`)
	is.NoErr(err) // the design's two-INSERT publish
	_, err = e.db.Pool.Exec(e.ctx(), `INSERT INTO transport_groups (group_id) VALUES ('p') ON CONFLICT DO NOTHING`)
	is.NoErr(err)
	after := time.Now()
	within := func(l *pgtransport.Lease, what string) {
		e.t.Helper()
		if l == nil {
			e.t.Fatalf("%s: no lease", what)
		}
		if l.PublishedAt.Before(before.Add(-time.Second)) || l.PublishedAt.After(after.Add(time.Second)) {
			e.t.Errorf("%s: PublishedAt %v, want within a second of [%v, %v]", what, l.PublishedAt, before, after)
		}
	}
	l := e.claim("w", 0)
	within(l, "Claim")
	next, err := e.tr.AckNext(e.ctx(), l, time.Minute)
	is.NoErr(err)
	within(next, "AckNext") // a kept lease
	e.ack(next)
	ls, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 1)
	is.NoErr(err)
	is.Equal(len(ls), 1)
	within(ls[0], "ClaimMany")
	e.ack(ls[0])
	l, err = e.tr.ClaimWait(e.ctx(), "w", time.Minute, 0)
	is.NoErr(err)
	within(l, "ClaimWait (a plain-SQL publish)")
	e.ack(l)

	// An hour-old message says so.
	e.publish("old", "o1", 0)
	_, err = e.db.Pool.Exec(e.ctx(), `UPDATE transport_messages SET published_at = published_at - interval '1 hour'`)
	is.NoErr(err)
	l = e.claim("w", 0)
	if d := time.Since(l.PublishedAt); d < time.Hour-time.Second || d > time.Hour+5*time.Second {
		e.t.Errorf("an hour-old message: PublishedAt %v ago", d)
	}
	e.ack(l)

	// Queued before the column existed: unknown.
	e.publish("old", "o2", 0)
	_, err = e.db.Pool.Exec(e.ctx(), `UPDATE transport_messages SET published_at = NULL`)
	is.NoErr(err)
	l = e.claim("w", 0)
	is.True(l.PublishedAt.IsZero())
	e.ack(l)
}

func (e *env) publishMessage(tr Transport, m pgtransport.Message) int64 {
	e.t.Helper()
	s, err := tr.PublishMessage(e.ctx(), m)
	if err != nil {
		e.t.Fatalf("publish %+v: %v", m, err)
	}
	return s
}

// dedupKeyStoresOnce: a (group, key) seen within the window stores
// nothing and answers the original seq, even once that message is acked;
// keys are per group; messages without a key are never deduplicated.
func dedupKeyStoresOnce(is *is.I, e *env) {
	s1 := e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "first", Priority: 3, DedupKey: "k"})
	is.Equal(e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "second", DedupKey: "k"}), s1)
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 1)
	is.Equal(e.count(`SELECT priority FROM transport_groups WHERE group_id = 'g'`), 3) // PublishMessage's priority
	s2 := e.publishMessage(e.tr, pgtransport.Message{Group: "h", Event: "other group", DedupKey: "k"})
	is.True(s2 != s1) // a key is per group
	n1 := e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "no key"})
	n2 := e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "no key"})
	is.True(n1 != n2) // no key, no dedup
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 4)
	l := e.claim("w", 3)
	is.Equal(l.Event, "first")
	e.ack(l)
	is.Equal(e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "after ack", DedupKey: "k"}), s1) // still seen
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 3)
}

// dedupKeyConcurrentPublishesStoreOnce: eight publishes of one key at once
// store one message and all answer its seq.
func dedupKeyConcurrentPublishesStoreOnce(is *is.I, e *env) {
	const rounds, publishers = 10, 8
	type result struct {
		seq int64
		err error
	}
	trs := make([]Transport, publishers)
	for i := range trs {
		trs[i] = e.open()
	}
	for r := range rounds {
		key := fmt.Sprint("k", r)
		start := make(chan struct{})
		results := make(chan result, publishers)
		var wg stdsync.WaitGroup
		for i, tr := range trs {
			wg.Go(func() {
				<-start
				s, err := tr.PublishMessage(e.ctx(), pgtransport.Message{Group: "g", Event: event(key, i), DedupKey: key})
				results <- result{s, err}
			})
		}
		close(start)
		wg.Wait()
		close(results)
		var seqs []int64
		for res := range results {
			is.NoErr(res.err)
			seqs = append(seqs, res.seq)
		}
		is.Equal(len(slices.Compact(slices.Sorted(slices.Values(seqs)))), 1) // one seq for all
		is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE seq = $1`, seqs[0]), 1)
	}
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), rounds) // one message per key
}

// dedupKeyInPublishMany: a batch stores each (group, key) once, answering
// the first's seq for its repeats, in input order; keys stored by one
// call hold off the next.
func dedupKeyInPublishMany(is *is.I, e *env) {
	seqs, err := e.tr.PublishMany(e.ctx(), []pgtransport.Message{
		{Group: "g", Event: "a", DedupKey: "k1"},
		{Group: "g", Event: "b", DedupKey: "k2"},
		{Group: "g", Event: "c", DedupKey: "k1"},
		{Group: "h", Event: "d", DedupKey: "k1"},
		{Group: "g", Event: "e"},
		{Group: "g", Event: "f"},
	})
	is.NoErr(err)
	is.Equal(len(seqs), 6)
	is.Equal(seqs[2], seqs[0]) // the repeat answers the first
	is.Equal(len(slices.Compact(slices.Sorted(slices.Values(seqs)))), 5)
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 5)
	again, err := e.tr.PublishMany(e.ctx(), []pgtransport.Message{
		{Group: "g", Event: "x", DedupKey: "k2"},
		{Group: "g", Event: "y", DedupKey: "k3"},
	})
	is.NoErr(err)
	is.Equal(again[0], seqs[1]) // seen in the earlier batch
	is.Equal(e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "z", DedupKey: "k3"}), again[1])
	is.Equal(e.text(`SELECT string_agg(event, ',' ORDER BY seq) FROM transport_messages WHERE group_id = 'g'`), "a,b,e,f,y") // FIFO of what was stored
}

// dedupKeyInCallersTransaction: a key stored in a transaction that rolls
// back holds nothing off, a publish of a key another transaction holds
// uncommitted waits for its outcome, and a committed one holds.
func dedupKeyInCallersTransaction(is *is.I, e *env) {
	begin := func() pgx.Tx {
		e.t.Helper()
		tx, err := e.db.Pool.Begin(e.ctx())
		is.NoErr(err)
		e.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx
	}
	tx := begin()
	s1, err := e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: "g", Event: "rolled back", DedupKey: "k"})
	is.NoErr(err)
	is.NoErr(tx.Rollback(e.ctx()))
	s2 := e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "kept", DedupKey: "k"})
	is.True(s2 != s1) // stored: the rolled-back key held nothing off
	is.Equal(e.text(`SELECT string_agg(event, ',') FROM transport_messages`), "kept")

	tx = begin()
	dup, err := e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: "g", Event: "dup", DedupKey: "k"})
	is.NoErr(err)
	is.Equal(dup, s2) // a committed key holds inside a transaction too
	is.NoErr(tx.Commit(e.ctx()))

	// A key held by a transaction still open: the other publish waits for
	// it, and stores its own message once it rolls back.
	tx = begin()
	_, err = e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: "g", Event: "pending", DedupKey: "k2"})
	is.NoErr(err)
	type result struct {
		seq int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := e.tr.PublishMessage(e.ctx(), pgtransport.Message{Group: "g", Event: "waited", DedupKey: "k2"})
		done <- result{s, err}
	}()
	e.waitLocked("harel_publish_keyed(")
	is.NoErr(tx.Rollback(e.ctx()))
	select {
	case res := <-done:
		is.NoErr(res.err)
		is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE seq = $1 AND event = 'waited'`, res.seq), 1) // its own, stored
	case <-time.After(30 * time.Second):
		e.t.Fatal("the waiting publish never returned")
	}

	tx = begin()
	s3, err := e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: "g", Event: "committed", DedupKey: "k3"})
	is.NoErr(err)
	is.NoErr(tx.Commit(e.ctx()))
	is.Equal(e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "later", DedupKey: "k3"}), s3)
	is.Equal(e.text(`SELECT string_agg(event, ',' ORDER BY seq) FROM transport_messages`), "kept,waited,committed")
}

// waitLocked waits until a statement of the case's schema calling fn
// waits for a lock, and fails the test after 30 s.
func (e *env) waitLocked(fn string) {
	e.t.Helper()
	call := pgx.Identifier{e.db.Schema}.Sanitize() + "." + fn
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if e.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, call) > 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no %s waited for a lock within 30s", call)
		}
	}
}

// dedupKeyExpiresAfterWindow: once DedupWindow has passed, the key holds
// nothing off (real time: the window is by the server's clock).
func dedupKeyExpiresAfterWindow(is *is.I, e *env) {
	const window = time.Second
	tr := e.with(pgtransport.Config{DedupWindow: window})
	start := time.Now()
	s1 := e.publishMessage(tr, pgtransport.Message{Group: "g", Event: "1", DedupKey: "k"})
	is.Equal(e.publishMessage(tr, pgtransport.Message{Group: "g", Event: "2", DedupKey: "k"}), s1) // within the window
	for {
		s := e.publishMessage(tr, pgtransport.Message{Group: "g", Event: "3", DedupKey: "k"})
		if s != s1 {
			break
		}
		if time.Since(start) > 15*time.Second {
			e.t.Fatal("the key never expired")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if took := time.Since(start); took < window {
		e.t.Errorf("the key expired after %v, within its window of %v", took, window)
	}
	is.Equal(e.text(`SELECT string_agg(event, ',' ORDER BY seq) FROM transport_messages`), "1,3")
}

// policyConfigIsValidatedAndStored: a new queue's policy is the
// documented default; a Config.Policy or SetPolicy out of range is
// refused and writes nothing; a valid one is written whole (a zero field
// is its default), on open or by SetPolicy; a Config without a Policy
// leaves the stored one alone; Policy reads it back.
func policyConfigIsValidatedAndStored(is *is.I, e *env) {
	is.Equal(e.policy(), policy{pgtransport.DefaultMaxAttempts, "dead_letter", 1, 60}) // a new queue's
	bad := map[string]pgtransport.Policy{
		"MaxAttemptsMinus2":        {MaxAttempts: -2},
		"NegativeBackoffMin":       {RetryBackoffMin: -time.Second},
		"NegativeBackoffMax":       {RetryBackoffMax: -time.Second},
		"MinAboveMax":              {RetryBackoffMin: 10 * time.Second, RetryBackoffMax: 5 * time.Second},
		"MinAboveTheDefaultMax":    {RetryBackoffMin: 2 * time.Minute},
		"BackoffBelowMillisecond":  {RetryBackoffMin: time.Microsecond},
		"BackoffAbove24h":          {RetryBackoffMax: 25 * time.Hour},
		"UnknownOnExhausted":       {OnExhausted: "explode"},
		"NegativeStateRetention":   {StateRetention: -time.Second},
		"BadBesideGoodMaxAttempts": {MaxAttempts: 3, RetryBackoffMin: -time.Second},
	}
	for name, p := range bad {
		if _, err := e.openCfg(pgtransport.Config{Policy: &p}); !errors.Is(err, pgtransport.ErrInvalidConfig) {
			e.t.Errorf("%s: open got %v, want ErrInvalidConfig", name, err)
		}
		if err := e.tr.SetPolicy(e.ctx(), p); !errors.Is(err, pgtransport.ErrInvalidConfig) {
			e.t.Errorf("%s: SetPolicy got %v, want ErrInvalidConfig", name, err)
		}
	}
	for name, cfg := range map[string]pgtransport.Config{"NegativeDedupWindow": {DedupWindow: -time.Second}, "DedupWindowAbove24h": {DedupWindow: 25 * time.Hour}} {
		if _, err := e.openCfg(cfg); !errors.Is(err, pgtransport.ErrInvalidConfig) {
			e.t.Errorf("%s: got %v, want ErrInvalidConfig", name, err)
		}
	}
	is.Equal(e.policy(), policy{pgtransport.DefaultMaxAttempts, "dead_letter", 1, 60}) // nothing written

	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: pgtransport.Unlimited}})
	is.Equal(e.policy(), policy{0, "dead_letter", 1, 60}) // 0: never dead-letter
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 3, OnExhausted: pgtransport.StopGroup, RetryBackoffMin: 2 * time.Second, RetryBackoffMax: 30 * time.Second}})
	is.Equal(e.policy(), policy{3, "stop", 2, 30})
	e.with(pgtransport.Config{})
	is.Equal(e.policy(), policy{3, "stop", 2, 30}) // no Policy: the stored one is left alone
	is.NoErr(e.tr.SetPolicy(e.ctx(), pgtransport.Policy{RetryBackoffMin: 5 * time.Millisecond}))
	is.Equal(e.policy(), policy{pgtransport.DefaultMaxAttempts, "dead_letter", 0.005, 60}) // whole: the zero fields are defaults again
	got, err := e.tr.Policy(e.ctx())
	is.NoErr(err)
	is.Equal(got, pgtransport.Policy{MaxAttempts: pgtransport.DefaultMaxAttempts, OnExhausted: pgtransport.DeadLetterHead, RetryBackoffMin: 5 * time.Millisecond, RetryBackoffMax: time.Minute}) // read back
}

// badDedupKeyWritesNothing: a dedup key too long, not UTF-8 or with a
// NUL is refused by every publish, before anything is written; so are the
// other bad fields of a Message and a Fail without a lease.
func badDedupKeyWritesNothing(is *is.I, e *env) {
	tx, err := e.db.Pool.Begin(e.ctx())
	is.NoErr(err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	keys := map[string]string{
		"TooLong":     strings.Repeat("k", pgtransport.MaxDedupKeyBytes+1),
		"InvalidUTF8": "a\xffb",
		"NUL":         "a\x00b",
	}
	for name, key := range keys {
		msg := pgtransport.Message{Group: "g", Event: "x", DedupKey: key}
		if _, err := e.tr.PublishMessage(e.ctx(), msg); !errors.Is(err, pgtransport.ErrInvalidDedupKey) {
			e.t.Errorf("PublishMessage, key %s: got %v, want ErrInvalidDedupKey", name, err)
		}
		if _, err := e.tr.PublishMessageTx(e.ctx(), tx, msg); !errors.Is(err, pgtransport.ErrInvalidDedupKey) {
			e.t.Errorf("PublishMessageTx, key %s: got %v, want ErrInvalidDedupKey", name, err)
		}
		if _, err := e.tr.PublishMany(e.ctx(), []pgtransport.Message{{Group: "g", Event: "fine", DedupKey: "fine"}, msg}); !errors.Is(err, pgtransport.ErrInvalidDedupKey) {
			e.t.Errorf("PublishMany, key %s: got %v, want ErrInvalidDedupKey", name, err)
		}
	}
	others := map[string]struct {
		msg  pgtransport.Message
		want error
	}{
		"EmptyGroup": {pgtransport.Message{Event: "x", DedupKey: "k"}, pgtransport.ErrInvalidGroup},
		"NULEvent":   {pgtransport.Message{Group: "g", Event: "\x00", DedupKey: "k"}, pgtransport.ErrInvalidEvent},
		"Priority9":  {pgtransport.Message{Group: "g", Event: "x", Priority: 9, DedupKey: "k"}, pgtransport.ErrInvalidPriority},
	}
	for name, o := range others {
		if _, err := e.tr.PublishMessage(e.ctx(), o.msg); !errors.Is(err, o.want) {
			e.t.Errorf("PublishMessage, %s: got %v, want %v", name, err, o.want)
		}
	}
	is.True(errors.Is(e.tr.Fail(e.ctx(), nil, errors.New("x")), pgtransport.ErrNilLease))
	is.NoErr(tx.Commit(e.ctx()))
	m, g := e.rows()
	is.Equal(m+g, 0) // nothing written
	is.Equal(e.count(`SELECT count(*) FROM transport_dedup`), 0)
	e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "x", DedupKey: strings.Repeat("k", pgtransport.MaxDedupKeyBytes)}) // the limit itself is fine
	is.Equal(e.count(`SELECT count(*) FROM transport_dedup`), 1)
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
	is.Equal(e.text(`SELECT last_error FROM transport_messages WHERE event = 'm1'`), "") // no cause recorded
	next, err := other.AckNext(e.ctx(), taken, time.Minute)                              // the holder still holds
	is.NoErr(err)
	is.Equal(next.Event, "m2")
	before = e.snapshot()
	lost(other, taken, "a kept lease's earlier message")
	is.NoErr(other.Ack(e.ctx(), next))
	before = e.snapshot()
	lost(other, next, "a settled lease")
}

// ackOfSeqNotHandedOutIsLost: under a valid token, a settling call that
// names a seq its claim did not hand out is ErrLeaseLost and changes
// nothing.
func ackOfSeqNotHandedOutIsLost(is *is.I, e *env) {
	e.publish("g", "m1", 0)
	s2, err := e.tr.Publish(e.ctx(), "g", "m2", 0)
	is.NoErr(err)
	l := e.claim("w", 0)
	is.Equal(l.Event, "m1")
	forged := *l
	forged.Seq, forged.Event = s2, "m2"
	before := e.snapshot()
	is.True(errors.Is(e.tr.Ack(e.ctx(), &forged), pgtransport.ErrLeaseLost)) // Ack
	errs, err := e.tr.AckMany(e.ctx(), []*pgtransport.Lease{&forged})
	is.NoErr(err)
	is.True(errors.Is(errs[0], pgtransport.ErrLeaseLost)) // AckMany
	_, err = e.tr.AckNext(e.ctx(), &forged, time.Minute)
	is.True(errors.Is(err, pgtransport.ErrLeaseLost))                                          // AckNext
	is.True(errors.Is(e.tr.Fail(e.ctx(), &forged, errors.New("x")), pgtransport.ErrLeaseLost)) // Fail
	is.Equal(e.snapshot(), before)                                                             // nothing changed
	e.ack(l)
	is.Equal(e.claim("w", 0).Event, "m2")
}
