package sync_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestMain checks, after the tests, that no goroutine of the core is left:
// ClaimWait's waits over partitions end by the Transport's Close.
func TestMain(m *testing.M) {
	pgtest.MainWithExamples(m, "github.com/pgtransport/pgtransport/internal/core", "github.com/pgtransport/pgtransport/internal/cluster", "github.com/pgtransport/pgtransport/sync")
}

func ctx(tb testing.TB) context.Context { return pgtest.Context(tb) }

func TestPublishTx(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	tr, err := pgsync.New(ctx(t), db.Pool, pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)

	tx, err := db.Pool.Begin(ctx(t))
	is.NoErr(err)
	_, err = tr.PublishTx(ctx(t), tx, "g", "rolled back", 0)
	is.NoErr(err)
	is.NoErr(tx.Rollback(ctx(t)))
	l, err := tr.Claim(ctx(t), "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l, nil) // a rolled-back publish is gone

	tx, err = db.Pool.Begin(ctx(t))
	is.NoErr(err)
	_, err = tr.PublishTx(ctx(t), tx, "g", "committed", 0)
	is.NoErr(err)
	l, err = tr.Claim(ctx(t), "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l, nil) // invisible before commit
	is.NoErr(tx.Commit(ctx(t)))
	l, err = tr.Claim(ctx(t), "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l.Event, "committed") // visible after commit

	_, err = tr.PublishTx(ctx(t), nil, "g", "x", 0)
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // nil tx
}

// TestPublishDuringDrain forces the lost-publish interleaving every round: a
// publish whose transaction is still open while the ack drains its group.
// The design's publish (ON CONFLICT DO NOTHING alone) strands the message
// here; the fixed one must not.
func TestPublishDuringDrain(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	tr, err := pgsync.New(ctx(t), db.Pool, pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)
	const rounds = 1000
	for r := range rounds {
		_, err := tr.Publish(ctx(t), "g", "m1", 0)
		is.NoErr(err)
		l, err := tr.Claim(ctx(t), "w", time.Minute, 0)
		is.NoErr(err)
		tx, err := db.Pool.Begin(ctx(t))
		is.NoErr(err)
		_, err = tr.PublishTx(ctx(t), tx, "g", "m2", 0)
		is.NoErr(err)
		is.NoErr(tr.Ack(ctx(t), l)) // drains g as far as committed data shows; must not block on the open publish
		is.NoErr(tx.Commit(ctx(t)))
		l2, err := tr.Claim(ctx(t), "w", time.Minute, 0)
		is.NoErr(err)
		if l2 == nil || l2.Event != "m2" {
			t.Fatalf("round %d: the racing publish was stranded: claim returned %+v", r, l2)
		}
		is.NoErr(tr.Ack(ctx(t), l2))
	}
}

func TestDefaultSchemaUsesCurrentSchema(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4) // the pool's search_path is the test schema
	tr, err := pgsync.New(ctx(t), db.Pool, pgtransport.Config{})
	is.NoErr(err)
	_, err = tr.Publish(ctx(t), "g", "e", 0)
	is.NoErr(err)
	var n int
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM `+pgx.Identifier{db.Schema, "transport_messages"}.Sanitize()).Scan(&n))
	is.Equal(n, 1) // the unqualified names landed in the current schema
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, 2)
	for _, tc := range []struct {
		name string
		cfg  pgtransport.Config
		want error
	}{
		{"SchemaWithNUL", pgtransport.Config{Schema: "a\x00"}, pgtransport.ErrInvalidSchema},
		{"SchemaTooLong", pgtransport.Config{Schema: string(make([]byte, 64))}, pgtransport.ErrInvalidSchema},
		{"ReservedSchema", pgtransport.Config{Schema: "pg_mine"}, pgtransport.ErrInvalidSchema},
		{"NegativeEventLimit", pgtransport.Config{MaxEventBytes: -1}, pgtransport.ErrInvalidConfig},
		{"MaxKeepBelowNever", pgtransport.Config{MaxKeep: -2}, pgtransport.ErrInvalidConfig},
		{"NegativeKeepWhileWaiting", pgtransport.Config{KeepWhileWaiting: -1}, pgtransport.ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			_, err := pgsync.New(ctx(t), db.Pool, tc.cfg)
			is.True(errors.Is(err, tc.want)) // typed config error
		})
	}
	t.Run("NilPool", func(t *testing.T) {
		is := is.New(t)
		_, err := pgsync.New(ctx(t), (*pgxpool.Pool)(nil), pgtransport.Config{})
		is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // an error, not a panic
		_, err = pgsync.New(ctx(t), nil, pgtransport.Config{SkipApply: true})
		is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
	})
	t.Run("SkipApplyOnEmptySchema", func(t *testing.T) {
		is := is.New(t)
		_, err := pgsync.New(ctx(t), db.Pool, pgtransport.Config{Schema: db.Schema, SkipApply: true})
		is.True(errors.Is(err, pgtransport.ErrSchemaMissing))               // refused at open, not at the first call
		is.True(strings.Contains(err.Error(), "pgtransport migrate apply")) // naming the fix
	})
	t.Run("EventLimit", func(t *testing.T) {
		is := is.New(t)
		tr, err := pgsync.New(ctx(t), db.Pool, pgtransport.Config{Schema: db.Schema, MaxEventBytes: 4})
		is.NoErr(err)
		_, err = tr.Publish(ctx(t), "g", "12345", 0)
		is.True(errors.Is(err, pgtransport.ErrEventTooLarge))
		_, err = tr.Publish(ctx(t), "g", "1234", 0)
		is.NoErr(err) // exactly the limit is fine
	})
}

// lateProxy listens on a free port, accepts nothing until open is closed,
// then forwards every connection to target.
func lateProxy(t *testing.T, target string) (addr string, open chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = l.Addr().String()
	l.Close() // nothing listens: connections are refused, as before a server starts
	open = make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		select {
		case <-open:
		case <-t.Context().Done():
			return
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("proxy listen: %v", err)
			return
		}
		stop := context.AfterFunc(t.Context(), func() { l.Close() })
		defer stop()
		var (
			conns  []net.Conn
			copies stdsync.WaitGroup
		)
		defer func() {
			for _, c := range conns {
				c.Close() // ends the copies
			}
			copies.Wait()
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			conns = append(conns, c, up)
			copies.Go(func() { _, _ = io.Copy(up, c); up.Close() })
			copies.Go(func() { _, _ = io.Copy(c, up); c.Close() })
		}
	}()
	return addr, open
}

func TestFromDSNWaitsForLateServer(t *testing.T) {
	is := is.New(t)
	db := pgtest.New(t, 2)
	u, err := url.Parse(pgtestURL(t, db.DSN))
	is.NoErr(err)
	addr, openProxy := lateProxy(t, u.Host)
	u.Host = addr

	time.AfterFunc(700*time.Millisecond, func() { close(openProxy) })
	start := time.Now()
	tr, err := pgsync.FromDSN(ctx(t), u.String(), pgtransport.Config{Schema: db.Schema, MaxConnectWait: 30 * time.Second})
	is.NoErr(err) // connected once the server accepted
	defer tr.Close()
	is.True(time.Since(start) >= 700*time.Millisecond) // it waited rather than failing fast
	_, err = tr.Publish(ctx(t), "g", "e", 0)
	is.NoErr(err)
	l, err := tr.Claim(ctx(t), "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l.Event, "e")
	tr.Close()
	tr.Close() // safe twice
}

func TestFromDSNGivesUp(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "postgres://postgres@" + l.Addr().String() + "/postgres?sslmode=disable&connect_timeout=1"
	l.Close()

	t.Run("WhenCtxEnds", func(t *testing.T) {
		is := is.New(t)
		c, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
		defer cancel()
		_, err := pgsync.FromDSN(c, dead, pgtransport.Config{})
		is.True(errors.Is(err, context.DeadlineExceeded)) // says why it stopped
		var connErr *pgconn.ConnectError
		is.True(errors.As(err, &connErr)) // and wraps the last connection error
	})
	t.Run("AfterMaxConnectWait", func(t *testing.T) {
		is := is.New(t)
		_, err := pgsync.FromDSN(ctx(t), dead, pgtransport.Config{MaxConnectWait: 300 * time.Millisecond})
		is.True(errors.Is(err, pgtransport.ErrUnreachable)) // the library's own wait ended
		is.True(!errors.Is(err, context.DeadlineExceeded))  // not the caller's deadline: its ctx has none
		var connErr *pgconn.ConnectError
		is.True(errors.As(err, &connErr))
	})
	t.Run("MalformedDSNFailsAtOnce", func(t *testing.T) {
		is := is.New(t)
		_, err := pgsync.FromDSN(ctx(t), "postgres://%zz", pgtransport.Config{})
		is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
	})
}

// pgtestURL turns the harness's DSN into a URL with a TCP host.
func pgtestURL(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host == "" || cfg.Host[0] == '/' {
		t.Fatalf("FromDSN test needs a TCP server, have %q", cfg.Host)
	}
	u := url.URL{Scheme: "postgres", User: url.User(cfg.User), Host: net.JoinHostPort(cfg.Host, itoa(cfg.Port)), Path: "/" + cfg.Database, RawQuery: "sslmode=disable"}
	if cfg.Password != "" {
		u.User = url.UserPassword(cfg.User, cfg.Password)
	}
	return u.String()
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }

// TestSchemasAreIsolated runs two transports in two schemas of one database,
// one on a pool and one on a single *pgx.Conn: neither sees the other's
// messages.
func TestSchemasAreIsolated(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	a, b := pgtest.New(t, 2), pgtest.New(t, 2)
	ta, err := pgsync.New(ctx(t), a.Pool, pgtransport.Config{Schema: a.Schema})
	is.NoErr(err)
	tb, err := pgsync.New(ctx(t), b.Conn(t), pgtransport.Config{Schema: b.Schema}) // a single connection works too
	is.NoErr(err)
	_, err = ta.Publish(ctx(t), "shared-group", "for a", 0)
	is.NoErr(err)
	l, err := tb.Claim(ctx(t), "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l, nil) // b sees nothing of a's
	_, err = tb.Publish(ctx(t), "shared-group", "for b", 0)
	is.NoErr(err)
	la, err := ta.Claim(ctx(t), "w", time.Minute, 0)
	is.NoErr(err)
	lb, err := tb.Claim(ctx(t), "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(la.Event, "for a") // the same group id is a different group in each schema
	is.Equal(lb.Event, "for b")
	is.True(errors.Is(tb.Ack(ctx(t), la), pgtransport.ErrLeaseLost)) // a's lease means nothing in b
	is.NoErr(ta.Ack(ctx(t), la))
	is.NoErr(tb.Ack(ctx(t), lb))
}

// TestServerGone: with no server behind the pool, every call returns an
// error, never a nil lease that a worker would read as "nothing to do".
func TestServerGone(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	is.NoErr(err)
	dead := "postgres://postgres@" + l.Addr().String() + "/postgres?sslmode=disable&connect_timeout=1"
	l.Close()
	pool, err := pgxpool.New(ctx(t), dead) // connects lazily: no error yet
	is.NoErr(err)
	defer pool.Close()

	_, err = pgsync.New(ctx(t), pool, pgtransport.Config{})
	is.True(err != nil) // applying the schema needs the server

	tr, err := pgsync.New(ctx(t), pool, pgtransport.Config{SkipApply: true})
	is.NoErr(err)
	lease, err := tr.Claim(ctx(t), "w", time.Minute, 0)
	is.True(err != nil) // an error, not "nothing claimable"
	is.Equal(lease, nil)
	_, err = tr.Publish(ctx(t), "g", "e", 0)
	is.True(err != nil)
	err = tr.Ack(ctx(t), &pgtransport.Lease{Group: "g", Seq: 1, Token: "w:x"})
	is.True(err != nil && !errors.Is(err, pgtransport.ErrLeaseLost)) // unknown, not "lost"
}

// TestClaimInCallersTxKeepsCommitMode: a claim commits without waiting for
// its WAL flush, but a Transport on the caller's transaction must not turn
// that on for the caller's own writes.
func TestClaimInCallersTxKeepsCommitMode(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	tr, err := pgsync.New(ctx(t), db.Pool, pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)
	_, err = tr.Publish(ctx(t), "g", "e", 0)
	is.NoErr(err)
	tx, err := db.Pool.Begin(ctx(t))
	is.NoErr(err)
	defer tx.Rollback(ctx(t))
	inTx, err := pgsync.New(ctx(t), tx, pgtransport.Config{Schema: db.Schema, SkipApply: true})
	is.NoErr(err)
	l, err := inTx.Claim(ctx(t), "w", time.Minute, 0)
	is.NoErr(err)
	is.True(l != nil)
	var mode string
	is.NoErr(tx.QueryRow(ctx(t), `SHOW synchronous_commit`).Scan(&mode))
	is.Equal(mode, "on") // the caller's commit stays synchronous

	conn, err := db.Pool.Acquire(ctx(t)) // and on a pool, the claim's own transaction only
	is.NoErr(err)
	defer conn.Release()
	onConn, err := pgsync.New(ctx(t), conn.Conn(), pgtransport.Config{Schema: db.Schema, SkipApply: true})
	is.NoErr(err)
	_, err = onConn.Claim(ctx(t), "w", time.Minute, 0)
	is.NoErr(err)
	is.NoErr(conn.QueryRow(ctx(t), `SHOW synchronous_commit`).Scan(&mode))
	is.Equal(mode, "on") // set_config(..., true) ended with the claim's transaction
}
