package async

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	stdsync "sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/worker"
)

// Cluster is the channel-based transport over one queue partitioned over
// several PostgreSQL databases: sync.Cluster's twin (see it for what
// spans partitions and what does not), with Transport's methods. Each
// partition has a Transport of its own (Part), with its pool, its
// listener and its streams; a call that names a group or a lease is that
// partition's Transport's, and the calls that span partitions (claims,
// batches, merged reads) run on a goroutine the Cluster waits for at
// Close. It is safe for concurrent use.
type Cluster struct {
	cl    *core.Cluster
	parts []*Transport
	owned []*pgxpool.Pool // closed by Close; set by OpenCluster

	mu      stdsync.Mutex
	closed  bool                        // set as Close begins: no stream starts after
	streams map[*ClusterStream]struct{} // open, for Close to wait for
	once    stdsync.Once                // Close's body: a second call waits for the first
}

// NewCluster returns a Cluster on pools, pools[i] on partition i's
// database, opening a Transport on each (New) and checking them as
// sync.NewCluster does. The caller owns the pools.
func NewCluster(ctx context.Context, pools []*pgxpool.Pool, cfg pgtransport.Config) (*Cluster, error) {
	parts, cl, err := core.OpenCluster(ctx, pools, cfg,
		func(p *pgxpool.Pool) (*Transport, error) { return New(ctx, p, cfg) },
		func(t *Transport) *core.Core { return t.core },
		(*Transport).Close)
	if err != nil {
		return nil, err
	}
	return &Cluster{cl: cl, parts: parts, streams: map[*ClusterStream]struct{}{}}, nil
}

// OpenCluster reads the partition map from the PL/Proxy proxy at proxyDSN
// and connects to each partition, as sync.OpenCluster does; the Cluster
// owns the pools.
func OpenCluster(ctx context.Context, proxyDSN string, cfg pgtransport.Config) (*Cluster, error) {
	c, pools, err := core.DialCluster(ctx, proxyDSN, cfg, func(pools []*pgxpool.Pool, cfg pgtransport.Config) (*Cluster, error) {
		return NewCluster(ctx, pools, cfg)
	})
	if err != nil {
		return nil, err
	}
	c.owned = pools
	return c, nil
}

// Close closes every partition's Transport (see Transport.Close: bounded):
// first it stops them all, so every call waiting on any partition (a
// ClaimWait, a stream) ends with ErrClosed at once; then it waits for each
// one's goroutines, for the forwarders of its ClusterStreams (which give
// back the leases they hold), and for ClaimWait's waits still ending
// (core.Cluster.Close); then it closes the pools OpenCluster opened. Safe
// to call twice, and at once: a second call returns when the first has.
func (c *Cluster) Close() {
	c.once.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		var closing []*Transport
		for _, t := range c.parts {
			if t.beginClose() {
				closing = append(closing, t)
			}
		}
		for _, t := range closing {
			t.finishClose()
		}
		c.mu.Lock()
		streams := slices.Collect(maps.Keys(c.streams))
		c.mu.Unlock()
		for _, cs := range streams {
			cs.wait()
		}
		c.cl.Close()
		for _, p := range c.owned {
			p.Close()
		}
	})
}

// Partitions is the number of partitions.
func (c *Cluster) Partitions() int { return c.cl.N() }

// Home is the partition group lives on: Hashtext(group) & (N-1), as the
// proxy routes it. While the cluster grows, a group may still live in its
// old home: Locate.
func (c *Cluster) Home(group string) int { return c.cl.Home(group) }

// Locate is sync.Cluster.Locate: the partition that holds group now.
func (c *Cluster) Locate(ctx context.Context, group string) <-chan Result[int] {
	return spanning(c, ctx, func(ctx context.Context) (int, error) { return c.cl.Locate(ctx, group) })
}

// Part is partition i's own Transport.
func (c *Cluster) Part(i int) *Transport { return c.parts[i] }

