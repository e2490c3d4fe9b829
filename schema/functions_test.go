package schema_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// inlined are the helpers the planner inlines into their callers'
// statements (see the head of functions/10_guard.sql): LANGUAGE sql, one
// expression, no setting. A function belongs here only if TestGuardInlined
// shows it inlined; every other function pins the four settings.
var inlined = []string{"harel_group_lock_key", "harel_guard_class", "harel_try_guard", "harel_share_guard", "harel_clock_skewed", "harel_group_state", "harel_ready_place"}

// lockOnly are the trigger functions that pin search_path alone (see
// harel_hold_group in functions/10_guard.sql): they run once per row, read
// no table and evaluate one plain expression, so the planner settings could
// change nothing there and would cost their setting and resetting on every
// row.
var lockOnly = []string{"harel_hold_group", "harel_home"}

// messagePath are the functions files whose functions also turn bitmap
// scans and merge joins off (see "The message path" and "Plans that probe"
// in functions/10_guard.sql; TestClaimWalksTheSlotsOnce,
// TestPlansProbeAnEmptyLookingQueue).
var messagePath = []string{"20_publish.sql", "25_ready.sql", "30_claim.sql", "40_ack.sql", "50_fail.sql",
	"55_keyed_publish.sql", "60_nack_extend.sql", "75_state.sql", "80_wakeups.sql"}

var fileHead = regexp.MustCompile(`^-- (\d\d_\w+\.sql): `)

// fileOf maps each function to the functions file that defines it, read
// from the files' first lines ("-- NN_name.sql: ...") in schema.Functions.
func fileOf() map[string]string {
	files := map[string]string{}
	file := ""
	for _, l := range strings.Split(schema.Functions(), "\n") {
		if m := fileHead.FindStringSubmatch(l); m != nil {
			file = m[1]
		}
		if fn, ok := strings.CutPrefix(l, "CREATE OR REPLACE FUNCTION "); ok {
			fn, _, _ = strings.Cut(fn, "(")
			files[fn] = file
		}
	}
	return files
}

// TestPinnedSettings checks the functions' invariant (the head of
// functions/10_guard.sql) from the catalog: every function but the inlined
// helpers and lockOnly pins search_path (the schema, then pg_temp),
// plan_cache_mode, enable_seqscan and jit, so a new
// function that forgets one fails here; the helpers pin none and are
// LANGUAGE sql, or the planner would not inline them; lockOnly pin
// search_path and name no queue table; the message path's pin bitmap
// scans and merge joins off too.
func TestPinnedSettings(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	rows, err := db.Pool.Query(ctx(t), `
		SELECT p.proname, l.lanname, COALESCE(p.proconfig, '{}'), p.prosecdef, p.prosrc
		  FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang
		 WHERE p.pronamespace = $1::regnamespace
		 ORDER BY p.proname`, db.Schema)
	is.NoErr(err)
	type fn struct {
		Name, Lang string
		Config     []string
		SecDef     bool
		Body       string
	}
	fns, err := pgx.CollectRows(rows, pgx.RowToStructByPos[fn])
	is.NoErr(err)
	want := []string{
		"search_path=" + db.Schema + ", pg_temp", // a test schema's name needs no quotes
		"plan_cache_mode=force_generic_plan",
		"enable_seqscan=off",
		"jit=off",
	}
	files := fileOf()
	var helpers, pinned, path int
	for _, f := range fns {
		if slices.Contains(inlined, f.Name) {
			helpers++
			if f.Lang != "sql" || len(f.Config) > 0 || f.SecDef {
				t.Errorf("%s is an inlined helper: it must be LANGUAGE sql with no SET clause and not SECURITY DEFINER, or the planner calls it instead of inlining it (language %s, settings %q)", f.Name, f.Lang, f.Config)
			}
			continue
		}
		if slices.Contains(lockOnly, f.Name) {
			if !slices.Equal(f.Config, want[:1]) || strings.Contains(f.Body, "transport_") {
				t.Errorf("%s may skip the planner settings only while it pins search_path alone and runs no query on a queue table (settings %q)", f.Name, f.Config)
			}
			continue
		}
		pinned++
		want := want
		if slices.Contains(messagePath, files[f.Name]) {
			path++
			want = append(slices.Clone(want), "enable_bitmapscan=off", "enable_mergejoin=off")
		}
		if !slices.Equal(slices.Sorted(slices.Values(f.Config)), slices.Sorted(slices.Values(want))) {
			t.Errorf("%s pins %q; every function that touches the queue tables, every trigger function and every function a client calls must pin exactly %q (in its definition in schema/sql/functions/)", f.Name, f.Config, want)
		}
	}
	is.Equal(helpers, len(inlined)) // every helper named above exists
	is.True(pinned >= 13)           // the protocol's functions were all read
	is.True(path >= 30)             // and the message path's files were found
}

