package async

import (
	"time"

	"github.com/pgtransport/pgtransport/internal/core"
)

// phase is where a stream stands between claiming and sleeping. After a
// claim finds nothing the stream stops claiming (acks still settle, and
// keep hot groups): each claim walks the round-robin index. Before it
// sleeps it says it is idle (a waiter row, so publishers notify it, and a
// ticket in the Transport's parking) and claims once more; then it sleeps
// until a wake-up: a notification, a wake-up from this process, the
// earliest lease or park it saw running out, IdleSweep, or an ack of its
// own that freed a group.
type phase int

const (
	claiming phase = iota // claim with every round-trip
	arming                // arm, then claim once more
	dry                   // settle only, until a wake-up
)

// depth is how many round-trips a claiming stream keeps in flight, each on
// a connection of its own. While one is out, the next leaves once half of
// MaxInFlight has been acked, or as soon as the first comes back: the
// stream's leases go round in two halves, each settled and replaced while
// the other is being worked on. (Measured, 64 in flight on 2 cores: one
// round-trip at a time, 28k msgs/s; two, the second leaving at the first
// ack, 31k, in batches of 19 at 51 µs of CPU a message; two, the second
// leaving at half, 38k, in batches of 31 at 39 µs. A third costs more CPU
// than it saves.)
const depth = 2

// trip is what the stream's loop learns from a round-trip.
type trip struct {
	limit              int // claims asked for, kept leases included
	got, claims, freed int // leases added, of which claimed (not kept); acks that freed their group
	err                error
}

// idleState is the stream's claiming phase and what it has armed for
// sleeping: its waiter row and its parking ticket. It decides when a
// round-trip may leave, how much it may claim, when to arm and when to
// sleep, and for how long. Only the stream's loop uses it, so it holds no
// lock.
type idleState struct {
	notify bool          // the stream has a subscription, so arming writes a waiter row
	sweep  time.Duration // Config.IdleSweep
	ttl    time.Duration // how long a waiter row stands once written (waiterTTL)

	phase  phase
	armed  bool // our waiter row may exist
	looked bool // dry after arming and claiming once more: safe to sleep
	// notified: woken by a notification since the waiter row was last
	// written. A new group row may come leased (published and claimed in
	// one transaction), so an empty claim after it must learn that lease's
	// end (write the row again) before the stream sleeps.
	notified bool
	next     time.Time // the earliest lease or park the waiter row saw running out (zero: none)
	ticket   *core.Ticket

	// When the stream last armed (wrote its waiter row, or found it
	// standing and asked for the next expiry), the ticket taken, and the
	// last round-trip that claimed left: a claim that left after both saw
	// every group claimable before it, and the row and the ticket catch
	// those after it.
	armedAt, ticketAt, claimedAt time.Time
	rowAt                        time.Time // when the waiter row was last written
}

// mayLeave reports whether a round-trip may leave now, with flying out and
// queued acks waiting. While one is out, a second leaves only when the
// stream is claiming and half of maxInFlight is acked; arming and sleeping
// go one at a time, as they read the outcome.
func (w *idleState) mayLeave(flying, queued, maxInFlight int) bool {
	if flying == 0 {
		return true
	}
	return flying < depth && w.phase == claiming && queued >= max(maxInFlight/2, 1)
}

// sleeps decides, given acks to send and free slots, whether there is
// nothing to send: then the stream sleeps. A dry stream that has not
// looked since it armed arms and claims once more first, unless the last
// claim left after its row and its ticket were in place.
func (w *idleState) sleeps(acks, free int, now time.Time) bool {
	if acks == 0 && w.phase == dry && !w.looked && free > 0 {
		if w.armedNow(now) && w.ticket != nil && w.armedAt.Before(w.claimedAt) && w.ticketAt.Before(w.claimedAt) {
			w.looked = true
		} else {
			w.phase = arming
		}
	}
	return acks == 0 && (free == 0 || w.phase == dry)
}

// limit is how many leases a round-trip may claim with free slots. A dry
// stream settles (and keeps) only, unless an ack frees a group for sure
// (Core.ReleasesAny): then it claims, as that group may be claimable
// again. An ack whose keep yields to a waiting group frees one too; the
// stream learns it from the answer and claims on its next round-trip.
func (w *idleState) limit(free int, freesGroup bool) int {
	if w.phase == dry && !freesGroup {
		return 0
	}
	return free
}

// arms reports whether the stream must arm before a round-trip claiming
// limit: it is about to sleep, and this claim is its last look.
func (w *idleState) arms(limit int) bool { return w.phase == arming && limit > 0 }

