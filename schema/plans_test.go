package schema_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// leadingColumn is the first column of each index of the queue's tables
// that the message path reads: a scan of one that does not bound that
// column reads the index from end to end.
var leadingColumn = map[string]string{
	"transport_messages_group": "group_id",
	"transport_messages_pkey":  "seq",
	"transport_groups_pkey":    "group_id",
	"transport_groups_sweep":   "slot",
	"transport_groups_due":     "retry_at",
	"transport_ready_pkey":     "vt",
	"transport_ready_tenant":   "tenant",
}

var indexScan = regexp.MustCompile(`(?:Index Only Scan|Index Scan|Bitmap Index Scan)(?: Backward)? (?:using|on) (\w+)`)

// unboundedScans reads auto_explain plans and returns the index scans of
// the queue's tables whose Index Cond does not name the index's leading
// column, and how many scans it read.
func unboundedScans(plans []string) (bad []string, scans int) {
	for _, plan := range plans {
		query := plan
		if _, after, ok := strings.Cut(plan, "Query Text:"); ok {
			query = after
		}
		query, _, _ = strings.Cut(strings.TrimSpace(query), "\n")
		lines := strings.Split(plan, "\n")
		for i, l := range lines {
			m := indexScan.FindStringSubmatch(l)
			if m == nil || leadingColumn[m[1]] == "" {
				continue
			}
			scans++
			indent := len(l) - len(strings.TrimLeft(l, " "))
			cond := ""
			for _, k := range lines[i+1:] {
				if len(k)-len(strings.TrimLeft(k, " ")) <= indent || strings.Contains(k, "->") {
					break
				}
				if c, ok := strings.CutPrefix(strings.TrimSpace(k), "Index Cond:"); ok {
					cond = c
				}
			}
			if !strings.Contains(cond, leadingColumn[m[1]]) {
				bad = append(bad, fmt.Sprintf("%s (Index Cond %q) in %q", m[1], cond, query))
			}
		}
	}
	return bad, scans
}

