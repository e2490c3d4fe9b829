package sync

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/cluster"
	"github.com/pgtransport/pgtransport/internal/core"
)

// DBTX is the connection a Transport runs on: a *pgxpool.Pool (safe for
// concurrent use), a *pgx.Conn (one goroutine at a time) or a pgx.Tx.
type DBTX = core.DBTX

// Transport is the blocking transport over a queue of N >= 1 partitions:
// one database (New, FromDSN), or the databases a PL/Proxy proxy routes
// over, reached directly (NewCluster, OpenCluster; docs/partitions.md).
// It is safe for concurrent use when its DBTX is (a pool is). On one
// database only Work and WorkTx start goroutines (their handler slots),
// and they end before Work returns; over partitions ClaimWait and the
// calls that span partitions do too, and they end before the call returns
// (or, for ClaimWait's waits, by Close).
//
// A group lives on one partition (Home), so its order, its one holder and
// the fencing of its leases are that partition's, and hold as on one
// database. What spans partitions:
//
//   - Claim, ClaimMany and ClaimWait try the partitions in turn, from a
//     start that moves with each claim, until they lease: a claim comes
//     back empty only when no partition it reached has claimable work (a
//     partition that fails is passed over). The priority floor applies on
//     every partition. ClaimWait waits on every partition at once.
//   - PublishMany and AckMany split by partition: atomic per partition,
//     not across (see PublishMany).
//   - DeadLetters, Redrive, PurgeDeadLetters, Stats and Groups read or act
//     on every partition and merge.
//   - Work and WorkTx run one runtime per partition, each with its share
//     of cfg.Concurrency (at least one slot each).
//   - PublishTx, PublishMessageTx, AckTx, AckStateTx and StateTx run in
//     the caller's transaction, which must be on the database of the
//     group's partition (Partition(Locate(group))): atomic with the
//     caller's writes there only. Another database's transaction is
//     refused (ErrInvalidConfig) before anything is written.
//   - While the cluster grows from N/2 partitions to N (docs/partitions.md,
//     "Growing"), a group whose home changed lives in its old partition
//     until it has nothing there: its calls locate it first (one
//     round-trip to the old partition) and its publishes try the old
//     partition first. A Transport opened before the growth keeps working,
//     but a publish of a group that has left is refused with
//     ErrGroupMoved: reopen it.
type Transport struct {
	cl     *cluster.Cluster
	owned  []*pgxpool.Pool // closed by Close; set by FromDSN and OpenCluster
	closed atomic.Bool     // set by Close: every later call returns ErrClosed
}

// New returns a Transport on db, one database. Unless cfg.SkipApply, it
// first brings the schema up to date (idempotent; safe from many workers
// at once). The caller owns db.
func New(ctx context.Context, db DBTX, cfg pgtransport.Config) (*Transport, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	cl, err := cluster.Single(ctx, db, cfg)
	if err != nil {
		return nil, err
	}
	return &Transport{cl: cl}, nil
}

