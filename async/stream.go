package async

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	stdsync "sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/notify"
)

// StreamConfig configures a Stream. WorkerID and Visibility are required.
type StreamConfig struct {
	// WorkerID names the consumer; it prefixes every lease token.
	WorkerID string
	// Visibility is how long each lease holds before it lapses.
	Visibility time.Duration
	// MinPriority is the priority floor: only groups at or above it.
	MinPriority int
	// MaxInFlight bounds the leases the stream holds at once: received and
	// not yet acked or nacked, plus those claimed and waiting in C. So it
	// is also how many groups the stream draws from at once, and the most
	// it claims in one round-trip. 0 means 1; at most pgtransport.MaxBatch.
	// While it claims, a stream has up to two round-trips in flight, on two
	// of the pool's connections.
	MaxInFlight int
	// OnError, if set, is told of each error the stream recovers from (it
	// retries with backoff). It runs on the stream's goroutine and must not
	// block.
	OnError func(error)
}

// Stream delivers leases on a channel as groups become claimable.
//
// One goroutine drives it. Each round-trip acks the leases its receivers
// acked since the last one left (Transport.Ack on a lease from a stream
// joins that batch; its channel delivers once the batch commits) and claims
// as many groups as there are free slots. While claiming it keeps up to two
// round-trips in flight, on two of the pool's connections: the second
// leaves once half of MaxInFlight is acked, so an ack waits for at most a
// round-trip in flight plus its own. An acked lease
// whose group has more messages is kept, up to Config.MaxKeep in a row, and
// the group's next message is delivered under the same token without a new
// claim.
//
// It holds at most MaxInFlight leases: a lease counts from its claim until
// it is acked or nacked through the Transport or its visibility runs out.
// C is buffered (MaxInFlight); a lease that waits there unreceived for half
// its visibility is given back (nack with no delay) before it can lapse.
//
// While idle it waits, without polling, for the first of: a notification of
// a new group (LISTEN/NOTIFY), an ack, nack or publish through the same
// Transport that may have freed work, the earliest lease or park it saw
// when it went idle running out, and Config.IdleSweep.
type Stream struct {
	t      *Transport
	cfg    StreamConfig
	out    chan *pgtransport.Lease
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns, after out
	sub    *notify.Subscription
	waiter string        // this stream's row in transport_waiters
	signal chan struct{} // acks queued; holds at most one

	mu        stdsync.Mutex
	accepting bool                 // acks may join the next batch
	acks      []ackRequest         // waiting for the next round-trip
	held      map[leaseKey]holding // leases claimed and not yet settled
	settling  int                  // of held, those whose ack is in a round-trip
	reserved  int                  // slots the round-trips in flight may fill
	err       error
}

// A stream's slots in use: leases held and not being settled, and those
// the round-trips in flight may bring. Never more than MaxInFlight, so C
// (buffered to MaxInFlight) never blocks the stream. s.mu is held.
func (s *Stream) used() int { return len(s.held) - s.settling + s.reserved }

// drop forgets a held lease. s.mu is held.
func (s *Stream) drop(k leaseKey) {
	if h, ok := s.held[k]; ok {
		if h.settling {
			s.settling--
		}
		delete(s.held, k)
	}
}

// leaseKey names a lease: a batch claim gives all its leases one token.
type leaseKey struct{ token, group string }

func keyOf(l *pgtransport.Lease) leaseKey { return leaseKey{l.Token, l.Group} }

type holding struct {
	lease    *pgtransport.Lease
	lapses   time.Time // by this process's clock
	giveBack time.Time // if still unreceived in C then
	settling bool      // its ack is in a round-trip: its slot is counted free
	acked    bool      // its ack is queued or in a round-trip
}

type ackRequest struct {
	lease *pgtransport.Lease
	done  chan error
}

