package async

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	stdsync "sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/outage"
	"github.com/pgtransport/pgtransport/notify"
)

// StreamConfig configures a Stream. The zero value works, with the same
// defaults as a pgtransport.WorkerConfig's.
type StreamConfig struct {
	// WorkerID names the consumer in every lease token it takes (for the
	// operator reading transport_groups: which process holds what); it
	// scopes nothing. "" means hostname:pid, as a WorkerConfig's. Run
	// one stream per process, with a large
	// MaxInFlight, rather than a stream per worker goroutine: each stream
	// has its own round-trips, and one stream of 1,024 leases in flight
	// was measured at 56k msgs/s where 16 streams of 64 each made 30k
	// (bench/README.md). Fan its leases out to handlers (Transport.Work
	// does).
	WorkerID string
	// Visibility is how long each lease holds before it lapses: 0 means
	// pgtransport.DefaultWorkerVisibility (30 s), as a WorkerConfig's; at
	// least pgtransport.MinVisibility.
	Visibility time.Duration
	// MinPriority is the priority floor: only groups at or above it.
	MinPriority int
	// MaxInFlight bounds the leases the stream holds at once: received and
	// not yet acked, nacked or failed, plus those claimed and waiting in C. So it
	// is also how many groups the stream draws from at once, and the most
	// it claims, or acks, in one round-trip. 0 means DefaultMaxInFlight
	// (64); at most pgtransport.MaxBatch. It trades throughput against
	// how much one stream takes: each of the stream's round-trips carries
	// the acks and claims of many leases, so throughput grows with it (1
	// is about 15x slower than 64 on many groups), while it holds that
	// many groups away from other consumers and that many leases that wait
	// for a receiver (a lease left in C for half its visibility is given
	// back). Set it to the number of leases the process can work on at
	// once: its handler goroutines. While it claims, a stream has up to
	// two round-trips in flight, on two of the pool's connections.
	MaxInFlight int
	// OnError, if set, is told of each error the stream recovers from (it
	// retries with backoff, or answers a refused ack alone). It runs on the stream's goroutine and must not
	// block.
	OnError func(error)
}

// DefaultMaxInFlight is StreamConfig.MaxInFlight's value when it is 0.
const DefaultMaxInFlight = 64

// stream is one partition's stream: the engine behind a Stream.
//
// One goroutine drives it. Each round-trip acks the leases its receivers
// acked since the last one left (Transport.Ack on a lease from a stream
// joins that batch; its channel delivers once the batch commits) and claims
// as many groups as there are free slots. While claiming it keeps up to two
// round-trips in flight, on two of the pool's connections: the second
// leaves once half of MaxInFlight is acked, so an ack waits for at most a
// round-trip in flight plus its own.
//
// It is five parts: an ackBatcher (the acks waiting for the next
// round-trip), a ledger (the leases held and the slots in use), an
// idleState (when to claim, arm and sleep), a gate (claims held back after
// a give-back), and run, the loop that selects over the events that move
// them.
type stream struct {
	t      *Transport
	p      *part
	cfg    StreamConfig
	out    chan *pgtransport.Lease
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns, after out
	sub    *notify.Subscription
	waiter string        // this stream's row in transport_waiters
	signal chan struct{} // acks queued or a slot freed; holds at most one
	outage outage.Log    // the run of failed round-trips under way; run's own

	mu     stdsync.Mutex // guards acks, ledger and gate together, and err
	acks   ackBatcher
	ledger ledger
	gate   gate
	err    error
}

