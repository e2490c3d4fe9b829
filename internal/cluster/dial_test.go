package cluster

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestConnectPoolSize: a pool FromDSN opens holds DefaultPoolSize
// connections unless the dsn names its size, in either dsn form.
func TestConnectPoolSize(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	for _, tc := range []struct {
		name string
		dsn  string
		want int32
	}{
		{"Default", dsn, pgtransport.DefaultPoolSize},
		{"SetSmaller", withParam(dsn, "pool_max_conns", "3"), 3},
		{"SetLarger", withParam(dsn, "pool_max_conns", "40"), 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			pool, _, err := Connect(pgtest.Context(t), tc.dsn, pgtransport.Config{})
			is.NoErr(err) // connect
			defer pool.Close()
			is.Equal(pool.Config().MaxConns, tc.want) // the pool's size
		})
	}
	is := is.New(t)
	is.True(setsPoolSize("host=h pool_max_conns=2"))            // keyword/value form
	is.True(setsPoolSize("postgres://h/d?pool_max_conns=2"))    // URL form
	is.True(!setsPoolSize("postgres://h/d?application_name=x")) // not set
}

// withParam adds key=value to dsn, a URL or a keyword/value string.
func withParam(dsn, key, value string) string {
	if !strings.Contains(dsn, "://") {
		return dsn + " " + key + "=" + value
	}
	if strings.Contains(dsn, "?") {
		return dsn + "&" + key + "=" + value
	}
	return dsn + "?" + key + "=" + value
}

// TestConnectFailsFastOnWhatCannotHeal: a database or a role that does
// not exist is the server's answer for good: Connect returns it at once,
// well within a second, wrapping the server's error and naming the fix,
// and does not call it unreachable.
func TestConnectFailsFastOnWhatCannotHeal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, key, value, code, hint string
	}{
		{"MissingDatabase", "dbname", "pgtransport_no_such_db", "3D000", "create the database"},
		{"MissingRole", "user", "pgtransport_no_such_role", "28000", "create the role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			start := time.Now()
			_, _, err := Connect(pgtest.Context(t), withParam(pgtest.DSN(t), tc.key, tc.value), pgtransport.Config{MaxConnectWait: time.Minute})
			took := time.Since(start)
			is.True(err != nil)                                  // refused
			is.True(took < time.Second)                          // at once, not after MaxConnectWait
			pgErr, ok := errors.AsType[*pgconn.PgError](err)     // the server's error
			is.True(ok && pgErr.Code == tc.code)                 // with its SQLSTATE
			is.True(strings.Contains(err.Error(), tc.hint))      // naming the fix
			is.True(!errors.Is(err, pgtransport.ErrUnreachable)) // not a wait that ran out
			is.True(!errors.Is(err, context.DeadlineExceeded))   // nor a deadline
		})
	}
}

// TestConnectRetriesWhatHeals: a refused connection is retried with
// backoff until MaxConnectWait, logged once however many tries, and then
// ErrUnreachable wrapping the last error, not a deadline of the caller's.
func TestConnectRetriesWhatHeals(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	is.NoErr(err)
	dead := "postgres://postgres@" + l.Addr().String() + "/postgres?sslmode=disable&connect_timeout=1"
	is.NoErr(l.Close())
	var logs countingHandler
	start := time.Now()
	_, _, err = Connect(context.Background(), dead, pgtransport.Config{MaxConnectWait: 700 * time.Millisecond, Logger: slog.New(&logs)})
	is.True(time.Since(start) >= 600*time.Millisecond)  // it waited, retrying
	is.True(errors.Is(err, pgtransport.ErrUnreachable)) // then gave up
	is.True(!errors.Is(err, context.DeadlineExceeded))  // its own wait, not the caller's deadline
	is.True(errors.Is(err, syscall.ECONNREFUSED))       // wrapping the last error
	is.Equal(logs.n.Load(), int32(1))                   // one kind of cause, logged once
}

// TestHeals: what a connect retries, and what it returns at once.
func TestHeals(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	for code, want := range map[string]bool{
		"57P03": true, "53300": true, "57P01": true, "08006": true, // starting, too many, shutting down, lost
		"3D000": false, "28000": false, "28P01": false, "42501": false, // no database, no role, wrong password, no CONNECT
	} {
		_, ok := heals(&pgconn.PgError{Code: code})
		is.Equal(ok, want) // by SQLSTATE
	}
	_, ok := heals(&net.DNSError{Err: "no such host", IsNotFound: true})
	is.True(ok) // a host name not resolvable yet: a compose service starting
	_, ok = heals(x509.UnknownAuthorityError{})
	is.True(!ok) // a certificate that does not verify will not
	is.True(strings.Contains(connectHint(&pgconn.PgError{Code: "28P01"}), "password"))
}

// countingHandler counts the records logged at Warn or above.
type countingHandler struct{ n atomic.Int32 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
