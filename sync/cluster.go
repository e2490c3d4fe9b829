package sync

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/worker"
)

// Cluster is the blocking transport over one queue partitioned over
// several PostgreSQL databases (docs/protocol.md, "Partitions"): the
// databases a PL/Proxy proxy routes over, reached directly, each with a
// pool and a Transport of its own, so no call takes the proxy's second
// hop. It has Transport's methods, with Transport's guarantees inside a
// group: a group lives on one partition (Home), so its order, its one
// holder and the fencing of its leases are that partition's. What spans
// partitions:
//
//   - Claim, ClaimMany and ClaimWait try the partitions in turn, from a
//     start that moves with each claim, until they lease: a claim comes
//     back empty only when no partition it reached has claimable work
//     (a partition that fails is passed over; see core.Cluster.Claim).
//     The priority floor applies on every partition.
//   - PublishMany and AckMany split by partition: atomic per partition,
//     not across (see PublishMany).
//   - DeadLetters, Redrive, PurgeDeadLetters, Stats and Groups read or act
//     on every partition and merge.
//   - Work and WorkTx run one runtime per partition, each with its share
//     of cfg.Concurrency (Shares).
//   - PublishTx, PublishMessageTx, AckTx, AckStateTx and StateTx run in
//     the caller's transaction, which must be on the database of the
//     group's partition (Locate; Part(i) is that partition's Transport):
//     atomic with the caller's writes there only. Another database's
//     transaction is refused (ErrInvalidConfig) before anything is
//     written.
//   - While the cluster grows from N/2 partitions to N (docs/protocol.md,
//     "Growing the cluster"; the partitions record it, NewCluster reads
//     it), a group whose home changed lives in its old partition until it
//     has nothing there: its calls locate it first (one round-trip to the
//     old partition) and its publishes try the old partition first, which
//     publishes them if the group is still there and hands them back
//     otherwise. A Cluster opened before the growth keeps working on its
//     partitions, but a publish of a group that has left is refused with
//     ErrGroupMoved: reopen it.
//
// It is safe for concurrent use.
type Cluster struct {
	cl     *core.Cluster
	parts  []*Transport
	owned  []*pgxpool.Pool // closed by Close; set by OpenCluster
	closed atomic.Bool
}

// NewCluster returns a Cluster on pools, pools[i] on partition i's
// database: as many as the proxy's cluster lists (a power of two), in its
// order. It opens a Transport on each (New, so the schema is brought up
// to date unless cfg.SkipApply) and checks that each database is the
// partition its place names (schema.Partition numbered it so) and hashes
// groups as the proxy does; a pool in the wrong place, a partition not
// numbered, or a grown cluster given without its new partitions, is
// ErrInvalidConfig. The caller owns the pools.
func NewCluster(ctx context.Context, pools []*pgxpool.Pool, cfg pgtransport.Config) (*Cluster, error) {
	parts, cl, err := core.OpenCluster(ctx, pools, cfg,
		func(p *pgxpool.Pool) (*Transport, error) { return New(ctx, p, cfg) },
		func(t *Transport) *core.Core { return t.core },
		(*Transport).Close)
	if err != nil {
		return nil, err
	}
	return &Cluster{cl: cl, parts: parts}, nil
}

// OpenCluster reads the partition map from the PL/Proxy proxy at proxyDSN
// (its cluster pgtransport, in cfg.Schema, as schema.ApplyProxy checked
// it; a cluster changed since is ErrInvalidConfig), connects to each
// partition as FromDSN does (retrying up to cfg.MaxConnectWait), with
// proxyDSN's role, password unless the partition's string has one,
// session settings and pool size, and returns the Cluster on them
// (NewCluster), which owns the pools. The proxy is not used after.
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

// Close closes every partition's Transport (see Transport.Close), waits
// for ClaimWait's waits still ending (usually none; at most a claim's and
// a give-back's time out, 35 s, against a partition that does not
// answer), and closes the pools OpenCluster opened. Safe to call twice.
func (c *Cluster) Close() {
	c.closed.Store(true)
	for _, t := range c.parts {
		t.Close()
	}
	c.cl.Close()
	for _, p := range c.owned {
		p.Close()
	}
}

// check is ErrClosed, for op, once Close has been called; else nil.
func (c *Cluster) check(op string) error {
	if c.closed.Load() {
		return fmt.Errorf("%s: %w", op, pgtransport.ErrClosed)
	}
	return nil
}

// Partitions is the number of partitions.
func (c *Cluster) Partitions() int { return c.cl.N() }

// Home is the partition group lives on: Hashtext(group) & (N-1), as the
// proxy routes it. While the cluster grows, a group may still live in its
// old home: Locate.
func (c *Cluster) Home(group string) int { return c.cl.Home(group) }

