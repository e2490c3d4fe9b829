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
	// not yet acked or nacked, plus the one (at most) waiting to be
	// received. So it is also how many groups the stream draws from at
	// once. 0 means 1.
	MaxInFlight int
	// OnError, if set, is told of each error the stream recovers from (it
	// retries with backoff). It runs on the stream's goroutine and must not
	// block.
	OnError func(error)
}

// Stream delivers leases on a channel as groups become claimable. It claims
// only while it holds fewer than MaxInFlight leases: a lease counts from its
// claim until the receiver acks or nacks it through the Transport, or its
// visibility runs out. A lease nobody receives within half its visibility
// is given back (nack with no delay) before it can lapse unseen.
//
// While idle it waits, without polling, for the first of: a notification of
// a new group (LISTEN/NOTIFY), an ack, nack or publish through the same
// Transport, the earliest lease or park it saw when it went idle running
// out, and Config.IdleSweep.
type Stream struct {
	t      *Transport
	cfg    StreamConfig
	out    chan *pgtransport.Lease
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns, after out
	kick   chan struct{} // in-process wake-ups; holds at most one
	sub    *notify.Subscription
	waiter string // this stream's row in transport_waiters

	mu   stdsync.Mutex
	held map[string]time.Time // token -> when its lease lapses, by this process's clock
	free chan struct{}        // a slot came free; holds at most one
	err  error
}

