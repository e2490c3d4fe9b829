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
	"github.com/pgtransport/pgtransport/internal/cluster"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/notify"
)

// Result is what a call's channel delivers: the value and the error the
// blocking transport's method would have returned.
type Result[T any] struct {
	Value T
	Err   error
}

// Transport is the channel-based transport over a queue of N >= 1
// partitions: one database (New, FromDSN), or the databases a PL/Proxy
// proxy routes over, reached directly (NewCluster, OpenCluster), as
// sync.Transport says (see it for what spans partitions). Each call
// returns at once with a channel that delivers its one result and is then
// left open (it is buffered: nobody needs to receive). It is safe for
// concurrent use. Each partition has its pool, its listener and its
// streams' bookkeeping; every goroutine any of them starts is the
// Transport's, and Close waits for it.
type Transport struct {
	cl     *cluster.Cluster
	parts  []*part
	cfg    pgtransport.Config
	owned  []*pgxpool.Pool // closed by Close; set by FromDSN and OpenCluster
	ctx    context.Context // ends as Close begins: streams and waits stop
	cancel context.CancelFunc
	hard   context.Context // ends closeGrace later: round-trips still out are cut off
	abort  context.CancelFunc

	mu     stdsync.Mutex
	closed bool
	wg     stdsync.WaitGroup // every goroutine the Transport started
	once   stdsync.Once      // Close's body: a second call waits for the first
}

// part is one partition's share of a Transport.
type part struct {
	core     *core.Core
	pool     *pgxpool.Pool
	listener *notify.Listener // nil with Config.Async.DisableNotify, and when pollOnly
	release  func()           // gives the shared listener back
	channel  string           // this schema's NOTIFY channel
	pollOnly bool             // a transaction pooler and no ListenDSN: no notifications can arrive
	streams  streamSet        // the running streams, asked which holds a lease
	parking  *core.Parking    // the core's: idle streams and ClaimWait callers
}

// New returns a Transport on pool, one database. Unless cfg.SkipApply, it
// first brings the schema up to date. Unless cfg.Async.DisableNotify, its
// streams share one LISTEN connection per pool (taken out of the pool)
// with every other Transport on the same pool; with cfg.Async.ListenDSN,
// one per process and ListenDSN instead. The caller owns pool.
//
// Behind a transaction pooler (cfg.Pooling; detected on open unless it says)
// it refuses a query exec mode that keeps session state
// (pgtransport.ErrPoolerExecMode), and never listens on the pool, through
// which no notification arrives: without cfg.Async.ListenDSN its streams
// find work every cfg.IdleSweep (Stream.PollOnly; logged once, at Warn).
func New(ctx context.Context, pool *pgxpool.Pool, cfg pgtransport.Config) (*Transport, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", pgtransport.ErrInvalidConfig)
	}
	cl, err := cluster.Single(ctx, pool, cfg)
	if err != nil {
		return nil, err
	}
	return open(ctx, cl, []*pgxpool.Pool{pool})
}

// NewCluster returns a Transport on a partitioned queue, pools[i] on
// partition i's database, checked as sync.NewCluster checks them. The
// caller owns the pools.
func NewCluster(ctx context.Context, pools []*pgxpool.Pool, cfg pgtransport.Config) (*Transport, error) {
	cl, err := cluster.Open(ctx, pools, cfg)
	if err != nil {
		return nil, err
	}
	return open(ctx, cl, pools)
}