func (c *Cluster) of(l *pgtransport.Lease) *Transport { return c.parts[c.cl.Of(l)] }

// onGroup is f on the Transport of the partition that holds group now:
// at once on its Home, or for a moving group while the cluster grows,
// once Locate has found it, spanning (on partition 0's Transport).
func onGroup[T any](c *Cluster, ctx context.Context, group string, f func(*Transport) <-chan Result[T]) <-chan Result[T] {
	if !c.cl.Moves(group) {
		return f(c.parts[c.cl.Home(group)])
	}
	return spanning(c, ctx, func(ctx context.Context) (T, error) {
		i, err := c.cl.Locate(ctx, group)
		if err != nil {
			var zero T
			return zero, err
		}
		r := <-f(c.parts[i])
		return r.Value, r.Err
	})
}

// onGroupErr is onGroup for a call that returns only an error.
func onGroupErr(c *Cluster, ctx context.Context, group string, f func(*Transport) <-chan error) <-chan error {
	if !c.cl.Moves(group) {
		return f(c.parts[c.cl.Home(group)])
	}
	return callErr(c.parts[0], ctx, func(ctx context.Context) error {
		i, err := c.cl.Locate(ctx, group)
		if err != nil {
			return err
		}
		return <-f(c.parts[i])
	})
}

// inTxAt is inTx on the partition where (a check of tx against group,
// after pre, the call's argument check) says: at once on group's Home for
// a group that does not move, else once where has answered, spanning.
func inTxAt[T any](c *Cluster, ctx context.Context, tx pgx.Tx, group, op string, pre error,
	where func(ctx context.Context) (int, error), f func(ctx context.Context, i int) <-chan Result[T]) <-chan Result[T] {
	if pre != nil || !c.cl.Moves(group) {
		i := c.cl.Home(group)
		return inTx(c, ctx, tx, i, op, pre, func(ctx context.Context) <-chan Result[T] { return f(ctx, i) })
	}
	return spanning(c, ctx, func(ctx context.Context) (T, error) {
		i, err := where(ctx)
		if err != nil {
			var zero T
			return zero, fmt.Errorf("%s: %w", op, err)
		}
		r := <-f(ctx, i)
		return r.Value, r.Err
	})
}

// spanning runs f, a call over several partitions, on a goroutine of
// partition 0's Transport: Close waits for it (partition 0 closes first,
// while the others' pools are still open), and cuts it short as it does
// its own calls.
func spanning[T any](c *Cluster, ctx context.Context, f func(context.Context) (T, error)) <-chan Result[T] {
	return call(c.parts[0], ctx, f)
}

// inTx runs f, partition i's call in the caller's transaction tx, once tx
// is checked to be on partition i's database (else ErrInvalidConfig).
func inTx[T any](c *Cluster, ctx context.Context, tx pgx.Tx, i int, op string, pre error, f func(context.Context) <-chan Result[T]) <-chan Result[T] {
	return call(c.parts[i], ctx, func(ctx context.Context) (T, error) {
		if err := c.cl.CheckTx(ctx, tx, i, pre); err != nil {
			var zero T
			return zero, fmt.Errorf("%s: %w", op, err)
		}
		r := <-f(ctx)
		return r.Value, r.Err
	})
}

// inTxErr is inTx for an ack, whose channel delivers an error.
func inTxErr(c *Cluster, ctx context.Context, tx pgx.Tx, i int, pre error, f func(context.Context) <-chan error) <-chan error {
	return callErr(c.parts[i], ctx, func(ctx context.Context) error {
		if err := c.cl.CheckTx(ctx, tx, i, pre); err != nil {
			return fmt.Errorf("ack: %w", err)
		}
		return <-f(ctx)
	})
}

// Publish is Transport.Publish on group's partition (while the cluster
// grows, as PublishMany places it).
func (c *Cluster) Publish(ctx context.Context, group, event string, priority int) <-chan Result[int64] {
	return c.PublishMessage(ctx, pgtransport.Message{Group: group, Event: event, Priority: priority})
}