// armedNow reports whether the waiter row still stands for the stream: it
// lives longer than any sleep (waiterTTL) if written within IdleSweep, and
// the next expiry it reported is still ahead. (With notifications off there
// is no row; the expiry still counts.)
func (w *idleState) armedNow(now time.Time) bool {
	fresh := now.Sub(w.armedAt) < w.sweep
	ahead := w.next.IsZero() || w.next.After(now)
	return (w.armed || !w.notify) && fresh && ahead
}

// rowStands reports whether the waiter row, written no earlier than
// rowAt, stands through anything the stream may do on an arming done now
// with a second to spare: it sleeps on it for up to IdleSweep while the
// arming is fresh (armedNow), so until 2 IdleSweeps from now at most.
// Then arming need not write the row again, only ask for the next expiry.
// (Under a held snapshot every write of the row leaves a version that each
// publisher's waiters check passes until the snapshot ends; a stream
// paced by its publisher wrote it about 15 times a second.)
func (w *idleState) rowStands(now time.Time) bool {
	return w.notify && w.armed && now.Sub(w.rowAt) < w.ttl-2*w.sweep-time.Second
}

// rowWritten records the arming answered at now: the waiter row written
// by a call that began at rowAt (zero: found standing, only the expiry
// asked for); in, if ok, is how long until the earliest lease or park it
// saw runs out.
func (w *idleState) rowWritten(now, rowAt time.Time, in time.Duration, ok bool) {
	w.armed, w.armedAt, w.notified = w.notify, now, false
	if !rowAt.IsZero() {
		w.rowAt = rowAt
	}
	w.next = time.Time{}
	if ok {
		w.next = now.Add(in)
	}
}

// retick swaps the ticket for t, taken at now: before the claim, so a
// wake-up after it is not lost.
func (w *idleState) retick(t *core.Ticket, now time.Time) {
	w.dropTicket()
	w.ticket, w.ticketAt = t, now
}

// dropTicket leaves the parking.
func (w *idleState) dropTicket() {
	if w.ticket != nil {
		w.ticket.Done()
		w.ticket = nil
	}
}

// sent records a round-trip leaving at now that claims limit.
func (w *idleState) sent(limit int, now time.Time) {
	if limit > 0 {
		w.claimedAt = now
	}
}

// landed takes in a round-trip's outcome, full telling whether every slot
// is now in use. A round-trip that claimed or freed something puts the
// stream back to claiming; one that claimed fewer than it asked makes it
// dry. A full stream needs no wake-ups: it leaves the parking and, if it
// claimed, reports unwait (withdraw the waiter row: publishers need not
// tell it).
func (w *idleState) landed(t trip, full bool) (unwait bool) {
	switch {
	case t.claims > 0 || t.freed > 0:
		w.phase, w.looked = claiming, false
		if !full {
			return false // room for more: still a waiter
		}
		if w.armed && t.claims > 0 {
			unwait, w.armed = true, false
		}
		w.dropTicket()
	case t.limit > t.got && w.phase == claiming:
		w.phase, w.looked = dry, false // no arming while acks keep the stream busy
	case t.limit > t.got && w.phase == arming && w.notified && t.got == 0:
		// A new group, and nothing to claim: it came leased, or another
		// consumer took it. Its lease's end is later news than the row's
		// last answer: arm again (its wait reports it) and claim
		// once more, or the stream would sleep past it until IdleSweep.
		w.notified, w.armedAt = false, time.Time{}
	case t.limit > t.got && w.phase == arming:
		w.phase, w.looked = dry, true
	}
	return unwait
}

// woken records a reason to claim again.
func (w *idleState) woken() { w.phase = arming }

// notifiedOf records a notification of a new group: a reason to claim
// again, and maybe (see notified) to write the waiter row again.
func (w *idleState) notifiedOf() { w.phase, w.notified = arming, true }

// wakeups returns the wake-up channels a sleep listens on: a dry stream
// wakes on a notification (sub, nil without) and on its ticket.
func (w *idleState) wakeups(sub <-chan struct{}) (notified, ticket <-chan struct{}) {
	if w.phase != dry {
		return nil, nil
	}
	if w.ticket != nil {
		ticket = w.ticket.C()
	}
	return sub, ticket
}

// sleepFor is how long a sleep lasts with deadline until a held lease
// lapses or one in C is due back: a dry stream also looks again after
// IdleSweep and once the earliest lease or park its row saw runs out.
func (w *idleState) sleepFor(deadline time.Duration, now time.Time) time.Duration {
	d := deadline
	if w.phase == dry {
		d = min(d, w.sweep)
		if !w.next.IsZero() {
			d = min(d, w.next.Sub(now)+time.Millisecond)
		}
	}
	return max(d, 0)
}