// Locate is the partition that holds group now: its Home, but while the
// cluster grows (docs/protocol.md, "Growing the cluster") a group whose
// home changed stays in its old partition as long as it has anything
// there, and Locate asks that partition. Open a PublishTx's or StateTx's
// transaction on Part(Locate(group)).
func (c *Cluster) Locate(ctx context.Context, group string) (int, error) {
	if err := c.check("locate"); err != nil {
		return 0, err
	}
	return c.cl.Locate(ctx, group)
}

// Part is partition i's own Transport.
func (c *Cluster) Part(i int) *Transport { return c.parts[i] }

// Shares is how Work and WorkTx split concurrency slots over the
// partitions: an equal share each, at least one.
func (c *Cluster) Shares(concurrency int) []int { return c.cl.Shares(concurrency) }

func (c *Cluster) of(l *pgtransport.Lease) *Transport { return c.parts[c.cl.Of(l)] }

// onGroup is f on the Transport of the partition that holds group now
// (Locate; Home but for a moving group while the cluster grows).
func onGroup[T any](c *Cluster, ctx context.Context, group string, f func(*Transport) (T, error)) (T, error) {
	if !c.cl.Moves(group) {
		return f(c.parts[c.cl.Home(group)])
	}
	i, err := c.Locate(ctx, group)
	if err != nil {
		var zero T
		return zero, err
	}
	return f(c.parts[i])
}

// onGroupErr is onGroup for a call that returns only an error.
func onGroupErr(c *Cluster, ctx context.Context, group string, f func(*Transport) error) error {
	_, err := onGroup(c, ctx, group, func(t *Transport) (struct{}, error) { return struct{}{}, f(t) })
	return err
}

// Publish is Transport.Publish on group's partition (while the cluster
// grows, as PublishMany places it).
func (c *Cluster) Publish(ctx context.Context, group, event string, priority int) (int64, error) {
	return c.PublishMessage(ctx, pgtransport.Message{Group: group, Event: event, Priority: priority})
}

// PublishMessage is Transport.PublishMessage on the group's partition
// (while the cluster grows, as PublishMany places it).
func (c *Cluster) PublishMessage(ctx context.Context, msg pgtransport.Message) (int64, error) {
	if !c.cl.Moves(msg.Group) {
		return c.parts[c.cl.Home(msg.Group)].PublishMessage(ctx, msg)
	}
	seqs, err := c.PublishMany(ctx, []pgtransport.Message{msg})
	if err != nil {
		return 0, err
	}
	return seqs[0], nil
}

// PublishTx is Transport.PublishTx; tx must be on the database of the
// partition that holds group (Locate), else ErrInvalidConfig and nothing
// is written. While the cluster grows, a moving group's old partition
// takes the transaction as it is, and its fence refuses the message with
// ErrGroupMoved if the group has left (roll back, and retry in its Home);
// its Home takes it once the old partition's fence says the group has
// left (a round-trip there), else ErrInvalidConfig.
func (c *Cluster) PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) (int64, error) {
	return c.PublishMessageTx(ctx, tx, pgtransport.Message{Group: group, Event: event, Priority: priority})
}

// PublishMessageTx is Transport.PublishMessageTx, with tx as PublishTx says.
func (c *Cluster) PublishMessageTx(ctx context.Context, tx pgx.Tx, msg pgtransport.Message) (int64, error) {
	if err := c.check("publish"); err != nil {
		return 0, err
	}
	i, err := c.cl.CheckPublishTx(ctx, tx, msg.Group, c.cl.Part(0).CheckMessage(msg))
	if err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	return c.parts[i].PublishMessageTx(ctx, tx, msg)
}

// PublishMany publishes msgs, each on its group's partition, and returns
// their seqs in input order. Every message is checked first: one bad
// message refuses the batch and nothing is written. Each partition's share
// is one Transport.PublishMany (one transaction), the partitions at once,
// so the batch is atomic per partition, not across: an error names the
// partitions whose share failed (not published, or, with
// ErrOutcomeUnknown, perhaps published), and comes with the seqs of the
// other partitions' messages, which are published (0 for a failed
// partition's message): retry those with seq 0, or give every message a
// DedupKey and retry the batch.
func (c *Cluster) PublishMany(ctx context.Context, msgs []pgtransport.Message) ([]int64, error) {
	if err := c.check("publish"); err != nil {
		return nil, err
	}
	return c.cl.PublishMany(ctx, msgs)
}