// PublishMessage is Transport.PublishMessage on the group's partition
// (while the cluster grows, as PublishMany places it).
func (c *Cluster) PublishMessage(ctx context.Context, msg pgtransport.Message) <-chan Result[int64] {
	if !c.cl.Moves(msg.Group) {
		return c.parts[c.cl.Home(msg.Group)].PublishMessage(ctx, msg)
	}
	return spanning(c, ctx, func(ctx context.Context) (int64, error) {
		seqs, err := c.cl.PublishMany(ctx, []pgtransport.Message{msg})
		if err != nil {
			return 0, err
		}
		return seqs[0], nil
	})
}

// PublishTx is sync.Cluster.PublishTx: tx must be on the database of the
// partition that holds group (Locate), else ErrInvalidConfig and nothing
// is written (while the cluster grows, a moving group's old partition's
// fence decides: ErrGroupMoved).
func (c *Cluster) PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) <-chan Result[int64] {
	return c.PublishMessageTx(ctx, tx, pgtransport.Message{Group: group, Event: event, Priority: priority})
}

// PublishMessageTx is Transport.PublishMessageTx, with tx as PublishTx says.
func (c *Cluster) PublishMessageTx(ctx context.Context, tx pgx.Tx, msg pgtransport.Message) <-chan Result[int64] {
	pre := c.cl.Part(0).CheckMessage(msg)
	where := func(ctx context.Context) (int, error) { return c.cl.CheckPublishTx(ctx, tx, msg.Group, nil) }
	return inTxAt(c, ctx, tx, msg.Group, "publish", pre, where, func(ctx context.Context, i int) <-chan Result[int64] {
		return c.parts[i].PublishMessageTx(ctx, tx, msg)
	})
}

// PublishMany is sync.Cluster.PublishMany: atomic per partition, not
// across.
func (c *Cluster) PublishMany(ctx context.Context, msgs []pgtransport.Message) <-chan Result[[]int64] {
	return spanning(c, ctx, func(ctx context.Context) ([]int64, error) { return c.cl.PublishMany(ctx, msgs) })
}

// Claim is sync.Cluster.Claim: the partitions in turn until one leases.
func (c *Cluster) Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) <-chan Result[*pgtransport.Lease] {
	return spanning(c, ctx, func(ctx context.Context) (*pgtransport.Lease, error) {
		return c.cl.Claim(ctx, workerID, visibility, minPriority)
	})
}

// ClaimWait is sync.Cluster.ClaimWait: it waits on every partition.
func (c *Cluster) ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) <-chan Result[*pgtransport.Lease] {
	return spanning(c, ctx, func(ctx context.Context) (*pgtransport.Lease, error) {
		return c.cl.ClaimWait(ctx, workerID, visibility, minPriority)
	})
}

// ClaimMany is sync.Cluster.ClaimMany.
func (c *Cluster) ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) <-chan Result[[]*pgtransport.Lease] {
	return spanning(c, ctx, func(ctx context.Context) ([]*pgtransport.Lease, error) {
		return c.cl.ClaimMany(ctx, workerID, visibility, minPriority, max)
	})
}

// Ack is Transport.Ack on the lease's partition (batched into the round-
// trips of the stream that holds it, if one does).
func (c *Cluster) Ack(ctx context.Context, lease *pgtransport.Lease) <-chan error {
	return c.of(lease).Ack(ctx, lease)
}

// AckMany is sync.Cluster.AckMany: one round-trip per partition, at once.
func (c *Cluster) AckMany(ctx context.Context, leases []*pgtransport.Lease) <-chan Result[[]error] {
	return spanning(c, ctx, func(ctx context.Context) ([]error, error) {
		errs, err := c.cl.AckMany(ctx, leases)
		for k, l := range leases {
			if k < len(errs) && (errs[k] == nil || errors.Is(errs[k], pgtransport.ErrLeaseLost)) {
				c.of(l).forget(l) // settled or lost: no stream holds it now
			}
		}
		return errs, err
	})
}

