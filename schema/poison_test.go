package schema_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestPlainSQLCountsAttempts: a consumer that speaks only the design's
// protocol (two INSERTs to publish, harel_claim, harel_ack) gets the
// queue's attempt limit without a change to its calls: a message whose
// leases keep lapsing is dead-lettered by the claim after max_attempts
// hand-outs, and the claim hands out the group's next message instead.
func TestPlainSQLCountsAttempts(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	for _, ev := range []string{"poison", "next"} {
		_, err := c.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ('g', $1)`, ev)
		is.NoErr(err)
		_, err = c.Exec(ctx(t), `INSERT INTO transport_groups (group_id) VALUES ('g') ON CONFLICT (group_id) DO NOTHING`)
		is.NoErr(err)
	}
	_, err := c.Exec(ctx(t), `UPDATE transport_policy SET max_attempts = 3`)
	is.NoErr(err)

	claim := func(now float64) (string, int64) {
		t.Helper()
		var ev string
		var seq int64
		err := c.QueryRow(ctx(t), `SELECT event, seq FROM harel_claim($1::float8, $1::float8 + 10, $2)`, now, fmt.Sprintf("w:%v", now)).Scan(&ev, &seq)
		is.NoErr(err)
		return ev, seq
	}
	now := 1000.0
	for attempt := 1; attempt <= 3; attempt++ { // three leases that lapse
		ev, _ := claim(now)
		is.Equal(ev, "poison")
		var counted int
		is.NoErr(c.QueryRow(ctx(t), `SELECT attempts FROM transport_groups WHERE group_id = 'g'`).Scan(&counted))
		is.Equal(counted, attempt)
		now += 11
	}
	ev, seq := claim(now) // the fourth claim dead-letters it and goes on
	is.Equal(ev, "next")
	var dead string
	var attempts int
	is.NoErr(c.QueryRow(ctx(t), `SELECT event, attempts FROM transport_dead_letters WHERE group_id = 'g'`).Scan(&dead, &attempts))
	is.Equal(dead, "poison")
	is.Equal(attempts, 3)
	var held bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('g', $1, $2, $3)`, seq, fmt.Sprintf("w:%v", now), now).Scan(&held))
	is.True(held)
}

// TestUpgradeKeepsQueueAndLeases: a database at version 9 with messages
// queued, a group leased and another parked upgrades to the current
// version with every message and lease intact: the lease is acked under
// its token, the park still holds, the design's plain-SQL publish works,
// and the first hand-out after the upgrade is attempt 1.
func TestUpgradeKeepsQueueAndLeases(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	load(t, db, shipped(t, 9))
	c := db.Conn(t)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := c.Exec(ctx(t), q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, g := range []string{"a", "a", "b", "b", "c"} {
		exec(`SELECT harel_publish($1, 'e-' || $1, 0)`, g)
	}
	var leased string
	var seq int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id, seq FROM harel_claim(1000, 1060, 'w:old')`).Scan(&leased, &seq))
	is.Equal(leased, "a")
	var parked string
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1000, 1060, 'w:park')`).Scan(&parked))
	exec(`SELECT harel_nack($1, 'w:park', 1000, 500)`, parked)

	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))

	var n int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_messages`).Scan(&n))
	is.Equal(n, 5) // every message kept
	var held bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('a', $1, 'w:old', 1001)`, seq).Scan(&held))
	is.True(held) // the lease taken before the upgrade settles
	var group string
	var attempt int
	err := c.QueryRow(ctx(t), `SELECT group_id, attempt FROM harel_claim_one(1002, 1062, 'w:new')`).Scan(&group, &attempt)
	is.NoErr(err)
	is.Equal(group, "c") // never served, first in line
	is.Equal(attempt, 1) // the first hand-out counted since the upgrade
	exec(`INSERT INTO transport_messages (group_id, event) VALUES ('d', 'plain')`)
	exec(`INSERT INTO transport_groups (group_id) VALUES ('d') ON CONFLICT (group_id) DO NOTHING`)
	var published bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT published_at IS NOT NULL FROM transport_messages WHERE group_id = 'd'`).Scan(&published))
	is.True(published) // a plain insert gets published_at by default
	rows, err := c.Query(ctx(t), `SELECT group_id FROM harel_claim_leases(1003, 1063, 'w:new2', 0, 10) ORDER BY 1`)
	is.NoErr(err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	is.NoErr(err)
	is.Equal(got, []string{"a", "d"}) // a's next message and the plain-SQL group; the parked b still waits (until 1500)
}

// TestRetryBeforeRoundRobin: a group whose head failed is claimed as soon
// as its backoff ends, ahead of groups that have waited in the
// round-robin longer (never-served ones included), by harel_claim and
// harel_claim_many alike, and so is a group whose nack's park ended (since
// version 20; it kept its place in the round-robin before), in the order
// they came due.
func TestRetryBeforeRoundRobin(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	_, err := c.Exec(ctx(t), `UPDATE transport_policy SET backoff_min = 1, backoff_max = 1`)
	is.NoErr(err)
	for _, g := range []string{"failed", "nacked", "x1", "x2", "x3"} {
		_, err := c.Exec(ctx(t), `SELECT harel_publish($1, 'e', 0)`, g)
		is.NoErr(err)
	}
	var seq int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_claim_one(1000, 1060, 'w:f') WHERE group_id = 'failed'`).Scan(&seq))
	var outcome string
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_fail('failed', $1, 'w:f', 1000, 'boom')`, seq).Scan(&outcome))
	is.Equal(outcome, "retry") // parked until 1000.5 to 1001
	var group string
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1000, 1060, 'w:n')`).Scan(&group))
	is.Equal(group, "nacked")
	_, err = c.Exec(ctx(t), `SELECT harel_nack('nacked', 'w:n', 1000, 1.5)`) // parked until 1001.5, under w:n
	is.NoErr(err)

	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1000.2, 1060, 'w:a')`).Scan(&group))
	is.Equal(group, "x1") // both parks hold: the round-robin
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1002, 1060, 'w:b')`).Scan(&group))
	is.Equal(group, "failed") // its backoff ended: ahead of x2 and x3, never served
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1002, 1060, 'w:c')`).Scan(&group))
	is.Equal(group, "nacked") // its park ended after that backoff: next
	rows, err := c.Query(ctx(t), `SELECT group_id FROM harel_claim_many(1002, 1060, 'w:d', 0, 5) ORDER BY 1`)
	is.NoErr(err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	is.NoErr(err)
	is.Equal(got, []string{"x2", "x3"})

	// The batch claim: a failed group whose backoff has ended comes before
	// groups never served.
	for _, g := range []string{"y1", "y2", "y3"} {
		_, err := c.Exec(ctx(t), `SELECT harel_publish($1, 'e', 0)`, g)
		is.NoErr(err)
	}
	var x1 int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM transport_messages WHERE group_id = 'x1'`).Scan(&x1))
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_fail('x1', $1, 'w:a', 1002, 'boom')`, x1).Scan(&outcome))
	is.Equal(outcome, "retry")
	rows, err = c.Query(ctx(t), `SELECT group_id FROM harel_claim_many(1004, 1060, 'w:e', 0, 2) ORDER BY 1`)
	is.NoErr(err)
	got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	is.NoErr(err)
	is.Equal(got, []string{"x1", "y1"}) // the retry, then the round-robin's first
}
