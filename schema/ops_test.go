package schema_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestPlainSQLSkipsPausedGroup: a client in another language, with the
// design's plain INSERTs and the claim functions, never gets a paused
// group; its holder at the pause acks as usual; the paused group then
// stays out until harel_resume_group, which answers whether it changed
// anything, as harel_pause_group does.
func TestPlainSQLSkipsPausedGroup(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	publish := func(group, event string) {
		t.Helper()
		_, err := c.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ($1, $2)`, group, event)
		is.NoErr(err)
		_, err = c.Exec(ctx(t), `INSERT INTO transport_groups (group_id) VALUES ($1) ON CONFLICT (group_id) DO NOTHING`, group)
		is.NoErr(err)
	}
	switched := func(fn, group string) bool {
		t.Helper()
		var changed bool
		is.NoErr(c.QueryRow(ctx(t), `SELECT `+fn+`($1)`, group).Scan(&changed))
		return changed
	}
	claim := func(now float64, token string) (group string, seq int64) {
		t.Helper()
		err := c.QueryRow(ctx(t), `SELECT group_id, seq FROM harel_claim($1::float8, $1::float8 + 10, $2)`, now, token).Scan(&group, &seq)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", 0
		}
		is.NoErr(err)
		return group, seq
	}
	publish("g", "g1")
	publish("g", "g2")
	publish("h", "h1")
	publish("h", "h2")

	is.True(switched("harel_pause_group", "g"))  // paused
	is.True(!switched("harel_pause_group", "g")) // already
	group, seq := claim(1000, "w:1")
	is.Equal(group, "h") // g is skipped

	is.True(switched("harel_pause_group", "h")) // paused under w:1's lease
	var held bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('h', $1, 'w:1', 1001)`, seq).Scan(&held))
	is.True(held) // the holder acks
	group, _ = claim(1002, "w:2")
	is.Equal(group, "") // harel_claim: nothing
	group, _ = claim(1_000_000, "w:3")
	is.Equal(group, "") // however late
	var n int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_claim_many(1000000, 1000010, 'w:4', 0, 10)`).Scan(&n))
	is.Equal(n, 0) // harel_claim_many: nothing
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_claim_one(1000000, 1000010, 'w:5', 0)`).Scan(&n))
	is.Equal(n, 0) // harel_claim_one: nothing

	is.True(switched("harel_resume_group", "g"))  // resumed
	is.True(!switched("harel_resume_group", "g")) // already
	var event string
	is.NoErr(c.QueryRow(ctx(t), `SELECT event FROM harel_claim(2000000, 2000010, 'w:6')`).Scan(&event))
	is.Equal(event, "g1") // back, from its head
	group, _ = claim(2000001, "w:7")
	is.Equal(group, "") // h is still paused
}

// TestOperationsRefuseWithSQLSTATEs: the codes the Go side maps: PT007 for
// a group with no row, 22023 for a bad listing or a negative purge limit.
func TestOperationsRefuseWithSQLSTATEs(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	_, err := db.Pool.Exec(ctx(t), `SELECT harel_publish('g', 'e', 0)`)
	is.NoErr(err)
	for _, tc := range []struct{ name, sql, code string }{
		{"GroupUnknown", `SELECT * FROM harel_group(NULL, 'nope')`, "PT007"},
		{"PeekUnknown", `SELECT * FROM harel_peek('nope', NULL, 10)`, "PT007"},
		{"PauseUnknown", `SELECT harel_pause_group('nope')`, "PT007"},
		{"ResumeUnknown", `SELECT harel_resume_group('nope')`, "PT007"},
		{"PurgeUnknown", `SELECT harel_purge_group('nope', NULL, NULL)`, "PT007"},
		{"PurgeNegative", `SELECT harel_purge_group('g', NULL, -1)`, "22023"},
		{"GroupsState", `SELECT * FROM harel_groups(NULL, 'stuck', NULL, 0, 10)`, "22023"},
		{"GroupsOrder", `SELECT * FROM harel_groups(NULL, NULL, 'newest', 0, 10)`, "22023"},
		{"GroupsOffset", `SELECT * FROM harel_groups(NULL, NULL, NULL, -1, 10)`, "22023"},
		{"GroupsLimit", `SELECT * FROM harel_groups(NULL, NULL, NULL, 0, -1)`, "22023"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			_, err := db.Pool.Exec(ctx(t), tc.sql)
			var pgErr *pgconn.PgError
			is.True(errors.As(err, &pgErr)) // refused by the server
			is.Equal(pgErr.Code, tc.code)
		})
	}
	var msgs, groups int
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT (SELECT count(*) FROM transport_messages), (SELECT count(*) FROM transport_groups WHERE NOT paused)`).Scan(&msgs, &groups))
	is.Equal([]int{msgs, groups}, []int{1, 1}) // nothing changed

	// harel_stats: a row per priority in order, then the total.
	rows, err := db.Pool.Query(ctx(t), `SELECT priority, groups, messages FROM harel_stats()`)
	is.NoErr(err)
	type row struct {
		Priority         *int32
		Groups, Messages int64
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	is.NoErr(err)
	is.Equal(len(rs), 6)
	for i, r := range rs[:5] {
		is.True(r.Priority != nil && int(*r.Priority) == i)
	}
	is.Equal(rs[5].Priority, nil)
	is.Equal([]int64{rs[0].Groups, rs[0].Messages, rs[5].Groups, rs[5].Messages}, []int64{1, 1, 1, 1})
}