// AckNext is Transport.AckNext on the lease's partition.
func (c *Cluster) AckNext(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) <-chan Result[*pgtransport.Lease] {
	return c.of(lease).AckNext(ctx, lease, visibility)
}

// Nack is Transport.Nack on the lease's partition.
func (c *Cluster) Nack(ctx context.Context, lease *pgtransport.Lease, delay time.Duration) <-chan error {
	return c.of(lease).Nack(ctx, lease, delay)
}

// Fail is Transport.Fail on the lease's partition.
func (c *Cluster) Fail(ctx context.Context, lease *pgtransport.Lease, cause error) <-chan error {
	return c.of(lease).Fail(ctx, lease, cause)
}

// Extend is Transport.Extend on the lease's partition.
func (c *Cluster) Extend(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) <-chan error {
	return c.of(lease).Extend(ctx, lease, visibility)
}

// DeadLetters is sync.Cluster.DeadLetters: merged in seq order.
func (c *Cluster) DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) <-chan Result[[]pgtransport.DeadLetter] {
	return spanning(c, ctx, func(ctx context.Context) ([]pgtransport.DeadLetter, error) { return c.cl.DeadLetters(ctx, q) })
}

// Redrive is sync.Cluster.Redrive.
func (c *Cluster) Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) <-chan Result[int64] {
	return spanning(c, ctx, func(ctx context.Context) (int64, error) { return c.cl.Redrive(ctx, f) })
}

// PurgeDeadLetters is sync.Cluster.PurgeDeadLetters.
func (c *Cluster) PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) <-chan Result[int64] {
	return spanning(c, ctx, func(ctx context.Context) (int64, error) { return c.cl.PurgeDeadLetters(ctx, f) })
}

// RestartGroup is Transport.RestartGroup on the partition that holds group (Locate).
func (c *Cluster) RestartGroup(ctx context.Context, group string, skipHead bool) <-chan error {
	return onGroupErr(c, ctx, group, func(t *Transport) <-chan error { return t.RestartGroup(ctx, group, skipHead) })
}

// Stats is sync.Cluster.Stats: added up over the partitions.
func (c *Cluster) Stats(ctx context.Context) <-chan Result[pgtransport.Stats] {
	return spanning(c, ctx, c.cl.Stats)
}

// Groups is sync.Cluster.Groups: merged over the partitions.
func (c *Cluster) Groups(ctx context.Context, q pgtransport.GroupQuery) <-chan Result[[]pgtransport.GroupInfo] {
	return spanning(c, ctx, func(ctx context.Context) ([]pgtransport.GroupInfo, error) { return c.cl.Groups(ctx, q) })
}

// Group is Transport.Group on the partition that holds group (Locate).
func (c *Cluster) Group(ctx context.Context, group string) <-chan Result[pgtransport.GroupInfo] {
	return onGroup(c, ctx, group, func(t *Transport) <-chan Result[pgtransport.GroupInfo] { return t.Group(ctx, group) })
}

// Peek is Transport.Peek on the partition that holds group (Locate).
func (c *Cluster) Peek(ctx context.Context, group string, n int) <-chan Result[[]pgtransport.PeekedMessage] {
	return onGroup(c, ctx, group, func(t *Transport) <-chan Result[[]pgtransport.PeekedMessage] { return t.Peek(ctx, group, n) })
}

// PauseGroup is Transport.PauseGroup on the partition that holds group (Locate).
func (c *Cluster) PauseGroup(ctx context.Context, group string) <-chan error {
	return onGroupErr(c, ctx, group, func(t *Transport) <-chan error { return t.PauseGroup(ctx, group) })
}