// open is the Transport on cl, whose partition i runs on pools[i]: each
// partition's listener, then the Transport's own goroutines.
func open(ctx context.Context, cl *cluster.Cluster, pools []*pgxpool.Pool) (*Transport, error) {
	t := &Transport{cl: cl, cfg: cl.Part(0).Config()}
	for i, pool := range pools {
		p, err := t.openPart(ctx, cl.Part(i), pool)
		if err != nil {
			t.releaseListeners()
			return nil, fmt.Errorf("%s%w", partitionPrefix(cl.N(), i), err)
		}
		t.parts = append(t.parts, p)
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.hard, t.abort = context.WithCancel(context.Background())
	if t.cfg.Async.Vacuum > 0 {
		for _, p := range t.parts {
			t.wg.Go(func() { t.vacuum(p) })
		}
	}
	return t, nil
}

// partitionPrefix names partition i in an error, over several.
func partitionPrefix(n, i int) string {
	if n == 1 {
		return ""
	}
	return fmt.Sprintf("partition %d: ", i)
}

// openPart is partition c's share of t, on pool: its listener, unless
// notifications are off or cannot arrive.
func (t *Transport) openPart(ctx context.Context, c *core.Core, pool *pgxpool.Pool) (*part, error) {
	p := &part{core: c, pool: pool, parking: c.Parking()}
	if t.cfg.Async.DisableNotify {
		return p, nil
	}
	switch {
	case t.cfg.Async.ListenDSN != "":
		p.listener, p.release = notify.SharedDSN(t.cfg.Async.ListenDSN, t.listenConfig(pool))
	case c.Pooled():
		p.pollOnly = true
		c.Logger().Warn("pgtransport: the pool goes through a transaction pooler, through which LISTEN delivers nothing: notifications are off, and idle streams look for work every IdleSweep; set Config.Async.ListenDSN to a connection string straight to PostgreSQL to wake them at once",
			slog.Duration("idle_sweep", t.cfg.IdleSweep))
		return p, nil
	default:
		p.listener, p.release = notify.Shared(pool, t.listenConfig(pool))
	}
	var err error
	if p.channel, err = c.Channel(ctx); err != nil {
		p.release()
		return nil, err
	}
	return p, nil
}

// releaseListeners gives back every partition's listener.
func (t *Transport) releaseListeners() {
	for _, p := range t.parts {
		if p.release != nil {
			p.release()
		}
	}
}

// listenConfig is the shared listener's Config as this Transport would
// have it on pool. Its liveness probe notifies through the pool, also
// when the pool goes through a transaction pooler (NOTIFY is the server's
// to deliver) or to a new primary after a failover: so a listener left
// on a host the pool no longer reaches hears nothing and reconnects.
func (t *Transport) listenConfig(pool *pgxpool.Pool) notify.Config {
	return notify.Config{
		Logger:       t.cfg.Logger,
		PingInterval: t.cfg.Async.ListenPing,
		Probe:        notify.ProbeThrough(pool),
	}
}

// vacuum is the goroutine Config.Async.Vacuum asks for on partition p: it
// vacuums the queue tables as they collect dead rows, until Close. A
// failed round (a role that may not vacuum, a lost connection) is tried
// again next time.
func (t *Transport) vacuum(p *part) {
	tick := time.NewTicker(t.cfg.Async.Vacuum)
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
			_, _ = p.core.Vacuum(t.ctx)
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
	pool, cfg, err := cluster.Connect(ctx, dsn, cfg)
	if err != nil {
		return nil, err
	}
	t, err := New(ctx, pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	t.owned = []*pgxpool.Pool{pool}
	return t, nil
}

// OpenCluster reads the partition map from the PL/Proxy proxy at proxyDSN
// and connects to each partition, as sync.OpenCluster does; the Transport
// owns the pools.
func OpenCluster(ctx context.Context, proxyDSN string, cfg pgtransport.Config) (*Transport, error) {
	pools, cfg, err := cluster.ConnectCluster(ctx, proxyDSN, cfg)
	if err != nil {
		return nil, err
	}
	t, err := NewCluster(ctx, pools, cfg)
	if err != nil {
		for _, p := range pools {
			p.Close()
		}
		return nil, err
	}
	t.owned = pools
	return t, nil
}

// Close stops every stream and waits for every goroutine the Transport
// started. With a server that answers it returns as soon as the calls in
// flight have (milliseconds); with one that stopped answering, within
// about twice closeGrace (5 s: the grace, then a give-back's own bound),
// but for a ClaimWait over partitions whose claim is out to a partition
// that stopped answering: that claim's own bound (30 s) and a give-back's
// (5 s).
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
// deliver ErrClosed. Closes the pools FromDSN or OpenCluster opened. Safe
// to call twice, and at once: a second call returns when the first has.
func (t *Transport) Close() {
	t.once.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		t.cancel()
		for _, p := range t.parts {
			p.parking.Close()
		}
		t.finishClose()
	})
}

