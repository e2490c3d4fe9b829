package notify_test

import (
	"errors"
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/pgtest"
	"github.com/pgtransport/pgtransport/notify"
)

// TestShared: callers on one pool share one Listener, which the last
// release closes; another pool gets its own; release twice is harmless.
func TestShared(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db, other := pgtest.New(t, 4), pgtest.New(t, 4)
	l1, release1 := notify.Shared(db.Pool, nil)
	l2, release2 := notify.Shared(db.Pool, nil)
	l3, release3 := notify.Shared(other.Pool, nil)
	defer release3()
	is.True(l1 == l2) // one Listener per pool
	is.True(l1 != l3) // another pool, another Listener
	sub, err := l2.Subscribe("shared")
	is.NoErr(err)
	wait(t, sub.Ready(), "ready")
	release1()
	release1() // a second release does nothing
	_, err = l2.Subscribe("shared")
	is.NoErr(err) // still open: l2's user has not released
	release2()
	_, err = l2.Subscribe("shared")
	is.True(errors.Is(err, notify.ErrClosed)) // the last release closed it
	l4, release4 := notify.Shared(db.Pool, nil)
	defer release4()
	is.True(l4 != l1) // a new one after the last release
	_, err = l4.Subscribe("shared")
	is.NoErr(err)
}