// Stream starts a consumer of leases for cfg.WorkerID. It runs until ctx
// ends, Close, or the Transport closes; then it acks what its receivers
// acked, gives back the leases still waiting in C, closes C and records why
// in Err. Errors from the database are retried with backoff; only
// ErrSchemaMissing ends the stream.
func (t *Transport) Stream(ctx context.Context, cfg StreamConfig) (*Stream, error) {
	if err := core.CheckClaim(cfg.WorkerID, cfg.Visibility, cfg.MinPriority); err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	if cfg.MaxInFlight < 0 || cfg.MaxInFlight > pgtransport.MaxBatch {
		return nil, fmt.Errorf("stream: %w: MaxInFlight %d, want 0 to %d", pgtransport.ErrInvalidConfig, cfg.MaxInFlight, pgtransport.MaxBatch)
	}
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, 1)
	if t.isClosed() {
		return nil, fmt.Errorf("stream: %w", pgtransport.ErrClosed)
	}
	s := &Stream{
		t:         t,
		cfg:       cfg,
		out:       make(chan *pgtransport.Lease, cfg.MaxInFlight),
		done:      make(chan struct{}),
		signal:    make(chan struct{}, 1),
		waiter:    core.NewToken(cfg.WorkerID),
		accepting: true,
		held:      map[leaseKey]holding{},
	}
	if t.listener != nil {
		sub, err := t.listener.Subscribe(t.channel)
		if errors.Is(err, notify.ErrClosed) {
			return nil, fmt.Errorf("stream: %w", pgtransport.ErrClosed) // the Transport closed meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("stream: %w", err)
		}
		s.sub = sub
	}
	parent := ctx
	ctx, s.cancel = t.bind(ctx)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		s.cancel()
		if s.sub != nil {
			s.sub.Close()
		}
		return nil, fmt.Errorf("stream: %w", pgtransport.ErrClosed)
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		s.run(ctx, parent)
	}()
	return s, nil
}

// C returns the channel of leases. The stream closes it when it stops.
func (s *Stream) C() <-chan *pgtransport.Lease { return s.out }

// Err says why the stream stopped: ErrClosed after Close (of the stream or
// the Transport), ctx's error after its ctx ended, or the error that ended
// it. Nil while it runs.
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Ready returns a channel closed once the stream's notifications are live
// (always closed with Config.DisableNotify). Tests wait on it.
func (s *Stream) Ready() <-chan struct{} {
	if s.sub == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return s.sub.Ready()
}

// Close stops the stream and waits for it: acks already asked for are
// done, leases waiting in C are given back, and C is closed. Safe to call
// twice.
func (s *Stream) Close() {
	s.stop(pgtransport.ErrClosed)
	s.cancel()
	<-s.done
}

