package async

import "time"

// gate holds a stream's claims back once it has had to give leases back.
// A lease is given back when it waited in C, unreceived, for half its
// visibility: the receivers are not keeping up. Claiming into the slots
// that freed would only take the same groups again (a group given back is
// first in line) and give them back again half a visibility later, while
// other consumers that could work on them never get the chance. So after
// a give-back the stream claims nothing until it sees a receiver at work:
// a lease taken out of C, or one of its leases settled (acked, nacked) or
// lapsed. A receiver may also be waiting on an empty C, which nothing
// shows: so once C is empty and the probe time has passed, the stream
// claims one lease at a time, which such a receiver takes at once, and
// that opens the gate.
//
// The stream's mutex guards it (C's length and the ledger's count of
// dropped leases are read under it).
type gate struct {
	shut  bool
	inC   int       // leases in C since it shut: there then, and put since
	gone  int       // the ledger's dropped leases when it shut
	probe time.Time // from then, with C empty, one lease at a time
	wait  time.Duration
}

// close shuts the gate at now, after a give-back that left inC leases in
// C and the ledger at gone dropped leases; a receiver waiting on an empty
// C is probed for after wait.
func (g *gate) close(now time.Time, inC, gone int, wait time.Duration) {
	*g = gate{shut: true, inC: inC, gone: gone, probe: now.Add(wait), wait: wait}
}

// put records n leases put in C.
func (g *gate) put(n int) {
	if g.shut {
		g.inC += n
	}
}

// limit is how many of free slots a round-trip sent at now may claim, with
// lenC leases in C and the ledger at gone dropped leases.
func (g *gate) limit(free, lenC, gone int, now time.Time) int {
	switch {
	case !g.shut:
		return free
	case lenC < g.inC || gone > g.gone: // a receiver took one, or settled one
		g.shut = false
		return free
	case lenC == 0 && !now.Before(g.probe):
		return min(free, 1)
	}
	return 0
}

// wakeAt is when the loop must look again, at now: with C empty, to
// probe; with leases in C, every wait, to see whether a receiver took one
// (taking from C wakes nothing); zero if the gate is open.
func (g *gate) wakeAt(lenC int, now time.Time) time.Time {
	switch {
	case !g.shut:
		return time.Time{}
	case lenC > 0:
		return now.Add(g.wait)
	}
	return g.probe
}