// Claim leases a claimable group of any partition, trying them in turn;
// nil when none has one. A partition whose claim fails is passed over; its
// error is returned when no other partition leased.
func (c *Cluster) Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	if err := c.check("claim"); err != nil {
		return nil, err
	}
	return c.cl.Claim(ctx, workerID, visibility, minPriority)
}

// ClaimWait is Claim that waits for work on every partition at once and
// returns the first lease (one another partition hands out meanwhile is
// given back, not counted as an attempt). A partition that fails while
// waited on is retried, logged at Warn, while the others are waited on.
func (c *Cluster) ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	if err := c.check("claim"); err != nil {
		return nil, err
	}
	return c.cl.ClaimWait(ctx, workerID, visibility, minPriority)
}

// ClaimMany leases up to max groups, partition after partition in turn
// until it has max or has asked each; one round-trip per partition asked.
func (c *Cluster) ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) ([]*pgtransport.Lease, error) {
	if err := c.check("claim"); err != nil {
		return nil, err
	}
	return c.cl.ClaimMany(ctx, workerID, visibility, minPriority, max)
}

// Ack is Transport.Ack on the lease's partition.
func (c *Cluster) Ack(ctx context.Context, lease *pgtransport.Lease) error {
	return c.of(lease).Ack(ctx, lease)
}

// AckMany acks leases, one Transport.AckMany per partition, at once, and
// returns an entry per lease in input order. A nil lease refuses the
// batch (nothing acked). When a partition's round-trip fails, its leases'
// entries hold that error too, and the call's error joins the failed
// partitions' errors; the other entries are their partition's outcome.
func (c *Cluster) AckMany(ctx context.Context, leases []*pgtransport.Lease) ([]error, error) {
	if err := c.check("ack"); err != nil {
		return nil, err
	}
	return c.cl.AckMany(ctx, leases)
}

// AckNext is Transport.AckNext on the lease's partition.
func (c *Cluster) AckNext(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) (*pgtransport.Lease, error) {
	return c.of(lease).AckNext(ctx, lease, visibility)
}

// Nack is Transport.Nack on the lease's partition.
func (c *Cluster) Nack(ctx context.Context, lease *pgtransport.Lease, delay time.Duration) error {
	return c.of(lease).Nack(ctx, lease, delay)
}

// Fail is Transport.Fail on the lease's partition.
func (c *Cluster) Fail(ctx context.Context, lease *pgtransport.Lease, cause error) error {
	return c.of(lease).Fail(ctx, lease, cause)
}

// Extend is Transport.Extend on the lease's partition.
func (c *Cluster) Extend(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) error {
	return c.of(lease).Extend(ctx, lease, visibility)
}

// DeadLetters is Transport.DeadLetters over every partition (q.Group's
// alone when set), merged in seq order: seqs of different partitions never
// collide, so paging by the last Seq works as on one database.
func (c *Cluster) DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) ([]pgtransport.DeadLetter, error) {
	if err := c.check("dead letters"); err != nil {
		return nil, err
	}
	return c.cl.DeadLetters(ctx, q)
}

// Redrive is Transport.Redrive on the partitions f selects on (the
// group's, the seqs', or all), the counts added up; not atomic across
// partitions.
func (c *Cluster) Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	if err := c.check("redrive"); err != nil {
		return 0, err
	}
	return c.cl.Redrive(ctx, f)
}

// PurgeDeadLetters is Transport.PurgeDeadLetters over the partitions, as
// Redrive.
func (c *Cluster) PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	if err := c.check("purge dead letters"); err != nil {
		return 0, err
	}
	return c.cl.PurgeDeadLetters(ctx, f)
}

// RestartGroup is Transport.RestartGroup on the partition that holds group (Locate).
func (c *Cluster) RestartGroup(ctx context.Context, group string, skipHead bool) error {
	return onGroupErr(c, ctx, group, func(t *Transport) error { return t.RestartGroup(ctx, group, skipHead) })
}

// Stats is Transport.Stats added up over the partitions: counts summed, an
// Exact flag true only when every partition's is, At and OldestHeadAge the
// largest.
func (c *Cluster) Stats(ctx context.Context) (pgtransport.Stats, error) {
	if err := c.check("stats"); err != nil {
		return pgtransport.Stats{}, err
	}
	return c.cl.Stats(ctx)
}

// Groups is Transport.Groups over the partitions: each one's first
// q.Offset+q.Limit in q.Order, merged, the page cut from that. OldestHead
// orders by HeadAge here (two partitions' seqs do not say which message
// came first).
func (c *Cluster) Groups(ctx context.Context, q pgtransport.GroupQuery) ([]pgtransport.GroupInfo, error) {
	if err := c.check("groups"); err != nil {
		return nil, err
	}
	return c.cl.Groups(ctx, q)
}

