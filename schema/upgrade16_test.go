package schema_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestUpgradeFromV15KeepsALiveQueue: version 16 (the sweep) applied to a
// version-15 queue in use keeps everything it held: a lease (its token
// still acks it), a failed head's backoff (served first once it ends), a
// nack's park, a paused group, a stopped group, a dead letter, a group's
// state and a dedup key; the old round-robin's order becomes the groups'
// slot order.
func TestUpgradeFromV15KeepsALiveQueue(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	load(t, db, shipped(t, 15))
	c := db.Conn(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := c.Exec(ctx(t), sql, args...)
		is.NoErr(err)
	}
	exec(`UPDATE transport_policy SET backoff_min = 10, backoff_max = 10, max_attempts = 2, on_exhausted = 'dead_letter'`)
	for _, g := range []string{"leased", "failed", "parked", "paused", "dead", "stateful", "waiting"} {
		exec(`SELECT harel_publish($1, $1 || '-1', 0)`, g)
		exec(`SELECT harel_publish($1, $1 || '-2', 0)`, g)
	}
	exec(`SELECT * FROM harel_publish_keyed('{keyed}', '{k-1}', '{0}', '{key-1}', 3600)`)
	type lease struct {
		Group string
		Seq   int64
	}
	claim := func(now float64, token string) lease {
		t.Helper()
		var l lease
		is.NoErr(c.QueryRow(ctx(t), `SELECT group_id, seq FROM harel_claim($1::float8, $1::float8 + 60, $2)`, now, token).Scan(&l.Group, &l.Seq))
		return l
	}
	byGroup := map[string]lease{}
	for range 6 { // leased, failed, parked, paused, dead, stateful: the order they arrived
		l := claim(1000, fmt.Sprint("old:", len(byGroup)))
		byGroup[l.Group] = l
	}
	is.Equal(len(byGroup), 6)
	var s string
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_fail('failed', $1, 'old:1', 1000, 'boom')`, byGroup["failed"].Seq).Scan(&s))
	is.Equal(s, "retry") // parked until 1010
	exec(`SELECT harel_nack('parked', 'old:2', 1000, 100)`)
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_dead_letter('dead', $1, 'old:4', 1000, 'never')`, byGroup["dead"].Seq).Scan(new(bool)))
	exec(`SELECT harel_ack_state('stateful', $1, 'old:5', 1000, '\x0102'::bytea)`, byGroup["stateful"].Seq)
	exec(`SELECT harel_release('paused', 'old:3')`)
	exec(`SELECT harel_pause_group('paused')`)

	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema)) // upgrade in place
	v, err := schema.CurrentVersion(ctx(t), db.Pool, db.Schema)
	is.NoErr(err)
	is.Equal(v, schema.Version())

	var ok bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('leased', $1, 'old:0', 1001)`, byGroup["leased"].Seq).Scan(&ok))
	is.True(ok) // a lease taken before the upgrade acks under its token
	var due float64
	is.NoErr(c.QueryRow(ctx(t), `SELECT retry_at FROM transport_groups WHERE group_id = 'failed'`).Scan(&due))
	is.True(due > 1000 && due <= 1010) // the backoff is due before the sweep
	// Before the backoff ends: the sweep from a fresh cursor, in the old
	// round-robin's order (never served by arrival, then by when freed).
	var got []string
	for {
		var g string
		err := c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1002, 1062, 'new')`).Scan(&g)
		if err == pgx.ErrNoRows {
			break
		}
		is.NoErr(err)
		got = append(got, g)
	}
	is.Equal(got, []string{"waiting", "keyed", "dead", "stateful", "leased"}) // failed and parked wait, paused stays
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1011, 1071, 'new')`).Scan(&s))
	is.Equal(s, "failed") // its backoff ended: due first
	// The park's end is found by the sweep, which rests for up to 2 s of
	// the server's clock after a claim that found nothing ("Going round"):
	// claims go on until it is handed out or the rest is long over.
	var late []string
	for deadline := time.Now().Add(5 * time.Second); !slices.Contains(late, "parked") && time.Now().Before(deadline); {
		rows, err := c.Query(ctx(t), `SELECT group_id FROM harel_claim_many(1101, 1161, 'new', 0, 20)`)
		is.NoErr(err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		is.NoErr(err)
		late = append(late, got...)
		if !slices.Contains(late, "parked") {
			time.Sleep(100 * time.Millisecond)
		}
	}
	is.True(slices.Contains(late, "parked")) // the nack's park ended
	is.True(!slices.Contains(late, "paused"))

	var dead, stateLen, keys int
	is.NoErr(c.QueryRow(ctx(t), `SELECT (SELECT count(*) FROM transport_dead_letters WHERE group_id = 'dead'),
		(SELECT octet_length(harel_state('stateful'))), (SELECT count(*) FROM transport_dedup WHERE dedup_key = 'key-1')`).Scan(&dead, &stateLen, &keys))
	is.Equal([]int{dead, stateLen, keys}, []int{1, 2, 1}) // the dead letter, the state and the dedup key stay
	var paused bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT paused FROM transport_groups WHERE group_id = 'paused'`).Scan(&paused))
	is.True(paused)
	var seqs []int64
	rows, err := c.Query(ctx(t), `SELECT * FROM harel_publish_keyed('{keyed}', '{k-again}', '{0}', '{key-1}', 3600)`)
	is.NoErr(err)
	seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	is.NoErr(err)
	is.Equal(len(seqs), 1) // the key still maps to the first publish
	var n int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_messages WHERE group_id = 'keyed'`).Scan(&n))
	is.Equal(n, 1) // not published twice
}