// startStream starts partition p's stream for cfg (checked, MaxInFlight
// set), on a goroutine of t.
func (t *Transport) startStream(ctx context.Context, p *part, cfg StreamConfig) (*stream, error) {
	if t.isClosed() {
		return nil, fmt.Errorf("stream: %w", pgtransport.ErrClosed)
	}
	s := &stream{
		t:      t,
		p:      p,
		cfg:    cfg,
		out:    make(chan *pgtransport.Lease, cfg.MaxInFlight),
		done:   make(chan struct{}),
		signal: make(chan struct{}, 1),
		waiter: core.NewToken(cfg.WorkerID),
		ledger: newLedger(cfg.MaxInFlight),
	}
	if p.listener != nil {
		sub, err := p.listener.Subscribe(p.channel)
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
	p.streams.add(s)
	go func() {
		defer t.wg.Done()
		s.run(ctx, parent)
	}()
	return s, nil
}

// C returns the channel of leases. The stream closes it when it stops.
func (s *stream) C() <-chan *pgtransport.Lease { return s.out }

// Err says why the stream stopped: ErrClosed after Close (of the stream or
// the Transport), ctx's error after its ctx ended, or the error that ended
// it. Nil while it runs.
func (s *stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Ready returns a channel closed once the stream's notifications are live,
// and replaced by an open one while the listener reconnects. With
// Config.Async.DisableNotify it is closed at once: there is nothing to wait for.
// Behind a transaction pooler with no Config.Async.ListenDSN it is never closed:
// no notification can arrive, and the stream finds work every IdleSweep
// (PollOnly says so). Tests wait on it.
func (s *stream) Ready() <-chan struct{} {
	switch {
	case s.sub != nil:
		return s.sub.Ready()
	case s.p.pollOnly:
		return make(chan struct{})
	}
	c := make(chan struct{})
	close(c)
	return c
}

// PollOnly reports whether the stream learns of work other processes
// publish only by looking for it every Config.IdleSweep: with
// Config.Async.DisableNotify, and behind a transaction pooler (Config.Pooling)
// with no Config.Async.ListenDSN.
func (s *stream) PollOnly() bool { return s.sub == nil }

// Close stops the stream and waits for it: acks already asked for are
// done, leases waiting in C are given back, and C is closed. Safe to call
// twice.
func (s *stream) Close() {
	s.stop(pgtransport.ErrStreamClosed)
	s.cancel()
	<-s.done
}

func (s *stream) stop(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

// The stream's side of the Transport's calls on its leases (streamSet).

// enqueue adds an ack of l to the next round-trip; false if the stream does
// not hold l or no longer takes acks (the caller acks on its own). An ack
// the ledger calls lost is answered ErrLeaseLost at once.
func (s *stream) enqueue(l *pgtransport.Lease) (<-chan error, bool) {
	s.mu.Lock()
	if s.acks.closed {
		s.mu.Unlock()
		return nil, false
	}
	var done <-chan error
	switch s.ledger.admit(l) {
	case notHeld:
		s.mu.Unlock()
		return nil, false
	case lostAck:
		s.mu.Unlock()
		s.p.core.LeaseLost("ack", l)
		lost := make(chan error, 1)
		lost <- pgtransport.ErrLeaseLost
		return lost, true
	case queueAck:
		done = s.acks.add(l)
	}
	s.mu.Unlock()
	s.poke()
	return done, true
}

// release frees the slot of a lease settled outside the stream's
// round-trips (a nack, a fail, AckMany, AckNext); false if the stream did
// not hold it.
func (s *stream) release(l *pgtransport.Lease) bool {
	s.mu.Lock()
	held := s.ledger.release(l)
	s.mu.Unlock()
	if held {
		s.poke() // a slot came free
	}
	return held
}

// extend records that l, held by the stream, now holds until until, and
// holds next's message if next is not nil; false if the stream does not
// hold it.
func (s *stream) extend(l, next *pgtransport.Lease, until time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ledger.extend(keyOf(l), next, until)
}

// heldBack records that a lease this stream handed to a merged Stream's
// forwarder waited there, unreceived, for half its visibility and was
// given back (and forgotten): as giveBackStale's give-back, it shuts the
// gate, so the stream claims no more until a receiver shows it is at work.
func (s *stream) heldBack() {
	s.mu.Lock()
	s.gate.close(time.Now(), len(s.out), s.ledger.gone, min(s.t.cfg.IdleSweep, s.cfg.Visibility/2))
	s.mu.Unlock()
}

// regate records that the forwarder, not a receiver, took a lease out of
// C while the gate is shut: C's shorter length is no sign of a receiver.
func (s *stream) regate() {
	s.mu.Lock()
	if s.gate.shut {
		s.gate.inC = len(s.out)
	}
	s.mu.Unlock()
}

// poke wakes the loop: acks are queued or a slot came free. Coalesced: the
// loop reads the state afresh whenever it wakes.
func (s *stream) poke() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// run is the stream's loop and goroutine, modelled on River's producer
// loop: each turn it sends a round-trip if one may leave (and there is
// something to send), else waits for the next event: a round-trip
// returned, acks queued or a slot freed, a notification or a wake-up from
// this process (dry only), the next deadline (a lease in C due back, one
// lapsing, IdleSweep), or ctx done. It owns the round-trips it sends and
// waits for them before it finishes.
func (s *stream) run(ctx, parent context.Context) {
	defer close(s.done)
	defer close(s.out)
	defer s.finish(parent)
	var (
		w      = idleState{notify: s.sub != nil, sweep: s.t.cfg.IdleSweep, ttl: s.waiterTTL()}
		retry  = newRetry()
		trips  = make(chan trip, depth)
		flying int // round-trips in flight
		subC   <-chan struct{}
	)
	if s.sub != nil {
		subC = s.sub.C()
	}
	defer func() {
		for ; flying > 0; flying-- {
			<-trips
		}
		w.dropTicket()
	}()
	for {
		switch s.leave(ctx, &w, trips, retry, flying) {
		case sent:
			flying++
			continue
		case again:
			continue
		case stopped:
			return
		}
		// Nothing to send now. With nothing in flight the stream sleeps
		// until a deadline or a wake-up; else it waits for a round-trip,
		// and meanwhile still gives back the leases in C that are due
		// back (a round-trip may hang for up to roundTripTimeout against a
		// server that stopped answering: leases must not outlive their
		// visibility in C meanwhile).
		var (
			sleep            *time.Timer
			timeout          <-chan time.Time
			notified, wakeup <-chan struct{}
		)
		switch {
		case flying == 0:
			sleep = time.NewTimer(w.sleepFor(s.untilDeadline(), time.Now()))
			timeout = sleep.C
			notified, wakeup = w.wakeups(subC)
		case len(s.out) > 0:
			sleep = time.NewTimer(s.untilGiveBack())
			timeout = sleep.C
		}
		select {
		case t := <-trips:
			flying--
			if !s.landed(ctx, &w, t, retry) {
				return
			}
		case <-s.signal: // acks queued or a slot freed: look again
		case <-notified:
			w.notifiedOf()
		case <-wakeup:
			w.woken()
		case <-timeout:
			s.giveBackStale(ctx)
			if flying == 0 && w.phase == dry {
				w.woken() // IdleSweep or the earliest expiry: look again
			}
		case <-ctx.Done():
			return
		}
		if sleep != nil {
			sleep.Stop()
		}
	}
}

// leaveStep is what leave did.
type leaveStep int

const (
	stay    leaveStep = iota // nothing may or need leave now: wait for an event
	sent                     // a round-trip left
	again                    // arming failed and was recovered from: look again
	stopped                  // the stream must stop
)

// leave sends the next round-trip if one may leave (flying are in
// flight) and there is something to send: the acks queued and, unless the
// stream sleeps, claims for its free slots, arming the wake-ups first
// when it is about to go dry.
func (s *stream) leave(ctx context.Context, w *idleState, trips chan<- trip, retry *backoff.ExponentialBackOff, flying int) leaveStep {
	if !w.mayLeave(flying, s.queued(), s.cfg.MaxInFlight) {
		return stay
	}
	acks, free := s.take()
	if w.sleeps(len(acks), free, time.Now()) {
		return stay
	}
	frees := w.phase == dry && s.p.core.ReleasesAny(leasesOf(acks)) // only dry asks
	limit := w.limit(free, frees)
	if w.arms(limit) { // nothing in flight: mayLeave
		if err := s.arm(ctx, w); err != nil {
			s.requeue(acks)
			if !s.recover(ctx, err, retry) {
				return stopped
			}
			return again
		}
	}
	w.sent(limit, time.Now())
	s.send(ctx, trips, acks, limit)
	return sent
}

// landed takes in a round-trip's outcome; false ends the stream.
func (s *stream) landed(ctx context.Context, w *idleState, t trip, retry *backoff.ExponentialBackOff) bool {
	if t.err != nil {
		return s.recover(ctx, t.err, retry)
	}
	retry.Reset()
	s.outage.Recovered(s.p.core.Logger(), "pgtransport: stream: database reachable again", slog.String("worker", s.cfg.WorkerID))
	if t.freed > 0 { // groups freed with messages left, maybe: for other waiters here
		s.p.parking.WakeOthers(t.freed, w.ticket)
	}
	if w.landed(t, s.full()) {
		if err := s.p.core.Unwait(ctx, s.waiter); err != nil {
			s.report(err) // harmless: the row only makes publishers notify until it lapses
		}
	}
	return ctx.Err() == nil
}

// arm readies the stream to sleep, before the claim that may find nothing:
// its waiter row, unless the last still stands (then only the next
// expiry is asked for, unless that too is still ahead), and a fresh
// ticket.
func (s *stream) arm(ctx context.Context, w *idleState) error {
	if now := time.Now(); !w.armedNow(now) {
		waiter, rowAt := s.waiterName(), now // the row's until counts from the call's start, or later
		if w.rowStands(now) {
			waiter, rowAt = "", time.Time{}
		}
		// Not cut short by ctx: a Close that cancelled it mid-flight could
		// see its Unwait (in finish) run before this row commits, and leave
		// the row behind until it lapses. It takes milliseconds.
		wctx, cancel := s.t.detach(ctx, 5*time.Second)
		d, ok, err := s.p.core.Wait(wctx, waiter, s.cfg.MinPriority, s.waiterTTL())
		cancel()
		if err != nil {
			return err
		}
		w.rowWritten(time.Now(), rowAt, d, ok)
	}
	w.retick(s.p.parking.Ticket(), time.Now())
	return nil
}

// send reserves limit slots and starts a round-trip that settles acks and
// claims up to limit; its outcome comes back on trips.
func (s *stream) send(ctx context.Context, trips chan<- trip, acks []ackRequest, limit int) {
	s.mu.Lock()
	s.ledger.reserve(limit)
	s.mu.Unlock()
	go func() { // run waits for it: every send is received from trips
		t := trip{limit: limit}
		t.got, t.claims, t.freed, t.err = s.exchange(ctx, acks, limit)
		trips <- t
	}()
}

// queued is how many acks wait for the next round-trip.
func (s *stream) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acks.len()
}

// full reports whether every slot is taken.
func (s *stream) full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ledger.full()
}

// take returns the acks queued for the next round-trip, their slots now
// counted free, and how many leases it may claim. Leases that lapsed are
// dropped first.
func (s *stream) take() ([]ackRequest, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	acks, alone := s.acks.take()
	now := time.Now()
	s.ledger.expire(now)
	s.ledger.settle(leasesOf(acks), true)
	if alone {
		return acks, 0 // settled on its own, with no claim: a refusal is its own
	}
	return acks, s.gate.limit(s.ledger.free(), len(s.out), s.ledger.gone, now)
}

// requeue puts acks back for the next round-trip after a failed one.
func (s *stream) requeue(acks []ackRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ledger.settle(leasesOf(acks), false)
	s.acks.requeue(acks)
}

// untilDeadline is how long until a held lease lapses or one waiting in C
// is due to be given back.
func (s *stream) untilDeadline() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	next := s.ledger.nextDeadline(now)
	if probe := s.gate.wakeAt(len(s.out), now); probe.After(now) {
		next = minTime(next, probe)
	}
	return max(next.Sub(now), 0)
}

