package contract

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	stdsync "sync"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// claimCases: which group a claim leases, one holder per group, the
// round-robin and the priority floor, batches and waits, the lease's
// expiry and visibility. An order among groups holds among the groups of
// one partition: the cases that assert one place their groups on one
// (env.local).
var claimCases = []testCase{
	{"OneLeasePerGroup", oneLeasePerGroup},
	{"RoundRobinServesNeverServedGroupFirst", roundRobinServesNeverServedGroupFirst},
	{"NeverServedGroupsInArrivalOrder", neverServedGroupsInArrivalOrder},
	{"EndedLeaseIsClaimableAgain", endedLeaseIsClaimableAgain},
	{"RoundRobinRotatesThroughManyGroups", roundRobinRotatesThroughManyGroups},
	{"PriorityFloor", priorityFloor},
	{"ClaimManyLeasesDistinctGroups", claimManyLeasesDistinctGroups},
	{"ClaimWaitParksUntilWorkOrCtxEnds", claimWaitParksUntilWorkOrCtxEnds},
	{"ClaimCleansUpStaleEmptyGroupRow", claimCleansUpStaleEmptyGroupRow},
	{"ExpiryIsByTheLocalClock", expiryIsByTheLocalClock},
	{"VisibilityBelowFloorIsRefused", visibilityBelowFloorIsRefused},
	{"Stress", stress},
}

func oneLeasePerGroup(is *is.I, e *env) {
	gs := e.local("G", "H")
	G, H := gs[0], gs[1]
	e.publish(G, "g1", 0)
	e.publish(G, "g2", 0)
	e.publish(H, "h1", 0)
	g := e.claim("w1", 0)
	is.Equal(g.Group, G) // never-served groups in the order they arrived
	h := e.claim("w2", 0)
	is.Equal(h.Group, H)            // while G is leased, H is served
	is.Equal(e.claim("w3", 0), nil) // then nothing: G's second message waits for G's lease
	e.ack(g)
	next := e.claim("w3", 0)
	is.True(next != nil)           // ack freed G
	is.Equal(next.Event, "g2")     // with its next message
	is.True(next.Token != g.Token) // under a new token
}

func roundRobinServesNeverServedGroupFirst(is *is.I, e *env) {
	gs := e.local("a", "b", "c")
	a, b, c := gs[0], gs[1], gs[2]
	e.publish(a, "a1", 0)
	e.publish(a, "a2", 0)
	e.publish(b, "b1", 0)
	first := e.claim("w", 0)
	is.Equal(first.Group, a)
	e.clock.Advance(time.Millisecond)
	e.ack(first)
	e.clock.Advance(time.Millisecond)
	e.publish(c, "c1", 0)
	is.Equal(e.claim("w", 0).Group, b) // b and c were never served: they come before a
}

func neverServedGroupsInArrivalOrder(is *is.I, e *env) {
	gs := e.local("z", "a", "m")
	z, a, m := gs[0], gs[1], gs[2]
	e.publish(z, "z1", 0)
	e.publish(a, "a1", 0)
	e.publish(m, "m1", 0)
	is.Equal(e.claim("w", 0).Group, z) // first come, first served (until version 12: by group id)
	l := e.claim("w", 0)
	is.Equal(l.Group, a)
	is.NoErr(e.tr.Nack(e.ctx(), l, 0)) // given back with no delay:
	is.Equal(e.claim("w", 0).Group, a) // first in line again, before m
	is.Equal(e.claim("w", 0).Group, m)
}