// ResumeGroup is Transport.ResumeGroup on the partition that holds group (Locate).
func (c *Cluster) ResumeGroup(ctx context.Context, group string) <-chan error {
	return onGroupErr(c, ctx, group, func(t *Transport) <-chan error { return t.ResumeGroup(ctx, group) })
}

// PurgeGroup is Transport.PurgeGroup on the partition that holds group (Locate).
func (c *Cluster) PurgeGroup(ctx context.Context, group string, limit int) <-chan Result[int64] {
	return onGroup(c, ctx, group, func(t *Transport) <-chan Result[int64] { return t.PurgeGroup(ctx, group, limit) })
}

// AckTx is Transport.AckTx; tx must be on the lease's partition's
// database, else ErrInvalidConfig and nothing is written.
func (c *Cluster) AckTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease) <-chan error {
	i := c.cl.Of(lease)
	return inTxErr(c, ctx, tx, i, core.CheckLease(lease), func(ctx context.Context) <-chan error { return c.parts[i].AckTx(ctx, tx, lease) })
}

// AckStateTx is Transport.AckStateTx, with tx as AckTx says.
func (c *Cluster) AckStateTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease, state []byte) <-chan error {
	i := c.cl.Of(lease)
	return inTxErr(c, ctx, tx, i, core.CheckLease(lease), func(ctx context.Context) <-chan error {
		return c.parts[i].AckStateTx(ctx, tx, lease, state)
	})
}

// State is Transport.State on the partition that holds group (Locate).
func (c *Cluster) State(ctx context.Context, group string) <-chan Result[[]byte] {
	return onGroup(c, ctx, group, func(t *Transport) <-chan Result[[]byte] { return t.State(ctx, group) })
}

// StateTx is Transport.StateTx; tx must be on the database of the
// partition that holds group (Locate), else ErrInvalidConfig.
func (c *Cluster) StateTx(ctx context.Context, tx pgx.Tx, group string) <-chan Result[[]byte] {
	where := func(ctx context.Context) (int, error) {
		i, err := c.cl.Locate(ctx, group)
		if err != nil {
			return 0, err
		}
		return i, c.cl.CheckTx(ctx, tx, i, nil)
	}
	return inTxAt(c, ctx, tx, group, "state", core.CheckGroup(group), where, func(ctx context.Context, i int) <-chan Result[[]byte] {
		return c.parts[i].StateTx(ctx, tx, group)
	})
}

// Work is Transport.Work over every partition: one runtime per
// partition, each fed by its partition's stream with its share of
// cfg.Concurrency (sync.Cluster.Shares), all stopped when ctx ends. An
// error of one stops the others and is returned.
func (c *Cluster) Work(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.Handler) error {
	cfg, err := worker.Check(cfg, h)
	if err != nil {
		return err
	}
	return c.cl.RunEach(ctx, cfg, func(ctx context.Context, i int, cfg pgtransport.WorkerConfig) error {
		return c.parts[i].Work(ctx, cfg, h)
	})
}

// WorkTx is Transport.WorkTx over every partition, as Work.
func (c *Cluster) WorkTx(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.TxHandler) error {
	cfg, err := worker.CheckTx(cfg, h)
	if err != nil {
		return err
	}
	return c.cl.RunEach(ctx, cfg, func(ctx context.Context, i int, cfg pgtransport.WorkerConfig) error {
		return c.parts[i].WorkTx(ctx, cfg, h)
	})
}

// ClusterStream is one stream of leases from every partition: a Stream on
// each (with its share of MaxInFlight, at least one), merged into C.
type ClusterStream struct {
	streams []*Stream
	out     chan *pgtransport.Lease
	stop    chan struct{}
	wg      stdsync.WaitGroup // the forwarders
	aux     stdsync.WaitGroup // the goroutines that close ready and C
	once    stdsync.Once
	ready   chan struct{}
}

