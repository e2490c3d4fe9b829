// Package contract is the behaviour every transport front-end must show,
// as cases over real PostgreSQL, area by area (see areas), each case run
// on one database and on a queue of four partitions. Package sync runs it
// against the blocking transport; package async runs the same cases
// against its twin, through an adapter that waits on each call's channel.
//
// Every name on the way to a case is CamelCase, so -run selects it as
// written: a topology (DB, Partitions4), an area, a case:
//
//	go test -run 'Contract/DB/Publish/FIFOWithinAGroup' ./sync/
//	go test -run 'Contract/Partitions4/' ./sync/ ./async/
//
// On partitions a group lives on its home partition and a claim tries the
// partitions in turn from a start that moves, so an order among groups
// (never-served groups in arrival order, the round-robin) is an order
// among the groups of one partition: a case that asserts one places its
// groups on one partition (env.local) and says so. A case that cannot
// hold across partitions says why in its own skip (env.skipOnPartitions).
// The area AcrossPartitions holds what only partitions have: placement,
// claim rotation, routing, transaction placement, a misnumbered cluster.
package contract

import (
	"context"
	"fmt"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// Transport is the blocking form of the API under test.
type Transport interface {
	Publish(ctx context.Context, group, event string, priority int) (int64, error)
	Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error)
	Ack(ctx context.Context, lease *pgtransport.Lease) error
	Nack(ctx context.Context, lease *pgtransport.Lease, delay time.Duration) error
	Extend(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) error
	PublishMany(ctx context.Context, msgs []pgtransport.Message) ([]int64, error)
	ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) ([]*pgtransport.Lease, error)
	AckMany(ctx context.Context, leases []*pgtransport.Lease) ([]error, error)
	AckNext(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) (*pgtransport.Lease, error)
	ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error)
	Fail(ctx context.Context, lease *pgtransport.Lease, cause error) error
	PublishMessage(ctx context.Context, msg pgtransport.Message) (int64, error)
	PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) (int64, error)
	PublishMessageTx(ctx context.Context, tx pgx.Tx, msg pgtransport.Message) (int64, error)
	DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) ([]pgtransport.DeadLetter, error)
	Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error)
	PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error)
	RestartGroup(ctx context.Context, group string, skipHead bool) error
	SetPolicy(ctx context.Context, p pgtransport.Policy) error
	Policy(ctx context.Context) (pgtransport.Policy, error)
	Close()
}

// Operator is the operator's calls and the runtime, in the blocking form:
// every Transport under test must have them (a case fails, never skips,
// when one lacks them).
type Operator interface {
	Transport
	Stats(ctx context.Context) (pgtransport.Stats, error)
	Groups(ctx context.Context, q pgtransport.GroupQuery) ([]pgtransport.GroupInfo, error)
	Group(ctx context.Context, group string) (pgtransport.GroupInfo, error)
	Peek(ctx context.Context, group string, n int) ([]pgtransport.PeekedMessage, error)
	PauseGroup(ctx context.Context, group string) error
	ResumeGroup(ctx context.Context, group string) error
	PurgeGroup(ctx context.Context, group string, limit int) (int64, error)
	Work(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.Handler) error
	SetTenantWeight(ctx context.Context, tenant string, weight int) error
	Tenants(ctx context.Context) ([]pgtransport.TenantInfo, error)
}

// Exactly is the exactly-once calls, in the blocking form: every
// Transport under test must have them (a case fails, never skips, when
// one lacks them).
type Exactly interface {
	Transport
	AckTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease) error
	AckStateTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease, state []byte) error
	State(ctx context.Context, group string) ([]byte, error)
	StateTx(ctx context.Context, tx pgx.Tx, group string) ([]byte, error)
	WorkTx(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.TxHandler) error
}

// Opener opens the transport under test with cfg, on each topology, or
// returns the error its constructor returned; the test owns what it opens
// (register its Close with t.Cleanup). Run runs the topologies whose
// opener is set.
type Opener struct {
	// DB opens it on one database: db is the case's pool, or one through
	// a pgtest.Proxy, or another test database's.
	DB func(t *testing.T, db core.DBTX, cfg pgtransport.Config) (Transport, error)
	// Partitions opens it over a queue's partitions, pools[i] on
	// partition i (or pools out of place, which it must refuse).
	Partitions func(t *testing.T, pools []*pgxpool.Pool, cfg pgtransport.Config) (Transport, error)
}

// partitions is how many partitions the partitioned topology has.
const partitions = 4

// area is a part of the contract: its cases, and whether it is about
// partitions only (run on the partitioned topology alone).
type area struct {
	name           string
	cases          []testCase
	partitionsOnly bool
}

// areas is the contract, in the order Run starts it.
var areas = []area{
	{"Publish", publishCases, false},
	{"Claim", claimCases, false},
	{"Ack", ackCases, false},
	{"Attempts", attemptsCases, false},
	{"DeadLetters", deadLettersCases, false},
	{"Dedup", dedupCases, false},
	{"Policy", policyCases, false},
	{"Operations", operationsCases, false},
	{"Tenants", tenantsCases, false},
	{"ExactlyOnce", exactlyOnceCases, false},
	{"Lifecycle", lifecycleCases, false},
	{"LostReplies", lostRepliesCases, false},
	{"AcrossPartitions", acrossPartitionsCases, true},
}

// testCase is one behaviour. Its name is CamelCase, without spaces,
// colons or slashes, so that -run selects it as written.
type testCase struct {
	name string
	run  func(is *is.I, e *env)
}

// Run runs every case against transports from o: on one database (DB)
// and over four partitions (Partitions4), each case on a fresh queue of
// its own, reset from an earlier case's (pgtest.ReusedDB and
// pgtest.ReusedPartitions; the partitions are skipped, loudly, where the
// test server has no PL/Proxy). All run in parallel.
func Run(t *testing.T, o Opener) {
	type topology struct {
		name string
		n    int
		open func(t *testing.T, pools []*pgxpool.Pool, cfg pgtransport.Config) (Transport, error)
	}
	var topologies []topology
	if o.DB != nil {
		topologies = append(topologies, topology{"DB", 1, func(t *testing.T, pools []*pgxpool.Pool, cfg pgtransport.Config) (Transport, error) {
			return o.DB(t, pools[0], cfg)
		}})
	}
	if o.Partitions != nil {
		topologies = append(topologies, topology{fmt.Sprint("Partitions", partitions), partitions, o.Partitions})
	}
	if len(topologies) == 0 {
		t.Fatal("contract.Run: an Opener with no topology")
	}
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			for _, a := range areas {
				if a.partitionsOnly && topo.n == 1 {
					continue
				}
				t.Run(a.name, func(t *testing.T) {
					t.Parallel()
					for _, tc := range a.cases {
						if strings.ContainsAny(tc.name, " :/") {
							t.Errorf("case %q: a name -run cannot select as written", tc.name)
						}
						t.Run(tc.name, func(t *testing.T) {
							t.Parallel()
							e := newEnv(t, topo.n, topo.open, o.DB)
							tc.run(is.New(t), e)
						})
					}
				})
			}
		})
	}
}

// Clock is a settable clock for Config.Clock.
type Clock struct {
	mu  stdsync.Mutex
	now time.Time
}

// NewClock returns a clock stopped at a fixed instant.
func NewClock() *Clock { return &Clock{now: time.Unix(1_800_000_000, 0)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

func event(group string, i int) string { return fmt.Sprintf("%s-%d", group, i) }
