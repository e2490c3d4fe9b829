package contract

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// lifecycleCases: what Close ends, and what every call says after it.
// RunClosed adds the ways a transport on one database is made and closed.
var lifecycleCases = []testCase{
	{"EveryCallAfterCloseIsErrClosed", everyCallAfterCloseIsErrClosed},
	{"CloseEndsAClaimWaitWithErrClosed", closeEndsAClaimWaitWithErrClosed},
}

// everyCallAfterCloseIsErrClosed: after Close, every call returns
// ErrClosed and writes nothing (afterClose); h's transaction is on h's
// home partition.
func everyCallAfterCloseIsErrClosed(is *is.I, e *env) {
	afterClose(e.t, e.tr, e.poolAt("h").Begin, e.count)
}

// closeEndsAClaimWaitWithErrClosed: a ClaimWait parked when Close is
// called (on every partition) returns ErrClosed at once, not ctx's error.
func closeEndsAClaimWaitWithErrClosed(is *is.I, e *env) {
	ctx, cancel := context.WithTimeout(e.ctx(), 30*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := e.tr.ClaimWait(ctx, "w", time.Minute, 0)
		got <- err
	}()
	e.waitParked()
	e.tr.Close()
	select {
	case err := <-got:
		is.True(errors.Is(err, pgtransport.ErrClosed)) // not ctx's error: Close ended it
	case <-time.After(20 * time.Second):
		e.t.Fatal("Close has not ended the ClaimWait 20 s on")
	}
}

// RunClosed checks that every method returns ErrClosed after Close, both
// for a transport made with New on the caller's pool (the pool stays
// open) and for one made with FromDSN (it owns its pool and closes it),
// and that a transport whose pool its owner closed answers ErrClosed too.
func RunClosed(t *testing.T, open func(t *testing.T, db *pgxpool.Pool, cfg pgtransport.Config) Transport, fromDSN func(t *testing.T, dsn string, cfg pgtransport.Config) Transport) {
	t.Run("New", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, 8)
		tr := open(t, db.Pool, pgtransport.Config{Schema: db.Schema})
		afterClose(t, tr, db.Pool.Begin, poolCount(t, db.Pool))
		is := is.New(t)
		is.NoErr(db.Pool.Ping(pgtest.Context(t))) // the caller's pool is still open
	})
	t.Run("FromDSN", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, 8)
		afterClose(t, fromDSN(t, pgtest.DSN(t), pgtransport.Config{Schema: db.Schema}), db.Pool.Begin, poolCount(t, db.Pool))
	})
	t.Run("PoolClosedByItsOwner", func(t *testing.T) {
		t.Parallel()
		is := is.New(t)
		db := pgtest.New(t, 8)
		pool, err := pgxpool.New(pgtest.Context(t), pgtest.DSN(t))
		is.NoErr(err) // a pool of the caller's
		tr := open(t, pool, pgtransport.Config{Schema: db.Schema})
		t.Cleanup(tr.Close)
		pool.Close()
		_, err = tr.Publish(pgtest.Context(t), "g", "e", 0)
		is.True(errors.Is(err, pgtransport.ErrClosed)) // not pgxpool's "closed pool" alone
		_, err = tr.Claim(pgtest.Context(t), "w", time.Minute, 0)
		is.True(errors.Is(err, pgtransport.ErrClosed))
	})
}

// poolCount is a count(*) query's result on pool (0 after an error, which
// fails t).
func poolCount(t *testing.T, pool *pgxpool.Pool) func(query string, args ...any) int {
	return func(query string, args ...any) int {
		var n int
		if err := pool.QueryRow(pgtest.Context(t), query, args...).Scan(&n); err != nil {
			t.Errorf("%s: %v", query, err)
		}
		return n
	}
}

// afterClose closes tr, which holds a lease of one of two messages of
// group g, and calls every method: each returns ErrClosed and writes
// nothing. begin begins a transaction where group h lives; count reads the
// queue's tables.
func afterClose(t *testing.T, tr Transport, begin func(context.Context) (pgx.Tx, error), count func(query string, args ...any) int) {
	is := is.New(t)
	ctx := pgtest.Context(t)
	_, err := tr.Publish(ctx, "g", "g1", 0)
	is.NoErr(err)
	_, err = tr.Publish(ctx, "g", "g2", 0)
	is.NoErr(err)
	lease, err := tr.Claim(ctx, "w", time.Minute, 0)
	is.NoErr(err)
	is.True(lease != nil)
	tr.Close()
	// A short deadline: a call that does not know it is closed (ClaimWait
	// would wait for work) fails the test by its error, not by hanging.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tx, err := begin(ctx)
	is.NoErr(err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	calls := map[string]func() error{
		"Publish": func() error { _, err := tr.Publish(ctx, "h", "x", 0); return err },
		"PublishMany": func() error {
			_, err := tr.PublishMany(ctx, []pgtransport.Message{{Group: "h", Event: "x"}})
			return err
		},
		"PublishTx": func() error { _, err := tr.PublishTx(ctx, tx, "h", "x", 0); return err },
		"Claim":     func() error { _, err := tr.Claim(ctx, "w", time.Minute, 0); return err },
		"ClaimMany": func() error { _, err := tr.ClaimMany(ctx, "w", time.Minute, 0, 10); return err },
		"ClaimWait": func() error { _, err := tr.ClaimWait(ctx, "w", time.Minute, 0); return err },
		"Ack":       func() error { return tr.Ack(ctx, lease) },
		"AckMany": func() error {
			_, err := tr.AckMany(ctx, []*pgtransport.Lease{lease})
			return err
		},
		"AckNext": func() error { _, err := tr.AckNext(ctx, lease, time.Minute); return err },
		"Nack":    func() error { return tr.Nack(ctx, lease, 0) },
		"Extend":  func() error { return tr.Extend(ctx, lease, time.Minute) },
		"Fail":    func() error { return tr.Fail(ctx, lease, errors.New("x")) },
		"PublishMessage": func() error {
			_, err := tr.PublishMessage(ctx, pgtransport.Message{Group: "h", Event: "x", DedupKey: "k"})
			return err
		},
		"PublishMessageTx": func() error {
			_, err := tr.PublishMessageTx(ctx, tx, pgtransport.Message{Group: "h", Event: "x", DedupKey: "k"})
			return err
		},
		"DeadLetters": func() error { _, err := tr.DeadLetters(ctx, pgtransport.DeadLetterQuery{}); return err },
		"Redrive":     func() error { _, err := tr.Redrive(ctx, pgtransport.DeadLetterFilter{}); return err },
		"PurgeDeadLetters": func() error {
			_, err := tr.PurgeDeadLetters(ctx, pgtransport.DeadLetterFilter{})
			return err
		},
		"RestartGroup": func() error { return tr.RestartGroup(ctx, "g", false) },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, pgtransport.ErrClosed) {
			t.Errorf("%s after Close: got %v, want ErrClosed", name, err)
		}
	}
	is.NoErr(tx.Commit(ctx))                                                                      // the PublishTx wrote nothing into it
	is.Equal(count(`SELECT count(*) FROM transport_messages`), 2)                                 // nothing published, acked or
	is.Equal(count(`SELECT count(*) FROM transport_groups WHERE locked_by = $1`, lease.Token), 1) // given back
	tr.Close()                                                                                    // twice is fine
}
