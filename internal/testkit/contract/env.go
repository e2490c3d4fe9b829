package contract

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/cluster"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// env is what a case gets: a transport on a fresh queue (one database, or
// partitions), its clock, and helpers that look at the queue's tables on
// the partition that holds what they look for (a group's home), or on
// every partition, adding up.
type env struct {
	t      *testing.T
	tr     Transport
	clock  *Clock
	n      int                 // partitions: 1 on one database
	schema string              // the queue's schema, the same in every database
	pools  []*pgxpool.Pool     // pools[i] on partition i; on one database its pool
	db     *pgtest.DB          // one database's; nil on partitions
	p      *pgtest.Partitioned // the partitions'; nil on one database
	target int                 // the partition place counts from: the case's own
	openOn func(pools []*pgxpool.Pool, cfg pgtransport.Config) (Transport, error)
	openDB func(t *testing.T, db core.DBTX, cfg pgtransport.Config) (Transport, error) // Opener.DB
}

// newEnv gives t a queue on n partitions (1: one database) and a
// transport on it from open.
func newEnv(t *testing.T, n int, open func(t *testing.T, pools []*pgxpool.Pool, cfg pgtransport.Config) (Transport, error),
	openDB func(t *testing.T, db core.DBTX, cfg pgtransport.Config) (Transport, error)) *env {
	e := &env{t: t, clock: NewClock(), n: n, openDB: openDB}
	if n == 1 {
		db := pgtest.ReusedDB(t, 24)
		e.db, e.schema, e.pools = db, db.Schema, []*pgxpool.Pool{db.Pool}
	} else {
		p := pgtest.ReusedPartitions(t, n)
		e.p, e.schema, e.pools = p, p.Schema, p.Parts
	}
	// Each case's groups go to a partition of its own choosing, so that
	// together the cases use every partition.
	e.target = int(cluster.Hashtext(t.Name())) & (n - 1)
	e.openOn = func(pools []*pgxpool.Pool, cfg pgtransport.Config) (Transport, error) { return open(t, pools, cfg) }
	e.tr = e.open()
	return e
}

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	e.t.Cleanup(cancel)
	return ctx
}

// config is the case's Config: its schema and clock.
func (e *env) config() pgtransport.Config {
	return pgtransport.Config{Schema: e.schema, Clock: e.clock.Now}
}

func (e *env) must(tr Transport, err error) Transport {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("open: %v", err)
	}
	return tr
}

// open opens another transport on the case's queue and clock.
func (e *env) open() Transport {
	e.t.Helper()
	return e.must(e.openOn(e.pools, e.config()))
}

// openCfg opens another transport on the case's queue with cfg (its
// Schema and Clock set to the case's), or returns the error its
// constructor returned.
func (e *env) openCfg(cfg pgtransport.Config) (Transport, error) {
	cfg.Schema, cfg.Clock = e.schema, e.clock.Now
	return e.openOn(e.pools, cfg)
}

// with opens another transport on the case's queue and clock with cfg's
// other fields: its policy fields become the queue's, for every
// transport on it.
func (e *env) with(cfg pgtransport.Config) Transport {
	e.t.Helper()
	tr, err := e.openCfg(cfg)
	if err != nil {
		e.t.Fatalf("open with %+v: %v", cfg, err)
	}
	return tr
}

// skipOnPartitions skips the case on partitions, saying why it cannot
// hold there.
func (e *env) skipOnPartitions(why string) {
	e.t.Helper()
	if e.n > 1 {
		e.t.Skip("cannot hold on partitions: " + why)
	}
}

// home is group's partition, as a proxy routes it (0 on one database).
func (e *env) home(group string) int { return int(cluster.Hashtext(group)) & (e.n - 1) }

// partOf is the partition of the message seq: a partition's seqs are its
// index modulo 1,024 (0 on one database).
func (e *env) partOf(seq int64) int {
	if e.n == 1 {
		return 0
	}
	return int(seq & 1023)
}

// place is a name for group on partition target+k (modulo the count):
// group itself where that is its home (always, on one database), else
// group with the first suffix "-1", "-2", ... that puts it there.
func (e *env) place(group string, k int) string {
	want := (e.target + k) % e.n
	if e.home(group) == want {
		return group
	}
	for j := 1; ; j++ {
		if g := fmt.Sprintf("%s-%d", group, j); e.home(g) == want {
			return g
		}
	}
}

// local places groups on one partition, the case's.
func (e *env) local(groups ...string) []string {
	out := make([]string, len(groups))
	for i, g := range groups {
		out[i] = e.place(g, 0)
	}
	return out
}

// spread places groups[i] on partition target+i: on as many partitions as
// there are groups, up to all.
func (e *env) spread(groups ...string) []string {
	out := make([]string, len(groups))
	for i, g := range groups {
		out[i] = e.place(g, i)
	}
	return out
}

// risingPerPartition reports whether seqs rise in slice order among the
// seqs of each partition: the order a batch's seqs have (on one database,
// all of them).
func (e *env) risingPerPartition(seqs []int64) bool {
	last := map[int]int64{}
	for _, s := range seqs {
		i := e.partOf(s)
		if l, ok := last[i]; ok && s <= l {
			return false
		}
		last[i] = s
	}
	return true
}

// poolAt is the pool of group's home partition.
func (e *env) poolAt(group string) *pgxpool.Pool { return e.pools[e.home(group)] }

