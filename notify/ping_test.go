package notify_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/notify"
)

// errorsTo returns an OnError that hands errors to a channel, never
// blocking the Listener (past 100 of them, the rest are dropped).
func errorsTo() (func(error), <-chan error) {
	c := make(chan error, 100)
	return func(err error) {
		select {
		case c <- err:
		default:
		}
	}, c
}

// TestHungConnection freezes the network between the listener and the
// server (no byte passes either way, both sockets stay open, as with a
// SIGSTOPped server or a partition). The probe still reaches the server
// (straight, not through the proxy), so only its notification's way back
// fails. Within PingInterval + PingTimeout the listener must report its
// channel not ready, and stay so while its reconnects hang too (each given
// up after PingTimeout); once the path answers again it must reconnect, be
// ready again, wake its subscribers to sweep, and deliver a notification
// published after that.
func TestHungConnection(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	proxy := pgtest.NewProxy(t)
	pool := proxy.Pool(t, db, 4)
	const interval, timeout = 200 * time.Millisecond, time.Second
	onError, errs := errorsTo()
	logs := &pgtest.Logs{Level: slog.LevelDebug}
	l, err := notify.New(notify.Config{
		Connect:      notify.FromPool(pool),
		OnError:      onError,
		Logger:       logs.Logger(),
		Probe:        notify.ProbeThrough(db.Pool),
		PingInterval: interval,
		PingTimeout:  timeout,
	})
	is.NoErr(err)
	defer l.Close()
	s, err := l.Subscribe("hung")
	is.NoErr(err)
	wait(t, s.Ready(), "ready")
	wait(t, s.C(), "connect wake-up")
	pid := l.BackendPID()
	is.True(pid != 0)

	proxy.Freeze()
	defer proxy.Thaw() // also on failure: the cleanups must not meet a frozen proxy
	frozen := time.Now()
	select {
	case err := <-errs:
		t.Logf("after %v: %v", time.Since(frozen).Round(time.Millisecond), err)
	case <-time.After(time.Minute):
		t.Fatal("the listener did not notice the hung connection")
	}
	took := time.Since(frozen)
	select {
	case <-s.Ready():
		t.Fatal("ready on a connection through which nothing can arrive")
	default:
	}
	is.True(took < interval+timeout+time.Second) // noticed within PingInterval + PingTimeout (and slack)
	select {                                     // a reconnect through the frozen path fails too, bounded by PingTimeout
	case err := <-errs:
		t.Logf("reconnecting: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("a connect through the frozen path did not give up")
	}
	select {
	case <-s.Ready():
		t.Fatal("ready while the path is frozen")
	default:
	}

	proxy.Thaw()
	wait(t, s.Ready(), "ready again after the thaw")
	wait(t, s.C(), "the sweep wake-up after the reconnect")
	is.True(l.BackendPID() != pid) // a new connection
	_, err = db.Pool.Exec(ctx(t), `SELECT pg_notify('hung', '')`)
	is.NoErr(err)
	wait(t, s.C(), "a notification on the new connection")

	is.Equal(len(logs.Find(slog.LevelWarn, "listener connection failed")), 1) // the hang, once
	is.Equal(len(logs.Find(slog.LevelInfo, "listener reconnected")), 1)       // the recovery
}

// TestIdleListenerStaysUp: a healthy listener with no traffic is probed
// every PingInterval and stays ready on the same connection: no reconnect,
// no error, no wake-up (the probe's notification wakes nobody).
func TestIdleListenerStaysUp(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	const interval, probes = 50 * time.Millisecond, 5
	onError, errs := errorsTo()
	probed := make(chan string, probes)
	send := notify.ProbeThrough(db.Pool)
	l, err := notify.New(notify.Config{
		Connect: notify.FromPool(db.Pool),
		OnError: onError,
		Probe: func(ctx context.Context, channel string) error {
			select {
			case probed <- channel:
			default:
			}
			return send(ctx, channel)
		},
		PingInterval: interval,
		PingTimeout:  2 * time.Second, // generous: this test is about flapping, not hangs
	})
	is.NoErr(err)
	defer l.Close()
	s, err := l.Subscribe("idle")
	is.NoErr(err)
	wait(t, s.Ready(), "ready")
	wait(t, s.C(), "connect wake-up")
	pid, ready := l.BackendPID(), s.Ready()

	// Until the buffer holds `probes` probes, then one more PingTimeout: the
	// last one came back too, or the listener reported an error by then.
	var quiet <-chan time.Time
	giveUp := time.After(time.Minute)
	for done := false; !done; {
		select {
		case err := <-errs:
			t.Fatalf("an idle, healthy listener failed: %v", err)
		case <-s.C():
			t.Fatal("an idle, healthy listener woke its subscriber (a reconnect)")
		case <-time.After(interval):
			if quiet == nil && len(probed) == probes {
				quiet = time.After(2 * time.Second)
			}
		case <-quiet:
			done = true
		case <-giveUp:
			t.Fatalf("%d probes in a minute", len(probed))
		}
	}
	is.Equal(l.BackendPID(), pid) // the same connection
	is.True(s.Ready() == ready)   // never down meanwhile
	channel := <-probed
	is.True(channel != "idle")                                    // a channel of the listener's own
	is.Equal(pgx.Identifier{channel}.Sanitize(), `"`+channel+`"`) // a plain name

	_, err = db.Pool.Exec(ctx(t), `SELECT pg_notify('idle', '')`)
	is.NoErr(err)
	wait(t, s.C(), "a notification after the probes")
}

// TestProbeFails: a probe that cannot be sent gives the connection up,
// with the probe's error, and the listener connects again.
func TestProbeFails(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	onError, errs := errorsTo()
	errProbe := errors.New("probe: no route")
	l, err := notify.New(notify.Config{
		Connect:      notify.FromPool(db.Pool),
		OnError:      onError,
		Logger:       (&pgtest.Logs{}).Logger(),
		Probe:        func(context.Context, string) error { return errProbe },
		PingInterval: 50 * time.Millisecond,
	})
	is.NoErr(err)
	defer l.Close()
	s, err := l.Subscribe("unprobed")
	is.NoErr(err)
	wait(t, s.Ready(), "ready")
	pid := l.BackendPID()
	select {
	case err := <-errs:
		is.True(errors.Is(err, errProbe)) // the probe's error, reported
	case <-time.After(time.Minute):
		t.Fatal("a failing probe went unnoticed")
	}
	for l.BackendPID() == pid || l.BackendPID() == 0 {
		wait(t, s.Ready(), "ready on a new connection")
		wait(t, s.C(), "the wake-up of a reconnect")
	}
}