// TestGuardInlined runs every path that takes the lost-publish guard's lock
// (a publish's trigger, an ack, a batch ack and both claims draining a
// group) with function-call tracking on: the helpers must never run as
// calls of their own. PostgreSQL tracks every call of a SQL function except
// one inlined into its caller's statement, so a helper that appears in
// pg_stat_xact_user_functions was not inlined and costs a call per row.
func TestGuardInlined(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	tx, err := c.Begin(ctx(t))
	is.NoErr(err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx(t), `SET LOCAL track_functions = 'all'`); err != nil {
		t.Fatalf("track_functions needs a superuser connection: %v", err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		_, err := tx.Exec(ctx(t), q, args...)
		is.NoErr(err)
	}
	groups := func() int {
		var n int
		is.NoErr(tx.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups`).Scan(&n))
		return n
	}

	// A publish (the trigger's shared lock), then an ack that drains the
	// group, whose row carries a state (a drained row without one is kept,
	// with no lock: see "Kept rows" in 30_claim.sql): its row is deleted
	// only after the try-lock.
	var seq int64
	is.NoErr(tx.QueryRow(ctx(t), `SELECT harel_publish('a', 'e', 0)`).Scan(&seq))
	exec(`SELECT * FROM harel_claim(1, 100, 'w:1', 0)`)
	var held bool
	is.NoErr(tx.QueryRow(ctx(t), `SELECT harel_ack_state('a', $1, 'w:1', 2, '\x01')`, seq).Scan(&held))
	is.True(held)
	is.Equal(groups(), 0) // harel_ack took the try-lock and deleted the row

	// The same through a batch: harel_publish_many, harel_exchange.
	var seqs []int64
	rows, err := tx.Query(ctx(t), `SELECT harel_publish_many('{b,c}', '{e,e}', '{0,0}')`)
	is.NoErr(err)
	seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	is.NoErr(err)
	exec(`SELECT * FROM harel_claim_many(3, 100, 'w:2', 0, 10)`)
	exec(`UPDATE transport_groups SET state = '\x01'`)
	exec(`SELECT * FROM harel_exchange(4, 100, 'w:2', 0, 0, '{b,c}', $1, '{w:2,w:2}', '{false,false}')`, seqs)
	is.Equal(groups(), 0) // harel_exchange took the try-locks and deleted the rows

	// Empty group rows (a publisher that rolled back while a drainer had to
	// free its group leaves one): both claims delete them after the
	// try-lock.
	exec(`INSERT INTO transport_groups (group_id) VALUES ('d')`)
	exec(`SELECT * FROM harel_claim(5, 100, 'w:3', 0)`)
	is.Equal(groups(), 0) // harel_claim took the try-lock and deleted the empty row
	exec(`INSERT INTO transport_groups (group_id) VALUES ('e')`)
	exec(`SELECT * FROM harel_claim_many(6, 100, 'w:4', 0, 10)`)
	is.Equal(groups(), 0) // harel_claim_many took the try-lock and deleted the empty row

	rows, err = tx.Query(ctx(t), `SELECT funcname::text FROM pg_stat_xact_user_functions WHERE schemaname = $1 AND calls > 0`, db.Schema)
	is.NoErr(err)
	called, err := pgx.CollectRows(rows, pgx.RowTo[string])
	is.NoErr(err)
	for _, f := range []string{"harel_hold_group", "harel_ack", "harel_exchange", "harel_claim", "harel_claim_many"} {
		is.True(slices.Contains(called, f)) // tracking sees the callers
	}
	for _, f := range inlined {
		if slices.Contains(called, f) {
			t.Errorf("%s ran as a call of its own, not inlined (calls tracked: %s)", f, strings.Join(called, ", "))
		}
	}
}

// TestRefusalsWordedAsShipped: the refusals that several functions share
// are raised by one helper each (harel_refuse_*, functions/15_checks.sql),
// which the caller names. Each call that reaches one is refused as the
// inline RAISE of version 14 refused it: the same SQLSTATE, message, detail
// and hint, so a helper given the wrong function's name, or a rewording,
// fails here.
func TestRefusalsWordedAsShipped(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	old, cur := pgtest.New(t, 2), pgtest.New(t, 2)
	load(t, old, shipped(t, 14)) // the last version that raised them inline
	is.NoErr(schema.Apply(ctx(t), cur.Pool, cur.Schema))
	var now float64
	is.NoErr(cur.Pool.QueryRow(ctx(t), `SELECT extract(epoch FROM clock_timestamp())::float8`).Scan(&now))
	fast := now + 3600
	for _, tc := range []struct {
		name, sql string
		args      []any
	}{
		{"ClaimToken", `SELECT * FROM harel_claim($1::float8, $1::float8 + 60, NULL, 0)`, []any{now}},
		{"ClaimLease", `SELECT * FROM harel_claim($1::float8, NULL, 'w', 0)`, []any{now}},
		{"ClaimSkew", `SELECT * FROM harel_claim($1::float8, $1::float8 + 60, 'w', 0)`, []any{fast}},
		{"ClaimManyToken", `SELECT * FROM harel_claim_many($1::float8, $1::float8 + 60, '', 0, 5)`, []any{now}},
		{"ClaimManyLease", `SELECT * FROM harel_claim_many($1::float8, $1::float8 - 1, 'w', 0, 5)`, []any{now}},
		{"ClaimManySkew", `SELECT * FROM harel_claim_many($1::float8, $1::float8 + 60, 'w', 0, 5)`, []any{fast}},
		{"ExchangeToken", `SELECT * FROM harel_exchange($1::float8, $1::float8 + 60, '', 0, 5, '{}', '{}', '{}', '{}')`, []any{now}},
		{"ExchangeLease", `SELECT * FROM harel_exchange($1::float8, $1::float8, 'w', 0, 5, '{}', '{}', '{}', '{}')`, []any{now}},
		{"ExchangeSkew", `SELECT * FROM harel_exchange($1::float8, $1::float8 + 60, 'w', 0, 5, '{}', '{}', '{}', '{}')`, []any{fast}},
		{"ExchangeLengths", `SELECT * FROM harel_exchange($1::float8, $1::float8 + 60, 'w', 0, 0, '{a}', '{}', '{}', '{}')`, []any{now}},
		{"AckSkew", `SELECT harel_ack('a', 1, 'w', $1::float8)`, []any{fast}},
		{"FailSkew", `SELECT harel_fail('a', 1, 'w', $1::float8, 'e')`, []any{fast}},
		{"NackSkew", `SELECT harel_nack('a', 'w', $1::float8, 0)`, []any{fast}},
		{"ExtendLease", `SELECT harel_extend('a', 'w', NULL)`, nil},
		{"ExtendManyLease", `SELECT * FROM harel_extend_many('{a}', '{1}', '{w}', $1::float8 - 60)`, []any{now}},
		{"ExtendManyLengths", `SELECT * FROM harel_extend_many('{a}', '{}', '{w}', $1::float8 + 60)`, []any{now}},
		{"PublishManyLengths", `SELECT harel_publish_many('{a}', '{}', '{}')`, nil},
		{"PublishKeyedLengths", `SELECT * FROM harel_publish_keyed('{a}', '{}', '{0}', '{k}', 60)`, nil},
		{"GroupUnknown", `SELECT * FROM harel_group($1::float8, 'nope')`, []any{now}},
		{"PeekUnknown", `SELECT * FROM harel_peek('nope', NULL, 10)`, nil},
		{"PauseUnknown", `SELECT harel_pause_group('nope')`, nil},
		{"ResumeUnknown", `SELECT harel_resume_group('nope')`, nil},
		{"PurgeSkew", `SELECT harel_purge_group('nope', $1::float8, NULL)`, []any{fast}},
		{"PurgeUnknown", `SELECT harel_purge_group('nope', $1::float8, NULL)`, []any{now}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refusal := func(db *pgtest.DB) *pgconn.PgError {
				t.Helper()
				_, err := db.Pool.Exec(ctx(t), tc.sql, tc.args...)
				pgErr, ok := errors.AsType[*pgconn.PgError](err)
				if !ok {
					t.Fatalf("%s: got %v, want a refusal", tc.sql, err)
				}
				return pgErr
			}
			want, got := refusal(old), refusal(cur)
			if got.Code != want.Code || got.Message != want.Message || got.Detail != want.Detail || got.Hint != want.Hint {
				t.Errorf("refused as\n  %s: %s (detail %q, hint %q)\nwant, as version 14:\n  %s: %s (detail %q, hint %q)",
					got.Code, got.Message, got.Detail, got.Hint, want.Code, want.Message, want.Detail, want.Hint)
			}
		})
	}
}
