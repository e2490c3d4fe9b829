package contract

import (
	"fmt"
	"slices"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// deadLettersCases: the dead letters' pages, and redrive and purge, by
// group, by seq or all.
var deadLettersCases = []testCase{
	{"RedrivePutsBackAtTheHeadInOrder", redrivePutsBackAtTheHeadInOrder},
	{"RedriveRacesPublishAndDrain", redriveRacesPublishAndDrain},
	{"PurgeDeadLetters", purgeDeadLetters},
	{"DeadLettersPaging", deadLettersPaging},
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
	is.Equal(e.valueAt("h", `SELECT priority FROM transport_groups WHERE group_id = 'h'`), 3)
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
	for r := range raceRoundsOn(e.n, 300) {
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

// deadLettersPaging: pages in seq order after a seq, per group or all:
// on partitions, over the two a and b are on, merged.
func deadLettersPaging(is *is.I, e *env) {
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1}})
	gs := e.spread("a", "b")
	a, b := gs[0], gs[1]
	var all, ofA []int64
	for i, g := range []string{a, b, a, b, a} {
		s, err := e.tr.Publish(e.ctx(), g, event(g, i), 0)
		is.NoErr(err)
		all = append(all, s)
		if g == a {
			ofA = append(ofA, s)
		}
	}
	is.True(e.risingPerPartition(all)) // in publish order within a partition: on one database, all of them
	all = slices.Sorted(slices.Values(all))
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
	is.Equal(seqs(e.deadLetters(pgtransport.DeadLetterQuery{Group: a})), ofA)
	is.Equal(seqs(e.deadLetters(pgtransport.DeadLetterQuery{Group: a, After: ofA[0], Limit: 1})), ofA[1:2])
	is.Equal(len(e.deadLetters(pgtransport.DeadLetterQuery{Group: "zzz"})), 0)
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