// untilGiveBack is how long until a lease waiting in C is due back, at
// least a millisecond: while a round-trip is in flight the loop wakes for
// nothing else (a lapsed lease that was received is dropped by the next
// take, not here).
func (s *stream) untilGiveBack() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	return max(s.ledger.nextGiveBack(now).Sub(now), time.Millisecond)
}

// exchange settles acks and claims up to limit leases (kept ones count),
// queues the new leases in C and delivers each ack's result; the limit
// slots reserved for it are then returned. It returns how many leases it
// added, how many of them were claimed (not kept), and how many acks freed
// their group. The stream stopping does not cancel it: a round-trip cut off
// mid-way would leave acks and leases in doubt (only the Transport's Close,
// after closeGrace, does).
func (s *stream) exchange(ctx context.Context, acks []ackRequest, limit int) (got, claims, freed int, err error) {
	reserved := limit
	leases := leasesOf(acks)
	if ctx.Err() != nil {
		limit = 0 // stopping: settle only
	}
	rctx, cancel := s.t.detach(ctx, roundTripTimeout)
	defer cancel()
	start := time.Now()
	// Lost acks are reported once resolve has settled those in doubt.
	settled, claimed, err := s.p.core.StreamExchange(rctx, leases, true, s.cfg.WorkerID, s.cfg.Visibility, s.cfg.MinPriority, max(limit, 0))
	if err != nil {
		return 0, 0, 0, s.failed(acks, reserved, limit, err)
	}
	s.resolve(rctx, acks, settled)
	for _, st := range settled {
		if errors.Is(st.Err, pgtransport.ErrLeaseLost) {
			s.p.core.LeaseLost("ack", st.Lease)
		}
	}
	s.mu.Lock()
	fresh := s.ledger.land(settled, claimed, reserved, start.Add(s.cfg.Visibility), start.Add(s.cfg.Visibility/2))
	s.mu.Unlock()
	for i, st := range settled {
		acks[i].done <- st.Err
	}
	var overflow []*pgtransport.Lease
	put := 0
	for _, l := range fresh {
		select {
		case s.out <- l: // C holds MaxInFlight, and so many slots we have
			put++
		default:
			// The ledger says C has room; were it ever wrong, give the
			// lease back rather than block the stream, and Close, on a send.
			overflow = append(overflow, l)
		}
	}
	s.mu.Lock()
	s.gate.put(put)
	s.mu.Unlock()
	if len(overflow) > 0 {
		err := fmt.Errorf("stream: %d leases over MaxInFlight given back", len(overflow))
		s.p.core.Logger().Error("pgtransport: stream: "+err.Error()+" (a bug: please report it)", slog.String("worker", s.cfg.WorkerID))
		s.report(err)
		s.giveBack(ctx, overflow)
	}
	return len(fresh), len(claimed), core.Freed(settled), nil
}