func (s *Stream) stop(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

// enqueue adds an ack of l to the next batch; false if the stream no
// longer takes acks (the caller acks on its own). An ack of a lease the
// stream holds in another form, an earlier message of a kept group under
// the same token or a lease whose ack is already on its way, is answered
// ErrLeaseLost at once: sent, it would free a group the stream still holds.
func (s *Stream) enqueue(l *pgtransport.Lease) (<-chan error, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.accepting {
		return nil, false
	}
	h, ok := s.held[keyOf(l)]
	if !ok {
		return nil, false // not ours (any more): lapsed, or already settled
	}
	done := make(chan error, 1)
	if h.acked || h.lease.Seq != l.Seq {
		done <- pgtransport.ErrLeaseLost
		return done, true
	}
	h.acked = true
	s.held[keyOf(l)] = h
	s.acks = append(s.acks, ackRequest{lease: l, done: done})
	select {
	case s.signal <- struct{}{}:
	default:
	}
	return done, true
}

// release frees the slot of a lease settled outside a batch (a nack).
func (s *Stream) release(l *pgtransport.Lease) {
	s.mu.Lock()
	s.drop(keyOf(l))
	s.mu.Unlock()
	select {
	case s.signal <- struct{}{}: // a slot came free
	default:
	}
}

func (s *Stream) extend(l *pgtransport.Lease, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.held[keyOf(l)]; ok {
		h.lapses = until
		s.held[keyOf(l)] = h
	}
}

// The stream's claiming phases. After a claim finds nothing the stream
// stops claiming (acks still settle, and keep hot groups): each claim walks
// the round-robin index. Before it sleeps it says it is idle (a waiter row,
// so publishers notify it) and claims once more; then it sleeps until a
// wake-up: a notification, a wake-up from this process, the earliest lease
// or park it saw running out, IdleSweep, or an ack of its own that freed a
// group.
const (
	claiming = iota // claim with every round-trip
	arming          // arm, then claim once more
	dry             // settle only, until a wake-up
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

// trip is what the stream's goroutine learns from a round-trip.
type trip struct {
	limit              int // claims asked for, kept leases included
	got, claims, freed int // as exchange returns them
	err                error
}

// run is the stream's goroutine. It owns the round-trips it launches and
// waits for them before it finishes.
func (s *Stream) run(ctx, parent context.Context) {
	defer close(s.done)
	defer close(s.out)
	defer s.finish(parent)
	var (
		phase  = claiming
		armed  bool // our waiter row may exist
		looked bool // dry after arming and claiming once more: safe to sleep
		next   time.Time
		ticket *core.Ticket
		retry  = newRetry()
		trips  = make(chan trip, depth)
		flying int // round-trips in flight
	)
	// When the waiter row was last written, the ticket taken, and the last
	// round-trip that claimed left: a claim that left after both saw every
	// group claimable before it, and the row and the ticket catch those
	// after it.
	var armedAt, ticketAt, claimedAt time.Time
	defer func() {
		for ; flying > 0; flying-- {
			<-trips
		}
		if ticket != nil {
			ticket.Done()
		}
	}()
	// landed takes in a round-trip's outcome; false ends the stream.
	landed := func(t trip) bool {
		flying--
		if t.err != nil {
			return s.recover(ctx, t.err, retry)
		}
		retry.Reset()
		if t.freed > 0 { // groups freed with messages left, maybe: for other waiters here
			s.t.parking.WakeOthers(t.freed, ticket)
		}
		switch {
		case t.claims > 0 || t.freed > 0:
			phase, looked = claiming, false
			if !s.full() {
				break // room for more: still a waiter
			}
			if armed && t.claims > 0 { // publishers need not tell us
				if err := s.t.core.Unwait(ctx, s.waiter); err != nil {
					s.report(err) // harmless: the row only makes publishers notify until it lapses
				}
				armed = false
			}
			if ticket != nil {
				ticket.Done()
				ticket = nil
			}
		case t.limit > t.got && phase == claiming:
			phase, looked = dry, false // no arming while acks keep the stream busy
		case t.limit > t.got && phase == arming:
			phase, looked = dry, true
		}
		return ctx.Err() == nil
	}
	for {
		// While a round-trip is out, a second leaves only when the stream
		// is claiming and half of MaxInFlight is acked; arming and sleeping
		// go one at a time, as they read the outcome.
		if flying > 0 {
			wait := flying >= depth || phase != claiming
			if !wait && s.queued() < max(s.cfg.MaxInFlight/2, 1) {
				select {
				case t := <-trips:
					if !landed(t) {
						return
					}
				case <-s.signal: // more acks
				case <-ctx.Done():
					return
				}
				continue
			}
			if wait {
				if !landed(<-trips) {
					return
				}
				continue
			}
		}
		acks, free := s.take()
		if len(acks) == 0 && phase == dry && !looked && free > 0 {
			if s.armedNow(armed, armedAt, next) && ticket != nil && armedAt.Before(claimedAt) && ticketAt.Before(claimedAt) {
				looked = true // the last claim left after the row and the ticket were in place: sleep
			} else {
				phase = arming // about to sleep: arm and claim once more first
			}
		}
		if len(acks) == 0 && (free == 0 || phase == dry) { // nothing out (see above)
			woken, ok := s.sleep(ctx, next, ticket, phase == dry)
			if !ok {
				return
			}
			if woken {
				phase = arming
			}
			continue
		}
		limit := free
		if phase == dry && !s.t.core.ReleasesAny(leasesOf(acks)) {
			limit = 0 // settle (and keep) only; but claim with an ack that frees a group
		}
		if phase == arming && limit > 0 { // nothing in flight: see above
			if !s.armedNow(armed, armedAt, next) { // else only the claim is needed
				d, ok, err := s.t.core.Wait(ctx, s.waiterName(), s.cfg.MinPriority, s.waiterTTL())
				if err != nil {
					s.requeue(acks)
					if !s.recover(ctx, err, retry) {
						return
					}
					continue
				}
				armed, armedAt = s.sub != nil, time.Now()
				next = time.Time{}
				if ok {
					next = time.Now().Add(d)
				}
			}
			if ticket != nil {
				ticket.Done()
			}
			ticket, ticketAt = s.t.parking.Ticket(), time.Now() // before the claim: a wake-up after it is not lost
		}
		if limit > 0 {
			claimedAt = time.Now()
		}
		s.mu.Lock()
		s.reserved += limit
		s.mu.Unlock()
		flying++
		go func() {
			t := trip{limit: limit}
			t.got, t.claims, t.freed, t.err = s.exchange(ctx, acks, limit)
			trips <- t
		}()
	}
}

// queued is how many acks wait for the next round-trip.
func (s *Stream) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acks)
}

