package schema_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// catalog is a fingerprint of everything Apply creates: each object and the
// transaction that last wrote its catalog row.
func catalog(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	var s string
	err := db.Pool.QueryRow(ctx(t), `
		SELECT string_agg(x, ',' ORDER BY x) FROM (
			SELECT 'proc:' || proname || ':' || xmin::text AS x FROM pg_proc WHERE pronamespace = $1::regnamespace
			UNION ALL
			SELECT 'rel:' || relname || ':' || xmin::text FROM pg_class WHERE relnamespace = $1::regnamespace
			UNION ALL
			SELECT 'trg:' || tgname || ':' || xmin::text FROM pg_trigger WHERE tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = $1::regnamespace)
			UNION ALL
			SELECT 'ver:' || version FROM transport_schema_version) s`, db.Schema).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestApplyTwiceChangesNothing(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	before := catalog(t, db)
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	is.Equal(catalog(t, db), before) // no catalog row rewritten
	tx, err := db.Pool.Begin(ctx(t))
	is.NoErr(err)
	defer tx.Rollback(ctx(t))
	v, err := schema.CurrentVersion(ctx(t), tx, db.Schema)
	is.NoErr(err)
	is.Equal(v, schema.Version()) // the version is recorded
}

func TestConcurrentApply(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	target := db.Schema + "_fresh" // does not exist yet: CREATE SCHEMA races too
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{target}.Sanitize()+" CASCADE")
	})
	const n = 20
	errs := make(chan error, n)
	start := make(chan struct{})
	for range n {
		go func() {
			conn, err := pgx.Connect(ctx(t), db.DSN) // 20 separate connections
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.Background())
			<-start
			errs <- schema.Apply(ctx(t), conn, target)
		}()
	}
	close(start)
	for range n {
		is.NoErr(<-errs) // every concurrent Apply succeeds
	}
	var versions int
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM `+pgx.Identifier{target, "transport_schema_version"}.Sanitize()).Scan(&versions))
	is.Equal(versions, schema.Version()) // each version applied exactly once
}

func TestUpgradeFromV1(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	load(t, db, shipped(t, 1))
	fixture, err := os.ReadFile("../testdata/v1_state.sql")
	is.NoErr(err)
	_, err = db.Pool.Exec(ctx(t), string(fixture))
	is.NoErr(err) // the v1 data loads into a v1 schema

	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema)) // upgrade in place
	tx, err := db.Pool.Begin(ctx(t))
	is.NoErr(err)
	v, err := schema.CurrentVersion(ctx(t), tx, db.Schema)
	is.NoErr(err)
	_ = tx.Rollback(ctx(t))
	is.Equal(v, schema.Version())

	// Everything v1 held is still served, leases and parks included.
	claim := func(now float64) (group, event string) {
		t.Helper()
		err := db.Pool.QueryRow(ctx(t), `SELECT group_id, event FROM harel_claim($1::float8, $1::float8 + 60, 'new:1', 0)`, now).Scan(&group, &event)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", ""
		}
		is.NoErr(err)
		return group, event
	}
	g, e := claim(1800000000)
	is.Equal(g+"/"+e, "free/free-1") // the free group first
	g, _ = claim(1800000000)
	is.Equal(g, "") // parked and in-flight groups stay held
	g, e = claim(1800000060)
	is.Equal(g+"/"+e, "parked/parked-1") // the park ended
	g, e = claim(1800000200)
	g2, e2 := claim(1800000200)
	// Our own lease (to ...060) and v1's (to ...100) lapsed: both
	// redelivered, in the sweep's order (see "The sweep" in
	// functions/30_claim.sql).
	is.Equal(slices.Sorted(slices.Values([]string{g + "/" + e, g2 + "/" + e2})), []string{"free/free-1", "inflight/inflight-1"})
	var ok bool
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT harel_publish('free', 'free-3', 0) > 0`).Scan(&ok))
	is.True(ok) // v2 functions work on v1 data
}

func TestScriptLoadsWithPsql(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal("psql not found: install the PostgreSQL client (apt-get install postgresql-client)")
	}
	db := pgtest.New(t, 2)
	run := func() {
		t.Helper()
		cmd := exec.CommandContext(ctx(t), psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db.DSN, "-f", "-")
		cmd.Env = append(os.Environ(), "PGOPTIONS=-c search_path="+db.Schema)
		cmd.Stdin = strings.NewReader(schema.SQL())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("psql: %v\n%s", err, out)
		}
	}
	run()
	run() // loading it again over itself is fine
	var n int
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM transport_schema_version`).Scan(&n))
	is.Equal(n, schema.Version())
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema)) // Apply sees it as current
	var seq int64
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT harel_publish('g', 'e', 0)`).Scan(&seq))
}