// finishClose is Close's second half: it waits for the Transport's
// goroutines (cutting off round-trips still out after closeGrace) and
// ClaimWait's waits over partitions, then gives back the listeners and
// closes the owned pools.
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
		t.cl.Part(0).Logger().Warn("pgtransport: close: round-trips still out after the grace period were cancelled; their outcome is unknown",
			"grace", closeGrace)
		t.abort()
		<-done
	}
	grace.Stop()
	t.abort()
	t.cl.Close()
	t.releaseListeners()
	for _, p := range t.owned {
		p.Close()
	}
}

// Partitions is the number of partitions: 1 on one database.
func (t *Transport) Partitions() int { return t.cl.N() }

// Home is the partition group lives on, as sync.Transport.Home.
func (t *Transport) Home(group string) int { return t.cl.Home(group) }

// Locate delivers the partition that holds group now, as
// sync.Transport.Locate.
func (t *Transport) Locate(ctx context.Context, group string) <-chan Result[int] {
	return call(t, ctx, func(ctx context.Context) (int, error) { return t.cl.Locate(ctx, group) })
}

// Partition is the pool partition i runs on (the one given to New on one
// database): begin the transaction of a PublishTx, AckTx or StateTx on
// Partition(Locate(group)).
func (t *Transport) Partition(i int) *pgxpool.Pool { return t.parts[i].pool }

// of is the partition of the lease's message.
func (t *Transport) of(l *pgtransport.Lease) *part { return t.parts[t.cl.Of(l)] }

// onGroup is f on the Core of the partition that holds group now
// (cluster.OnGroup), on a goroutine of t.
func onGroup[T any](t *Transport, ctx context.Context, group string, f func(context.Context, *core.Core) (T, error)) <-chan Result[T] {
	return call(t, ctx, func(ctx context.Context) (T, error) {
		c, err := t.cl.OnGroup(ctx, group)
		if err != nil {
			var zero T
			return zero, err
		}
		return f(ctx, c)
	})
}

// onGroupErr is onGroup for a call that returns only an error.
func onGroupErr(t *Transport, ctx context.Context, group string, f func(context.Context, *core.Core) error) <-chan error {
	return callErr(t, ctx, func(ctx context.Context) error {
		c, err := t.cl.OnGroup(ctx, group)
		if err != nil {
			return err
		}
		return f(ctx, c)
	})
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
		return t.cl.PublishMessage(ctx, pgtransport.Message{Group: group, Event: event, Priority: priority})
	})
}

// PublishTx is Publish inside the caller's transaction: the message commits
// or rolls back with the caller's own writes. The transaction is in use
// until the result is delivered; do not use it meanwhile.
func (t *Transport) PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) <-chan Result[int64] {
	return t.PublishMessageTx(ctx, tx, pgtransport.Message{Group: group, Event: event, Priority: priority})
}

// PublishMessage appends msg to its group's FIFO and delivers its seq;
// with a msg.DedupKey it is idempotent, delivering the first message's seq
// for a duplicate within Config.DedupWindow. As
// sync.Transport.PublishMessage. One round-trip.
//
// A lost reply delivers ErrOutcomeUnknown, as sync.Transport.PublishMessage says.
func (t *Transport) PublishMessage(ctx context.Context, msg pgtransport.Message) <-chan Result[int64] {
	return call(t, ctx, func(ctx context.Context) (int64, error) {
		return t.cl.PublishMessage(ctx, msg)
	})
}

