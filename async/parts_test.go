package async

// Table tests of the stream's parts: none needs a database
// (go test -run 'TestLedger|TestAckBatcher|TestIdleState' ./async/).

import (
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func lease(token, group string, seq int64) *pgtransport.Lease {
	return &pgtransport.Lease{Token: token, Group: group, Seq: seq}
}

// claim books a round-trip that claimed ls into n reserved slots, at t0
// with a minute's visibility.
func claim(g *ledger, n int, ls ...*pgtransport.Lease) []*pgtransport.Lease {
	return g.land(nil, ls, n, t0.Add(time.Minute), t0.Add(30*time.Second))
}

func TestLedger(t *testing.T) {
	a, b, c, d := lease("t1", "a", 1), lease("t1", "b", 1), lease("t1", "c", 1), lease("t1", "d", 1)
	e, f := lease("t2", "e", 1), lease("t2", "f", 1)
	cases := []struct {
		name                       string
		do                         func(is *is.I, g *ledger)
		used, free, held, settling int
	}{
		{
			name: "settling a kept lease's earlier message elsewhere frees no slot",
			do: func(is *is.I, g *ledger) {
				g.reserve(1)
				claim(g, 1, a)
				next := lease("t1", "a", 2) // AckNext kept group a: same key, next message
				is.True(g.extend(keyOf(a), next, time.Now().Add(time.Minute)))
				is.True(!g.release(a))   // a stale second ack of a: not what is held
				is.True(g.release(next)) // the message held now
			},
			used: 0, free: 4,
		},
		{
			name: "a round-trip in flight holds its slots",
			do:   func(is *is.I, g *ledger) { g.reserve(3) },
			used: 3, free: 1,
		},
		{
			name: "a claim that brings fewer returns the rest",
			do: func(is *is.I, g *ledger) {
				g.reserve(4)
				is.Equal(len(claim(g, 4, a, b)), 2) // both delivered
			},
			used: 2, free: 2, held: 2,
		},
		{
			name: "acks in a round-trip free their slots for the next one",
			do: func(is *is.I, g *ledger) {
				g.reserve(4)
				claim(g, 4, a, b, c, d)
				is.Equal(g.admit(a), queueAck) // a
				is.Equal(g.admit(b), queueAck) // b
				g.settle([]*pgtransport.Lease{a, b}, true)
			},
			used: 2, free: 2, held: 4, settling: 2,
		},
		{
			name: "two overlapping round-trips never claim past MaxInFlight",
			do: func(is *is.I, g *ledger) {
				g.reserve(4)
				claim(g, 4, a, b, c, d)
				g.admit(a)
				g.admit(b)
				g.settle([]*pgtransport.Lease{a, b}, true)
				g.reserve(g.free()) // the first round-trip: settles a, b, claims 2
				is.Equal(g.free(), 0)
				g.admit(c)
				g.settle([]*pgtransport.Lease{c}, true)
				g.reserve(g.free()) // the second leaves before the first is back
				is.Equal(g.free(), 0)
				g.land([]core.Settled{{Lease: a}, {Lease: b}}, []*pgtransport.Lease{e, f}, 2, t0, t0)
				is.Equal(g.free(), 0) // the second's slot is still reserved
				g.land([]core.Settled{{Lease: c}}, nil, 1, t0, t0)
			},
			used: 3, free: 1, held: 3,
		},
		{
			name: "a kept group's next message takes its slot",
			do: func(is *is.I, g *ledger) {
				g.reserve(1)
				claim(g, 1, a)
				g.admit(a)
				g.settle([]*pgtransport.Lease{a}, true)
				next := lease("t1", "a", 2)
				fresh := g.land([]core.Settled{{Lease: a, Next: next}}, nil, 0, t0, t0)
				is.Equal(fresh, []*pgtransport.Lease{next})      // delivered
				is.Equal(g.held[keyOf(a)].lease, next)           // held under the same key
				is.Equal(g.admit(lease("t1", "a", 2)), queueAck) // the next one may be acked
				is.Equal(g.admit(lease("t1", "a", 1)), lostAck)  // the earlier one is gone
				is.Equal(g.admit(lease("t1", "zz", 1)), notHeld) // never ours
				is.Equal(g.admit(lease("t1", "a", 2)), lostAck)  // twice
			},
			used: 1, free: 3, held: 1,
		},
		{
			name: "an ack the database refused may be sent again",
			do: func(is *is.I, g *ledger) {
				g.reserve(1)
				claim(g, 1, a)
				g.admit(a)
				g.settle([]*pgtransport.Lease{a}, true)
				g.refuse([]*pgtransport.Lease{a})
				is.Equal(g.admit(a), queueAck) // held as before
			},
			used: 1, free: 3, held: 1,
		},
		{
			name: "a failed round-trip gives its slots and acks back",
			do: func(is *is.I, g *ledger) {
				g.reserve(1)
				claim(g, 1, a)
				g.admit(a)
				g.settle([]*pgtransport.Lease{a}, true)
				g.reserve(3)
				g.unreserve(3)
				g.settle([]*pgtransport.Lease{a}, false)
			},
			used: 1, free: 3, held: 1,
		},
		{
			name: "lapsed leases leave, settling or not",
			do: func(is *is.I, g *ledger) {
				g.reserve(3)
				claim(g, 3, a, b, c)
				g.extend(keyOf(c), nil, t0.Add(time.Hour))
				g.admit(a)
				g.settle([]*pgtransport.Lease{a}, true)
				is.Equal(len(g.expire(t0.Add(time.Minute))), 2) // a and b
			},
			used: 1, free: 3, held: 1,
		},
		{
			name: "a nack or another transport's ack frees the slot",
			do: func(is *is.I, g *ledger) {
				g.reserve(2)
				claim(g, 2, a, b)
				is.True(g.drop(keyOf(a)))  // held
				is.True(!g.drop(keyOf(a))) // no longer
			},
			used: 1, free: 3, held: 1,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			g := newLedger(4)
			tc.do(is, &g)
			is.Equal(g.used(), tc.used)       // slots in use
			is.Equal(g.free(), tc.free)       // slots free
			is.Equal(len(g.held), tc.held)    // leases held
			is.Equal(g.settling, tc.settling) // acks in a round-trip
			is.Equal(g.full(), tc.free == 0)  // full when nothing is free
			is.True(g.used() <= g.max)        // never past MaxInFlight
		})
	}
}

