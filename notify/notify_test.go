package notify_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/notify"
)

func TestMain(m *testing.M) {
	pgtest.MainNoLeaks(m, "github.com/pgtransport/pgtransport/notify", "github.com/jackc/pgxlisten")
}

func ctx(tb testing.TB) context.Context { return pgtest.Context(tb) }

// wait receives from c or fails the test after a minute.
func wait(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(time.Minute):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func newListener(t *testing.T, db *pgtest.DB) *notify.Listener {
	t.Helper()
	l, err := notify.New(notify.Config{Connect: notify.FromPool(db.Pool)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func TestFanOut(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	l := newListener(t, db)
	var subs []*notify.Subscription
	for range 3 {
		s, err := l.Subscribe("fan")
		is.NoErr(err)
		subs = append(subs, s)
	}
	wait(t, subs[0].Ready(), "ready")
	for _, s := range subs {
		wait(t, s.C(), "the wake-up every subscriber gets on connect")
	}
	_, err := db.Pool.Exec(ctx(t), `SELECT pg_notify('fan', 'x')`)
	is.NoErr(err)
	for _, s := range subs {
		wait(t, s.C(), "the notification, at every subscriber")
	}

	subs[0].Close()
	subs[0].Close() // twice is fine
	_, err = db.Pool.Exec(ctx(t), `SELECT pg_notify('fan', 'y')`)
	is.NoErr(err)
	wait(t, subs[1].C(), "the second notification")
	select {
	case <-subs[0].C():
		t.Fatal("a closed subscription was woken")
	case <-time.After(100 * time.Millisecond): // subs[1] got it, so it was sent
	}
}

func TestOtherChannelsStaySilent(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	l := newListener(t, db)
	a, err := l.Subscribe("chan_a")
	is.NoErr(err)
	wait(t, a.Ready(), "a ready")
	wait(t, a.C(), "a's connect wake-up")
	b, err := l.Subscribe("chan_b") // a new channel: the listener listens again
	is.NoErr(err)
	wait(t, b.Ready(), "b ready")
	wait(t, b.C(), "b's connect wake-up")
	wait(t, a.Ready(), "a ready again")
	select { // a was woken by the re-listen; drain it
	case <-a.C():
	default:
	}
	_, err = db.Pool.Exec(ctx(t), `SELECT pg_notify('chan_a', '')`)
	is.NoErr(err)
	wait(t, a.C(), "a's notification")
	select {
	case <-b.C():
		t.Fatal("b was woken by a notification on chan_a")
	case <-time.After(100 * time.Millisecond):
	}
}

// TestReconnect kills the listening backend: the listener must notice,
// reconnect within seconds, be ready again, and wake its subscribers to
// sweep, since a notification sent meanwhile is lost.
func TestReconnect(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	var errs []error
	l, err := notify.New(notify.Config{
		Connect: notify.FromPool(db.Pool),
		OnError: func(err error) { errs = append(errs, err) }, // read only after Close
	})
	is.NoErr(err)
	s, err := l.Subscribe("re")
	is.NoErr(err)
	wait(t, s.Ready(), "ready")
	wait(t, s.C(), "connect wake-up")
	for round := range 3 {
		pid := l.BackendPID()
		is.True(pid != 0)
		var killed bool
		is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT pg_terminate_backend($1)`, pid).Scan(&killed))
		is.True(killed)
		wait(t, s.C(), "the sweep wake-up after the reconnect")
		wait(t, s.Ready(), "ready again")
		is.True(l.BackendPID() != pid) // a new connection
		_, err = db.Pool.Exec(ctx(t), `SELECT pg_notify('re', '')`)
		is.NoErr(err)
		wait(t, s.C(), "a notification on the new connection")
		t.Logf("round %d: reconnected", round)
	}
	l.Close()
	l.Close()               // twice is fine
	is.True(len(errs) >= 3) // each kill was reported
	_, err = l.Subscribe("re")
	is.True(errors.Is(err, notify.ErrClosed))
}

func TestBadConfig(t *testing.T) {
	is := is.New(t)
	_, err := notify.New(notify.Config{})
	is.True(err != nil) // Connect is required
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
	db := pgtest.New(t, 2)
	l := newListener(t, db)
	_, err = l.Subscribe("")
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // a channel needs a name
}