// endedLeaseIsClaimableAgain: a lease that ended makes its group
// claimable again without an entry in the ready log, so the sweep finds
// it (see "Going round" in schema/sql/functions/30_claim.sql): after the
// groups freed through the log, before them or after, one lease at a time
// or in a batch, it is handed out once they are.
func endedLeaseIsClaimableAgain(is *is.I, e *env) {
	gs := e.local("early", "lapsed", "late", "last")
	early, lapsed, late, last := gs[0], gs[1], gs[2], gs[3]
	for _, g := range gs {
		e.publish(g, g+"1", 0)
		e.publish(g, g+"2", 0)
	}
	settle := func(group string) {
		l := e.claim("w", 0)
		is.Equal(l.Group, group)
		e.clock.Advance(time.Second)
		e.ack(l)
	}
	settle(early)
	held := e.claim("w", 0)
	is.Equal(held.Group, lapsed)
	is.NoErr(e.tr.Extend(e.ctx(), held, 1500*time.Millisecond)) // ends at t+2.5
	settle(late)
	settle(last)
	e.clock.Advance(time.Second) // t+4: all four claimable, the lease ended
	batch, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 2)
	is.NoErr(err)
	got := map[string]bool{}
	for _, l := range batch {
		got[l.Group] = true
	}
	is.Equal(got, map[string]bool{early: true, late: true}) // the log's, in the order they were freed
	is.Equal(e.claim("w", 0).Group, last)
	l := e.claim("w", 0)
	is.Equal(l.Group, lapsed) // the sweep's: the log had nothing left
	is.Equal(l.Seq, held.Seq) // its message again
}

func roundRobinRotatesThroughManyGroups(is *is.I, e *env) {
	const groups, per = 12, 3
	names := make([]string, groups)
	for g := range names {
		names[g] = fmt.Sprintf("g%02d", g)
	}
	names = e.local(names...)
	for m := range per {
		for _, g := range names {
			e.publish(g, event("m", m), 0)
		}
	}
	for i := range groups * per {
		e.clock.Advance(time.Millisecond)
		l := e.claim("w", 0)
		is.Equal(l.Group, names[i%groups])      // every group once per pass, same order each pass
		is.Equal(l.Event, event("m", i/groups)) // and each group in FIFO order
		e.ack(l)
	}
}

// priorityFloor: a claim's floor admits the groups at or above it, on
// every partition (the three groups are on three).
func priorityFloor(is *is.I, e *env) {
	gs := e.spread("low", "mid", "high")
	low, mid, high := gs[0], gs[1], gs[2]
	e.publish(low, "l1", 0)
	e.publish(mid, "m1", 2)
	e.publish(high, "h1", 4)
	is.Equal(e.claim("w", 3).Group, high)
	is.Equal(e.claim("w", 3), nil)       // nothing else at 3 or above
	is.Equal(e.claim("w", 1).Group, mid) // floor 1 admits mid
	is.Equal(e.claim("w", 0).Group, low) // floor 0 admits all
}

// claimManyLeasesDistinctGroups: a batch leases distinct groups, each to
// one holder.
func claimManyLeasesDistinctGroups(is *is.I, e *env) {
	for g := range 5 {
		e.publish(fmt.Sprint("g", g), "first", 0)
		e.publish(fmt.Sprint("g", g), "second", 0)
	}
	first, err := e.tr.ClaimMany(e.ctx(), "w1", time.Minute, 0, 3)
	is.NoErr(err)
	is.Equal(len(first), 3)
	rest, err := e.tr.ClaimMany(e.ctx(), "w2", time.Minute, 0, 10)
	is.NoErr(err)
	is.Equal(len(rest), 2) // only the groups w1 does not hold
	seen := map[string]bool{}
	for _, l := range append(first, rest...) {
		is.True(!seen[l.Group]) // no group twice
		seen[l.Group] = true
		is.Equal(l.Event, "first") // each group's head
	}
	none, err := e.tr.ClaimMany(e.ctx(), "w3", time.Minute, 0, 10)
	is.NoErr(err)
	is.Equal(len(none), 0)
	errs, err := e.tr.AckMany(e.ctx(), first)
	is.NoErr(err)
	is.Equal(errs, []error{nil, nil, nil})
	again, err := e.tr.ClaimMany(e.ctx(), "w3", time.Minute, 0, 10)
	is.NoErr(err)
	is.Equal(len(again), 3)
	for _, l := range again {
		is.Equal(l.Event, "second") // acked heads are gone, the next ones follow
	}
}

