package worker

import (
	"context"
	"errors"
	"time"

	"github.com/pgtransport/pgtransport"
)

// heartbeat is the runtime's one heartbeat goroutine: every third of the
// visibility it extends the leases of the running handlers that need it,
// all in one round-trip, until done is closed. A lease answered lost, or
// one whose extensions failed until it lapsed, is lost: its handler's ctx
// is cancelled at once and its result will be ignored.
func (r *runtime) heartbeat(done <-chan struct{}) {
	tick := time.NewTicker(r.cfg.Visibility / 3)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			r.beat(time.Now())
		}
	}
}

// due reports whether a lease that holds until until needs extending at a
// beat at now: once a sixth of the visibility is used. A lease not extended
// now has more than half of it left at the next beat (a third later), so
// it is extended then with room to spare; a handler that returns within a
// sixth of the visibility is never extended at all, so a busy runtime's
// heartbeats carry only its slow handlers, and seldom one whose handler
// returned (and acked it) while the heartbeat was on its way (answered
// lost, and not reported: beat reports only leases whose handler still
// runs).
func (r *runtime) due(until, now time.Time) bool {
	return until.Sub(now) < r.cfg.Visibility-r.cfg.Visibility/6
}

// beat is one heartbeat, at now.
func (r *runtime) beat(now time.Time) {
	var (
		runs   []*run
		leases []*pgtransport.Lease
	)
	r.mu.Lock()
	for w := range r.running {
		if !w.lost && w.until.After(now) && r.due(w.until, now) { // a lapsed one is its timer's (lapsed)
			runs = append(runs, w)
			leases = append(leases, w.lease)
		}
	}
	r.mu.Unlock()
	if len(runs) == 0 {
		return
	}
	// Bounded by the interval: a heartbeat that cannot get through in
	// time is late for the next one too.
	ctx, cancel := context.WithTimeout(r.base, r.cfg.Visibility/3)
	defer cancel()
	start := time.Now()
	errs, err := r.feed.Extend(ctx, leases, r.cfg.Visibility)
	if err != nil {
		r.log.Warn("pgtransport: heartbeat failed; the leases lapse unless a later one gets through",
			"worker", r.cfg.WorkerID, "leases", len(leases), "err", err)
		return
	}
	var lost []*pgtransport.Lease
	r.mu.Lock()
	for i, w := range runs {
		if _, ok := r.running[w]; !ok {
			continue // its handler returned meanwhile: settled or being settled
		}
		switch {
		case errs[i] == nil && !w.lost:
			w.until = start.Add(r.cfg.Visibility)
			w.lapse.Reset(time.Until(w.until))
		case errors.Is(errs[i], pgtransport.ErrLeaseLost):
			// Its handler still runs: the lease was lost under it (not
			// acked by it meanwhile), which the core leaves to us to say.
			w.lost = true
			w.cancel()
			lost = append(lost, w.lease)
		}
	}
	r.mu.Unlock()
	for _, l := range lost { // outside the lock: the observer is the caller's code
		r.log.Warn("pgtransport: lease lost while its handler ran; handler cancelled, its result will be ignored",
			"worker", r.cfg.WorkerID, "group", l.Group, "seq", l.Seq, "attempt", l.Attempt)
		if r.obs != nil {
			r.obs.LeaseLost(l)
		}
	}
}