func TestInvalidSchemaName(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, 2)
	for _, name := range []string{"a\x00b", strings.Repeat("x", 64), "pg_evil", "bad\xff"} {
		is := is.New(t)
		err := schema.Apply(ctx(t), db.Pool, name)
		is.True(errors.Is(err, pgtransport.ErrInvalidSchema)) // refused before any SQL runs
	}
}

func TestApplyNilHandle(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	is.True(errors.Is(schema.Apply(ctx(t), nil, "x"), pgtransport.ErrInvalidConfig))
	is.True(errors.Is(schema.Apply(ctx(t), (*pgx.Conn)(nil), "x"), pgtransport.ErrInvalidConfig)) // typed nil too
}

func TestHostileSchemaNameIsQuoted(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	name := db.Schema + `"; DROP SCHEMA public; --`
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	})
	is.NoErr(schema.Apply(ctx(t), db.Pool, name))
	var n int
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, name).Scan(&n))
	is.Equal(n, 1) // the name is a name, not SQL
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM pg_namespace WHERE nspname = 'public'`).Scan(&n))
	is.Equal(n, 1)
}

// TestSearchPathPinned plants look-alike tables earlier on the caller's
// search_path: the functions must still use their own.
func TestSearchPathPinned(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	evil := db.Schema + "_evil"
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{evil}.Sanitize()+" CASCADE")
	})
	_, err := db.Pool.Exec(ctx(t), `CREATE SCHEMA `+pgx.Identifier{evil}.Sanitize())
	is.NoErr(err)
	tx, err := db.Pool.Begin(ctx(t))
	is.NoErr(err)
	defer tx.Rollback(ctx(t))
	_, err = tx.Exec(ctx(t), `SELECT set_config('search_path', $1, true)`, pgx.Identifier{evil}.Sanitize()+", "+pgx.Identifier{db.Schema}.Sanitize())
	is.NoErr(err)
	e := pgx.Identifier{evil}.Sanitize()
	_, err = tx.Exec(ctx(t), `
		CREATE TABLE `+e+`.transport_groups (group_id text, locked_by text, lock_expiry float8, priority int);
		CREATE TABLE `+e+`.transport_messages (seq bigint, group_id text, event text);
		CREATE TEMP TABLE transport_messages (seq bigint, group_id text, event text);
		INSERT INTO `+e+`.transport_groups VALUES ('planted', NULL, NULL, 0);
		INSERT INTO `+e+`.transport_messages VALUES (1, 'planted', 'planted');
		INSERT INTO pg_temp.transport_messages VALUES (1, 'planted', 'planted')`)
	is.NoErr(err)
	fn := pgx.Identifier{db.Schema}.Sanitize()
	_, err = tx.Exec(ctx(t), `SELECT `+fn+`.harel_publish('real', 'real', 0)`)
	is.NoErr(err)
	var group, event string
	is.NoErr(tx.QueryRow(ctx(t), `SELECT group_id, event FROM `+fn+`.harel_claim(1, 100, 'w:1', 0)`).Scan(&group, &event))
	is.Equal(group+"/"+event, "real/real") // the planted rows were not read
	var n int
	is.NoErr(tx.QueryRow(ctx(t), `SELECT count(*) FROM `+pgx.Identifier{evil, "transport_messages"}.Sanitize()).Scan(&n))
	is.Equal(n, 1) // nor written
	is.NoErr(tx.QueryRow(ctx(t), `SELECT count(*) FROM pg_temp.transport_messages`).Scan(&n))
	is.Equal(n, 1) // nor the temporary look-alike
}

// explained opens a connection to db's schema on which auto_explain
// reports the plan of every statement, those inside functions too; plans
// collects them as they arrive.
func explained(t *testing.T, db *pgtest.DB) (*pgx.Conn, *[]string) {
	t.Helper()
	plans := new([]string)
	cfg, err := pgx.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = db.Schema
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { *plans = append(*plans, n.Message) }
	c, err := pgx.ConnectConfig(ctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	if _, err := c.Exec(ctx(t), `LOAD 'auto_explain'`); err != nil {
		t.Fatalf("auto_explain (PostgreSQL contrib) is needed to see the plans inside the functions: %v", err)
	}
	if _, err := c.Exec(ctx(t), `SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;
		SET auto_explain.log_level = notice; SET client_min_messages = notice`); err != nil {
		t.Fatal(err)
	}
	return c, plans
}

// TestClaimWalksIndex shows each of the claim's picks walks an index,
// with no Sort, at 100k groups: the plans of the statements inside
// harel_claim, as auto_explain reports them. With entries in the ready
// log, the due index, the log's and the group rows' primary keys; with
// none, the due index and the sweep's slot index.
func TestClaimWalksIndex(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	_, err := db.Pool.Exec(ctx(t), `
		INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
		SELECT 'g' || i, CASE WHEN i % 3 = 0 THEN 'w:x' END, CASE WHEN i % 3 = 0 THEN 1e10 ELSE i END, i % 5
		  FROM generate_series(1, 100000) AS i;
		INSERT INTO transport_messages (group_id, event) SELECT 'g' || i, 'e' FROM generate_series(1, 100000) AS i;
		ANALYZE transport_groups; ANALYZE transport_messages; ANALYZE transport_ready`)
	is.NoErr(err)

	walks := func() map[string]bool {
		t.Helper()
		c, plans := explained(t, db)
		for range 3 { // past any first-call planning
			rows, err := c.Query(ctx(t), `SELECT * FROM harel_claim(1e9, 1e9 + 60, 'w:probe', 0)`)
			is.NoErr(err)
			rows.Close()
			is.NoErr(rows.Err())
		}
		walked := map[string]bool{}
		for _, p := range *plans {
			if (strings.Contains(p, "FROM transport_groups AS c") || strings.Contains(p, "FROM transport_ready AS r")) && strings.Contains(p, "SKIP LOCKED") {
				is.True(!strings.Contains(p, "Sort")) // no Sort of the groups or the log
				for _, index := range []string{"transport_groups_sweep", "transport_groups_due", "transport_groups_pkey", "transport_ready_pkey"} {
					if strings.Contains(p, index) {
						walked[index] = true
					}
				}
			}
		}
		if len(*plans) == 0 {
			t.Fatalf("no plan for the group pick among %d notices:\n%s", len(*plans), strings.Join(*plans, "\n---\n"))
		}
		return walked
	}
	// Each of the claim's walks (see "The ready log" and "The sweep" in
	// functions/30_claim.sql) is an index's: due groups, then the log, and
	// (the limit reached) the reap's walk of the next slots.
	is.Equal(walks(), map[string]bool{"transport_groups_due": true, "transport_ready_pkey": true, "transport_groups_pkey": true, "transport_groups_sweep": true})
	_, err = db.Pool.Exec(ctx(t), `DELETE FROM transport_ready`)
	is.NoErr(err)
	// An empty log: due groups, the log (nothing), then the sweep in slot
	// order.
	is.Equal(walks(), map[string]bool{"transport_groups_due": true, "transport_ready_pkey": true, "transport_groups_sweep": true})
}

// TestParallelClaimsDoNotWait holds N claim transactions open at once, each
// on its own connection: every one must return a different group without
// waiting on the others' row locks.
func TestParallelClaimsDoNotWait(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	const n = 8
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	_, err := db.Pool.Exec(ctx(t), `SELECT harel_publish('g' || i, 'e', 0) FROM generate_series(1, 20) AS i`)
	is.NoErr(err)
	seen := map[string]bool{}
	var txs []pgx.Tx
	for i := range n {
		conn, err := pgx.Connect(ctx(t), db.DSN)
		is.NoErr(err)
		t.Cleanup(func() { conn.Close(context.Background()) })
		tx, err := conn.Begin(ctx(t))
		is.NoErr(err)
		txs = append(txs, tx)
		_, err = tx.Exec(ctx(t), `SET LOCAL lock_timeout = '2s'`) // a waiting claim would fail, not hang
		is.NoErr(err)
		_, err = tx.Exec(ctx(t), `SELECT set_config('search_path', $1, true)`, db.Schema)
		is.NoErr(err)
		var group string
		start := time.Now()
		is.NoErr(tx.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1, 100, $1, 0)`, "w:"+string(rune('a'+i))).Scan(&group))
		is.True(time.Since(start) < time.Second) // no claim waited on another's lock
		is.True(!seen[group])                    // each leased a different group
		seen[group] = true
	}
	for _, tx := range txs {
		is.NoErr(tx.Commit(ctx(t)))
	}
	var leased int
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups WHERE locked_by IS NOT NULL`).Scan(&leased))
	is.Equal(leased, n)
}

// TestPlainSQLPublishRacesDrain publishes exactly as the design writes it
// (two plain statements in one transaction, as a client in another language
// would) while harel_ack drains the group: the message must never be left
// without a group row, and the next claim hands it out (where the ack's
// mark came after the publish's group insert, the claim reads the head
// under the mark: "Kept rows" in functions/30_claim.sql).
func TestPlainSQLPublishRacesDrain(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 4))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	const rounds = 600 // each round is the race: about 15 s under -race
	for r := range rounds {
		group := "g" + strconv.Itoa(r)
		_, err := db.Pool.Exec(ctx(t), `SELECT harel_publish($1, 'm1', 0)`, group)
		is.NoErr(err)
		var seq int64
		is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT seq FROM harel_claim(1, 100, 'w:1', 0)`).Scan(&seq))
		done := make(chan error, 1)
		go func() {
			done <- pgx.BeginFunc(ctx(t), db.Pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ($1, 'm2')`, group); err != nil {
					return err
				}
				_, err := tx.Exec(ctx(t), `INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority) VALUES ($1, NULL, NULL, 0) ON CONFLICT (group_id) DO NOTHING`, group)
				return err
			})
		}()
		var held bool
		is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w:1', 2)`, group, seq).Scan(&held))
		is.True(held)
		is.NoErr(<-done)
		var event string
		err = db.Pool.QueryRow(ctx(t), `SELECT seq, event FROM harel_claim(3, 100, 'w:1', 0)`).Scan(&seq, &event)
		if err != nil {
			t.Fatalf("round %d: the plain-SQL publish was stranded: %v", r, err)
		}
		is.Equal(event, "m2")
		is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w:1', 4)`, group, seq).Scan(&held))
	}
}

