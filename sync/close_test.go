package sync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestCloseEndsClaimWait: closing a FromDSN Transport ends a ClaimWait
// that waits for work (IdleSweep is an hour) at once, with ErrClosed.
func TestCloseEndsClaimWait(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	tr, err := pgsync.FromDSN(ctx(t), pgtest.DSN(t), pgtransport.Config{Schema: db.Schema, IdleSweep: time.Hour})
	is.NoErr(err)
	errs := make(chan error, 1)
	go func() {
		_, err := tr.ClaimWait(context.Background(), "w", time.Minute, 0)
		errs <- err
	}()
	db.WaitParked(t) // the call waits for work when Close comes
	tr.Close()
	select {
	case err := <-errs:
		is.True(errors.Is(err, pgtransport.ErrClosed)) // the wait ended with ErrClosed
	case <-time.After(10 * time.Second):
		t.Fatal("ClaimWait still waiting 10s after Close")
	}
}