// PublishMessageTx is PublishMessage inside the caller's transaction, as
// sync.Transport.PublishMessageTx. The transaction is in use until the
// result is delivered; do not use it meanwhile.
func (t *Transport) PublishMessageTx(ctx context.Context, tx pgx.Tx, msg pgtransport.Message) <-chan Result[int64] {
	return call(t, ctx, func(ctx context.Context) (int64, error) {
		c, err := t.cl.TxPublish(ctx, tx, msg)
		if err != nil {
			return 0, fmt.Errorf("publish: %w", err)
		}
		return c.PublishMessageTx(ctx, tx, msg)
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
		return t.cl.Claim(ctx, workerID, visibility, minPriority)
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
	p := t.of(lease)
	if ctx.Err() == nil {
		if done, ok := p.streams.enqueue(lease); ok {
			return done // no goroutine of its own: the stream answers
		}
	}
	return callErr(t, ctx, func(ctx context.Context) error {
		err := p.core.Ack(ctx, lease)
		if err == nil || errors.Is(err, pgtransport.ErrLeaseLost) {
			p.forget(lease) // a stream stopping no longer batches acks
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
		p := t.of(lease)
		err := p.core.Nack(ctx, lease, delay)
		if err == nil || errors.Is(err, pgtransport.ErrLeaseLost) {
			p.forget(lease)
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
		p := t.of(lease)
		_, err := p.core.Fail(ctx, lease, cause)
		if err == nil || errors.Is(err, pgtransport.ErrLeaseLost) {
			p.forget(lease)
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
		p := t.of(lease)
		err := p.core.Extend(ctx, lease, visibility)
		if err == nil {
			p.streams.extend(lease, nil, start.Add(visibility))
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
		return t.cl.PublishMany(ctx, msgs)
	})
}

// ClaimWait delivers a lease once one is claimable, or ctx's error; as
// sync.Transport.ClaimWait (a Stream also wakes on notifications).
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) <-chan Result[*pgtransport.Lease] {
	return call(t, ctx, func(ctx context.Context) (*pgtransport.Lease, error) {
		return t.cl.ClaimWait(ctx, workerID, visibility, minPriority)
	})
}

// ClaimMany leases up to max groups in one round-trip; as
// sync.Transport.ClaimMany.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) <-chan Result[[]*pgtransport.Lease] {
	return call(t, ctx, func(ctx context.Context) ([]*pgtransport.Lease, error) {
		return t.cl.ClaimMany(ctx, workerID, visibility, minPriority, max)
	})
}

// AckMany settles leases in one round-trip, with an entry per lease (nil or
// ErrLeaseLost); as sync.Transport.AckMany.
//
// A lost reply (or ctx ending while it runs): ErrOutcomeUnknown, as there.
func (t *Transport) AckMany(ctx context.Context, leases []*pgtransport.Lease) <-chan Result[[]error] {
	return call(t, ctx, func(ctx context.Context) ([]error, error) {
		errs, err := t.cl.AckMany(ctx, leases)
		for k, l := range leases {
			if k < len(errs) && (errs[k] == nil || errors.Is(errs[k], pgtransport.ErrLeaseLost)) {
				t.of(l).forget(l) // settled or lost: no stream holds it now
			}
		}
		if err != nil {
			return errs, err
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
		p := t.of(lease)
		next, err := p.core.AckNext(ctx, lease, visibility)
		switch {
		case next != nil:
			p.streams.extend(lease, next, start.Add(visibility)) // the same lease, on
		case err == nil || errors.Is(err, pgtransport.ErrLeaseLost):
			p.forget(lease)
		}
		return next, err
	})
}

// DeadLetters delivers a page of the queue's dead letters, in seq order;
// as sync.Transport.DeadLetters.
func (t *Transport) DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) <-chan Result[[]pgtransport.DeadLetter] {
	return call(t, ctx, func(ctx context.Context) ([]pgtransport.DeadLetter, error) {
		return t.cl.DeadLetters(ctx, q)
	})
}

// Redrive puts the dead letters f selects back at the heads of their
// groups, in their original order, and delivers how many; as
// sync.Transport.Redrive.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) <-chan Result[int64] {
	return call(t, ctx, func(ctx context.Context) (int64, error) {
		return t.cl.Redrive(ctx, f)
	})
}

// PurgeDeadLetters deletes the dead letters f selects and delivers how
// many; as sync.Transport.PurgeDeadLetters.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) <-chan Result[int64] {
	return call(t, ctx, func(ctx context.Context) (int64, error) {
		return t.cl.PurgeDeadLetters(ctx, f)
	})
}

// RestartGroup resumes a stopped group, dead-lettering its head first
// with skipHead; ErrGroupNotStopped if it is not stopped. As
// sync.Transport.RestartGroup.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) RestartGroup(ctx context.Context, group string, skipHead bool) <-chan error {
	return onGroupErr(t, ctx, group, func(ctx context.Context, c *core.Core) error {
		return c.RestartGroup(ctx, group, skipHead)
	})
}

// forget frees the stream slot of a lease settled outside its stream.
func (p *part) forget(l *pgtransport.Lease) {
	if l == nil {
		return
	}
	p.streams.release(l)
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

// spawnAll starts each of fs on a goroutine the Transport waits for at
// Close, all or (after Close) none.
func (t *Transport) spawnAll(fs []func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	for _, f := range fs {
		t.wg.Go(f)
	}
	return true
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
