package schema_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestUpgradeFromV16KeepsALiveQueue: version 17 (kept rows) applied to a
// version-16 queue in use: a lease taken before acks under its token, and
// the group it drains keeps its row, marked; a group with messages left
// is served in its order; an empty row from before (a publisher that
// rolled back while a drainer had to free its group leaves one) is
// deleted by the claim that meets it; and the first publish after a drain
// sets the group's priority, as before.
func TestUpgradeFromV16KeepsALiveQueue(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	load(t, db, shipped(t, 16))
	c := db.Conn(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := c.Exec(ctx(t), sql, args...)
		is.NoErr(err)
	}
	exec(`SELECT harel_publish('leased', 'l-1', 4)`)
	exec(`SELECT harel_publish('waiting', 'w-1', 0)`)
	exec(`SELECT harel_publish('waiting', 'w-2', 0)`)
	exec(`INSERT INTO transport_groups (group_id) VALUES ('empty')`)
	var seq int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_claim(1000, 1060, 'old', 4)`).Scan(&seq))

	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema)) // upgrade in place
	v, err := schema.CurrentVersion(ctx(t), db.Pool, db.Schema)
	is.NoErr(err)
	is.Equal(v, schema.Version())

	var ok bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('leased', $1, 'old', 1001)`, seq).Scan(&ok))
	is.True(ok) // a lease taken before the upgrade acks under its token
	var kept bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT drained_at IS NOT NULL FROM transport_groups WHERE group_id = 'leased'`).Scan(&kept))
	is.True(kept) // drained: kept, marked

	var got []string
	for now := 1002.0; ; now++ {
		var g string
		var s int64
		err := c.QueryRow(ctx(t), `SELECT group_id, seq FROM harel_claim($1::float8, $1::float8 + 60, 'new')`, now).Scan(&g, &s)
		if err == pgx.ErrNoRows {
			break
		}
		is.NoErr(err)
		got = append(got, g)
		is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'new', $3)`, g, s, now).Scan(&ok))
		is.True(ok)
	}
	is.Equal(got, []string{"waiting", "waiting"}) // in order
	var empty int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups WHERE group_id = 'empty'`).Scan(&empty))
	is.Equal(empty, 0) // the empty row from before, deleted by a claim

	exec(`INSERT INTO transport_messages (group_id, event) VALUES ('leased', 'l-2')`)
	exec(`INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority) VALUES ('leased', NULL, NULL, 1) ON CONFLICT (group_id) DO NOTHING`)
	var prio int
	is.NoErr(c.QueryRow(ctx(t), `SELECT priority FROM transport_groups WHERE group_id = 'leased'`).Scan(&prio))
	is.Equal(prio, 1) // the first publish after the drain set it
}
