// Package cluster is a queue of N >= 1 partitions: one Core (package
// core, the one-database engine) per partition, and what spans them. A
// queue on one database is a cluster of one, whose calls go straight to
// its Core. By concern:
//
//   - cluster.go: construction (Single, Open, NewCluster) and the growth
//     checks;
//   - route.go: where a group (Home, Locate) and a message (Of) live;
//   - hash.go: PostgreSQL's hashtext, which the routing shares with a
//     PL/Proxy proxy;
//   - claim.go: claims rotated over the partitions, and ClaimWait's
//     waits on all of them;
//   - batch.go: publish and ack batches split by partition;
//   - read.go: dead letters, stats and groups merged;
//   - tx.go: which partition a call in the caller's transaction belongs
//     to, and the check that the transaction is on it;
//   - work.go: a worker runtime's slots shared over the partitions;
//   - dial.go: connecting to one database, or to the partitions a proxy
//     lists.
package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	stdsync "sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// MaxPartitions bounds a cluster's partition count: seq & 1023 names a
// message's partition (schema.Partition).
const MaxPartitions = 1024

// Cluster is one queue spread over N partitions, each a Core on
// a database that holds the queue numbered by its place
// (schema.Partition), as the PL/Proxy proxy (schema/sql/proxy.sql) sees
// them: a group lives on partition Hashtext(group) & (N-1), and a message
// on partition seq & (N-1) (the seqs of partition i are i modulo 1,024).
// Order, the one holder per group and the fencing stay inside one
// partition; the Cluster routes a call to the partition its group or lease
// names, rotates claims over the partitions from a turn that moves with
// every claim, splits batches, and merges reads. The front-ends send a
// call that names a group to OnGroup(group), and one that names a lease
// to OfLease(lease); the rest are here.
//
// While the cluster grows from N/2 partitions to N (docs/protocol.md,
// "Growing the cluster"), a group whose home changed lives in its old
// home until it has nothing left there: Locate finds it, and a publish
// tries the old home first (Core.PublishHere), which hands back the
// messages of a group that has left.
type Cluster struct {
	parts []*core.Core
	from  int           // while growing: the count it grew from; 0 otherwise
	turn  atomic.Uint32 // the next claim's first partition

	mu      stdsync.Mutex
	closing bool              // set by Close: no more waits start
	waits   stdsync.WaitGroup // ClaimWait's waits on each partition
}

// NewCluster returns the cluster of parts (parts[i] partition i), after
// checking that their count is a power of two up to MaxPartitions, that
// each database is numbered by its place (an unnumbered database is
// allowed as the only partition), that its server hashes groups as
// Hashtext does, and that a grown cluster is given whole: every
// partition armed for len(parts) (schema's growth), or none. A
// misnumbered or unnumbered partition, or a grown cluster given in part,
// is ErrInvalidConfig: its groups would be looked for in another
// database.
func NewCluster(ctx context.Context, parts []*core.Core) (*Cluster, error) {
	n := len(parts)
	if n == 0 || n > MaxPartitions || n&(n-1) != 0 {
		return nil, fmt.Errorf("%w: %d partitions; a cluster has a power of two, 1 to %d", pgtransport.ErrInvalidConfig, n, MaxPartitions)
	}
	const probe = "pgtransport: is hashtext the same here?"
	var (
		from     = -1 // the count it grew from: -1 unread, 0 none
		anyArmed = false
	)
	for i, c := range parts {
		if c == nil {
			return nil, fmt.Errorf("%w: partition %d is nil", pgtransport.ErrInvalidConfig, i)
		}
		info, err := c.Partition(ctx, probe)
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", i, err)
		}
		part, armed, grownFrom, hash := info.Part, info.Armed, info.GrownFrom, info.Hash
		if err := checkArmed(i, n, armed, grownFrom, &from, &anyArmed); err != nil {
			return nil, err
		}
		switch {
		case part == nil && n > 1:
			return nil, fmt.Errorf("%w: partition %d is not numbered (schema.Partition, or pgtransport migrate apply --partition %d)", pgtransport.ErrInvalidConfig, i, i)
		case part != nil && int(*part) != i:
			return nil, fmt.Errorf("%w: the database given as partition %d is numbered %d", pgtransport.ErrInvalidConfig, i, *part)
		case hash != Hashtext(probe):
			return nil, fmt.Errorf("%w: partition %d's server hashes groups differently (a big-endian server?): hashtext routing would disagree with a proxy's", pgtransport.ErrInvalidConfig, i)
		}
	}
	cl := &Cluster{parts: slices.Clone(parts), from: max(from, 0)}
	cl.turn.Store(rand.Uint32())
	return cl, nil
}