// TestNoSeqScanUnanalyzed runs every function that touches the queue's
// tables on tables that were never analyzed and grow from empty, as a new
// queue's do where autovacuum has not run: no statement inside may scan a
// table whole (planned as tiny, "group_id = ANY (array)" became a scan
// testing every row against every element), as auto_explain reports them.
func TestNoSeqScanUnanalyzed(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c, plans := explained(t, db)
	run := func(q string, args ...any) [][]any {
		t.Helper()
		rows, err := c.Query(ctx(t), q, args...)
		is.NoErr(err)
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
		is.NoErr(err)
		return got
	}
	const now = 1e9
	for round := range 2 { // the first round plans on empty tables; the second runs those plans on full ones
		n := 2000
		groups, events, prios := make([]string, n), make([]string, n), make([]int32, n)
		for i := range n {
			groups[i], events[i] = "r"+strconv.Itoa(round)+"-g"+strconv.Itoa(i), "e"
		}
		run(`SELECT harel_publish_many($1, $2, $3)`, groups, events, prios)
		claimed := run(`SELECT * FROM harel_exchange($1::float8, $1::float8 + 60, 'w:a', 0, 500, '{}', '{}', '{}', '{}')`, now+float64(round))
		is.Equal(len(claimed), 500)
		var gs, toks []string
		var seqs []int64
		var keeps []bool
		for _, r := range claimed {
			gs, seqs, toks, keeps = append(gs, r[1].(string)), append(seqs, r[3].(int64)), append(toks, "w:a"), append(keeps, len(gs)%2 == 0)
		}
		run(`SELECT * FROM harel_exchange($1::float8, $1::float8 + 60, 'w:b', 0, 10, $2, $3, $4, $5)`, now+float64(round), gs, seqs, toks, keeps)
		one := run(`SELECT * FROM harel_claim($1::float8, $1::float8 + 60, 'w:c')`, now+float64(round))
		is.Equal(len(one), 1)
		run(`SELECT harel_ack($1, $2, 'w:c', $3)`, one[0][0], one[0][1], now+float64(round))
		two := run(`SELECT * FROM harel_claim($1::float8, $1::float8 + 60, 'w:d')`, now+float64(round))
		is.Equal(len(two), 1)
		run(`SELECT harel_extend($1, 'w:d', $2)`, two[0][0], now+float64(round)+120)
		run(`SELECT harel_nack($1, 'w:d', $2, 0)`, two[0][0], now+float64(round))
		run(`SELECT harel_publish('x', 'e', 0)`)
		run(`SELECT harel_wait('waiter', 0, 10, $1)`, now+float64(round))
	}
	is.True(len(*plans) > 20) // auto_explain reported the statements inside the functions
	for _, p := range *plans {
		if strings.Contains(p, "Seq Scan on transport_groups ") || strings.Contains(p, "Seq Scan on transport_messages ") { // the tables, not the sequence transport_groups_slot
			t.Errorf("a statement scans a whole table:\n%s", p)
		}
	}
}