// FromDSN connects to dsn with a pool and returns a Transport that owns it.
// An empty dsn means libpq's defaults (the PG* environment variables, the
// local socket, the OS user's name as role and database), as pgx reads
// them.
// While the server does not accept connections it retries with exponential
// backoff, so a worker started beside PostgreSQL waits for it; it gives up
// when ctx ends or cfg.MaxConnectWait passes, with an error that wraps both
// the reason it stopped and the last connection error. A malformed dsn fails
// at once. The pool holds up to pgtransport.DefaultPoolSize (20)
// connections unless the dsn sets pool_max_conns: each call in flight
// holds one, so a Work with Concurrency above 16, or as many ClaimWait
// loops, wants pool_max_conns=Concurrency+4 (or a pool of your own, with
// New).
func FromDSN(ctx context.Context, dsn string, cfg pgtransport.Config) (*Transport, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
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

// NewCluster returns a Transport on a partitioned queue: pools[i] on
// partition i's database, as many as the proxy's cluster lists (a power
// of two), in its order. It opens the queue on each (so the schema is
// brought up to date unless cfg.SkipApply) and checks that each database
// is the partition its place names (schema.Partition numbered it so) and
// hashes groups as the proxy does; a pool in the wrong place, a partition
// not numbered, or a grown cluster given without its new partitions, is
// ErrInvalidConfig. The caller owns the pools.
func NewCluster(ctx context.Context, pools []*pgxpool.Pool, cfg pgtransport.Config) (*Transport, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	cl, err := cluster.Open(ctx, pools, cfg)
	if err != nil {
		return nil, err
	}
	return &Transport{cl: cl}, nil
}

// OpenCluster reads the partition map from the PL/Proxy proxy at proxyDSN
// (its cluster pgtransport, in cfg.Schema, as schema.ApplyProxy checked
// it; a cluster changed since is ErrInvalidConfig), connects to each
// partition as FromDSN does (retrying up to cfg.MaxConnectWait), with
// proxyDSN's role, password unless the partition's string has one,
// session settings and pool size, and returns the Transport on them
// (NewCluster), which owns the pools. The proxy is not used after.
func OpenCluster(ctx context.Context, proxyDSN string, cfg pgtransport.Config) (*Transport, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
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

// checkConfig refuses the settings the blocking transport cannot honour:
// Config.Async's, which only an async Transport acts on.
func checkConfig(cfg pgtransport.Config) error {
	if cfg.Async != (pgtransport.AsyncConfig{}) {
		return fmt.Errorf("%w: Config.Async is the async transport's (notifications, ListenDSN, ListenPing, Vacuum); the blocking transport cannot honour it: leave it zero", pgtransport.ErrInvalidConfig)
	}
	return nil
}

// Close closes the Transport: a ClaimWait waiting for work returns
// ErrClosed at once, and every later call returns ErrClosed (errors.Is),
// however the Transport was made. A Transport from FromDSN or OpenCluster
// also closes its pools, once the round-trips in flight have finished (a
// call that had not reached the pool yet returns ErrClosed too); a lease a
// ClaimWait claims at that very instant cannot be given back on the
// closed pool and comes back after its visibility. A Transport made with
// New or NewCluster leaves its connections open: the caller owns them
// (and a lease claimed at that instant is given back on them). Over
// partitions it waits for ClaimWait's waits still ending (usually none; at
// most a claim's and a give-back's time out, 35 s, against a partition
// that does not answer). Safe to call twice.
func (t *Transport) Close() {
	t.closed.Store(true)
	t.cl.Close()
	for _, p := range t.owned {
		p.Close()
	}
}

// check is ErrClosed, for op, once Close has been called; else nil.
func (t *Transport) check(op string) error {
	if t.closed.Load() {
		return fmt.Errorf("%s: %w", op, pgtransport.ErrClosed)
	}
	return nil
}

// Partitions is the number of partitions: 1 on one database.
func (t *Transport) Partitions() int { return t.cl.N() }

// Home is the partition group lives on: Hashtext(group) & (N-1), as the
// proxy routes it (0 on one database). While the cluster grows, a group
// may still live in its old home: Locate.
func (t *Transport) Home(group string) int { return t.cl.Home(group) }

// Locate is the partition that holds group now: its Home, but while the
// cluster grows (docs/partitions.md, "Growing") a group whose home changed
// stays in its old partition as long as it has anything there, and Locate
// asks that partition. Open a PublishTx's or StateTx's transaction on
// Partition(Locate(group)). An invalid group id is ErrInvalidGroup.
func (t *Transport) Locate(ctx context.Context, group string) (int, error) {
	if err := t.check("locate"); err != nil {
		return 0, err
	}
	return t.cl.Locate(ctx, group)
}

// Partition is the database handle partition i runs on (the one given to
// New on one database): begin the transaction of a PublishTx, AckTx or
// StateTx on Partition(Locate(group)).
func (t *Transport) Partition(i int) DBTX { return t.cl.Part(i).DB() }

// group is the Core of the partition that holds group now (Locate).
func (t *Transport) group(ctx context.Context, op, group string) (*core.Core, error) {
	if err := t.check(op); err != nil {
		return nil, err
	}
	c, err := t.cl.OnGroup(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return c, nil
}

// Publish appends event to group's FIFO and returns its seq. A new group gets
// priority (0-4); an existing one keeps its priority and any live lease. One
// round-trip.
//
// A lost reply (ErrOutcomeUnknown): the message may have been appended;
// publishing it again may add a second copy.
func (t *Transport) Publish(ctx context.Context, group, event string, priority int) (int64, error) {
	if err := t.check("publish"); err != nil {
		return 0, err
	}
	return t.cl.PublishMessage(ctx, pgtransport.Message{Group: group, Event: event, Priority: priority})
}

// PublishMany appends every message, in slice order (so in order within
// each group), and returns their seqs in that order. A message that
// creates its group gives it its priority. Up to pgtransport.MaxBatch
// messages are one round-trip; a longer batch is sent in chunks of
// MaxBatch inside one transaction, so it too applies whole or not at all
// (its messages are claimable once it commits), and need not be cut up
// by the caller. An empty batch is ErrInvalidBatch; one bad message
// refuses the whole batch with a typed error naming it, and nothing is
// written. A message with a
// DedupKey is deduplicated as by PublishMessage, against earlier
// publishes and earlier messages of the batch: a repeat stores nothing
// and returns the first one's seq.
//
// A lost reply (ErrOutcomeUnknown): the whole batch was appended, or none
// of it; publishing it again may add a second copy of each message
// without a DedupKey (those with one are not stored twice within the
// window).
func (t *Transport) PublishMany(ctx context.Context, msgs []pgtransport.Message) ([]int64, error) {
	if err := t.check("publish"); err != nil {
		return nil, err
	}
	return t.cl.PublishMany(ctx, msgs)
}

// PublishTx is Publish inside the caller's transaction: the message commits
// or rolls back with the caller's own writes, and is invisible to claims
// until then.
func (t *Transport) PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) (int64, error) {
	return t.PublishMessageTx(ctx, tx, pgtransport.Message{Group: group, Event: event, Priority: priority})
}

// PublishMessage appends msg to its group's FIFO and returns its seq, as
// Publish. With a msg.DedupKey it is idempotent: if the same (group, key)
// was published within Config.DedupWindow, it writes nothing and returns
// the seq of that first message (even if that one was since acked), and
// concurrent publishes of one key store exactly one message. A bad key is
// ErrInvalidDedupKey, and nothing is written. One round-trip.
//
// A lost reply (ErrOutcomeUnknown): with a DedupKey, publish it again
// within the window: it returns the seq of the one stored, or stores it
// now. Without one, as Publish.
func (t *Transport) PublishMessage(ctx context.Context, msg pgtransport.Message) (int64, error) {
	if err := t.check("publish"); err != nil {
		return 0, err
	}
	return t.cl.PublishMessage(ctx, msg)
}

// PublishMessageTx is PublishMessage inside the caller's transaction: the
// message and its dedup key commit or roll back with the caller's own
// writes. A concurrent publish of the same key waits for that transaction
// and, if it rolls back, stores its own message.
func (t *Transport) PublishMessageTx(ctx context.Context, tx pgx.Tx, msg pgtransport.Message) (int64, error) {
	if err := t.check("publish"); err != nil {
		return 0, err
	}
	c, err := t.cl.TxPublish(ctx, tx, msg)
	if err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	return c.PublishMessageTx(ctx, tx, msg)
}

// Claim leases the claimable group (priority >= minPriority) that was served
// longest ago and returns its head, held for visibility (at least
// pgtransport.MinVisibility, as for every method that takes one). It
// returns nil, nil when nothing is claimable; it does not wait for work
// (ClaimWait does). One round-trip.
//
// A lost reply (ErrOutcomeUnknown): a group may have been leased to a token
// nobody holds; it comes back after visibility.
func (t *Transport) Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	if err := t.check("claim"); err != nil {
		return nil, err
	}
	return t.cl.Claim(ctx, workerID, visibility, minPriority)
}

// Ack deletes the lease's message and frees its group for the next claim (or
// deletes the group's row when it has no message left). ErrLeaseLost if the
// lease no longer holds. One round-trip.
//
// A lost reply (ErrOutcomeUnknown, wrapping the connection's or ctx's
// error): the message was deleted, or nothing changed and the lease holds
// as before (its message comes back after the lease's end unless settled).
// Acking again tells which while the lease holds: nil if the first ack had
// not applied (this one did); ErrLeaseLost if it had, or if the lease
// lapsed meanwhile and another worker took the group.
func (t *Transport) Ack(ctx context.Context, lease *pgtransport.Lease) error {
	if err := t.check("ack"); err != nil {
		return err
	}
	return t.cl.OfLease(lease).Ack(ctx, lease)
}

// ClaimWait is Claim that waits for work instead of returning nil: it
// blocks until it holds a lease, or returns ctx's error. Idle callers park
// rather than spin: an ack, nack or publish through this Transport wakes
// one of them; otherwise they look again when the earliest lease or park
// among claimable groups runs out, and at most every Config.IdleSweep (new
// work from other processes is found then; async streams wake on
// notifications instead).
//
// A lost reply (ErrOutcomeUnknown): as Claim.
func (t *Transport) ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	if err := t.check("claim"); err != nil {
		return nil, err
	}
	return t.cl.ClaimWait(ctx, workerID, visibility, minPriority)
}