func (e *env) publish(group, event string, priority int) {
	e.t.Helper()
	if _, err := e.tr.Publish(e.ctx(), group, event, priority); err != nil {
		e.t.Fatalf("publish %s/%s: %v", group, event, err)
	}
}

func (e *env) publishMessage(tr Transport, m pgtransport.Message) int64 {
	e.t.Helper()
	s, err := tr.PublishMessage(e.ctx(), m)
	if err != nil {
		e.t.Fatalf("publish %+v: %v", m, err)
	}
	return s
}

func (e *env) claim(worker string, minPriority int) *pgtransport.Lease {
	e.t.Helper()
	l, err := e.tr.Claim(e.ctx(), worker, time.Minute, minPriority)
	if err != nil {
		e.t.Fatalf("claim: %v", err)
	}
	return l
}

func (e *env) ack(l *pgtransport.Lease) {
	e.t.Helper()
	if l == nil {
		e.t.Fatal("ack: no lease")
	}
	if err := e.tr.Ack(e.ctx(), l); err != nil {
		e.t.Fatalf("ack %s/%d: %v", l.Group, l.Seq, err)
	}
}

// fail fails l with cause through tr.
func (e *env) fail(tr Transport, l *pgtransport.Lease, cause string) {
	e.t.Helper()
	if l == nil {
		e.t.Fatal("fail: no lease")
	}
	if err := tr.Fail(e.ctx(), l, errors.New(cause)); err != nil {
		e.t.Fatalf("fail %s/%d: %v", l.Group, l.Seq, err)
	}
}

// count runs a count(*) query on every partition and adds up the counts:
// on one database, the count.
func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	n := 0
	for i, pool := range e.pools {
		var k int
		if err := pool.QueryRow(e.ctx(), query, args...).Scan(&k); err != nil {
			e.t.Fatalf("partition %d: %s: %v", i, query, err)
		}
		n += k
	}
	return n
}

// rows counts the queued messages and the group rows, on every partition
// (not the kept rows of drained groups: "Kept rows" in
// schema/sql/functions/30_claim.sql).
func (e *env) rows() (messages, groups int) {
	return e.count(`SELECT count(*) FROM transport_messages`), e.count(`SELECT count(*) FROM transport_groups WHERE drained_at IS NULL`)
}

// valueAt runs a query of one integer value on group's home partition.
func (e *env) valueAt(group, query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.poolAt(group).QueryRow(e.ctx(), query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// textAt runs a query of one text value on group's home partition (""
// for NULL).
func (e *env) textAt(group, query string, args ...any) string {
	e.t.Helper()
	var s *string
	if err := e.poolAt(group).QueryRow(e.ctx(), query, args...).Scan(&s); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	if s == nil {
		return ""
	}
	return *s
}

// exec runs a statement on every partition (a table of the user's, say).
func (e *env) exec(query string, args ...any) {
	e.t.Helper()
	for i, pool := range e.pools {
		if _, err := pool.Exec(e.ctx(), query, args...); err != nil {
			e.t.Fatalf("partition %d: %s: %v", i, query, err)
		}
	}
}

// execAt runs a statement on group's home partition (a plain-SQL write of
// the group's).
func (e *env) execAt(group, query string, args ...any) {
	e.t.Helper()
	if _, err := e.poolAt(group).Exec(e.ctx(), query, args...); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
}

// begin starts a transaction on group's home partition, where a call in
// the caller's transaction for group must run; rolled back at the end of
// the case if still open.
func (e *env) begin(group string) pgx.Tx {
	e.t.Helper()
	tx, err := e.poolAt(group).Begin(e.ctx())
	if err != nil {
		e.t.Fatalf("begin: %v", err)
	}
	e.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// snapshot is every queued message, group row and dead letter as text,
// partition by partition: equal snapshots mean nothing changed.
func (e *env) snapshot() string {
	e.t.Helper()
	var parts []string
	for i, pool := range e.pools {
		var s *string
		if err := pool.QueryRow(e.ctx(), `SELECT string_agg(r, ' | ' ORDER BY r) FROM (
  SELECT 'g ' || g::text AS r FROM transport_groups g
  UNION ALL SELECT 'm ' || m::text FROM transport_messages m
  UNION ALL SELECT 'd ' || d::text FROM transport_dead_letters d) s`).Scan(&s); err != nil {
			e.t.Fatalf("partition %d: snapshot: %v", i, err)
		}
		if s != nil {
			parts = append(parts, fmt.Sprintf("%d: %s", i, *s))
		}
	}
	return strings.Join(parts, "\n")
}

// until polls cond until it holds, and fails the case if it does not
// within 30 s: for what only the tables show.
func (e *env) until(what string, cond func() bool) {
	e.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			e.t.Fatalf("never %s within 30 s", what)
		}
	}
}

// waitParked waits until a ClaimWait on the queue has parked: on every
// partition, where it waits on each.
func (e *env) waitParked() {
	e.t.Helper()
	if e.p != nil {
		e.p.WaitParked(e.t)
		return
	}
	e.db.WaitParked(e.t)
}

// waitLocked waits until a statement of the case's schema calling fn
// waits for a lock (on any partition: pg_stat_activity shows the whole
// server), and fails the test after 30 s.
func (e *env) waitLocked(fn string) {
	e.t.Helper()
	call := pgx.Identifier{e.schema}.Sanitize() + "." + fn
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n int
		if err := e.pools[0].QueryRow(e.ctx(), `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, call).Scan(&n); err != nil {
			e.t.Fatalf("pg_stat_activity: %v", err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no %s waited for a lock within 30s", call)
		}
	}
}
