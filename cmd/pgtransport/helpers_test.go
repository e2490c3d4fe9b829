package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	stdsync "sync"
	"testing"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// testDSN is the server the tests use: $TEST_DATABASE_URL, else the local
// one. A run without a server fails; it never skips.
func testDSN() string {
	if dsn := os.Getenv("TEST_DATABASE_URL"); dsn != "" {
		return dsn
	}
	return "postgres://postgres@127.0.0.1:5432/postgres"
}

// harness is one test's queue: a fresh schema, dropped when the test ends.
type harness struct {
	t      *testing.T
	schema string
	pool   *pgxpool.Pool
	dsn    string // the command's --dsn; empty: testDSN()
}

// newHarness makes a schema name of its own and, with apply, applies the
// schema through the command itself (migrate apply).
func newHarness(t *testing.T, apply bool) *harness {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	h := &harness{t: t, schema: "pgtcli_" + hex.EncodeToString(b[:])}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testDSN())
	if err != nil {
		t.Fatalf("connect to %s: %v", testDSN(), err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("no PostgreSQL at %s (set TEST_DATABASE_URL): %v", testDSN(), err)
	}
	h.pool = pool
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{h.schema}.Sanitize()+" CASCADE")
		pool.Close()
		if err != nil {
			t.Errorf("drop schema %s: %v", h.schema, err)
		}
	})
	if apply {
		h.ok("", "migrate", "apply")
	}
	return h
}

// result is one run of the command.
type result struct {
	stdout, stderr string
	code           int
}

// runEnv runs args (with --dsn and --schema added) under e, whose stdout
// and stderr it sets.
func (h *harness) runEnv(ctx context.Context, e *env, args ...string) result {
	var out, errb bytes.Buffer
	e.stdout, e.stderr = &out, &errb
	if e.stdin == nil {
		e.stdin = strings.NewReader("")
	}
	if e.getenv == nil {
		e.getenv = func(string) string { return "" }
	}
	// The harness's flags first: a --schema in args comes later and wins.
	args = append([]string{"--dsn=" + cmp.Or(h.dsn, testDSN()), "--schema=" + h.schema}, args...)
	code := run(ctx, args, e)
	return result{out.String(), errb.String(), code}
}

// run runs args with stdin, not on a terminal.
func (h *harness) run(stdin string, args ...string) result {
	return h.runEnv(context.Background(), &env{stdin: strings.NewReader(stdin)}, args...)
}

// ok runs args and fails the test unless they exit 0.
func (h *harness) ok(stdin string, args ...string) result {
	h.t.Helper()
	r := h.run(stdin, args...)
	if r.code != 0 {
		h.t.Fatalf("%v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r
}

// fails runs args and checks they exit with code and a message on stderr
// holding every one of want, and nothing on stdout.
func (h *harness) fails(code int, stdin string, args []string, want ...string) result {
	h.t.Helper()
	r := h.run(stdin, args...)
	if r.code != code {
		h.t.Fatalf("%v: exit %d, want %d\nstdout: %s\nstderr: %s", args, r.code, code, r.stdout, r.stderr)
	}
	if r.stdout != "" {
		h.t.Errorf("%v: stdout %q, want nothing", args, r.stdout)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			h.t.Errorf("%v: stderr %q lacks %q", args, r.stderr, w)
		}
	}
	return r
}

// counts is what the queue holds: messages, group rows, dead letters.
type counts struct{ messages, groups, dead int64 }

func (h *harness) counts() counts {
	h.t.Helper()
	var c counts
	s := pgx.Identifier{h.schema}.Sanitize()
	err := h.pool.QueryRow(context.Background(), fmt.Sprintf(
		`SELECT (SELECT count(*) FROM %[1]s.transport_messages), (SELECT count(*) FROM %[1]s.transport_groups), (SELECT count(*) FROM %[1]s.transport_dead_letters)`, s)).
		Scan(&c.messages, &c.groups, &c.dead)
	if err != nil {
		h.t.Fatalf("counts: %v", err)
	}
	return c
}

// transport is a library transport on the harness's queue, for setting up
// states the command then shows.
func (h *harness) transport(cfg pgtransport.Config) *pgsync.Transport {
	h.t.Helper()
	cfg.Schema, cfg.SkipApply = h.schema, true
	cfg.Logger = slog.New(slog.DiscardHandler) // dead letters are logged at Warn
	tr, err := pgsync.New(context.Background(), h.pool, cfg)
	if err != nil {
		h.t.Fatalf("transport: %v", err)
	}
	return tr
}

// publish publishes n messages "<group>-<i>" to group.
func (h *harness) publish(tr *pgsync.Transport, group string, priority, n int) {
	h.t.Helper()
	var msgs []pgtransport.Message
	for i := range n {
		msgs = append(msgs, pgtransport.Message{Group: group, Event: fmt.Sprintf("%s-%d", group, i+1), Priority: priority})
	}
	if _, err := tr.PublishMany(context.Background(), msgs); err != nil {
		h.t.Fatalf("publish: %v", err)
	}
}

// deadLetters makes n dead letters, one in each of groups dead-1..dead-n,
// seqs in that order: each published, claimed once and failed (the
// queue's MaxAttempts is set to 1).
func (h *harness) deadLetters(n int) {
	h.t.Helper()
	ctx := context.Background()
	tr := h.transport(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1}})
	for i := range n {
		h.publish(tr, fmt.Sprintf("dead-%02d", i+1), 0, 1)
	}
	leases, err := tr.ClaimMany(ctx, "w", time.Minute, 0, n)
	if err != nil || len(leases) != n {
		h.t.Fatalf("claim many: %d leases, %v", len(leases), err)
	}
	for _, l := range leases {
		if err := tr.Fail(ctx, l, fmt.Errorf("boom %s", l.Group)); err != nil {
			h.t.Fatalf("fail: %v", err)
		}
	}
	if c := h.counts(); c.dead != int64(n) {
		h.t.Fatalf("%d dead letters, want %d", c.dead, n)
	}
}