func TestLedgerDeadlines(t *testing.T) {
	is := is.New(t)
	g := newLedger(4)
	is.Equal(g.nextDeadline(t0), t0.Add(time.Hour)) // nothing held: an hour
	a, b := lease("t", "a", 1), lease("t", "b", 1)
	g.reserve(2)
	claim(&g, 2, a, b)
	is.Equal(g.nextDeadline(t0), t0.Add(30*time.Second)) // half the visibility: due back from C
	now := t0.Add(30 * time.Second)
	is.True(g.stale(a, now))                           // unreceived for half its visibility
	is.True(!g.stale(a, now.Add(-time.Nanosecond)))    // not before
	is.True(!g.stale(lease("t", "zz", 1), now))        // not ours
	g.received(now)                                    // a and b are with receivers
	is.True(!g.stale(a, now))                          // never given back from a receiver
	is.Equal(g.nextDeadline(now), t0.Add(time.Minute)) // the lapse is next
	is.True(g.extend(keyOf(a), nil, t0.Add(2*time.Minute)))
	is.True(!g.extend(keyOf(lease("t", "zz", 1)), nil, now))
	is.Equal(len(g.expire(t0.Add(time.Minute))), 1) // b lapsed; a was extended
}

func TestAckBatcher(t *testing.T) {
	is := is.New(t)
	var b ackBatcher
	a, c, d := lease("t", "a", 1), lease("t", "c", 1), lease("t", "d", 1)
	da := b.add(a)
	b.add(c)
	is.Equal(b.len(), 2)
	acks, alone := b.take()
	is.True(!alone)
	is.Equal(leasesOf(acks), []*pgtransport.Lease{a, c}) // oldest first
	is.Equal(b.len(), 0)                                 // all handed out
	b.add(d)
	b.requeue(acks) // the round-trip failed
	again, _ := b.take()
	is.Equal(leasesOf(again), []*pgtransport.Lease{a, c, d}) // ahead of later acks
	answer(acks, pgtransport.ErrInvalidBatch)
	is.True(errors.Is(<-da, pgtransport.ErrInvalidBatch)) // each caller answered once

	// A batch refused for good: each of its acks is then settled alone,
	// ahead of the acks that came since, which still go together.
	for i := range again[:2] {
		again[i].alone = true
	}
	b.requeue(again[:2])
	e := lease("t", "e", 1)
	b.add(e)
	one, alone := b.take()
	is.True(alone)
	is.Equal(leasesOf(one), []*pgtransport.Lease{a})
	one, alone = b.take()
	is.True(alone)
	is.Equal(leasesOf(one), []*pgtransport.Lease{c})
	rest, alone := b.take()
	is.True(!alone)
	is.Equal(leasesOf(rest), []*pgtransport.Lease{e}) // then the batch
	is.Equal(b.len(), 0)

	b.add(a)
	is.Equal(len(b.close()), 1) // the rest, at the stop
	is.True(b.closed)           // and no more
}

