package schema_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestReadyLogFrontier is "The frontier" in functions/25_ready.sql: the
// claims read the ready log from a frontier that never passes an entry
// whose writer has not ended (a publish still open when later ones commit
// is handed out once it commits), that moves past what the claims took
// while a read-only snapshot is held, and that a transaction holding an id
// stops until it ends.
func TestReadyLogFrontier(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 3))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	front := func() int64 {
		t.Helper()
		var f int64
		is.NoErr(c.QueryRow(ctx(t), `SELECT last_value FROM transport_ready_front`).Scan(&f))
		return f
	}
	last := func() int64 {
		t.Helper()
		var r int64
		is.NoErr(c.QueryRow(ctx(t), `SELECT last_value FROM transport_ready_vnow`).Scan(&r))
		return r
	}
	now := 1000.0
	claimAck := func() string {
		t.Helper()
		now++
		var g string
		var seq int64
		err := c.QueryRow(ctx(t), `SELECT group_id, seq FROM harel_claim($1::float8, $1::float8 + 60, 'w')`, now).Scan(&g, &seq)
		if err == pgx.ErrNoRows {
			return ""
		}
		is.NoErr(err)
		var ok bool
		is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w', $3)`, g, seq, now).Scan(&ok))
		is.True(ok)
		return g
	}
	// A claim records a check; a later one passes it once every
	// transaction with an older id, in any database of the cluster (other
	// tests run beside this one), has ended: claims with nothing to take
	// then move the frontier past everything before them.
	claimNothing := func(n int) {
		t.Helper()
		for range n {
			is.Equal(claimAck(), "")
		}
	}
	settle := func() {
		t.Helper()
		for start := time.Now(); front() <= last() && time.Since(start) < 10*time.Second; time.Sleep(5 * time.Millisecond) {
			claimNothing(1)
		}
	}
	publishAndTake := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			g := fmt.Sprintf("%s%d", prefix, i)
			_, err := c.Exec(ctx(t), `SELECT harel_publish($1, 'e', 0)`, g)
			is.NoErr(err)
			is.Equal(claimAck(), g) // in order, and the open publish's is not visible
		}
	}

	// A publish left open: its entry is drawn and not committed.
	slow, err := db.Conn(t).Begin(ctx(t))
	is.NoErr(err)
	_, err = slow.Exec(ctx(t), `SELECT harel_publish('slow', 'e', 0)`)
	is.NoErr(err)
	var slowEntry int64
	is.NoErr(slow.QueryRow(ctx(t), `SELECT vt FROM transport_ready WHERE group_id = 'slow'`).Scan(&slowEntry))
	publishAndTake("fast", 20)
	claimNothing(20)
	is.True(front() <= slowEntry) // never past the open publish's entry
	is.NoErr(slow.Commit(ctx(t)))
	is.Equal(claimAck(), "slow") // handed out once it committed
	settle()
	is.True(front() > last()) // past everything taken

	// A read-only snapshot held: the frontier moves on.
	ro, err := db.Conn(t).BeginTx(ctx(t), pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	is.NoErr(err)
	_, err = ro.Exec(ctx(t), `SELECT count(*) FROM transport_groups`)
	is.NoErr(err)
	publishAndTake("ro", 10)
	settle()
	is.True(front() > last())
	is.NoErr(ro.Rollback(ctx(t)))

	// A transaction holding an id: the frontier stays where it was until
	// it ends.
	before := last()
	held, err := db.Conn(t).Begin(ctx(t))
	is.NoErr(err)
	_, err = held.Exec(ctx(t), `SELECT pg_current_xact_id()`)
	is.NoErr(err)
	publishAndTake("id", 10)
	claimNothing(20)
	is.True(front() <= before+1) // entries taken since are passed by every claim
	is.NoErr(held.Rollback(ctx(t)))
	settle()
	is.True(front() > last())
}