// ClaimMany leases up to max claimable groups (1 to pgtransport.MaxBatch)
// in one round-trip and returns the head of each, served longest ago
// first; empty when nothing is claimable. The leases share one token; each
// is fenced on its own group.
//
// A lost reply (ErrOutcomeUnknown): up to max groups may have been leased
// to a token nobody holds; they come back after visibility.
func (t *Transport) ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) ([]*pgtransport.Lease, error) {
	if err := t.check("claim"); err != nil {
		return nil, err
	}
	return t.cl.ClaimMany(ctx, workerID, visibility, minPriority, max)
}

// AckMany settles leases in one round-trip, each fenced on its own token.
// The result has an entry per lease: nil, or ErrLeaseLost where that lease
// no longer held (nothing changed for it). The error is for the call.
//
// A lost reply (ErrOutcomeUnknown, and ctx's error too when ctx ended while
// it ran, as with a deadline that fires after the commit): no per-lease
// result; the round-trip applied whole or not at all, so either every
// lease that held was acked (its message deleted) or nothing changed and
// each holds as before. AckMany again tells which for each lease while the
// leases hold, as Ack does.
func (t *Transport) AckMany(ctx context.Context, leases []*pgtransport.Lease) ([]error, error) {
	if err := t.check("ack"); err != nil {
		return nil, err
	}
	return t.cl.AckMany(ctx, leases)
}

