package notify_test

import (
	"log/slog"
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/notify"
)

// TestReconnectLogged: a lost listening connection is logged once at
// Warn, and the reconnect that ends the outage at Info; a healthy
// listener logs nothing.
func TestReconnectLogged(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	logs := &pgtest.Logs{Level: slog.LevelDebug}
	l, err := notify.New(notify.Config{Connect: notify.FromPool(db.Pool), Logger: logs.Logger()})
	is.NoErr(err)
	defer l.Close()
	s, err := l.Subscribe("logged")
	is.NoErr(err)
	wait(t, s.Ready(), "ready")
	wait(t, s.C(), "connect wake-up")
	is.Equal(len(logs.Records()), 0) // connecting is not news

	pid := l.BackendPID()
	var killed bool
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT pg_terminate_backend($1)`, pid).Scan(&killed))
	is.True(killed)
	wait(t, s.C(), "the sweep wake-up after the reconnect")
	wait(t, s.Ready(), "ready again")

	is.Equal(len(logs.Find(slog.LevelWarn, "listener connection failed")), 1) // the loss, once
	up := logs.Find(slog.LevelInfo, "listener reconnected")
	is.Equal(len(up), 1) // the recovery, logged before Ready
	v, ok := pgtest.Attr(up[0], "outage")
	is.True(ok)
	is.True(v.Duration() > 0) // how long it was down
}