// armedNow reports whether the waiter row written at armedAt still stands
// for this stream: it lives longer than any sleep (waiterTTL) if written
// within IdleSweep, and the next expiry it reported is still ahead. (With
// notifications off there is no row; the expiry still counts.)
func (s *Stream) armedNow(armed bool, armedAt, next time.Time) bool {
	fresh := time.Since(armedAt) < s.t.cfg.IdleSweep
	ahead := next.IsZero() || next.After(time.Now())
	return (armed || s.sub == nil) && fresh && ahead
}

// full reports whether every slot is taken.
func (s *Stream) full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used() >= s.cfg.MaxInFlight
}

// take returns the acks queued for the next round-trip, their slots now
// counted free, and how many leases it may claim.
func (s *Stream) take() ([]ackRequest, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	acks := s.acks
	s.acks = nil
	s.expire(time.Now())
	s.mark(acks, true)
	return acks, max(s.cfg.MaxInFlight-s.used(), 0)
}

// mark sets whether the leases of acks are being settled. s.mu is held.
func (s *Stream) mark(acks []ackRequest, settling bool) {
	for _, a := range acks {
		k := keyOf(a.lease)
		if h, ok := s.held[k]; ok && h.settling != settling {
			h.settling = settling
			s.held[k] = h
			if settling {
				s.settling++
			} else {
				s.settling--
			}
		}
	}
}

// requeue puts acks back for the next round-trip after a failed one.
func (s *Stream) requeue(acks []ackRequest) {
	s.mu.Lock()
	s.mark(acks, false)
	s.acks = append(acks, s.acks...)
	s.mu.Unlock()
}

// expire drops leases whose visibility ran out: their groups are claimable
// again, not ours. s.mu is held.
func (s *Stream) expire(now time.Time) {
	for k, h := range s.held {
		if !h.lapses.After(now) {
			s.drop(k)
			s.t.leases.Delete(k)
		}
	}
}

