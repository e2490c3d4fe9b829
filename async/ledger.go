package async

import (
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// leaseKey names a lease: a batch claim gives all its leases one token.
type leaseKey struct{ token, group string }

func keyOf(l *pgtransport.Lease) leaseKey { return leaseKey{l.Token, l.Group} }

// ledger is a stream's slot accounting: which leases it holds, and how many
// of its MaxInFlight slots are in use. A slot is in use from the moment a
// round-trip is sent that may fill it (reserved) until the lease in it is
// acked (its ack sent in a round-trip: settling), nacked, or runs out. So
// with two round-trips in flight the count stays exact: neither may claim
// into a slot the other may fill, and a slot whose ack is on its way is
// already free for the next claim. Since no more than MaxInFlight slots are
// ever in use, C (buffered to MaxInFlight) never blocks the stream.
//
// The ledger holds no lock: the stream's mutex guards it together with the
// stream's ackBatcher.
type ledger struct {
	max      int                  // MaxInFlight
	held     map[leaseKey]holding // leases claimed and not yet settled
	settling int                  // of held, those whose ack is in a round-trip
	reserved int                  // slots the round-trips in flight may fill
	gone     int                  // leases dropped so far (settled, given back, lapsed): the gate watches it
}

type holding struct {
	lease    *pgtransport.Lease
	lapses   time.Time // by this process's clock
	giveBack time.Time // if still unreceived in C then
	settling bool      // its ack is in a round-trip: its slot is counted free
	acked    bool      // its ack is queued or in a round-trip
}

func newLedger(max int) ledger { return ledger{max: max, held: map[leaseKey]holding{}} }

// used is how many slots are in use: leases held and not being settled,
// and those the round-trips in flight may bring.
func (g *ledger) used() int { return len(g.held) - g.settling + g.reserved }

// free is how many leases a round-trip sent now may claim.
func (g *ledger) free() int { return max(g.max-g.used(), 0) }

// full reports whether every slot is in use.
func (g *ledger) full() bool { return g.used() >= g.max }

// ackVerdict is what the ledger says of an ack of a lease the stream may hold.
type ackVerdict int

const (
	notHeld  ackVerdict = iota // not ours (any more): the caller acks on its own
	queueAck                   // ours: it joins the next round-trip
	lostAck                    // ours in another form: answered ErrLeaseLost at once
)

// admit decides on an ack of l. A lease the stream holds in another form
// (an earlier message of a kept group, under the same token) or one whose
// ack is already on its way is lostAck: sent, it would free a group the
// stream still holds. On queueAck the lease is marked acked.
func (g *ledger) admit(l *pgtransport.Lease) ackVerdict {
	k := keyOf(l)
	h, ok := g.held[k]
	switch {
	case !ok:
		return notHeld
	case h.acked || h.lease.Seq != l.Seq:
		return lostAck
	}
	h.acked = true
	g.held[k] = h
	return queueAck
}

// settle marks whether the acks of leases are in a round-trip (their slots
// counted free) or back in the queue.
func (g *ledger) settle(leases []*pgtransport.Lease, on bool) {
	for _, l := range leases {
		k := keyOf(l)
		if h, ok := g.held[k]; ok && h.settling != on {
			h.settling = on
			g.held[k] = h
			if on {
				g.settling++
			} else {
				g.settling--
			}
		}
	}
}

// refuse takes back acks the database refused for good (a malformed
// batch): the leases are held as before and may be acked again.
func (g *ledger) refuse(leases []*pgtransport.Lease) {
	g.settle(leases, false)
	for _, l := range leases {
		if h, ok := g.held[keyOf(l)]; ok {
			h.acked = false
			g.held[keyOf(l)] = h
		}
	}
}

// reserve sets n slots aside for a round-trip about to leave; land or
// unreserve returns them.
func (g *ledger) reserve(n int) { g.reserved += n }

// unreserve returns the n slots of a round-trip that failed.
func (g *ledger) unreserve(n int) { g.reserved -= n }

// land books a round-trip's outcome: the settled leases leave (a kept
// group's next message takes its place under the same key), claimed ones
// join, and the reserved slots are returned. It returns the leases to
// deliver, kept ones first.
func (g *ledger) land(settled []core.Settled, claimed []*pgtransport.Lease, reserved int, lapses, giveBack time.Time) []*pgtransport.Lease {
	var fresh []*pgtransport.Lease
	for _, st := range settled {
		g.drop(keyOf(st.Lease))
		if st.Next != nil {
			fresh = append(fresh, st.Next)
		}
	}
	fresh = append(fresh, claimed...)
	for _, l := range fresh {
		g.held[keyOf(l)] = holding{lease: l, lapses: lapses, giveBack: giveBack}
	}
	g.reserved -= reserved
	return fresh
}

// release forgets l if the stream holds it in that form (the same
// message: a kept group's earlier message shares its key, and settling
// that one elsewhere must not free the slot of the next); false if not.
func (g *ledger) release(l *pgtransport.Lease) bool {
	k := keyOf(l)
	if h, ok := g.held[k]; !ok || h.lease.Seq != l.Seq {
		return false
	}
	return g.drop(k)
}

// drop forgets a held lease; false if it was not held.
func (g *ledger) drop(k leaseKey) bool {
	h, ok := g.held[k]
	if !ok {
		return false
	}
	if h.settling {
		g.settling--
	}
	delete(g.held, k)
	g.gone++
	return true
}

// lapses returns when l, held in that form (the same message), lapses by
// this process's clock: never later than the database's end of the lease.
func (g *ledger) lapses(l *pgtransport.Lease) (time.Time, bool) {
	h, ok := g.held[keyOf(l)]
	if !ok || h.lease.Seq != l.Seq {
		return time.Time{}, false
	}
	return h.lapses, true
}

// expire drops the leases whose visibility ran out by now (their groups
// are claimable again, not ours) and returns their keys.
func (g *ledger) expire(now time.Time) []leaseKey {
	var gone []leaseKey
	for k, h := range g.held {
		if !h.lapses.After(now) {
			g.drop(k)
			gone = append(gone, k)
		}
	}
	return gone
}

// extend records that the lease k now holds until until and, if next is
// not nil, that it holds next's message (an AckNext kept its group under
// the same key); false if k is not held.
func (g *ledger) extend(k leaseKey, next *pgtransport.Lease, until time.Time) bool {
	h, ok := g.held[k]
	if !ok {
		return false
	}
	h.lapses = until
	if next != nil {
		h.lease, h.acked = next, false
	}
	g.held[k] = h
	return true
}

// nextDeadline is when a held lease next lapses or one waiting in C is due
// to be given back: at most an hour after now.
func (g *ledger) nextDeadline(now time.Time) time.Time {
	first := now.Add(time.Hour)
	for _, h := range g.held {
		first = minTime(first, minTime(h.lapses, h.giveBack))
	}
	return first
}

// nextGiveBack is when a lease still unreceived in C is next due to be
// given back (received ones have giveBack = lapses: see received): at most
// an hour after now.
func (g *ledger) nextGiveBack(now time.Time) time.Time {
	first := now.Add(time.Hour)
	for _, h := range g.held {
		if h.giveBack.Before(h.lapses) {
			first = minTime(first, h.giveBack)
		}
	}
	return first
}

// stale reports whether l, still unreceived in C, is due to be given back.
func (g *ledger) stale(l *pgtransport.Lease, now time.Time) bool {
	h, ok := g.held[keyOf(l)]
	return ok && !h.giveBack.After(now)
}

// received is called once the stale leases are out of C: every lease past
// its give-back time then is with a receiver, so none is given back again.
func (g *ledger) received(now time.Time) {
	for k, h := range g.held {
		if !h.giveBack.After(now) {
			h.giveBack = h.lapses
			g.held[k] = h
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
