package main

import (
	"context"
	"errors"
	"fmt"
	stdsync "sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// A drainer empties a preloaded backlog with some number of workers. It
// stops when stop is closed or when every message is acked, and reports
// every ack to the checker.
type drainer interface {
	drain(ctx context.Context, workers int, stop <-chan struct{}, c *checker) error
	close()
}

// checker verifies, as claims happen, that each group's messages are handed
// out in seq order (a redelivery repeats the head; nothing goes back), and
// counts acks. The order is checked at claim time: the claim of a group's
// next message happens after the ack of the one before, while two workers'
// calls to ack may return in either order.
type checker struct {
	mu     stdsync.Mutex
	last   map[string]int64
	acked  atomic.Int64
	target int64 // done when acked reaches it
	done   chan struct{}
	once   stdsync.Once
	err    error
}

func newChecker(target int64) *checker {
	return &checker{last: map[string]int64{}, target: target, done: make(chan struct{})}
}

// claimed records that message seq of group was handed out.
func (c *checker) claimed(group string, seq int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq < c.last[group] && c.err == nil {
		c.err = fmt.Errorf("group %s: seq %d handed out after %d", group, seq, c.last[group])
	}
	c.last[group] = seq
}

// skipped fails if a message still queued in db comes before one of its
// group that was handed out: a head skipped, which the claim-time check
// cannot see when the run ends before the skipped one comes.
func (c *checker) skipped(ctx context.Context, db *pgxpool.Pool) error {
	rows, err := db.Query(ctx, `SELECT group_id, min(seq) FROM transport_messages GROUP BY group_id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for rows.Next() {
		var group string
		var head int64
		if err := rows.Scan(&group, &head); err != nil {
			return err
		}
		if last, ok := c.last[group]; ok && head < last {
			return fmt.Errorf("group %s: message %d still queued, and %d after it was handed out", group, head, last)
		}
	}
	return rows.Err()
}

// ack counts an ack.
func (c *checker) ack() {
	if c.acked.Add(1) >= c.target {
		c.once.Do(func() { close(c.done) })
	}
}

// verify fails on an order violation, or unless acked plus still queued
// is published: a message lost, or acked twice.
func (c *checker) verify(ctx context.Context, db *pgtest.DB, published int64) error {
	return c.verifyParts(ctx, []*pgxpool.Pool{db.Pool}, int(published))
}

// finished reports whether stop is closed or everything is acked.
func finished(stop <-chan struct{}, c *checker) bool {
	select {
	case <-stop:
		return true
	case <-c.done:
		return true
	default:
		return false
	}
}

// syncDrainer: W goroutines, each a blocking loop of one ClaimWait and one
// Ack per message (keep: AckNext, which keeps a hot group).
type syncDrainer struct {
	tr   *pgsync.Transport
	keep bool
}

func (d syncDrainer) close() {}

func (d syncDrainer) drain(ctx context.Context, workers int, stop <-chan struct{}, c *checker) error {
	// Only the wait is cut off at the end; acks always finish, so that
	// every ack's outcome is known.
	waitCtx, cancel := stopCtx(ctx, stop, c)
	defer cancel()
	return parallel(workers, func(w int) error {
		id := fmt.Sprint("w", w)
		var l *pgtransport.Lease
		for !finished(stop, c) {
			if l == nil {
				var err error
				if l, err = d.tr.ClaimWait(waitCtx, id, time.Minute, 0); err != nil {
					return quiet(waitCtx, err)
				}
			}
			c.claimed(l.Group, l.Seq)
			if !d.keep {
				if err := d.tr.Ack(ctx, l); err != nil {
					return err
				}
				l = nil
			} else {
				next, err := d.tr.AckNext(ctx, l, time.Minute)
				if err != nil {
					return err
				}
				l = next
			}
			c.ack()
		}
		if l != nil { // kept past the end: give it back
			_ = d.tr.Nack(ctx, l, 0)
		}
		return nil
	})
}

// stopCtx is ctx, cancelled when stop closes or everything is acked, so a
// worker parked in ClaimWait returns.
func stopCtx(ctx context.Context, stop <-chan struct{}, c *checker) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-stop:
		case <-c.done:
		case <-ctx.Done():
		}
		cancel()
	}()
	return ctx, cancel
}

// quiet drops the error of a call cut off by the end of the run.
func quiet(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil
	}
	return err
}

// asyncDrainer: one stream holding up to W leases, drained by W goroutines
// that ack what they receive (River's shape: W workers, at most W jobs
// fetched at once). Its acks are settled in batches, with the next claims.
// It drains an async.Transport, or an async.Transport (whose stream is one
// per partition, merged).
type asyncDrainer struct {
	stream func(ctx context.Context, cfg async.StreamConfig) (leaseStream, error)
	ack    func(ctx context.Context, l *pgtransport.Lease) <-chan error
	shut   func()
}

// leaseStream is what asyncDrainer takes from a stream.
type leaseStream interface {
	C() <-chan *pgtransport.Lease
	Err() error
	Close()
}

func transportDrainer(tr *async.Transport) asyncDrainer {
	return asyncDrainer{
		stream: func(ctx context.Context, cfg async.StreamConfig) (leaseStream, error) { return tr.Stream(ctx, cfg) },
		ack:    tr.Ack, shut: tr.Close,
	}
}

func clusterDrainer(c *async.Transport) asyncDrainer {
	return asyncDrainer{
		stream: func(ctx context.Context, cfg async.StreamConfig) (leaseStream, error) { return c.Stream(ctx, cfg) },
		ack:    c.Ack, shut: c.Close,
	}
}

func (d asyncDrainer) close() { d.shut() }

func (d asyncDrainer) drain(ctx context.Context, workers int, stop <-chan struct{}, c *checker) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := d.stream(ctx, async.StreamConfig{WorkerID: "w", Visibility: time.Minute, MaxInFlight: workers})
	if err != nil {
		return err
	}
	defer s.Close()
	return parallel(workers, func(w int) error {
		for {
			select {
			case <-stop:
				return nil
			case <-c.done:
				return nil
			case l, ok := <-s.C():
				if !ok {
					return s.Err()
				}
				c.claimed(l.Group, l.Seq)
				if err := <-d.ack(ctx, l); err != nil {
					return err
				}
				c.ack()
			}
		}
	})
}

// baselineDrainer is the design this project replaced: the same tables and
// functions, but every claim serialized behind one global advisory lock.
type baselineDrainer struct{ pool *pgxpool.Pool }

// baselineSQL is bench-only: it wraps harel_claim in the global lock.
const baselineSQL = `
CREATE OR REPLACE FUNCTION bench_serialized_claim(p_now float8, p_lease float8, p_token text)
RETURNS TABLE (group_id text, seq bigint, event text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(424242);
    RETURN QUERY SELECT * FROM harel_claim(p_now, p_lease, p_token, 0);
END $$`

func (d baselineDrainer) close() {}

func (d baselineDrainer) drain(ctx context.Context, workers int, stop <-chan struct{}, c *checker) error {
	return parallel(workers, func(w int) error {
		for i := 0; !finished(stop, c); i++ {
			token := fmt.Sprintf("w%d:%d", w, i)
			var (
				group string
				seq   int64
				event string
			)
			err := d.pool.QueryRow(ctx, `SELECT group_id, seq, event FROM bench_serialized_claim(
				extract(epoch FROM clock_timestamp()), extract(epoch FROM clock_timestamp()) + 60, $1)`, token).Scan(&group, &seq, &event)
			if err != nil {
				if isNoRows(err) {
					continue
				}
				return err
			}
			c.claimed(group, seq)
			var held bool
			if err := d.pool.QueryRow(ctx, `SELECT harel_ack($1, $2, $3, extract(epoch FROM clock_timestamp()))`, group, seq, token).Scan(&held); err != nil {
				return err
			}
			if !held {
				return fmt.Errorf("baseline: lease on %s lost", group)
			}
			c.ack()
		}
		return nil
	})
}

// parallel runs f for workers 0..n-1 and returns the first error.
func parallel(n int, f func(w int) error) error {
	var (
		wg    stdsync.WaitGroup
		mu    stdsync.Mutex
		first error
	)
	for w := range n {
		wg.Go(func() {
			if err := f(w); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// openDrainer opens system on a fresh schema sized for workers.
func openDrainer(ctx context.Context, system string, workers int) (drainer, *pgtest.DB, error) {
	db, err := pgtest.Open(int32(workers) + 4)
	if err != nil {
		return nil, nil, err
	}
	cfg := pgtransport.Config{Schema: db.Schema}
	var d drainer
	switch system {
	case "sync", "sync-keep":
		tr, err := pgsync.New(ctx, db.Pool, cfg)
		if err != nil {
			return nil, db, err
		}
		d = syncDrainer{tr: tr, keep: system == "sync-keep"}
	case "async":
		tr, err := async.New(ctx, db.Pool, cfg)
		if err != nil {
			return nil, db, err
		}
		d = transportDrainer(tr)
	case "baseline":
		if _, err := pgsync.New(ctx, db.Pool, cfg); err != nil { // applies the schema
			return nil, db, err
		}
		if _, err := db.Pool.Exec(ctx, baselineSQL); err != nil {
			return nil, db, err
		}
		d = baselineDrainer{db.Pool}
	default:
		if d, err = openWork(ctx, system, db); err != nil {
			return nil, db, err
		}
	}
	return d, db, nil
}

// preload publishes n messages over groups in one statement, round-robin,
// so every group has about n/groups in seq order.
func preload(ctx context.Context, db *pgtest.DB, n, groups int) error {
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO transport_messages (group_id, event)
		SELECT 'g' || (i % $1), i::text FROM generate_series(0, $2 - 1) AS i ORDER BY i`, groups, n)
	if err != nil {
		return err
	}
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO transport_groups (group_id) SELECT DISTINCT group_id FROM transport_messages
		ON CONFLICT DO NOTHING;
		ANALYZE transport_groups; ANALYZE transport_messages`)
	return err
}

// leftover counts messages and group rows still in the tables, not the
// kept rows of drained groups (drained_at set, schema version 17; read
// through to_jsonb so that the query also runs against older versions).
func leftover(ctx context.Context, db *pgtest.DB) (messages, groups int, err error) {
	err = db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM transport_messages), (SELECT count(*) FROM transport_groups AS g WHERE to_jsonb(g) ->> 'drained_at' IS NULL)`).Scan(&messages, &groups)
	return
}

// emptyQueue empties the queue's tables in db before a run. A claim the
// last run's end cancelled may still be running in its backend for a
// moment (the cancel reaches the server after the client has moved on),
// and a TRUNCATE's lock waits against it can be a deadlock the server
// resolves by failing one of them: the TRUNCATE is tried again then.
func emptyQueue(ctx context.Context, db *pgxpool.Pool) error {
	var err error
	for try := 0; try < 5; try++ {
		if _, err = db.Exec(ctx, `TRUNCATE transport_messages, transport_groups`); !isDeadlock(err) {
			return err
		}
		time.Sleep(50 * time.Millisecond) // kept: the cancelled claims end meanwhile
	}
	return err
}

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}
