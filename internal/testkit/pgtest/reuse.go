package pgtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport/schema"
)

// ReusedPartitions is Partitions(tb, n) for tests that use the queue only
// through its tables and functions, as the contract's cases do: the
// queue may be one an earlier test of this process finished with, emptied
// back to the state of a fresh one; tests that run at once each have
// their own. Making a queue over four partitions takes about 0.7 s (the
// functions applied five times) and dropping it 0.15 s, against some
// 15 ms for the reset: over the contract's hundred-odd cases per
// front-end, that was most of their partitioned run.
//
// The reset, on every database of the queue, drops the tables the test
// made, empties the queue's tables and puts back the rows a fresh queue
// holds (its policy, its number, its version), and sets every sequence
// (the seqs, the claim's floors) back where a fresh one starts. A queue
// whose test failed, or in which the test made something other than
// tables (a function, a view, a trigger), is dropped instead; grants and
// the server's statistics counters are not reset, so a test that grants,
// or reads harel_counters, takes Partitions.
func ReusedPartitions(tb testing.TB, n int) *Partitioned {
	tb.Helper()
	DSN(tb)
	p, err := takeReused(n)
	if errors.Is(err, ErrNoPLProxy) {
		fmt.Fprintln(os.Stderr, "pgtest: "+plproxyInstall)
		tb.Skip("pgtest: " + plproxyInstall)
	}
	if err != nil {
		tb.Fatalf("pgtest: partitions: %v", err)
	}
	tb.Cleanup(func() {
		if err := p.release(tb.Failed()); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return p
}

// ReusedDB is New(tb, maxConns) with the queue applied in the schema
// (schema.Apply), for tests that use the queue only through its tables
// and functions, as the contract's cases do: the schema may be one an
// earlier test of this process finished with, reset as ReusedPartitions
// resets a partition (with the same limits). Applying the functions takes
// about 0.1 s of the server's time, 0.3 s on a loaded one, and dropping
// the schema 30 ms, against some 5 ms for the reset; a transport opened
// on it finds its version current and applies nothing.
func ReusedDB(tb testing.TB, maxConns int32) *DB {
	tb.Helper()
	db, err := takeReusedDB(maxConns)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := db.release(tb.Failed()); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return db
}

// takeReusedDB returns a schema holding a fresh queue from reused, on a
// pool of its own, or a new one.
func takeReusedDB(maxConns int32) (*DB, error) {
	reused.mu.Lock()
	var db *DB
	if n := len(reused.dbs); n > 0 {
		db, reused.dbs = reused.dbs[n-1], reused.dbs[:n-1]
	}
	reused.mu.Unlock()
	if db != nil {
		pool, err := schemaPool(db.DSN, db.Schema, maxConns)
		if err != nil {
			return nil, errors.Join(err, db.Drop())
		}
		db.Pool = pool
		return db, nil
	}
	db, err := Open(maxConns)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := schema.Apply(ctx, db.Pool, db.Schema); err != nil {
		return nil, errors.Join(err, db.Drop())
	}
	if db.fresh, err = takeSnapshot(ctx, db.admin, db.Schema); err != nil {
		return nil, errors.Join(err, db.Drop())
	}
	return db, nil
}

// release ends a test's use of db: its pool closed, then db reset and
// kept for the next test, or dropped (failed: the test failed).
func (db *DB) release(failed bool) error {
	db.Pool.Close()
	if failed {
		return db.Drop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ok, err := db.fresh.restore(ctx, db.admin, db.Schema)
	if err != nil || !ok {
		return errors.Join(err, db.Drop())
	}
	reused.mu.Lock()
	defer reused.mu.Unlock()
	reused.dbs = append(reused.dbs, db)
	return nil
}

// reused holds the queues ReusedPartitions (by partition count) and
// ReusedDB hand out again.
var reused struct {
	mu   stdsync.Mutex
	free map[int][]*Partitioned
	dbs  []*DB
}

// reusedMaxConns is the pool size of a reused queue's pools, Partitions'.
const reusedMaxConns = 8

// takeReused returns a queue over n partitions from reused, on pools of
// its own, or a new one.
func takeReused(n int) (*Partitioned, error) {
	reused.mu.Lock()
	var p *Partitioned
	if free := reused.free[n]; len(free) > 0 {
		p, reused.free[n] = free[len(free)-1], free[:len(free)-1]
	}
	reused.mu.Unlock()
	if p != nil {
		return p, p.connect()
	}
	c, err := partitionCluster(n)
	if err != nil {
		return nil, err
	}
	if p, err = c.open(reusedMaxConns); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, adm := range p.admins() {
		s, err := takeSnapshot(ctx, adm, p.Schema)
		if err != nil {
			return nil, errors.Join(err, p.Drop())
		}
		p.fresh = append(p.fresh, s)
	}
	return p, nil
}

// admins is the admin pool of each of p's databases: the proxy's, then
// the partitions' in order.
func (p *Partitioned) admins() []*pgxpool.Pool {
	return append([]*pgxpool.Pool{p.cluster.proxy}, p.cluster.parts...)
}

// connect gives a reused p new pools on its schema.
func (p *Partitioned) connect() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	if p.Proxy, err = p.connectTo(ctx, p.ProxyDSN); err != nil {
		return errors.Join(err, p.Drop())
	}
	p.Parts = make([]*pgxpool.Pool, len(p.PartDSNs))
	for i, dsn := range p.PartDSNs {
		if p.Parts[i], err = p.connectTo(ctx, dsn); err != nil {
			return errors.Join(err, p.Drop())
		}
	}
	return nil
}

// release ends a test's use of p: its pools closed, then p reset and kept
// for the next test, or dropped (failed: the test failed).
func (p *Partitioned) release(failed bool) error {
	p.Proxy.Close()
	for _, part := range p.Parts {
		part.Close()
	}
	if failed {
		return p.Drop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admins := p.admins()
	oks, errs := make([]bool, len(admins)), make([]error, len(admins))
	var wg stdsync.WaitGroup
	for i, adm := range admins {
		wg.Go(func() { oks[i], errs[i] = p.fresh[i].restore(ctx, adm, p.Schema) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil || slices.Contains(oks, false) {
		return errors.Join(err, p.Drop())
	}
	reused.mu.Lock()
	defer reused.mu.Unlock()
	if reused.free == nil {
		reused.free = map[int][]*Partitioned{}
	}
	reused.free[len(p.Parts)] = append(reused.free[len(p.Parts)], p)
	return nil
}

// dropReused drops the queues kept for reuse, before the admin pools
// close.
func dropReused() {
	reused.mu.Lock()
	defer reused.mu.Unlock()
	for _, ps := range reused.free {
		for _, p := range ps {
			if err := p.cluster.drop(p); err != nil {
				fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
			}
		}
	}
	for _, db := range reused.dbs {
		if err := db.Drop(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		}
	}
	reused.free, reused.dbs = nil, nil
}

// snapshot is what one database's schema of a fresh queue holds: the
// rows of each table (as JSON), each sequence's position, and how many
// objects of each kind it has.
type snapshot struct {
	tables  []string          // in name order
	rows    map[string]string // table: its rows as a JSON array, where it has any
	seqs    map[string]seqAt
	objects string // the schema's objects counted by kind: anything made since is seen
}

type seqAt struct {
	last   int64
	called bool
}

// objectsQuery counts the schema's objects by kind: relations by relkind
// (indexes and sequences included), functions, types and triggers.
const objectsQuery = `SELECT concat_ws(' ',
	(SELECT string_agg(k || '=' || n, ',' ORDER BY k) FROM (SELECT relkind::text AS k, count(*) AS n FROM pg_class WHERE relnamespace = $1::regnamespace GROUP BY 1) AS c),
	'proc=' || (SELECT count(*) FROM pg_proc WHERE pronamespace = $1::regnamespace),
	'type=' || (SELECT count(*) FROM pg_type WHERE typnamespace = $1::regnamespace),
	'trigger=' || (SELECT count(*) FROM pg_trigger AS g JOIN pg_class AS r ON r.oid = g.tgrelid WHERE r.relnamespace = $1::regnamespace AND NOT g.tgisinternal))`

// takeSnapshot reads schema's fresh state on the database adm is on.
func takeSnapshot(ctx context.Context, adm *pgxpool.Pool, schema string) (*snapshot, error) {
	s := &snapshot{rows: map[string]string{}, seqs: map[string]seqAt{}}
	rows, err := adm.Query(ctx, `SELECT relname::text, relkind::text FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'S') ORDER BY 1`, schema)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	type rel struct{ Name, Kind string }
	rels, err := pgx.CollectRows(rows, pgx.RowToStructByPos[rel])
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	for _, r := range rels {
		q := pgx.Identifier{schema, r.Name}.Sanitize()
		if r.Kind == "S" {
			var at seqAt
			if err := adm.QueryRow(ctx, `SELECT last_value, is_called FROM `+q).Scan(&at.last, &at.called); err != nil {
				return nil, fmt.Errorf("snapshot %s: %w", r.Name, err)
			}
			s.seqs[r.Name] = at
			continue
		}
		s.tables = append(s.tables, r.Name)
		var js *string
		if err := adm.QueryRow(ctx, `SELECT json_agg(t)::text FROM `+q+` AS t`).Scan(&js); err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", r.Name, err)
		}
		if js != nil {
			s.rows[r.Name] = *js
		}
	}
	if err := adm.QueryRow(ctx, objectsQuery, schema).Scan(&s.objects); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return s, nil
}

// restore puts schema, on the database adm is on, back to s in one
// transaction: false when it holds something restore does not undo. It
// deletes rather than truncates (a TRUNCATE's new files cost more than
// the few rows a test leaves), the groups first (their delete trigger
// keeps states, deleted after), and commits without waiting for the WAL
// flush: a reset lost to a crash of the server loses nothing a test needs.
func (s *snapshot) restore(ctx context.Context, adm *pgxpool.Pool, schema string) (ok bool, err error) {
	tx, err := adm.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("reset: %w", err)
	}
	defer func() {
		if !ok || err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	rows, err := tx.Query(ctx, `SELECT relname::text FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind = 'r' AND NOT relname = ANY ($2) ORDER BY 1`, schema, s.tables)
	if err != nil {
		return false, fmt.Errorf("reset: %w", err)
	}
	made, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return false, fmt.Errorf("reset: %w", err)
	}
	b := &pgx.Batch{}
	b.Queue(`SET LOCAL synchronous_commit = off`)
	for _, t := range made {
		b.Queue(`DROP TABLE ` + pgx.Identifier{schema, t}.Sanitize() + ` CASCADE`)
	}
	tables := slices.Clone(s.tables)
	slices.SortStableFunc(tables, func(a, b string) int {
		return cmp.Compare(btoi(b == "transport_groups"), btoi(a == "transport_groups"))
	})
	for _, t := range tables {
		b.Queue(`DELETE FROM ` + pgx.Identifier{schema, t}.Sanitize())
	}
	for _, t := range s.tables {
		if js, ok := s.rows[t]; ok {
			q := pgx.Identifier{schema, t}.Sanitize()
			b.Queue(`INSERT INTO `+q+` SELECT * FROM json_populate_recordset(NULL::`+q+`, $1::json)`, js)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.seqs)) {
		at := s.seqs[name]
		b.Queue(`SELECT setval($1::regclass, $2, $3)`, pgx.Identifier{schema, name}.Sanitize(), at.last, at.called)
	}
	var objects string
	b.Queue(objectsQuery, schema).QueryRow(func(row pgx.Row) error { return row.Scan(&objects) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return false, fmt.Errorf("reset: %w", err)
	}
	if objects != s.objects {
		return false, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("reset: %w", err)
	}
	return true, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