func claimWaitParksUntilWorkOrCtxEnds(is *is.I, e *env) {
	got := make(chan *pgtransport.Lease, 1)
	go func() {
		l, err := e.tr.ClaimWait(e.ctx(), "w", time.Minute, 0)
		if err != nil {
			e.t.Error(err)
		}
		got <- l
	}()
	e.waitParked()
	e.publish("g", "e", 0)
	select {
	case l := <-got:
		is.Equal(l.Event, "e")
	case <-time.After(30 * time.Second):
		e.t.Fatal("ClaimWait never woke")
	}
	ctx, cancel := context.WithTimeout(e.ctx(), 100*time.Millisecond)
	defer cancel()
	l, err := e.tr.ClaimWait(ctx, "w", time.Minute, 0)
	is.True(l == nil)
	is.True(errors.Is(err, context.DeadlineExceeded)) // ctx's end, not a nil lease
}

// claimCleansUpStaleEmptyGroupRow: a group row without a message (a
// plain-SQL client's) is skipped and deleted by the claim that reaches
// it: on partitions, one of its own partition's, which zzz shares.
func claimCleansUpStaleEmptyGroupRow(is *is.I, e *env) {
	gs := e.local("aaa-stale", "zzz")
	stale, zzz := gs[0], gs[1]
	e.execAt(stale, `INSERT INTO transport_groups (group_id) VALUES ($1)`, stale)
	e.publish(zzz, "z1", 0)
	l := e.claim("w", 0)
	is.Equal(l.Group, zzz)                                                                   // the stale row (first in line) was skipped
	is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE group_id = $1`, stale), 0) // and deleted
}

// expiryIsByTheLocalClock: Lease.Expiry is by this process's clock, even
// when the clock the statements use (here the injected one, standing for
// the server's) is an hour off: time.Until(Expiry) is the time the lease
// has left. The first claim must be a's, and b and c are published after
// AckNext keeps it (a keep yields to a waiting group): a, b and c share a
// partition.
func expiryIsByTheLocalClock(is *is.I, e *env) {
	const vis = time.Minute
	within := func(l *pgtransport.Lease, what string) {
		e.t.Helper()
		left := time.Until(l.Expiry)
		if left <= 0 || left > vis {
			e.t.Errorf("%s: time.Until(Expiry) = %v, want within (0, %v]", what, left, vis)
		}
	}
	gs := e.local("a", "b", "c")
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		e.clock.Advance(time.Now().Add(skew).Sub(e.clock.Now())) // the "server" is skew off
		e.publish(gs[0], "a1", 0)
		e.publish(gs[0], "a2", 0)

		l, err := e.tr.Claim(e.ctx(), "w", vis, 0)
		is.NoErr(err)
		within(l, "Claim")
		next, err := e.tr.AckNext(e.ctx(), l, vis)
		is.NoErr(err)
		is.True(next != nil) // a2 under the same lease
		within(next, "AckNext")
		e.publish(gs[1], "b1", 0)
		e.publish(gs[2], "c1", 0)
		is.NoErr(e.tr.Ack(e.ctx(), next))

		many, err := e.tr.ClaimMany(e.ctx(), "w", vis, 0, 1)
		is.NoErr(err)
		is.Equal(len(many), 1)
		within(many[0], "ClaimMany")
		is.NoErr(e.tr.Ack(e.ctx(), many[0]))

		waited, err := e.tr.ClaimWait(e.ctx(), "w", vis, 0)
		is.NoErr(err)
		within(waited, "ClaimWait")
		is.NoErr(e.tr.Ack(e.ctx(), waited))
		m, g := e.rows()
		is.Equal(m+g, 0) // all settled
	}
}

// visibilityBelowFloorIsRefused: a visibility below MinVisibility is
// refused by every method that takes one, before anything is sent;
// MinVisibility itself is accepted.
func visibilityBelowFloorIsRefused(is *is.I, e *env) {
	e.publish("g", "g1", 0)
	e.publish("g", "g2", 0)
	lease := e.claim("w", 0)
	for _, vis := range []time.Duration{time.Nanosecond, time.Millisecond, pgtransport.MinVisibility - time.Nanosecond} {
		calls := map[string]func() error{
			"Claim": claimErr(e, context.Background(), "w", vis, 0),
			"ClaimMany": func() error {
				_, err := e.tr.ClaimMany(e.ctx(), "w", vis, 0, 10)
				return err
			},
			"ClaimWait": func() error { // accepted, it would wait for work: fail fast
				ctx, cancel := context.WithTimeout(e.ctx(), 5*time.Second)
				defer cancel()
				_, err := e.tr.ClaimWait(ctx, "w", vis, 0)
				return err
			},
			"AckNext": func() error {
				_, err := e.tr.AckNext(e.ctx(), lease, vis)
				return err
			},
			"Extend": func() error { return e.tr.Extend(e.ctx(), lease, vis) },
		}
		for name, call := range calls {
			if err := call(); !errors.Is(err, pgtransport.ErrInvalidVisibility) {
				e.t.Errorf("%s with visibility %v: got %v, want ErrInvalidVisibility", name, vis, err)
			}
		}
	}
	m, g := e.rows()
	is.Equal(m, 2) // nothing acked
	is.Equal(g, 1)
	is.NoErr(e.tr.Extend(e.ctx(), lease, pgtransport.MinVisibility)) // the floor itself is fine
	next, err := e.tr.AckNext(e.ctx(), lease, pgtransport.MinVisibility)
	is.NoErr(err)
	is.Equal(next.Event, "g2") // the lease still held, and moved on
	is.NoErr(e.tr.Ack(e.ctx(), next))
}

// stress: eight workers on transports of their own: every message once
// acked, per-group order, one holder per group, from every partition.
func stress(is *is.I, e *env) {
	const workers, groups, per = 8, 40, 15
	for m := range per {
		for g := range groups {
			e.publish(fmt.Sprintf("g%d", g), event("m", m), 0)
		}
	}
	var (
		mu     stdsync.Mutex
		holder = map[string]string{}
		next   = map[string]int{}
		parts  = map[int]bool{}
		acked  int
		errs   = make(chan error, workers)
		wg     stdsync.WaitGroup
	)
	for w := range workers {
		tr := e.open()
		wg.Go(func() {
			errs <- func() error {
				id := fmt.Sprintf("w%d", w)
				for {
					l, err := tr.Claim(e.ctx(), id, time.Minute, 0)
					if err != nil {
						return err
					}
					if l == nil {
						return nil
					}
					mu.Lock()
					if h := holder[l.Group]; h != "" {
						mu.Unlock()
						return fmt.Errorf("group %s held by %s and %s at once", l.Group, h, id)
					}
					holder[l.Group] = id
					if want := event("m", next[l.Group]); l.Event != want {
						mu.Unlock()
						return fmt.Errorf("group %s: got %s, want %s", l.Group, l.Event, want)
					}
					next[l.Group]++
					parts[e.partOf(l.Seq)] = true
					mu.Unlock()
					runtime.Gosched() // the handler; another worker's claim lands here if exclusion is broken
					// Released just before the ack is sent: [claim returned, ack sent]
					// lies inside the server-side lease, so overlap here is a real double holder.
					mu.Lock()
					delete(holder, l.Group)
					mu.Unlock()
					if err := tr.Ack(e.ctx(), l); err != nil {
						return err
					}
					mu.Lock()
					acked++
					mu.Unlock()
				}
			}()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		is.NoErr(err)
	}
	is.Equal(acked, groups*per) // every message delivered and acked exactly once
	for g := range groups {
		is.Equal(next[fmt.Sprintf("g%d", g)], per)
	}
	is.Equal(len(parts), e.n) // from every partition
	m, g := e.rows()
	is.Equal(m+g, 0)
}
