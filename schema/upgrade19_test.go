package schema_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestUpgradeFromV19KeepsALiveQueue: version 20 (the ready log) applied to
// a version-19 queue in use. The groups claimable at the upgrade get their
// entries in sweep order and are handed out in it; a lease taken before
// is acked after under its token by a version-19 consumer's exchange (the
// statement it prepared, with p_rest), which then leases the next group;
// a parked group stays parked until its park ends; a kept row keeps its
// mark and the design's publish revives it; every message is handed out,
// in order, none twice.
func TestUpgradeFromV19KeepsALiveQueue(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	load(t, db, shipped(t, 19))
	c := db.Conn(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := c.Exec(ctx(t), sql, args...)
		is.NoErr(err)
	}
	const exchange = `SELECT e.group_id, e.seq FROM harel_exchange_leases($1::float8, $1::float8 + 60, $2::text, 0, 1,
		$3::text[], $4::bigint[], $5::text[], $6::bool[], true) AS e WHERE e.kind = 'c'`
	exec(`SELECT harel_publish('kept', 'kept-1', 0)`)
	for _, g := range []string{"leased", "parked", "w1", "w2", "w3"} {
		exec(`SELECT harel_publish($1, $1 || '-1', 0), harel_publish($1, $1 || '-2', 0)`, g)
	}
	var g string
	var seq, leasedSeq int64
	claim := func(now float64) (string, int64) {
		t.Helper()
		is.NoErr(c.QueryRow(ctx(t), `SELECT group_id, seq FROM harel_claim_one($1::float8, $1::float8 + 60, 'old')`, now).Scan(&g, &seq))
		return g, seq
	}
	var ok bool
	g, seq = claim(1000)
	is.Equal(g, "kept")
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'old', 1000)`, g, seq).Scan(&ok))
	is.True(ok) // drained: kept, marked
	g, leasedSeq = claim(1001)
	is.Equal(g, "leased")
	g, seq = claim(1001)
	is.Equal(g, "parked")
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_nack('parked', 'old', 1001, 30)`).Scan(&ok))
	is.True(ok) // parked until 1031

	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema)) // upgrade in place
	v, err := schema.CurrentVersion(ctx(t), db.Pool, db.Schema)
	is.NoErr(err)
	is.Equal(v, schema.Version())
	rows, err := c.Query(ctx(t), `SELECT group_id FROM transport_ready ORDER BY vt, rseq`)
	is.NoErr(err)
	entries, err := pgx.CollectRows(rows, pgx.RowTo[string])
	is.NoErr(err)
	is.Equal(entries, []string{"w1", "w2", "w3"}) // the claimable groups, in sweep order

	// The old consumer's prepared exchange acks the lease taken before
	// and leases the next group in order.
	is.NoErr(c.QueryRow(ctx(t), exchange, 1002.0, "old",
		[]string{"leased"}, []int64{leasedSeq}, []string{"old"}, []bool{false}).Scan(&g, &seq))
	is.Equal(g, "w1")
	handed := map[string][]string{}
	var order []string
	var event string
	take := func(now float64) string {
		t.Helper()
		err := c.QueryRow(ctx(t), `SELECT c.group_id, c.seq, m.event FROM harel_claim_one($1::float8, $1::float8 + 60, 'new') AS c
		                           JOIN transport_messages AS m ON m.seq = c.seq`, now).Scan(&g, &seq, &event)
		if err == pgx.ErrNoRows {
			return ""
		}
		is.NoErr(err)
		is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'new', $3)`, g, seq, now).Scan(&ok))
		is.True(ok)
		handed[g] = append(handed[g], event)
		order = append(order, g)
		return g
	}
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('w1', $1, 'old', 1002)`, seq).Scan(&ok))
	is.True(ok)
	handed["w1"] = []string{"w1-1"}
	is.Equal(take(1003), "w2")
	is.Equal(take(1003), "w3")
	is.Equal(take(1003), "leased") // freed by the ack after the upgrade, with a message left: its entry
	is.Equal(take(1003), "w1")

	// The design's publish revives the kept row: handed out after w2 and
	// w3, which were freed before it.
	exec(`INSERT INTO transport_messages (group_id, event) VALUES ('kept', 'kept-2')`)
	exec(`INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority) VALUES ('kept', NULL, NULL, 3) ON CONFLICT (group_id) DO NOTHING`)
	order = nil
	for now := 1004.0; take(now) != ""; now++ {
	}
	is.Equal(order, []string{"w2", "w3", "kept"})
	is.Equal(take(1031.5), "parked") // its park ended
	for now := 1032.0; take(now) != ""; now++ {
	}
	var left int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_messages`).Scan(&left))
	is.Equal(left, 0) // every message handed out and acked
	is.Equal(handed["w2"], []string{"w2-1", "w2-2"})
	is.Equal(handed["w3"], []string{"w3-1", "w3-2"})
	is.Equal(handed["w1"], []string{"w1-1", "w1-2"})
	is.Equal(handed["leased"], []string{"leased-2"})
	is.Equal(handed["kept"], []string{"kept-2"})
	is.Equal(handed["parked"], []string{"parked-1", "parked-2"})
}