// Stream starts a stream on every partition, each with its share of
// cfg.MaxInFlight (0: DefaultMaxInFlight), merged into one channel. Leases
// are acked, nacked and failed through the Cluster, as a Stream's through
// its Transport. A bad cfg is refused before any stream starts.
func (c *Cluster) Stream(ctx context.Context, cfg StreamConfig) (*ClusterStream, error) {
	if err := core.CheckClaim(cfg.WorkerID, cfg.Visibility, cfg.MinPriority); err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	if cfg.MaxInFlight < 0 || cfg.MaxInFlight > pgtransport.MaxBatch {
		return nil, fmt.Errorf("stream: %w: MaxInFlight %d, want 0 to %d", pgtransport.ErrInvalidConfig, cfg.MaxInFlight, pgtransport.MaxBatch)
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	cs := &ClusterStream{out: make(chan *pgtransport.Lease), stop: make(chan struct{}), ready: make(chan struct{})}
	for i, share := range c.cl.Shares(cfg.MaxInFlight) {
		scfg := cfg
		scfg.MaxInFlight = share
		s, err := c.parts[i].Stream(ctx, scfg)
		if err != nil {
			cs.Close()
			return nil, fmt.Errorf("partition %d: %w", i, err)
		}
		cs.streams = append(cs.streams, s)
	}
	c.mu.Lock()
	defer c.mu.Unlock() // Close waits for the stream's goroutines: they start under the lock or not at all
	if c.closed {
		cs.Close()
		return nil, fmt.Errorf("stream: %w", pgtransport.ErrClosed)
	}
	c.streams[cs] = struct{}{}
	for i, s := range cs.streams {
		cs.wg.Go(func() { cs.forward(c.parts[i], s, cfg.Visibility) })
	}
	cs.aux.Go(func() { // ends when every partition's stream is ready or stopped
		for _, s := range cs.streams {
			select {
			case <-s.Ready():
			case <-s.done:
			}
		}
		close(cs.ready)
	})
	cs.aux.Go(func() { // closes C once every forwarder has ended
		cs.wg.Wait()
		close(cs.out)
		c.mu.Lock()
		delete(c.streams, cs)
		c.mu.Unlock()
	})
	return cs, nil
}

// forward moves s's leases to C until s stops. A lease it holds when the
// stream closes or s stops (ctx ended, the Cluster closed), or that no
// receiver takes before half its visibility has passed since its claim
// (the point where a Stream gives back a lease left in its C: a receiver
// must get it with time to handle it), goes back to its partition, not
// counted as an attempt.
func (cs *ClusterStream) forward(t *Transport, s *Stream, visibility time.Duration) {
	for l := range s.C() {
		due := time.NewTimer(time.Until(l.Expiry.Add(-visibility / 2)))
		select {
		case cs.out <- l:
			due.Stop()
			continue
		case <-cs.stop:
		case <-s.done:
		case <-due.C:
		}
		due.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = t.core.Release(ctx, l)
		cancel()
		t.forget(l)
	}
}

// C delivers the leases; it is closed once every partition's stream has
// stopped (Close, ctx ended, or the Cluster closed).
func (cs *ClusterStream) C() <-chan *pgtransport.Lease { return cs.out }

// Err is the first partition stream's error (see Stream.Err), nil if none.
func (cs *ClusterStream) Err() error {
	for _, s := range cs.streams {
		if err := s.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Ready is closed once every partition's stream is ready (Stream.Ready)
// or has stopped.
func (cs *ClusterStream) Ready() <-chan struct{} { return cs.ready }

// Close stops every partition's stream (each gives back the leases it
// holds that were not delivered) and waits for them.
func (cs *ClusterStream) Close() {
	cs.once.Do(func() { close(cs.stop) })
	for _, s := range cs.streams {
		s.Close()
	}
	cs.wait()
}

// wait waits for the stream's goroutines, which end once every
// partition's stream has stopped.
func (cs *ClusterStream) wait() {
	cs.wg.Wait()
	cs.aux.Wait()
}