// Stream starts a consumer of leases for cfg.WorkerID. It runs until ctx
// ends, Close, or the Transport closes; then it gives back a lease it had
// claimed but not delivered, closes the channel and records why in Err.
// Errors from the database are retried with backoff; only ErrSchemaMissing
// ends the stream.
func (t *Transport) Stream(ctx context.Context, cfg StreamConfig) (*Stream, error) {
	if err := core.CheckClaim(cfg.WorkerID, cfg.Visibility, cfg.MinPriority); err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	if cfg.MaxInFlight < 0 {
		return nil, fmt.Errorf("stream: %w: MaxInFlight %d", pgtransport.ErrInvalidConfig, cfg.MaxInFlight)
	}
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, 1)
	s := &Stream{
		t:      t,
		cfg:    cfg,
		out:    make(chan *pgtransport.Lease),
		done:   make(chan struct{}),
		kick:   make(chan struct{}, 1),
		waiter: core.NewToken(cfg.WorkerID),
		held:   map[string]time.Time{},
		free:   make(chan struct{}, 1),
	}
	if t.isClosed() {
		return nil, fmt.Errorf("stream: %w", pgtransport.ErrClosed)
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
	t.streams[s] = struct{}{}
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

// Close stops the stream and waits for it: a lease claimed and not yet
// received is given back, and C is closed. Safe to call twice.
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

func (s *Stream) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// release frees the slot of a settled lease.
func (s *Stream) release(token string) {
	s.mu.Lock()
	delete(s.held, token)
	s.mu.Unlock()
	select {
	case s.free <- struct{}{}:
	default:
	}
}

func (s *Stream) extend(token string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.held[token]; ok {
		s.held[token] = until
	}
}

// run is the stream's goroutine.
func (s *Stream) run(ctx, parent context.Context) {
	defer close(s.done)
	defer close(s.out)
	defer s.finish(parent)
	var (
		sleepy bool // the last claim found nothing: look (and arm) before the next
		armed  bool // our waiter row may exist
		next   time.Time
		retry  = newRetry()
	)
	for {
		if !s.waitSlot(ctx) {
			return
		}
		if sleepy {
			d, ok, err := s.t.core.Wait(ctx, s.waiterName(), s.cfg.MinPriority, s.waiterTTL())
			if err != nil {
				if !s.recover(ctx, err, retry) {
					return
				}
				continue
			}
			armed = s.sub != nil
			next = time.Time{}
			if ok {
				next = time.Now().Add(d)
			}
		}
		start := time.Now()
		l, err := s.claim(ctx)
		if err != nil {
			if !s.recover(ctx, err, retry) {
				return
			}
			continue
		}
		retry.Reset()
		if l == nil {
			if !sleepy {
				sleepy = true // look, arm, and claim once more before sleeping
				continue
			}
			if !s.sleep(ctx, next) {
				return
			}
			continue
		}
		if armed {
			if err := s.t.core.Unwait(ctx, s.waiter); err != nil {
				s.report(err) // harmless: the row only makes publishers notify until it lapses
			}
			armed = false
		}
		sleepy = false
		if !s.deliver(ctx, l, start) {
			return
		}
	}
}

// claim claims one lease. The stream stopping does not cancel it: a claim
// cut off mid-way may have taken a lease we would never learn of, held
// until its visibility runs out. A claim that lands after the stop is given
// back by deliver.
func (s *Stream) claim(ctx context.Context) (*pgtransport.Lease, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	return s.t.core.Claim(ctx, s.cfg.WorkerID, s.cfg.Visibility, s.cfg.MinPriority)
}

// claimTimeout bounds one claim round-trip of a stream.
const claimTimeout = 30 * time.Second

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

// waitSlot waits until the stream holds fewer than MaxInFlight leases.
func (s *Stream) waitSlot(ctx context.Context) bool {
	for {
		s.mu.Lock()
		now := time.Now()
		var first time.Time
		for tok, until := range s.held {
			if !until.After(now) {
				delete(s.held, tok) // lapsed: the group is claimable again, not ours
				s.t.leases.Delete(tok)
				continue
			}
			if first.IsZero() || until.Before(first) {
				first = until
			}
		}
		n := len(s.held)
		s.mu.Unlock()
		if n < s.cfg.MaxInFlight {
			return true
		}
		timer := time.NewTimer(time.Until(first))
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-s.free:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// sleep waits for a reason to claim again; false when ctx ended.
func (s *Stream) sleep(ctx context.Context, next time.Time) bool {
	d := s.t.cfg.IdleSweep
	if !next.IsZero() {
		d = min(d, time.Until(next)+time.Millisecond)
	}
	timer := time.NewTimer(max(d, 0))
	defer timer.Stop()
	var notified <-chan struct{}
	if s.sub != nil {
		notified = s.sub.C()
	}
	select {
	case <-ctx.Done():
		return false
	case <-notified:
	case <-s.kick:
	case <-timer.C:
	}
	return true
}

// deliver hands l to the receiver. It counts against MaxInFlight from now;
// if nobody receives it within half its visibility, or the stream stops
// first, it is given back.
func (s *Stream) deliver(ctx context.Context, l *pgtransport.Lease, claimed time.Time) bool {
	s.mu.Lock()
	s.held[l.Token] = claimed.Add(s.cfg.Visibility)
	s.mu.Unlock()
	s.t.leases.Store(l.Token, s) // before the receiver can settle it
	if ctx.Err() != nil {
		s.giveBack(ctx, l) // claimed as the stream stopped
		return false
	}
	timer := time.NewTimer(time.Until(claimed.Add(s.cfg.Visibility / 2)))
	defer timer.Stop()
	select {
	case s.out <- l:
		return true
	case <-timer.C:
		s.giveBack(ctx, l)
		return true
	case <-ctx.Done():
		s.giveBack(ctx, l)
		return false
	}
}

// giveBack nacks an undelivered lease with no delay: its group is first in
// line again with the same head. It runs even when ctx has ended.
func (s *Stream) giveBack(ctx context.Context, l *pgtransport.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s.t.leases.Delete(l.Token)
	s.release(l.Token)
	if err := s.t.core.Nack(ctx, l, 0); err != nil && !errors.Is(err, pgtransport.ErrLeaseLost) {
		s.report(err) // it comes back after its visibility instead
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

// finish runs as the stream stops: it records why, withdraws the waiter row
// and the subscription, and leaves the Transport.
func (s *Stream) finish(parent context.Context) {
	if err := parent.Err(); err != nil && s.t.ctx.Err() == nil {
		s.stop(err)
	}
	s.stop(pgtransport.ErrClosed) // if nothing else was recorded
	if s.sub != nil {
		s.sub.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.t.core.Unwait(ctx, s.waiter) // best effort: the row lapses anyway
		cancel()
	}
	s.t.mu.Lock()
	delete(s.t.streams, s)
	s.t.mu.Unlock()
	s.cancel() // unhooks ctx from the Transport's
}

func newRetry() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 50 * time.Millisecond
	b.MaxInterval = 2 * time.Second
	b.MaxElapsedTime = 0
	return b
}
