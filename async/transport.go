package async

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	stdsync "sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/notify"
)

// Result is what a call's channel delivers: the value and the error the
// blocking transport's method would have returned.
type Result[T any] struct {
	Value T
	Err   error
}

// Transport is the channel-based transport. Each call returns at once with a
// channel that delivers its one result and is then left open (it is
// buffered: nobody needs to receive). It is safe for concurrent use.
type Transport struct {
	core   *core.Core
	pool   *pgxpool.Pool
	owned  bool // Close closes pool (FromDSN)
	cfg    pgtransport.Config
	ctx    context.Context // ends as Close begins: streams and waits stop
	cancel context.CancelFunc
	hard   context.Context // ends closeGrace later: round-trips still out are cut off
	abort  context.CancelFunc

	listener *notify.Listener // nil with Config.DisableNotify, and when pollOnly
	release  func()           // gives the shared listener back
	channel  string           // this schema's NOTIFY channel
	pollOnly bool             // a transaction pooler and no ListenDSN: no notifications can arrive

	mu      stdsync.Mutex
	closed  bool
	wg      stdsync.WaitGroup // every goroutine the Transport started
	streams streamSet         // the running streams, asked which holds a lease
	parking *core.Parking     // the core's: idle streams and ClaimWait callers of this Transport
}

// New returns a Transport on pool. Unless cfg.SkipApply, it first brings the
// schema up to date. Unless cfg.DisableNotify, its streams share one LISTEN
// connection per pool (taken out of the pool) with every other Transport on
// the same pool; with cfg.ListenDSN, one per process and ListenDSN instead.
//
// Behind a transaction pooler (cfg.Pooling; detected on open unless it says)
// it refuses a query exec mode that keeps session state
// (pgtransport.ErrPoolerExecMode), and never listens on the pool, through
// which no notification arrives: without cfg.ListenDSN its streams find
// work every cfg.IdleSweep (Stream.PollOnly; logged once, at Warn).
func New(ctx context.Context, pool *pgxpool.Pool, cfg pgtransport.Config) (*Transport, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", pgtransport.ErrInvalidConfig)
	}
	c, err := core.New(ctx, pool, cfg)
	if err != nil {
		return nil, err
	}
	pooled := c.Pooled()
	t := &Transport{core: c, pool: pool, cfg: c.Config(), parking: c.Parking()}
	if !t.cfg.DisableNotify {
		switch {
		case t.cfg.ListenDSN != "":
			t.listener, t.release = notify.SharedDSN(t.cfg.ListenDSN, t.listenConfig())
		case pooled:
			t.pollOnly = true
			c.Logger().Warn("pgtransport: the pool goes through a transaction pooler, through which LISTEN delivers nothing: notifications are off, and idle streams look for work every IdleSweep; set Config.ListenDSN to a connection string straight to PostgreSQL to wake them at once",
				slog.Duration("idle_sweep", t.cfg.IdleSweep))
		default:
			t.listener, t.release = notify.Shared(pool, t.listenConfig())
		}
		if t.listener != nil {
			if t.channel, err = c.Channel(ctx); err != nil {
				t.release()
				return nil, err
			}
		}
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.hard, t.abort = context.WithCancel(context.Background())
	if t.cfg.Vacuum > 0 {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			t.vacuum()
		}()
	}
	return t, nil
}

// listenConfig is the shared listener's Config as this Transport would
// have it. Its liveness probe notifies through the Transport's pool, also
// when the pool goes through a transaction pooler (NOTIFY is the server's
// to deliver) or to a new primary after a failover: so a listener left
// on a host the pool no longer reaches hears nothing and reconnects.
func (t *Transport) listenConfig() notify.Config {
	return notify.Config{
		Logger:       t.cfg.Logger,
		PingInterval: t.cfg.ListenPing,
		Probe:        notify.ProbeThrough(t.pool),
	}
}

// vacuum is the goroutine Config.Vacuum asks for: it vacuums the queue
// tables as they collect dead rows, until Close. A failed round (a role
// that may not vacuum, a lost connection) is tried again next time.
func (t *Transport) vacuum() {
	tick := time.NewTicker(t.cfg.Vacuum)
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
			_, _ = t.core.Vacuum(t.ctx)
		}
	}
}

// FromDSN connects to dsn with a pool, waiting with backoff while the server
// does not accept connections (as sync.FromDSN does; an empty dsn means
// libpq's defaults there too), and returns a
// Transport that owns the pool. The pool holds up to
// pgtransport.DefaultPoolSize (20) connections unless the dsn sets
// pool_max_conns: a stream uses up to two, each call in flight (a Fail,
// a Publish) one, and notifications one more, outside the pool.
func FromDSN(ctx context.Context, dsn string, cfg pgtransport.Config) (*Transport, error) {
	t, _, err := core.FromDSN(ctx, dsn, cfg, func(pool *pgxpool.Pool, cfg pgtransport.Config) (*Transport, error) {
		return New(ctx, pool, cfg)
	})
	if err != nil {
		return nil, err
	}
	t.owned = true
	return t, nil
}