// TestPlansProbeAnEmptyLookingQueue is "Plans that probe" in
// functions/10_guard.sql: with the statistics an ANALYZE records when it
// finds the messages table empty (0 rows) or nearly so, the message path's
// generic plans still bound every index scan of the queue's tables by the
// index's leading column. On version 24 these calls read
// transport_messages_group end to end in four statements at 0 and 1 rows
// (the exchange's acked-message delete, its fence's EXISTS, the reap's pick
// and its delete).
func TestPlansProbeAnEmptyLookingQueue(t *testing.T) {
	t.Parallel()
	for _, left := range []int{0, 1, 20} {
		t.Run(fmt.Sprintf("%d rows", left), func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			db := pgtest.New(t, 2)
			is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
			// Indexes of some size, a table that looks empty: 30,000
			// messages over 3,000 groups, all but `left` gone, drained
			// rows marked, then ANALYZE; then messages the statistics do
			// not know of, for the calls below to take.
			_, err := db.Pool.Exec(ctx(t), `
				SELECT count(*) FROM harel_publish_many(
				    (SELECT array_agg('g' || (i % 3000)) FROM generate_series(1, 30000) AS i),
				    array_fill('e'::text, ARRAY[30000]), array_fill(0, ARRAY[30000]))`)
			is.NoErr(err)
			_, err = db.Pool.Exec(ctx(t), `DELETE FROM transport_messages WHERE seq <= (SELECT max(seq) FROM transport_messages) - $1`, left)
			is.NoErr(err)
			_, err = db.Pool.Exec(ctx(t), `
				UPDATE transport_groups AS g SET drained_at = 1, lock_expiry = 1
				 WHERE NOT EXISTS (SELECT 1 FROM transport_messages AS m WHERE m.group_id = g.group_id)`)
			is.NoErr(err)
			for _, table := range []string{"transport_messages", "transport_groups", "transport_ready"} {
				_, err = db.Pool.Exec(ctx(t), "ANALYZE "+pgx.Identifier{db.Schema, table}.Sanitize())
				is.NoErr(err)
			}
			var rows float64
			is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT reltuples FROM pg_class WHERE oid = 'transport_messages'::regclass`).Scan(&rows))
			is.True(rows <= float64(left)) // the statistics the planner now has
			_, err = db.Pool.Exec(ctx(t), `
				SELECT count(*) FROM harel_publish_many(
				    (SELECT array_agg('g' || (i % 150)) FROM generate_series(1, 300) AS i),
				    array_fill('e'::text, ARRAY[300]), array_fill(0, ARRAY[300]))`)
			is.NoErr(err)

			// A connection of its own, so that every plan is made now,
			// from these statistics, and auto_explain hands it back.
			var mu sync.Mutex
			var plans []string
			cfg, err := pgx.ParseConfig(db.DSN)
			is.NoErr(err)
			cfg.RuntimeParams["search_path"] = db.Schema
			cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
				if strings.Contains(n.Message, "plan:") {
					mu.Lock()
					plans = append(plans, n.Message)
					mu.Unlock()
				}
			}
			c, err := pgx.ConnectConfig(ctx(t), cfg)
			is.NoErr(err)
			defer c.Close(context.Background())
			for _, set := range []string{
				`LOAD 'auto_explain'`,
				`SET auto_explain.log_min_duration = 0`,
				`SET auto_explain.log_nested_statements = on`,
				`SET auto_explain.log_level = notice`,
				`SET client_min_messages = notice`,
			} {
				_, err = c.Exec(ctx(t), set)
				is.NoErr(err)
			}
			now := `extract(epoch FROM clock_timestamp())::float8`
			// A stream's claim of 64, then its exchange that acks them,
			// asking a third to keep, a third to keep while no group
			// waits (harel_ready_waits) and a third to free (groups with a
			// message left keep, drained ones are marked).
			var groups []string
			var seqs []int64
			r, err := c.Query(ctx(t), `SELECT e.group_id, e.seq FROM harel_exchange_leases(`+now+`, `+now+` + 30, 'tok', 0, 64, '{}', '{}', '{}', '{}', true) AS e`)
			is.NoErr(err)
			for r.Next() {
				var g string
				var s int64
				is.NoErr(r.Scan(&g, &s))
				groups, seqs = append(groups, g), append(seqs, s)
			}
			is.NoErr(r.Err())
			is.True(len(groups) > 0) // the claim leased something to ack
			tokens := make([]string, len(groups))
			keep := make([]*bool, len(groups))
			for i := range groups {
				tokens[i] = "tok"
				if i%3 != 1 {
					keep[i] = new(bool)
					*keep[i] = i%3 == 0
				}
			}
			for _, call := range []struct {
				sql  string
				args []any
			}{
				{`SELECT count(*) FROM harel_exchange_leases(` + now + `, ` + now + ` + 30, 'tok', 0, 64, $1, $2, $3, $4, true)`, []any{groups, seqs, tokens, keep}},
				{`SELECT count(*) FROM harel_publish_many(ARRAY['g1', 'g2', 'g2999', 'new-1'], ARRAY['a', 'b', 'c', 'd'], ARRAY[0, 0, 0, 0])`, nil},
				{`SELECT harel_wait('w', 0, 30, ` + now + `)`, nil},
			} {
				_, err = c.Exec(ctx(t), call.sql, call.args...)
				is.NoErr(err)
			}
			// The blocking worker's claim, then its ack-and-claim.
			var g string
			var s int64
			is.NoErr(c.QueryRow(ctx(t), `SELECT group_id, seq FROM harel_claim(`+now+`, `+now+` + 30, 'tok-2')`).Scan(&g, &s))
			_, err = c.Exec(ctx(t), `SELECT count(*) FROM harel_ack_claim($1, $2, 'tok-2', NULL, `+now+`, `+now+` + 30, 'tok-3', 0)`, g, s)
			is.NoErr(err)
			_, err = c.Exec(ctx(t), `SELECT count(*) FROM harel_ack_claim($1, $2, 'tok-2', false, `+now+`, `+now+` + 30, 'tok-3', 0)`, g, s)
			is.NoErr(err)
			mu.Lock()
			defer mu.Unlock()
			bad, scans := unboundedScans(plans)
			is.True(scans >= 20) // the plans of the message path were read
			for _, b := range bad {
				t.Errorf("an index read end to end with the messages table analyzed at %d rows: %s", left, b)
			}
		})
	}
}