// exchange settles acks and claims up to limit leases (kept ones count),
// queues the new leases in C and delivers each ack's result; the limit
// slots reserved for it are then returned. It returns how many leases it
// added, how many of them were claimed (not kept), and how many acks freed
// their group. The stream stopping does not cancel it: a round-trip cut off
// mid-way would leave acks and leases in doubt.
func (s *Stream) exchange(ctx context.Context, acks []ackRequest, limit int) (got, claims, freed int, err error) {
	reserved := limit
	leases := leasesOf(acks)
	if ctx.Err() != nil {
		limit = 0 // stopping: settle only
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), roundTripTimeout)
	defer cancel()
	start := time.Now()
	settled, claimed, err := s.t.core.Exchange(rctx, leases, true, s.cfg.WorkerID, s.cfg.Visibility, s.cfg.MinPriority, max(limit, 0))
	if err != nil {
		s.mu.Lock()
		s.reserved -= reserved
		s.mu.Unlock()
		if len(acks) > 0 && errors.Is(err, pgtransport.ErrInvalidBatch) {
			s.mu.Lock()
			s.mark(acks, false)
			for _, a := range acks { // answered: the leases are held as before
				if h, ok := s.held[keyOf(a.lease)]; ok {
					h.acked = false
					s.held[keyOf(a.lease)] = h
				}
			}
			s.mu.Unlock()
			s.answer(acks, err) // cannot succeed on a retry
			return 0, 0, 0, nil
		}
		s.requeue(acks)
		return 0, 0, 0, err
	}
	lapses := start.Add(s.cfg.Visibility)
	giveBack := start.Add(s.cfg.Visibility / 2)
	var fresh []*pgtransport.Lease
	s.mu.Lock()
	for i, st := range settled {
		s.drop(keyOf(st.Lease))
		if st.Next != nil {
			fresh = append(fresh, st.Next)
		} else if st.Err == nil {
			freed++
		}
		acks[i].done <- st.Err
	}
	fresh = append(fresh, claimed...)
	for _, l := range fresh {
		s.held[keyOf(l)] = holding{lease: l, lapses: lapses, giveBack: giveBack}
		s.t.leases.Store(keyOf(l), s)
	}
	s.reserved -= reserved
	s.mu.Unlock()
	for _, l := range fresh {
		s.out <- l // never blocks: C holds MaxInFlight, and so many slots we have
	}
	return len(fresh), len(claimed), freed, nil
}

func leasesOf(acks []ackRequest) []*pgtransport.Lease {
	ls := make([]*pgtransport.Lease, len(acks))
	for i, a := range acks {
		ls[i] = a.lease
	}
	return ls
}

func (s *Stream) answer(acks []ackRequest, err error) {
	for _, a := range acks {
		a.done <- err
	}
}

// roundTripTimeout bounds one round-trip of a stream.
const roundTripTimeout = 30 * time.Second

// waiterName is the waiter row to arm: none without notifications.
func (s *Stream) waiterName() string {
	if s.sub == nil {
		return ""
	}
	return s.waiter
}

// waiterTTL outlives the longest sleep (IdleSweep) with room to spare, so
// the row lapses soon after a consumer dies without removing it.
func (s *Stream) waiterTTL() time.Duration { return 2*s.t.cfg.IdleSweep + 5*time.Second }

// nextDeadline is how long until a held lease lapses or one waiting in C
// is due to be given back.
func (s *Stream) nextDeadline() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	first := time.Now().Add(time.Hour)
	for _, h := range s.held {
		first = minTime(first, minTime(h.lapses, h.giveBack))
	}
	return max(time.Until(first), 0)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// giveBackStale takes back from C the leases that waited there too long
// and nacks them; the rest go back into C.
func (s *Stream) giveBackStale(ctx context.Context) {
	now := time.Now()
	var stale, keep []*pgtransport.Lease
	for {
		select {
		case l := <-s.out:
			s.mu.Lock()
			h, ok := s.held[keyOf(l)]
			s.mu.Unlock()
			if ok && !h.giveBack.After(now) {
				stale = append(stale, l)
			} else {
				keep = append(keep, l)
			}
			continue
		default:
		}
		break
	}
	for _, l := range keep {
		s.out <- l
	}
	s.nackAll(ctx, stale)
	s.mu.Lock()
	for k, h := range s.held { // received long ago: no give-back for those
		if !h.giveBack.After(now) {
			h.giveBack = h.lapses
			s.held[k] = h
		}
	}
	s.mu.Unlock()
}