// TestGate: after a give-back the stream claims nothing until a receiver
// takes a lease from C or settles one; with C empty it probes with one
// lease at a time once the probe time has passed.
func TestGate(t *testing.T) {
	is := is.New(t)
	var g gate
	is.Equal(g.limit(4, 0, 0, t0), 4) // open: every free slot
	is.True(g.wakeAt(0, t0).IsZero()) // and no wake-up of its own
	g.close(t0, 2, 10, time.Second)   // two left in C, ten dropped so far
	is.Equal(g.limit(4, 2, 10, t0), 0)
	is.Equal(g.wakeAt(2, t0), t0.Add(time.Second)) // C not empty: look again then, for a receiver's take
	g.put(1)
	is.Equal(g.limit(4, 3, 10, t0), 0)                  // what we put is no sign of a receiver
	is.Equal(g.limit(4, 2, 10, t0), 4)                  // one taken out of C: open
	g.close(t0, 0, 10, time.Second)                     // C empty
	is.Equal(g.wakeAt(0, t0), t0.Add(time.Second))      // a probe is due then
	is.Equal(g.limit(4, 0, 10, t0), 0)                  // not yet
	is.Equal(g.limit(4, 0, 10, t0.Add(time.Second)), 1) // one at a time
	g.put(1)
	is.Equal(g.limit(4, 1, 10, t0.Add(2*time.Second)), 0) // the probe waits in C
	is.Equal(g.limit(4, 1, 11, t0.Add(2*time.Second)), 4) // a lease settled: open
}

// TestAnswerInDoubt: an ack whose earlier attempt lost its reply is never
// answered a plain error (it may have applied), nor one that says lost.
func TestAnswerInDoubt(t *testing.T) {
	is := is.New(t)
	plain := ackRequest{done: make(chan error, 1)}
	doubt := ackRequest{done: make(chan error, 1), doubt: true}
	refused := errors.New("refused")
	answer([]ackRequest{plain, doubt}, refused)
	is.Equal(<-plain.done, refused)                                 // as it came
	is.True(errors.Is(<-doubt.done, pgtransport.ErrOutcomeUnknown)) // in doubt, said so
	answer([]ackRequest{doubt}, nil)
	is.NoErr(<-doubt.done) // settled is settled
}