// failed books a round-trip that failed with err: its reserved slots come
// back, and its acks are retried or answered. An error a retry may get
// past (a lost connection, a timeout) sends them all back for the next
// round-trip, marked in doubt if the reply was lost after the request
// left: the stream retries with backoff (err is returned). A refusal for
// good is answered to the ack it concerns alone, so that no lease may
// wedge the stream: with one ack and no claim the refusal is that ack's;
// otherwise each ack goes back to be settled alone, with no claim. The
// acks' leases stay held, as before their ack.
func (s *stream) failed(acks []ackRequest, reserved, limit int, err error) error {
	leases := leasesOf(acks)
	s.mu.Lock()
	s.ledger.unreserve(reserved)
	switch {
	case len(acks) == 0 || !core.Permanent(err):
		for i := range acks {
			acks[i].doubt = acks[i].doubt || errors.Is(err, pgtransport.ErrOutcomeUnknown)
		}
		s.ledger.settle(leases, false)
		s.acks.requeue(acks)
		s.mu.Unlock()
		return err
	case len(acks) == 1 && limit == 0:
		s.ledger.refuse(leases)
		s.mu.Unlock()
		answer(acks, err) // the same ack would be refused again
		return nil
	default:
		for i := range acks {
			acks[i].alone = true
		}
		s.ledger.settle(leases, false)
		s.acks.requeue(acks)
		s.mu.Unlock()
		s.report(err)
		return nil
	}
}

