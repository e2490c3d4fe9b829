package schema_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestExtendMany: one call extends every lease its token holds on the
// message it was handed, answers in input order, and changes nothing for
// a foreign token, a seq not handed out, or a repeat of a group.
func TestExtendMany(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	for _, g := range []string{"a", "b", "c"} {
		_, err := c.Exec(ctx(t), `SELECT harel_publish($1, 'e', 0)`, g)
		is.NoErr(err)
	}
	rows, err := c.Query(ctx(t), `SELECT group_id, seq FROM harel_claim_leases(1000, 1060, 'w:1', 0, 2) ORDER BY 1`)
	is.NoErr(err)
	type held struct {
		Group string
		Seq   int64
	}
	leased, err := pgx.CollectRows(rows, pgx.RowToStructByPos[held])
	is.NoErr(err)
	is.Equal(len(leased), 2)                                                             // a and b
	_, err = c.Exec(ctx(t), `SELECT * FROM harel_claim_leases(1000, 1060, 'w:2', 0, 1)`) // c, to another token
	is.NoErr(err)

	rows, err = c.Query(ctx(t), `SELECT held FROM harel_extend_many($1, $2, $3, 1200)`,
		[]string{"b", "a", "c", "a", "b"},
		[]int64{leased[1].Seq, leased[0].Seq, 3, leased[0].Seq, leased[1].Seq + 100},
		[]string{"w:1", "w:1", "w:1", "w:1", "w:1"})
	is.NoErr(err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	is.NoErr(err)
	is.Equal(got, []bool{true, true, false, false, false}) // c is w:2's; repeats of a and b change nothing
	var ends []float64
	rows, err = c.Query(ctx(t), `SELECT lock_expiry FROM transport_groups ORDER BY group_id`)
	is.NoErr(err)
	ends, err = pgx.CollectRows(rows, pgx.RowTo[float64])
	is.NoErr(err)
	is.Equal(ends, []float64{1200, 1200, 1060}) // c unchanged
}

// TestAckClaim: harel_ack_claim keeps a group that has another message
// when asked (same token, that message next; with p_keep NULL only while no
// other group waits), else acks and claims the group that became claimable
// first for the new token; a lost lease is answered held = false and the
// claim is made all the same.
func TestAckClaim(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	publish := func(groups ...string) {
		t.Helper()
		for _, g := range groups {
			_, err := c.Exec(ctx(t), `SELECT harel_publish($1, 'e', 0)`, g)
			is.NoErr(err)
		}
	}
	publish("a", "a", "a", "a")
	var a1 int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_claim_one(1000, 1060, 'w:1')`).Scan(&a1)) // a's first
	type step struct {
		Held, Kept bool
		Group      *string
		Seq        *int64
	}
	next := func(group string, seq int64, token string, keep *bool, newToken string) step {
		t.Helper()
		var s step
		is.NoErr(c.QueryRow(ctx(t), `SELECT held, kept, group_id, seq FROM harel_ack_claim($1, $2, $3, $4, 1001, 1061, $5, 0)`,
			group, seq, token, keep, newToken).Scan(&s.Held, &s.Kept, &s.Group, &s.Seq))
		return s
	}
	yes, no := true, false
	s := next("a", a1, "w:1", nil, "w:2")
	is.True(s.Held && s.Kept) // a has another message and no group waits: kept under w:1
	is.Equal(*s.Group, "a")
	a2 := *s.Seq
	var holder string
	is.NoErr(c.QueryRow(ctx(t), `SELECT locked_by FROM transport_groups WHERE group_id = 'a'`).Scan(&holder))
	is.Equal(holder, "w:1")
	publish("b")
	s = next("a", a2, "w:1", &yes, "w:9")
	is.True(s.Held && s.Kept) // kept when asked, b waiting or not
	a3 := *s.Seq
	s = next("a", a3, "w:1", nil, "w:3")
	is.True(s.Held && !s.Kept) // NULL: b waits, the keep yields, a is acked and freed
	is.Equal(*s.Group, "b")    // and b, waiting longest, is claimed for w:3
	b1 := *s.Seq
	s = next("a", a3, "w:1", &no, "w:4")
	is.True(!s.Held)        // already settled: lost
	is.Equal(*s.Group, "a") // the claim is made all the same: a's fourth message
	s = next("b", b1, "w:3", &yes, "w:5")
	is.True(s.Held && !s.Kept) // drained: acked, then a claim for w:5
	is.True(s.Group == nil)    // and nothing left to claim
	var left int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_messages`).Scan(&left))
	is.Equal(left, 1) // a's fourth, leased to w:4
}