// AckNext acks the lease and, when its group has another message and the
// lease has taken fewer than Config.MaxKeep in a row (and fewer than
// Config.KeepWhileWaiting, or no other group waits to be claimed), keeps
// the group: it returns that next message under the same lease, held for
// visibility, with no claim in between. Otherwise it returns nil and the
// group is freed for the round-robin. ErrLeaseLost if the lease no longer held. One
// round-trip: a hot group is served at one round-trip per message.
//
// The lease it returns is held, as a claim's is, until it is settled (Ack,
// AckNext, Nack, Fail) or its visibility runs out: a worker that stops
// with it in hand (shutting down, or giving up on an error of its own)
// holds up its whole group until then, unless it gives it back with
// Nack(ctx, next, 0), which frees the group at once (that hand-out still
// counts as an attempt). Work does this for you.
//
// A lost reply (ErrOutcomeUnknown): as Ack, except that an ack that kept the
// group is safe to repeat: AckNext again with the same lease returns the
// same next message, under the same lease, as long as it holds.
func (t *Transport) AckNext(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) (*pgtransport.Lease, error) {
	if err := t.check("ack"); err != nil {
		return nil, err
	}
	return t.cl.OfLease(lease).AckNext(ctx, lease, visibility)
}

// Nack gives the lease back without deleting the message. delay > 0 parks the
// group until now+delay (the message stays its head; the token still holds
// it); delay == 0 frees it at once, first in line. ErrLeaseLost if the lease
// no longer holds. One round-trip.
//
// A lost reply (ErrOutcomeUnknown): the group was given back (parked or
// freed), or nothing changed and the lease holds as before; Nack again
// tells which while it holds (nil: this one gave it back).
func (t *Transport) Nack(ctx context.Context, lease *pgtransport.Lease, delay time.Duration) error {
	if err := t.check("nack"); err != nil {
		return err
	}
	return t.cl.OfLease(lease).Nack(ctx, lease, delay)
}

