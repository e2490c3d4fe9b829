package notify_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/notify"
)

// TestShared: callers on one pool share one Listener, which the last
// release closes; another pool gets its own; release twice is harmless.
func TestShared(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db, other := pgtest.New(t, 4), pgtest.New(t, 4)
	l1, release1 := notify.Shared(db.Pool, notify.Config{})
	l2, release2 := notify.Shared(db.Pool, notify.Config{})
	l3, release3 := notify.Shared(other.Pool, notify.Config{})
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
	l4, release4 := notify.Shared(db.Pool, notify.Config{})
	defer release4()
	is.True(l4 != l1) // a new one after the last release
	_, err = l4.Subscribe("shared")
	is.NoErr(err)
}

// TestSharedProbe: a shared Listener probes through the Probe of its
// longest-standing user, and through the next one's once that one has
// released it (whose pool may be closed by then).
func TestSharedProbe(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	send := notify.ProbeThrough(db.Pool)
	probe := func(c chan<- struct{}) func(context.Context, string) error {
		return func(ctx context.Context, channel string) error {
			select {
			case c <- struct{}{}:
			default:
			}
			return send(ctx, channel)
		}
	}
	first, second := make(chan struct{}, 1), make(chan struct{}, 1)
	const interval = 20 * time.Millisecond
	l, release1 := notify.Shared(db.Pool, notify.Config{Probe: probe(first), PingInterval: interval})
	defer release1()
	_, release2 := notify.Shared(db.Pool, notify.Config{Probe: probe(second)})
	defer release2()
	s, err := l.Subscribe("shared_probe")
	is.NoErr(err)
	wait(t, s.Ready(), "ready")
	wait(t, first, "a probe through the first user's Probe")
	release1()
	// A probe picked before the release may still be under way: drain it,
	// then only the second user's Probe is used.
	select {
	case <-first:
	case <-time.After(10 * interval):
	}
	wait(t, second, "a probe through the second user's Probe")
	select {
	case <-first:
		t.Fatal("probed through a user that released the Listener")
	case <-time.After(10 * interval):
	}
}