// Close stops every stream and waits for every goroutine the Transport
// started. With a server that answers it returns as soon as the calls in
// flight have (milliseconds); with one that stopped answering, within
// about twice closeGrace (5 s: the grace, then a give-back's own bound).
// Leases a stream had claimed
// but not yet handed to its receiver are given back at once (free, first
// in line, not counted as an attempt), so they are not held until their visibility runs out; leases
// already received stay the receiver's and come back after their
// visibility unless settled with another transport. A ClaimWait waiting
// for work ends at once with ErrClosed; if its claim was in flight, the
// lease it brings back is given back and the call still delivers
// ErrClosed. Other round-trips in flight are not cancelled, so none ends
// with an unknown outcome, unless still out after closeGrace (a server
// that stopped answering): then their ctx is cancelled. Later calls
// deliver ErrClosed. Closes the pool FromDSN opened. Safe to call twice.
func (t *Transport) Close() {
	if t.beginClose() {
		t.finishClose()
	}
}

// beginClose is Close's first half, which waits for nothing: every later
// call returns ErrClosed, streams and waits stop. False if the Transport
// was closed already.
func (t *Transport) beginClose() bool {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return false
	}
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	t.parking.Close()
	return true
}

// finishClose is Close's second half: it waits for the Transport's
// goroutines (cutting off round-trips still out after closeGrace), then
// gives back the listener and closes an owned pool.
func (t *Transport) finishClose() {
	done := make(chan struct{})
	go func() { // owned by Close, which waits for it below
		defer close(done)
		t.wg.Wait()
	}()
	grace := time.NewTimer(closeGrace)
	select {
	case <-done:
	case <-grace.C:
		t.core.Logger().Warn("pgtransport: close: round-trips still out after the grace period were cancelled; their outcome is unknown",
			"grace", closeGrace)
		t.abort()
		<-done
	}
	grace.Stop()
	t.abort()
	if t.release != nil {
		t.release()
	}
	if t.owned {
		t.pool.Close()
	}
}

// closeGrace is how long Close lets round-trips in flight finish before
// it cancels them. A healthy server answers in milliseconds; this only
// bounds Close when it does not.
const closeGrace = 5 * time.Second

// Publish appends event to group's FIFO and delivers its seq. A new group
// gets priority (0-4); an existing one keeps its priority and any live lease.
// One round-trip.
//
// A lost reply delivers ErrOutcomeUnknown, as sync.Transport.Publish says.
func (t *Transport) Publish(ctx context.Context, group, event string, priority int) <-chan Result[int64] {
	return call(t, ctx, func(ctx context.Context) (int64, error) {
		return t.core.Publish(ctx, group, event, priority)
	})
}

// PublishTx is Publish inside the caller's transaction: the message commits
// or rolls back with the caller's own writes. The transaction is in use
// until the result is delivered; do not use it meanwhile.
func (t *Transport) PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) <-chan Result[int64] {
	return call(t, ctx, func(ctx context.Context) (int64, error) {
		return t.core.PublishTx(ctx, tx, group, event, priority)
	})
}

// PublishMessage appends msg to its group's FIFO and delivers its seq;
// with a msg.DedupKey it is idempotent, delivering the first message's seq
// for a duplicate within Config.DedupWindow. As
// sync.Transport.PublishMessage. One round-trip.
//
// A lost reply delivers ErrOutcomeUnknown, as sync.Transport.PublishMessage says.
func (t *Transport) PublishMessage(ctx context.Context, msg pgtransport.Message) <-chan Result[int64] {
	return call(t, ctx, func(ctx context.Context) (int64, error) {
		return t.core.PublishMessage(ctx, msg)
	})
}

// PublishMessageTx is PublishMessage inside the caller's transaction, as
// sync.Transport.PublishMessageTx. The transaction is in use until the
// result is delivered; do not use it meanwhile.
func (t *Transport) PublishMessageTx(ctx context.Context, tx pgx.Tx, msg pgtransport.Message) <-chan Result[int64] {
	return call(t, ctx, func(ctx context.Context) (int64, error) {
		return t.core.PublishMessageTx(ctx, tx, msg)
	})
}

// Claim leases the claimable group (priority >= minPriority) that was served
// longest ago and delivers its head, held for visibility, or a nil lease
// when nothing is claimable: like the blocking Claim, it does not wait for
// work (a Stream does). One round-trip.
//
// A lost reply delivers ErrOutcomeUnknown, as sync.Transport.Claim says.
func (t *Transport) Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) <-chan Result[*pgtransport.Lease] {
	return call(t, ctx, func(ctx context.Context) (*pgtransport.Lease, error) {
		return t.core.Claim(ctx, workerID, visibility, minPriority)
	})
}

