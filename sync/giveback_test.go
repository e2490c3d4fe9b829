package sync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestGiveBackDoesNotCount: a lease a ClaimWait claims at the instant its
// Transport closes is given back unused: its group is free at once, and
// that hand-out is not counted, so the next claim is the message's first
// attempt (a nack would have made it the second).
func TestGiveBackDoesNotCount(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	cfg := pgtransport.Config{Schema: db.Schema}
	tr, err := pgsync.New(ctx(t), db.Pool, cfg)
	is.NoErr(err)
	_, err = tr.Publish(ctx(t), "g", "m", 0)
	is.NoErr(err)

	lock, err := db.Pool.Begin(ctx(t))
	is.NoErr(err)
	defer func() { _ = lock.Rollback(context.Background()) }()
	_, err = lock.Exec(ctx(t), `LOCK TABLE transport_groups IN EXCLUSIVE MODE`)
	is.NoErr(err) // the claim waits for it, so Close lands while it runs
	type result struct {
		l   *pgtransport.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := tr.ClaimWait(ctx(t), "w", time.Minute, 0)
		done <- result{l, err}
	}()
	waitLocked(t, db, "harel_claim_one(")
	tr.Close()
	is.NoErr(lock.Commit(ctx(t))) // the claim goes on, and claims g
	select {
	case res := <-done:
		is.Equal(res.l, nil)
		is.True(errors.Is(res.err, pgtransport.ErrClosed))
	case <-time.After(30 * time.Second):
		t.Fatal("ClaimWait never returned")
	}
	var held int
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups WHERE locked_by IS NOT NULL`).Scan(&held))
	is.Equal(held, 0) // given back, not left to lapse

	other, err := pgsync.New(ctx(t), db.Pool, cfg)
	is.NoErr(err)
	l, err := other.Claim(ctx(t), "w2", time.Minute, 0)
	is.NoErr(err)
	is.True(l != nil)
	is.Equal(l.Attempt, 1) // the give-back did not count
	is.NoErr(other.Ack(ctx(t), l))
}

// waitLocked waits until a statement of db's schema calling fn waits for a
// lock, and fails the test after 30 s.
func waitLocked(t *testing.T, db *pgtest.DB, fn string) {
	t.Helper()
	watch := db.Conn(t)
	call := pgx.Identifier{db.Schema}.Sanitize() + "." + fn
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var waiting bool
		err := watch.QueryRow(ctx(t), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0)`, call).Scan(&waiting)
		if err != nil {
			t.Fatalf("pg_stat_activity: %v", err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s waited for a lock within 30s", call)
		}
	}
}