func TestIdleState(t *testing.T) {
	now := t0.Add(time.Hour)
	t.Run("mayLeave", func(t *testing.T) {
		cases := []struct {
			name                     string
			phase                    phase
			flying, queued, inFlight int
			want                     bool
		}{
			{"nothing in flight", dry, 0, 0, 64, true},
			{"second before half is acked", claiming, 1, 31, 64, false},
			{"second at half acked", claiming, 1, 32, 64, true},
			{"second with MaxInFlight 1 at one ack", claiming, 1, 1, 1, true},
			{"no third", claiming, 2, 64, 64, false},
			{"arming goes one at a time", arming, 1, 64, 64, false},
			{"dry goes one at a time", dry, 1, 64, 64, false},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				is := is.New(t)
				w := idleState{phase: tc.phase}
				is.Equal(w.mayLeave(tc.flying, tc.queued, tc.inFlight), tc.want)
			})
		}
	})
	t.Run("landed", func(t *testing.T) {
		cases := []struct {
			name       string
			phase      phase
			armed      bool
			t          trip
			full       bool
			wantPhase  phase
			wantLooked bool
			wantUnwait bool
			wantTicket bool
		}{
			{"a claim keeps it claiming", dry, false, trip{limit: 4, got: 4, claims: 4}, false, claiming, false, false, true},
			{"an ack that freed a group too", dry, false, trip{freed: 1}, false, claiming, false, false, true},
			{"full and armed: withdraw the row", arming, true, trip{limit: 4, got: 4, claims: 4}, true, claiming, false, true, false},
			{"full by keeps only: the row stays", arming, true, trip{limit: 4, got: 4, freed: 1}, true, claiming, false, false, false},
			{"a short claim makes it dry", claiming, false, trip{limit: 4, got: 2}, false, dry, false, false, true},
			{"the look after arming: safe to sleep", arming, true, trip{limit: 4}, false, dry, true, false, true},
			{"settle only: no change", dry, true, trip{}, false, dry, false, false, true},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				is := is.New(t)
				var p core.Parking
				w := idleState{phase: tc.phase, armed: tc.armed, ticket: p.Ticket()}
				is.Equal(w.landed(tc.t, tc.full), tc.wantUnwait) // unwait
				is.Equal(w.phase, tc.wantPhase)                  // phase
				is.Equal(w.looked, tc.wantLooked)                // looked
				is.Equal(w.ticket != nil, tc.wantTicket)         // parked
				if tc.wantUnwait {
					is.True(!w.armed) // the row is withdrawn
				}
			})
		}
	})
	t.Run("NotifiedEmptyClaimArmsAgain", func(t *testing.T) {
		is := is.New(t)
		w := idleState{phase: dry, notify: true, sweep: time.Minute}
		w.rowWritten(now, now, 0, false) // armed, no lease seen
		w.notifiedOf()                   // a new group, which came leased
		is.Equal(w.phase, arming)
		is.True(w.armedNow(now)) // the row stands: this claim goes without a write
		w.landed(trip{limit: 4}, false)
		is.Equal(w.phase, arming)                                  // nothing to claim: not dry yet
		is.True(!w.armedNow(now))                                  // armed again (the expiry asked for), to learn the new lease's end
		w.rowWritten(now, time.Time{}, 100*time.Millisecond, true) // asked again; the row stands
		w.landed(trip{limit: 4}, false)
		is.Equal(w.phase, dry) // then it sleeps
		is.True(w.looked)
		is.Equal(w.sleepFor(time.Hour, now), 101*time.Millisecond) // until that lease's end, not IdleSweep
	})
	t.Run("sleeps", func(t *testing.T) {
		armed := func(w *idleState) { // row and ticket in place before the last claim left
			w.armed, w.armedAt, w.ticketAt, w.claimedAt = true, now.Add(-3*time.Millisecond), now.Add(-2*time.Millisecond), now.Add(-time.Millisecond)
			w.ticket = (&core.Parking{}).Ticket()
		}
		cases := []struct {
			name       string
			phase      phase
			looked     bool
			setup      func(*idleState)
			acks, free int
			want       bool
			wantPhase  phase
			wantLooked bool
		}{
			{"acks to send", dry, true, nil, 1, 4, false, dry, true},
			{"claiming with room", claiming, false, nil, 0, 4, false, claiming, false},
			{"claiming and full: wait for a slot", claiming, false, nil, 0, 0, true, claiming, false},
			{"dry and looked: sleep", dry, true, nil, 0, 4, true, dry, true},
			{"dry, not armed: arm and look once more", dry, false, nil, 0, 4, false, arming, false},
			{"dry, armed before the last claim: sleep", dry, false, armed, 0, 4, true, dry, true},
			{"dry, row too old: arm again", dry, false, func(w *idleState) { armed(w); w.armedAt = now.Add(-2 * time.Second) }, 0, 4, false, arming, false},
			{"dry, expiry passed: arm again", dry, false, func(w *idleState) { armed(w); w.next = now }, 0, 4, false, arming, false},
			{"dry, claim before the ticket: arm again", dry, false, func(w *idleState) { armed(w); w.claimedAt = w.ticketAt }, 0, 4, false, arming, false},
			{"dry and full: sleep", dry, false, nil, 0, 0, true, dry, false},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				is := is.New(t)
				w := idleState{notify: true, sweep: time.Second, phase: tc.phase, looked: tc.looked}
				if tc.setup != nil {
					tc.setup(&w)
				}
				is.Equal(w.sleeps(tc.acks, tc.free, now), tc.want) // sleeps
				is.Equal(w.phase, tc.wantPhase)                    // phase
				is.Equal(w.looked, tc.wantLooked)                  // looked
			})
		}
	})
	t.Run("arming", func(t *testing.T) {
		is := is.New(t)
		var p core.Parking
		w := idleState{notify: true, sweep: time.Second, phase: dry}
		is.Equal(w.limit(4, false), 0) // dry: settle only
		is.Equal(w.limit(4, true), 4)  // unless an ack frees a group
		is.True(!w.arms(4))            // dry does not arm
		w.woken()                      // a reason to claim
		is.True(w.arms(4))             // arming, with room to claim
		is.True(!w.arms(0))            // nothing to claim: no arming
		is.True(!w.armedNow(now))      // no row yet
		w.ttl = 7 * time.Second
		w.rowWritten(now, now, time.Minute, true)
		is.True(w.armedNow(now))                   // written now
		is.True(!w.armedNow(now.Add(time.Second))) // older than IdleSweep
		is.Equal(w.next, now.Add(time.Minute))     // the earliest expiry it saw
		// A row that stands through the next sleep is not written again:
		// arming only asks for the expiry (written false), which leaves
		// the row's time as it was.
		is.True(w.rowStands(now.Add(3900 * time.Millisecond))) // 7 s TTL: stands through 2 s of arming and sleep, a second to spare
		is.True(!w.rowStands(now.Add(4 * time.Second)))        // would lapse within a second of that
		w.rowWritten(now.Add(2*time.Second), time.Time{}, 0, false)
		is.True(w.armedNow(now.Add(2 * time.Second)))   // armed again
		is.True(!w.rowStands(now.Add(4 * time.Second))) // but the row is as old as before
		w.armed = false                                 // withdrawn (Unwait)
		is.True(!w.rowStands(now))                      // must be written
		first := p.Ticket()
		w.retick(first, now)
		w.retick(p.Ticket(), now)
		p.Wake(1)
		select {
		case <-first.C():
			t.Fatal("the old ticket is still parked")
		case <-w.ticket.C(): // the new one is the only one
		}
		w.sent(0, now.Add(time.Second))
		is.Equal(w.claimedAt, time.Time{}) // a settle-only round-trip claims nothing
		w.sent(4, now)
		is.Equal(w.claimedAt, now) // claimed
	})
	t.Run("sleepFor", func(t *testing.T) {
		is := is.New(t)
		w := idleState{sweep: time.Second, phase: claiming}
		is.Equal(w.sleepFor(time.Hour, now), time.Hour) // full: until a deadline
		w.phase = dry
		is.Equal(w.sleepFor(time.Hour, now), time.Second) // dry: IdleSweep at most
		w.next = now.Add(100 * time.Millisecond)
		is.Equal(w.sleepFor(time.Hour, now), 101*time.Millisecond) // or just past the earliest expiry
		is.Equal(w.sleepFor(-time.Second, now), time.Duration(0))  // never negative
		sub := make(chan struct{})
		n, tk := w.wakeups(sub)
		is.True(n != nil && tk == nil) // dry: notifications; no ticket yet
		w.phase = claiming
		n, tk = w.wakeups(sub)
		is.True(n == nil && tk == nil) // only a dry stream wakes on them
	})
}