// TestReadyLogLosesNoEntry: publishers whose transactions commit out of
// the order they drew their entries, and claimers that move the frontier
// meanwhile (a claim and its ack in one transaction, as a blocking worker
// does, or each on its own): every group is handed out, and once all is
// quiet no entry is left below the frontier, where no claim would read it
// (the sweep would still find its group; this checks the log alone).
func TestReadyLogLosesNoEntry(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	const publishers, claimers, perPublisher = 6, 3, 60
	db := noClockBound(t, pgtest.New(t, publishers+claimers+2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	ctx, cancel := context.WithTimeout(ctx(t), 2*time.Minute)
	defer cancel()

	var published, handed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, publishers+claimers)
	for p := range publishers {
		wg.Go(func() {
			for i := range perPublisher {
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `SELECT harel_publish($1, 'e', 0)`, fmt.Sprintf("p%d-%d", p, i)); err != nil {
						return err
					}
					time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) // commit late, out of order
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
				published.Add(1)
			}
		})
	}
	var cw sync.WaitGroup
	for w := range claimers {
		cw.Go(func() {
			token := fmt.Sprint("w", w)
			for ctx.Err() == nil && handed.Load() < publishers*perPublisher {
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					now := float64(time.Now().UnixMicro()) / 1e6
					rows, err := tx.Query(ctx, `SELECT group_id, seq FROM harel_claim_leases($1::float8, $1::float8 + 60, $2, 0, 4)`, now, token)
					if err != nil {
						return err
					}
					type lease struct {
						Group string
						Seq   int64
					}
					got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[lease])
					if err != nil {
						return err
					}
					for _, l := range got {
						var ok bool
						if err := tx.QueryRow(ctx, `SELECT harel_ack($1, $2, $3, $4)`, l.Group, l.Seq, token, now).Scan(&ok); err != nil {
							return err
						}
						if !ok {
							return fmt.Errorf("ack of %s refused", l.Group)
						}
					}
					handed.Add(int64(len(got)))
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	cw.Wait()
	close(errs)
	for err := range errs {
		is.NoErr(err)
	}
	is.Equal(handed.Load(), published.Load()) // every group handed out
	c := db.Conn(t)
	// Quiet: checks recorded and passed, and the entries of groups a
	// sweep leased while a claim held their entries (stale since) passed
	// and deleted, one a claim of one; a few a run.
	var below, left int
	for range 100 {
		now := float64(time.Now().UnixMicro()) / 1e6
		_, err := c.Exec(ctx, `SELECT * FROM harel_claim($1::float8, $1::float8 + 60, 'q')`, now)
		is.NoErr(err)
		is.NoErr(c.QueryRow(ctx, `SELECT count(*) FILTER (WHERE vt < (SELECT last_value FROM transport_ready_front)), count(*) FROM transport_ready`).Scan(&below, &left))
		if left == 0 {
			break
		}
	}
	is.Equal(below, 0) // no entry skipped by the frontier
	is.Equal(left, 0)  // and none left: every one was taken
}

// TestReadyFrontRecordsOnlyWithoutAnID: a call of harel_ready_front whose
// pending check passes moves the frontier with a setval, which takes a
// transaction id; it must not then record the next check with that id,
// older than the entry number it would read after it (version 21: the
// frontier passed a writer's entry so under load). It clears the check,
// and the next call in a transaction without an id records one.
func TestReadyFrontRecordsOnlyWithoutAnID(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	var front, check int64
	state := func() {
		t.Helper()
		is.NoErr(c.QueryRow(ctx(t), `SELECT (SELECT last_value FROM transport_ready_front), (SELECT last_value FROM transport_ready_check_xid)`).Scan(&front, &check))
	}
	_, err := c.Exec(ctx(t), `SELECT harel_ready_front()`) // records a check (R = 0)
	is.NoErr(err)
	for i := range 5 { // entries, taken: the frontier has somewhere to go
		_, err := c.Exec(ctx(t), `SELECT harel_publish($1, 'e', 0)`, fmt.Sprint("g", i))
		is.NoErr(err)
	}
	var taken int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_claim_leases(1000, 1060, 'w', 0, 5)`).Scan(&taken))
	is.Equal(taken, 5)
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(5 * time.Millisecond) {
		state()
		before := front
		tx, err := c.Begin(ctx(t))
		is.NoErr(err)
		_, err = tx.Exec(ctx(t), `SELECT harel_ready_front()`)
		is.NoErr(err)
		var moved bool
		is.NoErr(tx.QueryRow(ctx(t), `SELECT last_value > $1 FROM transport_ready_front`, before).Scan(&moved))
		var recorded int64
		is.NoErr(tx.QueryRow(ctx(t), `SELECT last_value FROM transport_ready_check_xid`).Scan(&recorded))
		is.NoErr(tx.Commit(ctx(t)))
		if moved {
			is.Equal(recorded, int64(0)) // cleared, not recorded with the setval's id
			_, err := c.Exec(ctx(t), `SELECT harel_ready_front()`)
			is.NoErr(err)
			state()
			is.True(check > 0) // the next call, with no id, records
			return
		}
	}
	t.Fatal("the frontier never moved")
}