// nackAll gives leases back with no delay: each group is first in line
// again with the same head. It runs even when ctx has ended.
func (s *Stream) nackAll(ctx context.Context, leases []*pgtransport.Lease) {
	if len(leases) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, l := range leases {
		s.mu.Lock()
		s.drop(keyOf(l))
		s.mu.Unlock()
		s.t.leases.Delete(keyOf(l))
		if err := s.t.core.Nack(ctx, l, 0); err != nil && !errors.Is(err, pgtransport.ErrLeaseLost) {
			s.report(err) // it comes back after its visibility instead
		}
	}
	s.t.parking.Wake(len(leases))
}

// sleep waits, with nothing to settle, for acks, a slot, or (dry) a
// reason to claim again. woken reports the latter; ok is false when ctx
// ended.
func (s *Stream) sleep(ctx context.Context, next time.Time, ticket *core.Ticket, dry bool) (woken, ok bool) {
	d := s.nextDeadline()
	if dry {
		d = min(d, s.t.cfg.IdleSweep)
		if !next.IsZero() {
			d = min(d, time.Until(next)+time.Millisecond)
		}
	}
	timer := time.NewTimer(max(d, 0))
	defer timer.Stop()
	var notified, wake <-chan struct{}
	if dry && s.sub != nil {
		notified = s.sub.C()
	}
	if dry && ticket != nil {
		wake = ticket.C()
	}
	select {
	case <-ctx.Done():
		return false, false
	case <-notified:
		return true, true
	case <-wake:
		return true, true
	case <-s.signal:
		return false, true
	case <-timer.C:
		s.giveBackStale(ctx)
		return dry, true
	}
}

// recover decides after a database error: false ends the stream.
func (s *Stream) recover(ctx context.Context, err error, b *backoff.ExponentialBackOff) bool {
	if ctx.Err() != nil {
		return false
	}
	if errors.Is(err, pgtransport.ErrSchemaMissing) {
		s.stop(err)
		return false
	}
	s.report(err)
	timer := time.NewTimer(b.NextBackOff())
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

func (s *Stream) report(err error) {
	if s.cfg.OnError != nil {
		s.cfg.OnError(err)
	}
}

// finish runs as the stream stops: it stops taking acks and settles those
// queued, gives back the leases still in C, records why it stopped, and
// withdraws the waiter row and the subscription.
func (s *Stream) finish(parent context.Context) {
	if err := parent.Err(); err != nil && s.t.ctx.Err() == nil {
		s.stop(err)
	}
	s.stop(pgtransport.ErrClosed) // if nothing else was recorded
	s.mu.Lock()
	s.accepting = false
	acks := s.acks
	s.acks = nil
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), roundTripTimeout)
	defer cancel()
	if len(acks) > 0 {
		_, _, freed, err := s.exchange(ctx, acks, 0)
		if err != nil {
			s.answer(acks, err)
		}
		s.t.parking.Wake(freed) // for other waiters here
	}
	var waiting []*pgtransport.Lease
	for {
		select {
		case l := <-s.out:
			waiting = append(waiting, l)
			continue
		default:
		}
		break
	}
	s.nackAll(ctx, waiting)
	if s.sub != nil {
		s.sub.Close()
		_ = s.t.core.Unwait(ctx, s.waiter) // best effort: the row lapses anyway
	}
	s.cancel() // unhooks ctx from the Transport's
}

func newRetry() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 50 * time.Millisecond
	b.MaxInterval = 2 * time.Second
	b.MaxElapsedTime = 0
	return b
}