// Ack deletes the lease's message and frees its group for the next claim (or
// deletes the group's row when it has no message left). ErrLeaseLost if the
// lease no longer holds. One round-trip; but the ack of a lease a Stream
// delivered joins that stream's next round-trip, which settles all acks
// queued since the last one and claims more in the same transaction: its
// channel delivers when that batch commits (after at most the round-trip in
// flight and its own), and ctx no longer cancels it once queued.
//
// A lost reply delivers ErrOutcomeUnknown, as sync.Transport.Ack says. A
// stream settles the outcome of its own round-trips: it retries a batch
// whose reply was lost, and an ack the retry finds no longer held is
// answered nil if its message is gone while the lease could not have
// lapsed (the first attempt applied it: only the group's holder deletes its
// messages), ErrLeaseLost only if its message is still queued (it will be
// handed out again), and otherwise ErrOutcomeUnknown: the message is not
// queued any more, acked by this ack or, after the lease lapsed, by another
// worker. An ack the database refuses for good (anything but a lost
// connection, a timeout or a transient failure) is answered that error, and
// the acks batched with it are settled without it: one lease cannot stop a
// stream.
func (t *Transport) Ack(ctx context.Context, lease *pgtransport.Lease) <-chan error {
	if ctx.Err() == nil {
		if done, ok := t.streams.enqueue(lease); ok {
			return done // no goroutine of its own: the stream answers
		}
	}
	return callErr(t, ctx, func(ctx context.Context) error {
		err := t.core.Ack(ctx, lease)
		if err == nil || errors.Is(err, pgtransport.ErrLeaseLost) {
			t.forget(lease) // a stream stopping no longer batches acks
		}
		return err
	})
}

// Nack gives the lease back without deleting the message: delay > 0 parks
// the group until now+delay, delay == 0 frees it at once, first in line.
// ErrLeaseLost if the lease no longer holds. One round-trip.
//
// A lost reply delivers ErrOutcomeUnknown, as sync.Transport.Nack says.
func (t *Transport) Nack(ctx context.Context, lease *pgtransport.Lease, delay time.Duration) <-chan error {
	return callErr(t, ctx, func(ctx context.Context) error {
		err := t.core.Nack(ctx, lease, delay)
		if err == nil || errors.Is(err, pgtransport.ErrLeaseLost) {
			t.forget(lease)
		}
		return err
	})
}

// Fail ends the lease as a failed attempt, recording cause's text on the
// message; by the queue's policy the group is parked for a backoff, or
// the message is dead-lettered, or the group stopped. As
// sync.Transport.Fail: fenced like Ack (ErrLeaseLost if the lease no
// longer holds, and nothing changed). A lease a Stream delivered leaves
// the stream's count of leases in flight, as with Nack. One round-trip.
//
// A lost reply delivers ErrOutcomeUnknown, as sync.Transport.Fail says.
func (t *Transport) Fail(ctx context.Context, lease *pgtransport.Lease, cause error) <-chan error {
	return callErr(t, ctx, func(ctx context.Context) error {
		_, err := t.core.Fail(ctx, lease, cause)
		if err == nil || errors.Is(err, pgtransport.ErrLeaseLost) {
			t.forget(lease)
		}
		return err
	})
}

// Extend makes the lease hold until now+visibility. ErrLeaseLost if the
// lease no longer holds. One round-trip.
//
// A lost reply delivers ErrOutcomeUnknown, as sync.Transport.Extend says.
func (t *Transport) Extend(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) <-chan error {
	return callErr(t, ctx, func(ctx context.Context) error {
		start := time.Now()
		err := t.core.Extend(ctx, lease, visibility)
		if err == nil {
			t.streams.extend(lease, nil, start.Add(visibility))
		}
		return err
	})
}

// PublishMany appends every message, in slice order, and delivers their
// seqs in that order, each DedupKey honoured: in one round-trip up to
// pgtransport.MaxBatch, and past it in chunks inside one transaction; as
// sync.Transport.PublishMany.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) PublishMany(ctx context.Context, msgs []pgtransport.Message) <-chan Result[[]int64] {
	return call(t, ctx, func(ctx context.Context) ([]int64, error) {
		return t.core.PublishMany(ctx, msgs)
	})
}

// ClaimWait delivers a lease once one is claimable, or ctx's error; as
// sync.Transport.ClaimWait (a Stream also wakes on notifications).
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) <-chan Result[*pgtransport.Lease] {
	return call(t, ctx, func(ctx context.Context) (*pgtransport.Lease, error) {
		return t.core.ClaimWait(ctx, workerID, visibility, minPriority)
	})
}

