package async_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
)

// closed runs tr.Close on a goroutine of the test's and returns a channel
// closed once Close has returned.
func closed(tr *async.Transport) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.Close()
	}()
	return done
}

// TestCloseEndsClaimWait: Close returns promptly while a ClaimWait with no
// deadline waits for work that never comes (IdleSweep is an hour), and the
// wait ends with ErrClosed.
func TestCloseEndsClaimWait(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{IdleSweep: time.Hour})
	waits := []<-chan async.Result[*pgtransport.Lease]{
		tr.ClaimWait(context.Background(), "w", time.Minute, 0),
		tr.ClaimWait(context.Background(), "w", time.Minute, 0),
	}
	db.WaitParked(t) // at least one waits for work when Close comes
	select {
	case <-closed(tr):
	case <-time.After(10 * time.Second):
		t.Fatal("Close still blocked after 10s with ClaimWait in flight")
	}
	for _, w := range waits { // each delivered before Close returned
		r := <-w
		is.True(r.Value == nil)                          // no lease
		is.True(errors.Is(r.Err, pgtransport.ErrClosed)) // the wait ended with ErrClosed
	}
}

// TestCloseGivesBackClaimWaitLease: a lease that a ClaimWait claims while
// the Transport closes is given back at once (claimable by another worker
// without waiting out its visibility) and the call delivers ErrClosed. The
// claim is held mid round-trip by a lock on the groups table until Close
// has begun.
func TestCloseGivesBackClaimWaitLease(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, st, db := setup(t, pgtransport.Config{IdleSweep: time.Hour})
	is.NoErr((<-tr.Publish(ctx(t), "g", "e", 0)).Err)

	lock, err := db.Pool.Begin(ctx(t))
	is.NoErr(err) // begin the locking transaction
	defer func() { _ = lock.Rollback(context.Background()) }()
	_, err = lock.Exec(ctx(t), `LOCK TABLE transport_groups IN ACCESS EXCLUSIVE MODE`)
	is.NoErr(err) // lock the groups table

	w := tr.ClaimWait(context.Background(), "w", time.Hour, 0)
	eventually(t, time.Minute, "the claim blocks on the lock", func() bool {
		return count(t, db, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'transport_groups'::regclass`) > 0
	})
	done := closed(tr)
	eventually(t, time.Minute, "Close has begun", func() bool {
		// A bad worker ID fails before any round-trip, with ErrClosed once closing.
		return errors.Is((<-tr.Claim(ctx(t), "", time.Minute, 0)).Err, pgtransport.ErrClosed)
	})
	is.NoErr(lock.Rollback(ctx(t))) // the claim goes ahead and leases g

	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still blocked after 10s")
	}
	r := <-w
	is.True(r.Value == nil)                          // the lease went to nobody...
	is.True(errors.Is(r.Err, pgtransport.ErrClosed)) // ...and the call says why
	l, err := st.Claim(ctx(t), "other", time.Minute, 0)
	is.NoErr(err)
	is.True(l != nil) // given back: claimable now, not after an hour's visibility
	is.Equal(l.Event, "e")
}