// resolve settles what a retry cannot tell: an ack in doubt (an earlier
// round-trip with it lost its reply) that the retry finds no longer held
// may have applied the first time. If its message is still queued, it did
// not: ErrLeaseLost holds (the lease lapsed and went elsewhere, and the
// message will be handed out again). If the message is gone while the
// lease could not have lapsed yet (by this process's clock, after the
// check: the ledger's lapse time is never later than the database's), it
// did, since only the group's holder deletes its messages and nobody else
// could hold the group before our ack freed it: nil. Otherwise nobody can
// tell: ErrOutcomeUnknown (the message is not queued any more; it was
// acked, by this ack or by a later holder after the lease lapsed).
func (s *stream) resolve(ctx context.Context, acks []ackRequest, settled []core.Settled) {
	var (
		at     []int
		leases []*pgtransport.Lease
		until  []time.Time
	)
	s.mu.Lock()
	for i, st := range settled {
		if acks[i].doubt && errors.Is(st.Err, pgtransport.ErrLeaseLost) {
			lapses, _ := s.ledger.lapses(acks[i].lease) // zero if no longer held: nothing proven
			at, leases, until = append(at, i), append(leases, acks[i].lease), append(until, lapses)
		}
	}
	s.mu.Unlock()
	if len(at) == 0 {
		return
	}
	pending, err := s.p.core.Pending(ctx, leases)
	checked := time.Now()
	for j, i := range at {
		switch {
		case err != nil:
			settled[i].Err = fmt.Errorf("ack: %w: its reply was lost, and checking failed: %w", pgtransport.ErrOutcomeUnknown, err)
		case pending[j]:
			// Not applied: ErrLeaseLost stands.
		case checked.Before(until[j]):
			settled[i].Err = nil // applied by the attempt whose reply was lost
		default:
			settled[i].Err = fmt.Errorf("ack: %w: its reply was lost and the lease may have lapsed since; the message is not queued any more", pgtransport.ErrOutcomeUnknown)
		}
	}
}