// decode parses a command's JSON output into v, failing the test if it
// is not exactly one JSON document.
func decode(t *testing.T, out string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("parse JSON output: %v\n%s", err, out)
	}
	if dec.More() {
		t.Fatalf("more than one JSON document:\n%s", out)
	}
}

var (
	// A duration cell as age formats it.
	durationRE = regexp.MustCompile(`^~?(\d+s|\d+m\d\ds|\d+h\d\dm|\d+d\d\dh)( ago)?$`)
	uuidRE     = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	stampRE    = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)
	cellSep    = regexp.MustCompile(`\s{2,}`)
)

// volatile are the columns whose values vary from run to run: ages.
var volatile = map[string]bool{"OLDEST HEAD": true, "HEAD AGE": true, "AGE": true, "HELD FOR": true, "ENDS IN": true, "DIED": true}

// normTable checks that the table at the top of raw (up to its first
// blank line) is aligned: every cell starts where its header does. It
// returns raw with the varying values (ages, lease tokens' uuids,
// timestamps) replaced by placeholders, the table realigned.
func normTable(t *testing.T, raw string) string {
	t.Helper()
	table, rest, _ := strings.Cut(raw, "\n\n")
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	header, starts := cells(lines[0])
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, line := range lines[1:] {
		cs, at := cells(line)
		if len(cs) != len(header) {
			t.Fatalf("row %q has %d cells, the header %d", line, len(cs), len(header))
		}
		for i := range cs {
			if at[i] != starts[i] {
				t.Errorf("row %q: cell %d starts at %d, its header at %d", line, i, at[i], starts[i])
			}
			if volatile[header[i]] && cs[i] != "-" {
				if !durationRE.MatchString(cs[i]) {
					t.Errorf("column %s: %q is not a duration", header[i], cs[i])
				}
				cs[i] = "<age>"
			}
			cs[i] = uuidRE.ReplaceAllString(cs[i], "<uuid>")
		}
		fmt.Fprintln(tw, strings.Join(cs, "\t"))
	}
	_ = tw.Flush()
	if rest != "" {
		b.WriteString("\n")
		b.WriteString(stampRE.ReplaceAllString(rest, "<time>"))
	}
	return b.String()
}

// cells splits a table line on runs of two or more spaces, returning the
// cells and the rune offset each starts at.
func cells(line string) ([]string, []int) {
	var cs []string
	var at []int
	pos := 0
	for _, loc := range cellSep.FindAllStringIndex(line, -1) {
		cs = append(cs, line[pos:loc[0]])
		at = append(at, utf8.RuneCountInString(line[:pos]))
		pos = loc[1]
	}
	cs = append(cs, line[pos:])
	at = append(at, utf8.RuneCountInString(line[:pos]))
	return cs, at
}

// golden compares got with testdata/name, or writes it there with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu stdsync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