// checkArmed checks partition i's growth record (the count it was armed
// for, the count it grew from) against a cluster of n: armed for n or not
// at all, all alike; *from is the count every partition so far grew
// from, and *anyArmed whether any was armed.
func checkArmed(i, n int, armed, grownFrom *int32, from *int, anyArmed *bool) error {
	switch {
	case armed != nil && int(*armed) > n:
		return fmt.Errorf("%w: partition %d belongs to a cluster grown to %d partitions; open it with all of them (OpenCluster reads them from the proxy)", pgtransport.ErrInvalidConfig, i, *armed)
	case armed != nil && int(*armed) != n:
		return fmt.Errorf("%w: partition %d was armed for a cluster of %d partitions, not %d", pgtransport.ErrInvalidConfig, i, *armed, n)
	case i > 0 && armed != nil && !*anyArmed:
		return fmt.Errorf("%w: partition %d is armed for growth and partition 0 is not: the growth was not finished (the proxy's harel_px_grow arms them all)", pgtransport.ErrInvalidConfig, i)
	case i > 0 && armed == nil && *anyArmed:
		return fmt.Errorf("%w: partition 0 is armed for growth and partition %d is not: the growth was not finished (the proxy's harel_px_grow arms them all)", pgtransport.ErrInvalidConfig, i)
	}
	g := 0
	if grownFrom != nil {
		g = int(*grownFrom)
	}
	if *from >= 0 && g != *from {
		return fmt.Errorf("%w: partition %d grew from %d partitions, partition 0 from %d: the growth is half finished (the proxy's harel_px_grown)", pgtransport.ErrInvalidConfig, i, g, *from)
	}
	*from, *anyArmed = g, armed != nil
	return nil
}

// N is the number of partitions.
func (cl *Cluster) N() int { return len(cl.parts) }

// one is the only partition's Core when there is one partition, else
// nil: the calls that span partitions go straight to it, as on one
// database (no goroutine, no merge).
func (cl *Cluster) one() *core.Core {
	if len(cl.parts) == 1 {
		return cl.parts[0]
	}
	return nil
}

// OnGroup is the Core of the partition that holds group now (Locate): at
// once with one partition, or for a group that does not move.
func (cl *Cluster) OnGroup(ctx context.Context, group string) (*core.Core, error) {
	if len(cl.parts) == 1 {
		return cl.parts[0], nil
	}
	if !cl.Moves(group) {
		return cl.parts[cl.Home(group)], nil
	}
	i, err := cl.Locate(ctx, group)
	if err != nil {
		return nil, err
	}
	return cl.parts[i], nil
}

// OfLease is the Core of the lease's partition (Of).
func (cl *Cluster) OfLease(l *pgtransport.Lease) *core.Core { return cl.parts[cl.Of(l)] }

// Part is partition i.
func (cl *Cluster) Part(i int) *core.Core { return cl.parts[i] }

// Close ends every ClaimWait waiting on any partition (ErrClosed: each
// Core's parked callers are woken for good), stops ClaimWait from
// starting waits, and waits for the goroutines of those it left behind
// (waits that were ending as it returned): at most a claim's time out
// (30 s) and a give-back's (5 s) against a partition that does not
// answer, usually at once. Safe to call twice.
func (cl *Cluster) Close() {
	cl.mu.Lock()
	cl.closing = true
	cl.mu.Unlock()
	for _, c := range cl.parts {
		c.Parking().Close()
	}
	cl.waits.Wait()
}

// Single is the queue of one database, db, as New and FromDSN open it:
// a partition of one, which is not asked for its partition record (a
// transport opens with SkipApply and no server to reach, as it always
// could). Its calls go straight to the one Core.
func Single(ctx context.Context, db core.DBTX, cfg pgtransport.Config) (*Cluster, error) {
	c, err := core.New(ctx, db, cfg)
	if err != nil {
		return nil, err
	}
	return &Cluster{parts: []*core.Core{c}}, nil
}

// Open opens a Core on each of pools (partition i on pools[i]) with cfg,
// then checks them as NewCluster does: the queue as NewCluster and
// OpenCluster of the front-ends open it.
func Open(ctx context.Context, pools []*pgxpool.Pool, cfg pgtransport.Config) (*Cluster, error) {
	if n := len(pools); n == 0 || n > MaxPartitions || n&(n-1) != 0 {
		return nil, fmt.Errorf("%w: %d partitions; a cluster has a power of two, 1 to %d", pgtransport.ErrInvalidConfig, n, MaxPartitions)
	}
	cores := make([]*core.Core, len(pools))
	for i, pool := range pools {
		if pool == nil {
			return nil, fmt.Errorf("%w: partition %d: nil pool", pgtransport.ErrInvalidConfig, i)
		}
		c, err := core.New(ctx, pool, cfg)
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", i, err)
		}
		cores[i] = c
	}
	return NewCluster(ctx, cores)
}