// roundTripTimeout bounds one round-trip of a stream.
const roundTripTimeout = 30 * time.Second

// detach returns a ctx for cleanup and round-trips that must not be cut
// off when ctx ends: it keeps ctx's values, ends after d, and is cancelled
// only if the Transport's Close gives up waiting (closeGrace).
func (t *Transport) detach(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	stop := context.AfterFunc(t.hard, cancel)
	return ctx, func() { stop(); cancel() }
}

// waiterName is the waiter row to arm: none without notifications.
func (s *stream) waiterName() string {
	if s.sub == nil {
		return ""
	}
	return s.waiter
}

// waiterTTL outlives the longest sleep (IdleSweep) with room to spare, so
// the row lapses soon after a consumer dies without removing it.
func (s *stream) waiterTTL() time.Duration { return 2*s.t.cfg.IdleSweep + 5*time.Second }

// giveBackStale takes back from C the leases that waited there too long
// and gives them back; the rest go back into C.
func (s *stream) giveBackStale(ctx context.Context) {
	now := time.Now()
	var stale, keep []*pgtransport.Lease
	waiting := s.drain()
	s.mu.Lock()
	for _, l := range waiting {
		if s.ledger.stale(l, now) {
			stale = append(stale, l)
		} else {
			keep = append(keep, l)
		}
	}
	s.mu.Unlock()
	for _, l := range keep {
		s.out <- l
	}
	if len(stale) > 0 { // not per message: once per sweep, when receivers fall behind
		s.p.core.Logger().Info("pgtransport: stream: gave back leases that waited unreceived for half their visibility; its receivers are not keeping up (claims are held back a while)",
			slog.String("worker", s.cfg.WorkerID), slog.Int("leases", len(stale)))
	}
	// Out of the ledger now, and back to the database from a goroutine of
	// the Transport's (Close waits for it): against a server that stopped
	// answering a give-back waits up to its timeout, and the loop must go
	// on giving back the leases in C that come due meanwhile.
	s.forget(stale)
	if len(stale) > 0 && !s.t.spawn(func() { s.giveBackNow(ctx, stale) }) {
		s.giveBackNow(ctx, stale) // the Transport is closing: give them back here
	}
	s.mu.Lock()
	s.ledger.received(now) // past due and not in C: received, so not given back
	if len(stale) > 0 {    // receivers are not keeping up: claim less (gate)
		s.gate.close(time.Now(), len(s.out), s.ledger.gone, min(s.t.cfg.IdleSweep, s.cfg.Visibility/2))
	}
	s.mu.Unlock()
}

