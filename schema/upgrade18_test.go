package schema_test

import (
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestUpgradeFromV17KeepsALiveQueue: version 18 (resting rounds) applied
// to a version-17 queue in use: a lease taken before acks under its
// token; a version-17 consumer's exchange, the statement it prepared
// before the upgrade (nine arguments, no p_rest), runs after it and
// leases the next group in order; a kept row keeps its mark and its
// group's next publish revives it with the publish's priority; and the
// rounds start without a rest.
func TestUpgradeFromV17KeepsALiveQueue(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	load(t, db, shipped(t, 17))
	c := db.Conn(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := c.Exec(ctx(t), sql, args...)
		is.NoErr(err)
	}
	// A version-17 consumer's exchange: settle, then claim one.
	const exchange = `SELECT e.group_id, e.seq FROM harel_exchange_leases($1::float8, $1::float8 + 60, $2::text, 0, 1,
		$3::text[], $4::bigint[], $5::text[], $6::bool[]) AS e WHERE e.kind = 'c'`
	exec(`SELECT harel_publish('kept', 'k-1', 0)`)
	exec(`SELECT harel_publish('leased', 'l-1', 0)`)
	exec(`SELECT harel_publish('waiting', 'w-1', 0)`)
	exec(`SELECT harel_publish('waiting', 'w-2', 0)`)
	var g string
	var seq, leasedSeq int64
	is.NoErr(c.QueryRow(ctx(t), exchange, 1000.0, "old", []string{}, []int64{}, []string{}, []bool{}).Scan(&g, &seq))
	is.Equal(g, "kept")
	var ok bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('kept', $1, 'old', 1000)`, seq).Scan(&ok))
	is.True(ok) // drained: kept, marked
	is.NoErr(c.QueryRow(ctx(t), exchange, 1001.0, "old", []string{}, []int64{}, []string{}, []bool{}).Scan(&g, &leasedSeq))
	is.Equal(g, "leased")

	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema)) // upgrade in place
	v, err := schema.CurrentVersion(ctx(t), db.Pool, db.Schema)
	is.NoErr(err)
	is.Equal(v, schema.Version())

	var rest int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT last_value FROM transport_claim_rest`).Scan(&rest))
	is.Equal(rest, int64(0)) // no rest
	var kept bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT drained_at IS NOT NULL FROM transport_groups WHERE group_id = 'kept'`).Scan(&kept))
	is.True(kept) // the mark survives the upgrade

	// The old consumer's prepared exchange acks the lease taken before
	// and leases the next group.
	is.NoErr(c.QueryRow(ctx(t), exchange, 1002.0, "old",
		[]string{"leased"}, []int64{leasedSeq}, []string{"old"}, []bool{false}).Scan(&g, &seq))
	is.Equal(g, "waiting")
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('waiting', $1, 'old', 1002)`, seq).Scan(&ok))
	is.True(ok)
	var event string
	is.NoErr(c.QueryRow(ctx(t), `SELECT event FROM transport_messages WHERE group_id = 'waiting'`).Scan(&event))
	is.Equal(event, "w-2") // in order

	// The design's publish readies the kept row with its priority (the
	// mark stays until the lease, since version 24).
	exec(`INSERT INTO transport_messages (group_id, event) VALUES ('kept', 'k-2')`)
	exec(`INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority) VALUES ('kept', NULL, NULL, 3) ON CONFLICT (group_id) DO NOTHING`)
	var prio int
	is.NoErr(c.QueryRow(ctx(t), `SELECT priority FROM transport_groups WHERE group_id = 'kept'`).Scan(&prio))
	is.Equal(prio, 3)
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1003, 1063, 'new', 3)`).Scan(&g))
	is.Equal(g, "kept")
	is.NoErr(c.QueryRow(ctx(t), `SELECT drained_at IS NOT NULL FROM transport_groups WHERE group_id = 'kept'`).Scan(&kept))
	is.True(!kept) // the lease cleared the mark
}