// ClaimMany leases up to max groups in one round-trip; as
// sync.Transport.ClaimMany.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) <-chan Result[[]*pgtransport.Lease] {
	return call(t, ctx, func(ctx context.Context) ([]*pgtransport.Lease, error) {
		return t.core.ClaimMany(ctx, workerID, visibility, minPriority, max)
	})
}

// AckMany settles leases in one round-trip, with an entry per lease (nil or
// ErrLeaseLost); as sync.Transport.AckMany.
//
// A lost reply (or ctx ending while it runs): ErrOutcomeUnknown, as there.
func (t *Transport) AckMany(ctx context.Context, leases []*pgtransport.Lease) <-chan Result[[]error] {
	return call(t, ctx, func(ctx context.Context) ([]error, error) {
		errs, err := t.core.AckMany(ctx, leases)
		if err != nil {
			return nil, err
		}
		for _, l := range leases { // settled or lost: no stream holds it now
			t.forget(l)
		}
		return errs, nil
	})
}

// AckNext acks the lease and delivers the group's next message under the
// same lease when it keeps the group; as sync.Transport.AckNext. That
// lease is held until settled or lapsed: a worker that stops with it
// gives it back with Nack(ctx, next, 0), or its group waits out the
// visibility.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) AckNext(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) <-chan Result[*pgtransport.Lease] {
	return call(t, ctx, func(ctx context.Context) (*pgtransport.Lease, error) {
		start := time.Now()
		next, err := t.core.AckNext(ctx, lease, visibility)
		switch {
		case next != nil:
			t.streams.extend(lease, next, start.Add(visibility)) // the same lease, on
		case err == nil || errors.Is(err, pgtransport.ErrLeaseLost):
			t.forget(lease)
		}
		return next, err
	})
}

// DeadLetters delivers a page of the queue's dead letters, in seq order;
// as sync.Transport.DeadLetters.
func (t *Transport) DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) <-chan Result[[]pgtransport.DeadLetter] {
	return call(t, ctx, func(ctx context.Context) ([]pgtransport.DeadLetter, error) {
		return t.core.DeadLetters(ctx, q)
	})
}

// Redrive puts the dead letters f selects back at the heads of their
// groups, in their original order, and delivers how many; as
// sync.Transport.Redrive.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) <-chan Result[int64] {
	return call(t, ctx, func(ctx context.Context) (int64, error) {
		return t.core.Redrive(ctx, f)
	})
}

// PurgeDeadLetters deletes the dead letters f selects and delivers how
// many; as sync.Transport.PurgeDeadLetters.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) <-chan Result[int64] {
	return call(t, ctx, func(ctx context.Context) (int64, error) {
		return t.core.PurgeDeadLetters(ctx, f)
	})
}

// RestartGroup resumes a stopped group, dead-lettering its head first
// with skipHead; ErrGroupNotStopped if it is not stopped. As
// sync.Transport.RestartGroup.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) RestartGroup(ctx context.Context, group string, skipHead bool) <-chan error {
	return callErr(t, ctx, func(ctx context.Context) error {
		return t.core.RestartGroup(ctx, group, skipHead)
	})
}

// forget frees the stream slot of a lease settled outside its stream.
func (t *Transport) forget(l *pgtransport.Lease) {
	if l == nil {
		return
	}
	t.streams.release(l)
}

// call runs f on its own goroutine, owned by t, and delivers the result on a buffered channel.
func call[T any](t *Transport, ctx context.Context, f func(context.Context) (T, error)) <-chan Result[T] {
	out := make(chan Result[T], 1)
	t.do(ctx, func(ctx context.Context) {
		v, err := f(ctx)
		out <- Result[T]{Value: v, Err: err}
	}, func() { out <- Result[T]{Err: pgtransport.ErrClosed} })
	return out
}

// callErr is call for calls that return only an error.
func callErr(t *Transport, ctx context.Context, f func(context.Context) error) <-chan error {
	out := make(chan error, 1)
	t.do(ctx, func(ctx context.Context) { out <- f(ctx) }, func() { out <- pgtransport.ErrClosed })
	return out
}

// do runs f on a goroutine the Transport waits for at Close, or closed if
// the Transport is closed. f's ctx is also cancelled if f is still running
// closeGrace after Close began.
func (t *Transport) do(ctx context.Context, f func(context.Context), closed func()) {
	if !t.spawn(func() {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(t.hard, cancel)
		defer stop()
		f(ctx)
	}) {
		closed()
	}
}

// spawn starts f on a goroutine the Transport waits for at Close; false
// after Close.
func (t *Transport) spawn(f func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
	return true
}

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// bind returns ctx, also cancelled when the Transport closes.
func (t *Transport) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(t.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}
