package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/schema"
)

func TestHelp(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	var out strings.Builder
	code := run(context.Background(), []string{"--help"}, &env{stdout: &out, stderr: &out, stdin: strings.NewReader(""), getenv: func(string) string { return "postgres://u:secret@db/app" }})
	is.Equal(code, 0)
	is.True(!strings.Contains(out.String(), "secret")) // $DATABASE_URL is not shown as the default
	for _, want := range []string{"Exit codes:", "130  interrupted", "migrate", "stats", "groups", "peek", "pause", "resume", "purge", "dead", "publish", "metrics", "serve", "version", "--dsn", "--schema"} {
		is.True(strings.Contains(out.String(), want)) // root help lists it
	}
	for _, sub := range [][]string{{"migrate"}, {"migrate", "grants"}, {"groups"}, {"purge"}, {"dead", "redrive"}, {"dead", "purge"}, {"publish"}, {"metrics"}, {"serve"}} {
		out.Reset()
		code := run(context.Background(), append(sub, "--help"), &env{stdout: &out, stderr: &out, stdin: strings.NewReader(""), getenv: func(string) string { return "" }})
		is.Equal(code, 0)                                         // --help of a subcommand
		is.True(strings.Contains(out.String(), "Usage:"))         // it shows usage
		is.True(len(out.String()) > 300)                          // and says more than the usage line
		is.True(!strings.Contains(out.String(), "pgtransport: ")) // no error
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	h := newHarness(t, false)
	h.fails(exitUsage, "", []string{"bogus"}, `unknown command "bogus"`, "--help")
	h.fails(exitUsage, "", []string{"stats", "--bogus"}, "unknown flag: --bogus")
	h.fails(exitUsage, "", []string{"groups", "--limit", "x"}, `invalid argument "x" for "--limit"`)
	h.fails(exitUsage, "", []string{"peek"}, "takes 1 argument(s) (GROUP), got 0")
	h.fails(exitUsage, "", []string{"migrate", "grants"}, "(ROLE)")
	h.fails(exitUsage, "", []string{"stats", "--dsn", "postgres://x:y@[::1"}, "--dsn")
}

func TestDSNFromEnvironment(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	var out, errb strings.Builder
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(k string) string {
		if k == "DATABASE_URL" {
			return testDSN()
		}
		return ""
	}}
	code := run(context.Background(), []string{"migrate", "version", "--schema", h.schema}, e) // no --dsn
	is.Equal(code, 0)                                                                          // connected through $DATABASE_URL
	is.True(strings.Contains(out.String(), fmt.Sprintf("recorded: %d", schema.Version())))
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, false)

	sql := h.ok("", "migrate", "sql").stdout
	is.True(strings.HasPrefix(sql, fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS "%s";`+"\n"+`SET search_path TO "%s";`+"\n", h.schema, h.schema))) // --schema: created and selected first
	is.True(strings.HasSuffix(sql, schema.SQL()))                                                                                              // then the library's script
	is.Equal(h.run("", "migrate", "sql", "--schema", "").stdout, schema.SQL())                                                                 // no schema: the script alone

	var v struct {
		Schema            string
		Recorded, Library int
	}
	decode(t, h.ok("", "migrate", "version", "--json").stdout, &v)
	is.Equal(v.Schema, h.schema)
	is.Equal(v.Recorded, 0) // nothing applied yet
	is.Equal(v.Library, schema.Version())
	is.True(strings.Contains(h.ok("", "migrate", "version").stdout, "migrate apply creates it"))

	h.fails(exitFailed, "", []string{"stats"}, "schema not applied", "pgtransport migrate apply") // the other commands never apply it

	is.Equal(h.ok("", "migrate", "apply").stdout, fmt.Sprintf("schema %q upgraded from version 0 to %d\n", h.schema, schema.Version()))
	is.Equal(h.ok("", "migrate", "apply").stdout, fmt.Sprintf("schema %q is up to date at version %d\n", h.schema, schema.Version()))
	decode(t, h.ok("", "migrate", "version", "--json").stdout, &v)
	is.Equal(v.Recorded, schema.Version())
	is.Equal(h.ok("", "migrate", "version").stdout, fmt.Sprintf("recorded: %d\nlibrary:  %d\n", schema.Version(), schema.Version()))
}

func TestBadSchemaName(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, false)
	for _, name := range []string{"pg_queue", strings.Repeat("x", 64), "bad\x00name"} {
		for _, args := range [][]string{{"migrate", "apply"}, {"stats"}, {"migrate", "sql"}, {"migrate", "grants", "worker"}} {
			r := h.run("", append(args, "--schema", name)...) // the last --schema wins
			is.Equal(r.code, exitUsage)                       // a bad schema name is bad input
			is.Equal(r.stdout, "")                            // nothing printed
			is.True(strings.Contains(r.stderr, "--schema: pgtransport: invalid schema name"))
		}
		if !strings.ContainsRune(name, 0) {
			var n int
			is.NoErr(h.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, name).Scan(&n))
			is.Equal(n, 0) // no schema created
		}
	}
}

func TestGrants(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	ctx := context.Background()

	// A role name with quotes and SQL in it is quoted, not run.
	role := fmt.Sprintf(`w"%s"; DROP SCHEMA %s CASCADE; --`, h.schema[7:], h.schema)
	out := h.ok("", "migrate", "grants", role).stdout
	quoted := pgx.Identifier{role}.Sanitize()
	is.True(strings.Contains(out, " TO "+quoted+";\n")) // the role, quoted, doubled quotes
	want, err := schema.Grants(h.schema, role)
	is.NoErr(err)
	is.Equal(out, want) // exactly the library's statements

	_, err = h.pool.Exec(ctx, "CREATE ROLE "+quoted)
	is.NoErr(err)
	t.Cleanup(func() {
		_, _ = h.pool.Exec(context.Background(), "DROP OWNED BY "+quoted)
		_, _ = h.pool.Exec(context.Background(), "DROP ROLE "+quoted)
	})
	_, err = h.pool.Exec(ctx, out) // run the printed script as psql would
	is.NoErr(err)
	var canPublish, canAlter bool
	is.NoErr(h.pool.QueryRow(ctx, `SELECT has_function_privilege($1, $2, 'EXECUTE'), has_schema_privilege($1, $3, 'CREATE')`,
		role, h.schema+".harel_publish(text,text,integer,text)", h.schema).Scan(&canPublish, &canAlter))
	is.True(canPublish)            // the role may work the queue
	is.True(!canAlter)             // and nothing more
	is.Equal(h.counts(), counts{}) // the schema is still there, and empty

	h.fails(exitUsage, "", []string{"migrate", "grants", ""}, `invalid role name ""`)
	h.fails(exitUsage, "", []string{"migrate", "grants", "a\x00b"}, "invalid role name")
	h.fails(exitUsage, "", []string{"migrate", "grants", "a\xffb"}, "invalid role name")
}

// queueState sets up one group in each state: park (parked: its head
// failed, attempts 1), lease (leased, attempts 2: a nack, then held), pause (paused, 2 messages), free
// (free, priority 2). Seqs: park 1-3, lease 4, pause 5-6, free 7.
func queueState(t *testing.T, h *harness) {
	t.Helper()
	ctx := context.Background()
	tr := h.transport(pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: time.Hour, RetryBackoffMax: time.Hour}})
	h.publish(tr, "park", 0, 3)
	lease, err := tr.Claim(ctx, "op-test", time.Hour, 0)
	if err != nil || lease == nil || lease.Group != "park" {
		t.Fatalf("claim park: %v %v", lease, err)
	}
	if err := tr.Fail(ctx, lease, fmt.Errorf("connection refused\nretrying later")); err != nil {
		t.Fatalf("fail: %v", err)
	}
	h.publish(tr, "lease", 1, 1)
	for attempt := 1; attempt <= 2; attempt++ {
		lease, err := tr.Claim(ctx, "op-test", time.Hour, 1)
		if err != nil || lease == nil || lease.Group != "lease" || lease.Attempt != attempt {
			t.Fatalf("claim lease: %+v %v", lease, err)
		}
		if attempt == 1 {
			if err := tr.Nack(ctx, lease, 0); err != nil { // back at once, the attempt counted
				t.Fatalf("nack: %v", err)
			}
		}
	}
	h.publish(tr, "pause", 0, 2)
	h.ok("", "pause", "pause")
	h.publish(tr, "free", 2, 1)
}

func TestStatsGroupsPeek(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	queueState(t, h)

	golden(t, "stats.golden", normTable(t, h.ok("", "stats").stdout))
	var s statsJSON
	decode(t, h.ok("", "stats", "--json").stdout, &s)
	is.Equal(s.Total.Groups, int64(4))
	is.Equal(s.Total.Messages, int64(7))
	is.True(s.Total.MessagesExact)
	is.Equal([]int64{s.Total.Free, s.Total.Leased, s.Total.Parked, s.Total.Stopped, s.Total.Paused}, []int64{1, 1, 1, 0, 1})
	is.True(s.Total.Priority == nil)
	is.Equal(len(s.ByPriority), 5)
	is.Equal(*s.ByPriority[2].Priority, 2)
	is.Equal(s.ByPriority[2].Groups, int64(1))
	is.True(s.Total.OldestHeadAge > 0 && s.Total.OldestHeadAge < 60)
	is.True(time.Since(s.At) < time.Minute)

	golden(t, "groups.golden", normTable(t, h.ok("", "groups").stdout))
	golden(t, "groups_oldest_head.golden", normTable(t, h.ok("", "groups", "--order", "oldest_head").stdout))
	golden(t, "groups_paused.golden", normTable(t, h.ok("", "groups", "--state", "paused").stdout))
	golden(t, "groups_most_attempts.golden", normTable(t, h.ok("", "groups", "--order", "most_attempts").stdout))

	r := h.ok("", "groups", "--limit", "2", "--offset", "1")
	is.Equal(strings.Count(r.stdout, "\n"), 3)                            // the header and two groups
	is.True(strings.HasPrefix(strings.Split(r.stdout, "\n")[1], "lease")) // by id, after "free"
	is.Equal(r.stderr, "(more may follow: --offset 3)\n")

	var gs []groupJSON
	decode(t, h.ok("", "groups", "--json", "--order", "held_longest").stdout, &gs)
	is.Equal(len(gs), 1) // only the leased group has a holder
	is.Equal(gs[0].Group, "lease")
	is.Equal(gs[0].State, "leased")
	is.True(strings.HasPrefix(gs[0].Holder, "op-test:"))
	is.True(gs[0].LeasedAt != nil && gs[0].Until != nil)
	is.True(gs[0].Until.Sub(*gs[0].LeasedAt) > 59*time.Minute) // the claim's hour
	is.Equal(gs[0].HeadSeq, int64(4))
	is.Equal(gs[0].Attempts, 2)

	golden(t, "group_lease.golden", stampRE.ReplaceAllString(
		uuidRE.ReplaceAllString(regexpAges(h.ok("", "group", "lease").stdout), "<uuid>"), "<time>"))
	var g groupJSON
	decode(t, h.ok("", "group", "park", "--json").stdout, &g)
	is.Equal(g.State, "parked")
	is.Equal(g.Attempts, 1)
	is.Equal(g.HeadSeq, int64(1))

	golden(t, "peek_park.golden", normTable(t, h.ok("", "peek", "park").stdout))
	var ms []peekJSON
	decode(t, h.ok("", "peek", "park", "-n", "2", "--json").stdout, &ms)
	is.Equal(len(ms), 2)
	is.Equal(ms[0].Seq, int64(1))
	is.Equal(ms[0].Event, "park-1")
	is.Equal(ms[0].LastError, "connection refused\nretrying later") // whole in JSON
	is.True(ms[0].PublishedAt != nil)
	is.Equal(ms[1].Seq, int64(2))
	is.Equal(ms[1].LastError, "")

	is.Equal(h.counts(), counts{messages: 7, groups: 4}) // reading changed nothing
}

// regexpAges replaces the ages in a "key: value" listing.
func regexpAges(s string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && durationRE.MatchString(strings.TrimSpace(v)) {
			line = k + ":" + strings.Repeat(" ", len(v)-len(strings.TrimLeft(v, " "))) + "<age>"
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

func TestUnknownAndInvalidGroup(t *testing.T) {
	t.Parallel()
	h := newHarness(t, true)
	tr := h.transport(pgtransport.Config{})
	h.publish(tr, "g", 0, 2)
	before := h.counts()
	for _, args := range [][]string{{"group", "nope"}, {"peek", "nope"}, {"pause", "nope"}, {"resume", "nope"}, {"purge", "nope", "--yes"}} {
		h.fails(exitNotFound, "", args, `pgtransport: unknown group "nope": it has no row (never published to, or drained)`)
	}
	// An id too long to publish may still name a group stored before the
	// limit: the reads and purge look it up.
	long := strings.Repeat("x", pgtransport.MaxGroupBytes+1)
	h.fails(exitNotFound, "", []string{"peek", long}, "unknown group")
	for _, args := range [][]string{{"group", ""}, {"peek", "a\x00b"}, {"pause", "a\x00b"}, {"resume", ""}, {"purge", "", "--yes"}, {"dead", "list", "--group", "a\x00"}, {"dead", "redrive", "--group", "a\x00"}, {"dead", "purge", "--group", "a\x00", "--yes"}} {
		h.fails(exitUsage, "", args, "invalid group id")
	}
	h.fails(exitUsage, "", []string{"groups", "--state", "sleeping"}, `--state "sleeping": want one of [free leased parked stopped paused]`)
	h.fails(exitUsage, "", []string{"groups", "--order", "newest"}, `--order "newest"`)
	h.fails(exitUsage, "", []string{"peek", "g", "-n", "0"}, "-n 0: want 1 to 10000")
	if c := h.counts(); c != before {
		t.Fatalf("counts %+v, want %+v: a refused command wrote", c, before)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	tr := h.transport(pgtransport.Config{})
	h.publish(tr, "g", 0, 1)
	state := func() string {
		var g groupJSON
		decode(t, h.ok("", "group", "g", "--json").stdout, &g)
		return g.State
	}
	is.Equal(h.ok("", "pause", "g").stdout, "group \"g\" is paused\n")
	is.Equal(state(), "paused")
	h.ok("", "pause", "g") // idempotent
	lease, err := tr.Claim(context.Background(), "w", time.Minute, 0)
	is.NoErr(err)
	is.True(lease == nil) // a paused group is not claimed
	is.Equal(h.ok("", "resume", "g").stdout, "group \"g\" is resumed\n")
	is.Equal(state(), "free")
	h.ok("", "resume", "g") // idempotent
	lease, err = tr.Claim(context.Background(), "w", time.Minute, 0)
	is.NoErr(err)
	is.True(lease != nil && lease.Group == "g") // claimable again
}

func TestPurge(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	tr := h.transport(pgtransport.Config{})
	h.publish(tr, "g", 0, 25)
	h.publish(tr, "other", 0, 3)

	// Piped: --yes is required, and nothing is deleted without it.
	h.fails(exitUsage, "", []string{"purge", "g"}, "pass --yes", "nothing was changed")
	// On a terminal: it asks; anything but yes declines.
	r := h.runEnv(context.Background(), &env{stdinTTY: true, stdin: strings.NewReader("n\n")}, "purge", "g")
	is.Equal(r.code, exitFailed)
	is.True(strings.Contains(r.stderr, `Delete every message of group "g" (free, head seq 1)? This cannot be undone. [y/N]`))
	is.True(strings.Contains(r.stderr, "not confirmed; nothing was changed"))
	is.Equal(h.counts(), counts{messages: 28, groups: 2})

	// Confirmed on a terminal, in batches of 10, with a progress bar.
	r = h.runEnv(context.Background(), &env{stdinTTY: true, stderrTTY: true, stdin: strings.NewReader("y\n")}, "purge", "g", "--batch", "10")
	is.Equal(r.code, 0)
	is.Equal(r.stdout, "purged 25 messages of group \"g\"\n")
	is.True(strings.Contains(r.stderr, "purge")) // the bar
	is.Equal(h.counts(), counts{messages: 3, groups: 1})

	// Piped with --yes: quiet on stderr; JSON.
	h.publish(tr, "g", 0, 20) // exactly two batches: the group's row goes with the second
	r = h.ok("", "purge", "g", "--yes", "--batch", "10", "--json")
	is.Equal(r.stderr, "")
	var p struct {
		Group  string
		Purged int64
	}
	decode(t, r.stdout, &p)
	is.Equal(p.Group, "g")
	is.Equal(p.Purged, int64(20))
	is.Equal(h.counts(), counts{messages: 3, groups: 1}) // "other" untouched
	h.fails(exitNotFound, "", []string{"purge", "g", "--yes"}, "unknown group")
	h.fails(exitUsage, "", []string{"purge", "other", "--yes", "--batch", "0"}, "--batch 0")
}

func TestDead(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	h.deadLetters(12)

	r := h.ok("", "dead", "list", "--limit", "5")
	golden(t, "dead_list.golden", normTable(t, r.stdout))
	is.Equal(r.stderr, "(more may follow: --after 5)\n")
	var ds []deadJSON
	decode(t, h.ok("", "dead", "list", "--after", "5", "--limit", "100", "--json").stdout, &ds)
	is.Equal(len(ds), 7)
	is.Equal(ds[0].Seq, int64(6))
	is.Equal(ds[0].Group, "dead-06")
	is.Equal(ds[0].Event, "dead-06-1")
	is.Equal(ds[0].LastError, "boom dead-06")
	is.Equal(ds[0].Attempts, 1)
	decode(t, h.ok("", "dead", "list", "--group", "dead-03", "--json").stdout, &ds)
	is.Equal(len(ds), 1)
	is.Equal(ds[0].Seq, int64(3))

	// Redrive chosen seqs, then one group.
	var n map[string]int64
	decode(t, h.ok("", "dead", "redrive", "--seq", "1,2", "--seq", "7", "--json").stdout, &n)
	is.Equal(n["redriven"], int64(3))
	is.Equal(h.ok("", "dead", "redrive", "--group", "dead-04").stdout, "redriven 1 dead letters\n")
	is.Equal(h.counts(), counts{messages: 4, groups: 4, dead: 8})
	var ms []peekJSON
	decode(t, h.ok("", "peek", "dead-07", "--json").stdout, &ms)
	is.Equal(ms[0].Seq, int64(7)) // back with its own seq

	// Purge: --yes required when piped; one group; then the rest in batches.
	h.fails(exitUsage, "", []string{"dead", "purge"}, "Delete every dead letter?", "pass --yes")
	is.Equal(h.ok("", "dead", "purge", "--group", "dead-05", "--yes").stdout, "purged 1 dead letters\n")
	is.Equal(h.counts().dead, int64(7))
	r = h.ok("", "dead", "purge", "--yes", "--batch", "3")
	is.Equal(r.stdout, "purged 7 dead letters\n")
	is.Equal(r.stderr, "") // no bar when piped
	is.Equal(h.counts(), counts{messages: 4, groups: 4, dead: 0})
	is.Equal(h.ok("", "dead", "list").stdout, "SEQ  GROUP  PRIORITY  ATTEMPTS  DIED  LAST ERROR  EVENT\n") // empty

	h.fails(exitUsage, "", []string{"dead", "redrive", "--seq", "0"}, "seqs are positive")
	h.fails(exitUsage, "", []string{"dead", "list", "--limit", "10001"}, "--limit 10001")
}

// TestDeadRedriveInterrupt: Ctrl-C during a batch lets it finish whole,
// then stops before the next: exit 130, and only whole batches redriven.
func TestDeadRedriveInterrupt(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	h.deadLetters(25)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := &env{stderrTTY: true, beforeBatch: func(n int) {
		if n == 2 {
			cancel() // Ctrl-C as the second batch starts
		}
	}}
	r := h.runEnv(ctx, e, "dead", "redrive", "--batch", "10")
	is.Equal(r.code, exitInterrupted)
	is.Equal(r.stdout, "")
	is.True(strings.Contains(r.stderr, "interrupted: 20 dead letters redriven in 2 batches; the rest are untouched"))
	is.Equal(h.counts(), counts{messages: 20, groups: 20, dead: 5}) // two whole batches, not one more message
	var ds []deadJSON
	decode(t, h.ok("", "dead", "list", "--json").stdout, &ds)
	is.Equal(ds[0].Seq, int64(21)) // the first 20 went, in seq order

	// Run again: it goes on with the rest.
	is.Equal(h.ok("", "dead", "redrive", "--batch", "10").stdout, "redriven 5 dead letters\n")
	is.Equal(h.counts(), counts{messages: 25, groups: 25})
}

func TestPublish(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	in := `{"group":"a","event":"one"}

{"group":"a","event":{"n": 2, "s": "two"}, "dedup_key":"k"}
  {"group":"b","event":"x","priority":3,"tenant":"acme"}
{"group":"a","event":"dup","dedup_key":"k"}
{"group":"a","event":""}
`
	var p struct {
		Published int
		Seqs      []int64
	}
	decode(t, h.ok(in, "publish", "--json", "--batch", "2").stdout, &p)
	is.Equal(p.Published, 5)
	is.Equal(p.Seqs[:3], []int64{1, 2, 3})
	is.Equal(p.Seqs[3], int64(2)) // the dedup key's first seq
	var ts []tenantJSON
	decode(t, h.ok("", "tenants", "--json").stdout, &ts)
	is.Equal(len(ts), 2)
	is.Equal(ts[0].Tenant, "acme") // b's tenant, from its line
	is.Equal(ts[0].Groups, int64(1))
	is.Equal(ts[1].Groups, int64(1)) // a, in the default tenant
	var ms []peekJSON
	decode(t, h.ok("", "peek", "a", "--json").stdout, &ms)
	is.Equal(len(ms), 3)
	is.Equal(ms[0].Event, "one")
	is.Equal(ms[1].Event, `{"n":2,"s":"two"}`) // a JSON value as its compact text
	is.Equal(ms[2].Event, "")
	var g groupJSON
	decode(t, h.ok("", "group", "b", "--json").stdout, &g)
	is.Equal(g.Priority, 3)
	is.Equal(h.ok("", "publish").stdout, "published 0 messages\n") // empty input

	r := h.ok(`{"group":"c","event":"x"}`+"\n", "publish") // piped: no bar
	is.Equal(r.stdout, "published 1 messages\n")
	is.Equal(r.stderr, "")
}

// TestPublishBadInput: a bad line anywhere is named, exit 2, and nothing
// of the input is published, the good lines before it included.
func TestPublishBadInput(t *testing.T) {
	t.Parallel()
	h := newHarness(t, true)
	good := strings.Repeat(`{"group":"g","event":"e"}`+"\n", 3)
	for _, c := range []struct {
		line string
		want string
	}{
		{`{"group":"g","event":"e"`, "line 4: not a JSON object of a message"},
		{`not json`, "line 4: not a JSON object"},
		{`["g","e"]`, "line 4: not a JSON object"},
		{`{"group":"g","event":"e"} {"group":"g","event":"e"}`, "line 4: more than one JSON value"},
		{`{"event":"e"}`, `line 4: no "group"`},
		{`{"group":"g"}`, `line 4: no "event"`},
		{`{"group":"g","event":null}`, `line 4: no "event"`},
		{`{"group":"","event":"e"}`, "line 4: pgtransport: invalid group id"},
		{`{"group":"a\u0000b","event":"e"}`, "line 4: pgtransport: invalid group id"},
		{`{"group":"` + strings.Repeat("x", 1025) + `","event":"e"}`, "line 4: pgtransport: invalid group id"},
		{`{"group":"g","event":"e\u0000"}`, "line 4: pgtransport: invalid event"},
		{`{"group":"g","event":"e","priority":5}`, "line 4: pgtransport: invalid priority: 5"},
		{`{"group":"g","event":"e","priority":"high"}`, "line 4: not a JSON object"},
		{`{"group":"g","event":"e","dedup_key":"` + strings.Repeat("k", 257) + `"}`, "line 4: pgtransport: invalid dedup key"},
		{`{"group":"g","event":"e","tenant":"` + strings.Repeat("t", 257) + `"}`, "line 4: pgtransport: invalid tenant"},
		{`{"group":"g","event":"e","dedupkey":"k"}`, `line 4: not a JSON object of a message: json: unknown field "dedupkey"`},
		{"{\"group\":\"g\xff\",\"event\":\"e\"}", "line 4: not valid UTF-8"},
	} {
		in := good + c.line + "\n" + good
		h.fails(exitUsage, in, []string{"publish", "--batch", "2"}, c.want, "nothing was published")
	}
	h.fails(exitUsage, good+`{"group":"g","event":"eleven bytes"}`+"\n", []string{"publish", "--max-event-bytes", "10"}, "line 4: pgtransport: event too large: 12 bytes, the limit is 10")
	r := h.fails(exitUsage, strings.Repeat("bad\n", 15), []string{"publish"}, "15 bad input lines", "line 1:", "line 10:", "(and 5 more bad lines)")
	if strings.Contains(r.stderr, "line 11:") {
		t.Errorf("stderr names more than 10 bad lines: %s", r.stderr)
	}
	if c := h.counts(); c != (counts{}) {
		t.Fatalf("counts %+v: bad input wrote", c)
	}
}

// TestPublishInterrupt: Ctrl-C between batches leaves whole batches, and
// says where the input stopped.
func TestPublishInterrupt(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	var in strings.Builder
	for i := range 25 {
		fmt.Fprintf(&in, `{"group":"g%d","event":"e"}`+"\n", i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := &env{stdin: strings.NewReader(in.String()), beforeBatch: func(n int) {
		if n == 2 {
			cancel()
		}
	}}
	r := h.runEnv(ctx, e, "publish", "--batch", "10")
	is.Equal(r.code, exitInterrupted)
	is.True(strings.Contains(r.stderr, "interrupted: the first 20 messages, up to line 20, were published in 2 batches; the rest were not"))
	is.Equal(h.counts(), counts{messages: 20, groups: 20})
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	tr := h.transport(pgtransport.Config{})
	h.publish(tr, "a", 0, 3)
	h.publish(tr, "b", 2, 4)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &syncBuffer{}
	var stdout strings.Builder
	done := make(chan int, 1)
	go func() {
		args := []string{"--dsn=" + testDSN(), "--schema=" + h.schema, "metrics", "--addr", "127.0.0.1:0", "--queue", "jobs"}
		done <- run(ctx, args, &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: stderr, getenv: func(string) string { return "" }})
	}()
	var url string
	deadline := time.After(10 * time.Second)
	for url == "" {
		if _, rest, ok := strings.Cut(stderr.String(), "serving metrics on "); ok {
			url, _, _ = strings.Cut(rest, "\n")
			break
		}
		select {
		case code := <-done:
			t.Fatalf("metrics exited %d: %s", code, stderr.String())
		case <-deadline:
			t.Fatalf("metrics did not start: %s", stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	resp, err := http.Get(url)
	is.NoErr(err)
	body, err := io.ReadAll(resp.Body)
	is.NoErr(err)
	is.NoErr(resp.Body.Close())
	is.Equal(resp.StatusCode, 200)
	is.True(strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain")) // Prometheus text
	text := string(body)
	// The depth gauge, per priority, for this queue.
	depth := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "pgtransport_queue_messages") && strings.Contains(line, `messaging_destination_name="jobs"`) {
			i := strings.Index(line, `pgtransport_priority="`)
			is.True(i >= 0) // per priority
			p := line[i+len(`pgtransport_priority="`):][:1]
			depth[p] = line[strings.LastIndex(line, " ")+1:]
		}
	}
	is.Equal(depth, map[string]string{"0": "3", "1": "0", "2": "4", "3": "0", "4": "0"})
	cancel() // Ctrl-C
	select {
	case code := <-done:
		is.Equal(code, 0) // a clean stop
	case <-time.After(10 * time.Second):
		t.Fatal("metrics did not stop")
	}
}

// TestPublishInterruptedReading: Ctrl-C before the input is read whole
// publishes nothing.
func TestPublishInterruptedReading(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := h.runEnv(ctx, &env{stdin: strings.NewReader(`{"group":"g","event":"e"}` + "\n")}, "publish")
	is.Equal(r.code, exitInterrupted)
	is.Equal(r.stderr, "pgtransport: interrupted while reading stdin: nothing was published\n")
	is.Equal(h.counts(), counts{})
}
