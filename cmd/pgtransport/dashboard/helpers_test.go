package dashboard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// browser is the headless browser the tests share (a tab each); nil when
// none is installed.
var browser context.Context

// browserMissing says why there is no browser.
var browserMissing string

func TestMain(m *testing.M) {
	flag.Parse()
	stop := startBrowser()
	code := m.Run()
	stop()
	if browserMissing != "" {
		fmt.Fprintf(os.Stderr, "\n%s\n%s\n%s\n\n", banner, browserMissing, banner)
	}
	os.Exit(code)
}

const banner = "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"

// browserPath is $CHROME_PATH, else the first Chromium or Chrome on $PATH.
func browserPath() string {
	if p := os.Getenv("CHROME_PATH"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// startBrowser starts the shared browser, and returns what stops it. A
// browser that is installed but does not start fails the run.
func startBrowser() (stop func()) {
	path := browserPath()
	if path == "" {
		browserMissing = "DASHBOARD BROWSER TESTS SKIPPED: no Chromium or Chrome found (apt-get install chromium, or set CHROME_PATH)"
		return func() {}
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // CI runs as root in a container
		chromedp.WindowSize(1200, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	// The first run starts the browser, which lives as long as the context
	// of that run: bctx itself, not one with a timeout.
	if err := chromedp.Do(bctx); err != nil {
		cancelBrowser()
		cancelAlloc()
		fmt.Fprintf(os.Stderr, "dashboard tests: the browser at %s does not start: %v\n", path, err)
		os.Exit(1)
	}
	browser = bctx
	return func() { cancelBrowser(); cancelAlloc() }
}

// tab is a new browser tab for t, closed when t ends; t is skipped, loudly,
// when no browser is installed.
func tab(t *testing.T) context.Context {
	t.Helper()
	return tabFor(t, 30*time.Second)
}

// tabFor is tab, closed after d at the latest.
func tabFor(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	if browser == nil {
		t.Skip(browserMissing)
	}
	ctx, cancel := chromedp.NewContext(browser)
	ctx, cancelTimeout := context.WithTimeout(ctx, d)
	t.Cleanup(func() { cancelTimeout(); cancel() })
	return ctx
}

// testDSN is $TEST_DATABASE_URL, else the local server. A run without a
// server fails; it never skips.
func testDSN() string {
	if dsn := os.Getenv("TEST_DATABASE_URL"); dsn != "" {
		return dsn
	}
	return "postgres://postgres@127.0.0.1:5432/postgres"
}

// queue is one test's queue, in a fresh schema dropped when the test ends.
type queue struct {
	t      *testing.T
	schema string
	pool   *pgxpool.Pool
	tr     *pgsync.Transport
}

func newQueue(t *testing.T, cfg pgtransport.Config) *queue {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	q := &queue{t: t, schema: "pgtdash_" + hex.EncodeToString(b[:])}
	ctx := context.Background()
	pc, err := pgxpool.ParseConfig(testDSN())
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatalf("connect to %s: %v", testDSN(), err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("no PostgreSQL at %s (set TEST_DATABASE_URL): %v", testDSN(), err)
	}
	q.pool = pool
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{q.schema}.Sanitize()+" CASCADE")
		pool.Close()
		if err != nil {
			t.Errorf("drop schema %s: %v", q.schema, err)
		}
	})
	cfg.Schema = q.schema
	cfg.Logger = slog.New(slog.DiscardHandler) // dead letters are logged at Warn
	if q.tr, err = pgsync.New(ctx, pool, cfg); err != nil {
		t.Fatalf("transport: %v", err)
	}
	return q
}

// publish publishes n messages "<group>-<i>" to group.
func (q *queue) publish(group string, priority, n int) {
	q.t.Helper()
	var msgs []pgtransport.Message
	for i := range n {
		msgs = append(msgs, pgtransport.Message{Group: group, Event: fmt.Sprintf("%s-%d", group, i+1), Priority: priority})
	}
	if _, err := q.tr.PublishMany(context.Background(), msgs); err != nil {
		q.t.Fatalf("publish: %v", err)
	}
}

// count runs a count(*)-like query on the queue's schema (%s: the
// schema, quoted).
func (q *queue) count(query string) int64 {
	q.t.Helper()
	var n int64
	if err := q.pool.QueryRow(context.Background(), fmt.Sprintf(query, pgx.Identifier{q.schema}.Sanitize())).Scan(&n); err != nil {
		q.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// serve starts a dashboard on q with its sampler; both stop when the test
// ends.
func (q *queue) serve(cfg Config) (*Server, string) {
	q.t.Helper()
	cfg.Transport, cfg.DB, cfg.Schema = q.tr, q.pool, q.schema
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := New(cfg)
	if err != nil {
		q.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	srv := httptest.NewServer(s)
	q.t.Cleanup(func() {
		srv.Close()
		cancel()
		if err := <-ran; err != nil {
			q.t.Errorf("run: %v", err)
		}
	})
	return s, srv.URL
}

// digits keeps the digits of a number as the page shows it ("1,234").
func digits(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, s)
}