// drain takes every lease waiting in C out of it.
func (s *stream) drain() []*pgtransport.Lease {
	var ls []*pgtransport.Lease
	for {
		select {
		case l := <-s.out:
			ls = append(ls, l)
		default:
			return ls
		}
	}
}

// giveBack gives back leases nobody received (core.Release): each group is
// free at once, first in line, with the same head, the hand-out not
// counted as an attempt, and each give-back wakes a parked caller here
// (as core.Release does). It runs even when ctx has ended.
func (s *stream) giveBack(ctx context.Context, leases []*pgtransport.Lease) {
	s.forget(leases)
	s.giveBackNow(ctx, leases)
}

// forget drops leases from the ledger: the stream no longer tracks them.
func (s *stream) forget(leases []*pgtransport.Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range leases {
		s.ledger.drop(keyOf(l))
	}
}

// giveBackNow gives leases the ledger no longer tracks back to the
// database (core.Release), within 5 s.
func (s *stream) giveBackNow(ctx context.Context, leases []*pgtransport.Lease) {
	if len(leases) == 0 {
		return
	}
	ctx, cancel := s.t.detach(ctx, 5*time.Second)
	defer cancel()
	var failed int
	var last error
	for _, l := range leases {
		if err := s.p.core.Release(ctx, l); err != nil && !errors.Is(err, pgtransport.ErrLeaseLost) {
			failed, last = failed+1, err
			s.report(err) // it comes back after its visibility instead
		}
	}
	lg := s.p.core.Logger()
	if failed > 0 {
		lg.Warn("pgtransport: stream: could not give leases back; they come back when their visibility runs out",
			slog.String("worker", s.cfg.WorkerID), slog.Int("leases", failed), slog.Any("error", last))
	}
	if lg.Enabled(ctx, slog.LevelDebug) {
		lg.Debug("pgtransport: stream: gave back leases nobody received", slog.String("worker", s.cfg.WorkerID), slog.Int("leases", len(leases)-failed))
	}
}

// recover decides after a database error: false ends the stream.
func (s *stream) recover(ctx context.Context, err error, b *backoff.ExponentialBackOff) bool {
	if ctx.Err() != nil {
		return false
	}
	if errors.Is(err, pgtransport.ErrSchemaMissing) {
		s.p.core.Logger().Error("pgtransport: stream stopped: the schema is missing", slog.String("worker", s.cfg.WorkerID), slog.Any("error", err))
		s.stop(err)
		return false
	}
	s.outage.Failed(s.p.core.Logger(), "pgtransport: stream: database call failed; retrying with backoff", err, slog.String("worker", s.cfg.WorkerID))
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

func (s *stream) report(err error) {
	if s.cfg.OnError != nil {
		s.cfg.OnError(err)
	}
}

// finish runs as the stream stops: it stops taking acks and settles those
// queued, gives back the leases still in C, records why it stopped, and
// withdraws the waiter row and the subscription.
func (s *stream) finish(parent context.Context) {
	if err := parent.Err(); err != nil && s.t.ctx.Err() == nil {
		s.stop(err)
	}
	s.stop(pgtransport.ErrClosed) // if nothing else was recorded
	s.mu.Lock()
	acks := s.acks.close()
	s.mu.Unlock()
	ctx, cancel := s.t.detach(context.Background(), roundTripTimeout)
	defer cancel()
	for len(acks) > 0 {
		_, _, freed, err := s.exchange(ctx, acks, 0)
		s.p.parking.Wake(freed) // for other waiters here
		s.mu.Lock()
		if err != nil {
			acks = s.acks.drain() // the acks sent, back in the queue
			s.mu.Unlock()
			answer(acks, err)
			break
		}
		acks, _ = s.acks.take() // those split off to settle alone
		s.mu.Unlock()
	}
	s.giveBack(ctx, s.drain())
	if s.sub != nil {
		s.sub.Close()
		_ = s.p.core.Unwait(ctx, s.waiter) // best effort: the row lapses anyway
	}
	s.p.streams.remove(s)
	s.cancel() // unhooks ctx from the Transport's
}

func newRetry() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 50 * time.Millisecond
	b.MaxInterval = 2 * time.Second
	b.MaxElapsedTime = 0
	return b
}