// Fail ends the lease as a failed attempt: it records cause's text on the
// message (nil: none; made valid UTF-8, without NUL bytes, and cut to
// pgtransport.MaxErrorBytes) and, by the queue's policy (Policy.MaxAttempts,
// RetryBackoffMin/Max, OnExhausted): while the message has attempts left
// (Lease.Attempt below MaxAttempts), parks the group for a backoff that
// doubles with each attempt, with jitter, within the policy's bounds (the
// message stays its head, and is handed out again, to any worker, when
// the backoff ends); otherwise it moves the message to the dead letters
// and frees the group for its next message, or (StopGroup) stops the
// group with the message still its head until RestartGroup. Either way
// the lease is over: unlike Nack with a delay, which parks under the
// lease, a later Ack, Nack or Extend of it returns ErrLeaseLost. Fenced
// like Ack: ErrLeaseLost if the lease no longer holds, and nothing
// changed. One round-trip.
//
// A lost reply (ErrOutcomeUnknown): it applied whole, or nothing changed
// and the lease holds until it lapses; either way the message is handed
// out again later (as its next attempt), unless this Fail dead-lettered
// it or stopped its group.
func (t *Transport) Fail(ctx context.Context, lease *pgtransport.Lease, cause error) error {
	if err := t.check("fail"); err != nil {
		return err
	}
	_, err := t.cl.OfLease(lease).Fail(ctx, lease, cause)
	return err
}

// Extend makes the lease hold until now+visibility, for handlers that run
// long. ErrLeaseLost if the lease no longer holds. One round-trip.
//
// A lost reply (ErrOutcomeUnknown): the lease holds until now+visibility,
// or nothing changed; Extend again (nil: it holds until then).
func (t *Transport) Extend(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) error {
	if err := t.check("extend"); err != nil {
		return err
	}
	return t.cl.OfLease(lease).Extend(ctx, lease, visibility)
}

// DeadLetters returns a page of the queue's dead letters, in seq order:
// those of q.Group ("" every group) with a seq after q.After, at most
// q.Limit (0: pgtransport.DefaultDeadLetterLimit; at most
// pgtransport.MaxBatch). Page on with After set to the last Seq returned.
// A read. One round-trip.
func (t *Transport) DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) ([]pgtransport.DeadLetter, error) {
	if err := t.check("dead letters"); err != nil {
		return nil, err
	}
	return t.cl.DeadLetters(ctx, q)
}

// Redrive puts the dead letters f selects back into their groups and
// returns how many: each at the head of its group with its own seq, so in
// their original order and ahead of the messages published after them; a
// group that drained meanwhile is created again. Each is then a fresh
// message (Lease.Attempt starts at 1 again). Safe against concurrent
// publishers and consumers. One round-trip, one transaction.
//
// A lost reply (ErrOutcomeUnknown): all were put back, or none; Redrive
// again puts back those still dead.
func (t *Transport) Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	if err := t.check("redrive"); err != nil {
		return 0, err
	}
	return t.cl.Redrive(ctx, f)
}

// PurgeDeadLetters deletes the dead letters f selects for good and returns
// how many. One round-trip, one transaction.
//
// A lost reply (ErrOutcomeUnknown): all were deleted, or none; purging
// again deletes those left.
func (t *Transport) PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	if err := t.check("purge dead letters"); err != nil {
		return 0, err
	}
	return t.cl.PurgeDeadLetters(ctx, f)
}

// RestartGroup resumes a group the queue stopped (policy
// pgtransport.StopGroup): it goes back into the round-robin and its head
// gets fresh attempts; with skipHead the head is first moved to the dead
// letters, and the group goes on with its next message.
// ErrGroupNotStopped if the group is not stopped, and nothing changed. One
// round-trip.
//
// A lost reply (ErrOutcomeUnknown): it was restarted, or nothing changed;
// RestartGroup again tells which (ErrGroupNotStopped: the first one did,
// unless the group stopped again since).
func (t *Transport) RestartGroup(ctx context.Context, group string, skipHead bool) error {
	c, err := t.group(ctx, "restart group", group)
	if err != nil {
		return err
	}
	return c.RestartGroup(ctx, group, skipHead)
}