// Group is Transport.Group on the partition that holds group (Locate).
func (c *Cluster) Group(ctx context.Context, group string) (pgtransport.GroupInfo, error) {
	return onGroup(c, ctx, group, func(t *Transport) (pgtransport.GroupInfo, error) { return t.Group(ctx, group) })
}

// Peek is Transport.Peek on the partition that holds group (Locate).
func (c *Cluster) Peek(ctx context.Context, group string, n int) ([]pgtransport.PeekedMessage, error) {
	return onGroup(c, ctx, group, func(t *Transport) ([]pgtransport.PeekedMessage, error) { return t.Peek(ctx, group, n) })
}

// PauseGroup is Transport.PauseGroup on the partition that holds group (Locate).
func (c *Cluster) PauseGroup(ctx context.Context, group string) error {
	return onGroupErr(c, ctx, group, func(t *Transport) error { return t.PauseGroup(ctx, group) })
}

// ResumeGroup is Transport.ResumeGroup on the partition that holds group (Locate).
func (c *Cluster) ResumeGroup(ctx context.Context, group string) error {
	return onGroupErr(c, ctx, group, func(t *Transport) error { return t.ResumeGroup(ctx, group) })
}

// PurgeGroup is Transport.PurgeGroup on the partition that holds group (Locate).
func (c *Cluster) PurgeGroup(ctx context.Context, group string, limit int) (int64, error) {
	return onGroup(c, ctx, group, func(t *Transport) (int64, error) { return t.PurgeGroup(ctx, group, limit) })
}

// AckTx is Transport.AckTx; tx must be on the lease's partition's
// database (Home of its group), else ErrInvalidConfig and nothing is
// written.
func (c *Cluster) AckTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease) error {
	if err := c.check("ack"); err != nil {
		return err
	}
	i := c.cl.Of(lease)
	if err := c.cl.CheckTx(ctx, tx, i, core.CheckLease(lease)); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	return c.parts[i].AckTx(ctx, tx, lease)
}

// AckStateTx is Transport.AckStateTx, with tx as AckTx says.
func (c *Cluster) AckStateTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease, state []byte) error {
	if err := c.check("ack"); err != nil {
		return err
	}
	i := c.cl.Of(lease)
	if err := c.cl.CheckTx(ctx, tx, i, core.CheckLease(lease)); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	return c.parts[i].AckStateTx(ctx, tx, lease, state)
}

// State is Transport.State on the partition that holds group (Locate).
func (c *Cluster) State(ctx context.Context, group string) ([]byte, error) {
	return onGroup(c, ctx, group, func(t *Transport) ([]byte, error) { return t.State(ctx, group) })
}

// StateTx is Transport.StateTx; tx must be on the database of the
// partition that holds group (Locate), else ErrInvalidConfig.
func (c *Cluster) StateTx(ctx context.Context, tx pgx.Tx, group string) ([]byte, error) {
	if err := c.check("state"); err != nil {
		return nil, err
	}
	pre := core.CheckGroup(group)
	i := c.cl.Home(group)
	if pre == nil && c.cl.Moves(group) {
		var err error
		if i, err = c.Locate(ctx, group); err != nil {
			return nil, fmt.Errorf("state: %w", err)
		}
	}
	if err := c.cl.CheckTx(ctx, tx, i, pre); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	return c.parts[i].StateTx(ctx, tx, group)
}

// Work is Transport.Work over every partition: one runtime per
// partition, each on its partition's Transport with its share of
// cfg.Concurrency (Shares: at least one slot each), all stopped when ctx
// ends. It returns once all have; an error of one (ErrClosed, say) stops
// the others and is returned. An invalid cfg is refused at once.
func (c *Cluster) Work(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.Handler) error {
	if err := c.check("work"); err != nil {
		return err
	}
	cfg, err := worker.Check(cfg, h)
	if err != nil {
		return err
	}
	return c.cl.RunEach(ctx, cfg, func(ctx context.Context, i int, cfg pgtransport.WorkerConfig) error {
		return c.parts[i].Work(ctx, cfg, h)
	})
}

// WorkTx is Transport.WorkTx over every partition, as Work: each handler's
// transaction is on its message's partition.
func (c *Cluster) WorkTx(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.TxHandler) error {
	if err := c.check("work"); err != nil {
		return err
	}
	cfg, err := worker.CheckTx(cfg, h)
	if err != nil {
		return err
	}
	return c.cl.RunEach(ctx, cfg, func(ctx context.Context, i int, cfg pgtransport.WorkerConfig) error {
		return c.parts[i].WorkTx(ctx, cfg, h)
	})
}
