package schema_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// moving returns a group id (prefix plus a number) whose home is from in
// a cluster of two partitions and to in one of four.
func moving(t *testing.T, p *pgtest.Partitioned, prefix string, from, to int) string {
	t.Helper()
	for i := 0; ; i++ {
		g := fmt.Sprint(prefix, i)
		var h int
		if err := p.Proxy.QueryRow(ctx(t), `SELECT hashtext($1)`, g).Scan(&h); err != nil {
			t.Fatal(err)
		}
		if h&1 == from && h&3 == to {
			return g
		}
	}
}

// TestGrowThroughProxy grows a queue from two partitions to four while it
// holds work, all in plain SQL through the proxy as a client in another
// language would, and looks at the partitions to see where each message
// went: a moving group with messages, a lease, or a dead letter in its
// old partition stays there (its order and its one holder kept; a dead
// letter redriven drains there too) and moves once it has nothing left; a new moving group goes straight to its
// new home; a client with the old map is refused by the old partition;
// the growth ends only when no old partition holds anything of a moving
// group, and then the proxy routes straight to the homes.
func TestGrowThroughProxy(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Growable(t, 2)
	db := p.Proxy
	b, a, s := moving(t, p, "b", 0, 2), moving(t, p, "a", 1, 3), moving(t, p, "s", 0, 0)
	d, c := moving(t, p, "d", 1, 3), moving(t, p, "c", 0, 2)
	publish := func(group, event string) int64 {
		t.Helper()
		var seq int64
		is.NoErr(db.QueryRow(ctx(t), `SELECT harel_publish($1, $2)`, group, event).Scan(&seq))
		return seq
	}
	publish(b, "b1")
	publish(b, "b2")
	publish(s, "s1")
	publish(a, "a1")
	ga, seqA, _, ok := claim(t, p.Parts[1], "tA", 0) // a's lease, held across the growth
	is.True(ok && ga == a)
	publish(d, "d1")
	_, err := p.Parts[1].Exec(ctx(t), `UPDATE transport_policy SET max_attempts = 1`)
	is.NoErr(err)
	gd, seqD, _, ok := claim(t, p.Parts[1], "tD", 0)
	is.True(ok && gd == d)
	var outcome string
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_fail($1, $2, 'tD', `+nowSQL+`, 'boom')`, d, seqD).Scan(&outcome))
	is.Equal(outcome, "dead") // d has a dead letter and nothing else in partition 1

	n, err := p.Grow(ctx(t))
	is.NoErr(err)
	is.Equal(n, 4)
	is.NoErr(schema.ApplyProxy(ctx(t), db, p.Schema)) // a grown proxy checks out

	// A client with the old map publishes c, new and moving, in its old
	// home: refused, nothing written.
	_, err = p.Parts[0].Exec(ctx(t), `SELECT harel_publish($1, 'stale')`, c)
	var pgErr *pgconn.PgError
	is.True(errors.As(err, &pgErr) && pgErr.Code == "PT010")
	is.True(strings.Contains(pgErr.Message, "partition 2"))

	// Through the proxy: b (backlog), a (leased) and d (a dead letter)
	// stay; c, new, goes to its new home; s never moves.
	is.Equal(publish(b, "b3")&3, int64(0))
	is.Equal(publish(c, "c1")&3, int64(2))
	is.Equal(publish(d, "d2")&3, int64(1))
	is.Equal(publish(s, "s2")&3, int64(0))
	rows, err := db.Query(ctx(t), `SELECT s FROM harel_publish_many($1, $2, $3) AS s`,
		[]string{b, c, s, b}, []string{"b4", "c2", "s3", "b5"}, []int{0, 0, 0, 0})
	is.NoErr(err)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	is.NoErr(err)
	is.Equal([]int64{seqs[0] & 3, seqs[1] & 3, seqs[2] & 3, seqs[3] & 3}, []int64{0, 2, 0, 0})
	var held bool
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_extend($1, 'tA', `+nowSQL+` + 30)`, a).Scan(&held))
	is.True(held) // located in its old home
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'tA', `+nowSQL+`)`, a, seqA).Scan(&held))
	is.True(held)
	is.Equal(publish(a, "a2")&3, int64(3)) // nothing left in partition 1: a moved

	_, err = schema.Grown(ctx(t), db, p.Schema)
	is.True(errors.Is(err, schema.ErrNotGrown)) // b and d are still in their old homes
	t.Log(err)

	// Drain through the proxy: each group's events in publish order.
	got := map[string][]string{}
	for {
		g, seq, event, ok := claim(t, db, "w", 0)
		if !ok {
			break
		}
		got[g] = append(got[g], event)
		is.NoErr(db.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w', `+nowSQL+`)`, g, seq).Scan(&held))
		is.True(held)
	}
	is.Equal(got[b], []string{"b1", "b2", "b3", "b4", "b5"})
	is.Equal(got[c], []string{"c1", "c2"})
	is.Equal(got[s], []string{"s1", "s2", "s3"})
	is.Equal(got[a], []string{"a2"})
	is.Equal(got[d], []string{"d2"})

	_, err = schema.Grown(ctx(t), db, p.Schema)
	is.True(errors.Is(err, schema.ErrNotGrown)) // d's dead letter
	is.True(strings.Contains(err.Error(), "p1: 0 groups, 1 dead letters"))
	// Redriven, d's dead letter drains in place, under its own seq.
	var redriven int64
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_redrive($1, NULL)`, d).Scan(&redriven))
	is.Equal(redriven, int64(1))
	gd, sd, event, ok := claim(t, db, "w", 0)
	is.True(ok && gd == d && sd == seqD && event == "d1")
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w', `+nowSQL+`)`, gd, sd).Scan(&held))
	is.True(held)
	n, err = schema.Grown(ctx(t), db, p.Schema)
	is.NoErr(err)
	is.Equal(n, 4)
	is.Equal(publish(d, "d3")&3, int64(3)) // straight to its home now
	for i, part := range p.Parts {
		var parts, from *int
		is.NoErr(part.QueryRow(ctx(t), `SELECT parts, grown_from FROM transport_partition`).Scan(&parts, &from))
		is.True(parts != nil && *parts == 4 && from == nil) // partition i
		_ = i
	}
	// The fence stays: the old map's client is refused for good.
	_, err = p.Parts[0].Exec(ctx(t), `SELECT harel_publish($1, 'stale')`, c)
	is.True(errors.As(err, &pgErr) && pgErr.Code == "PT010")
	// And a second growth is refused until partitions are added.
	_, err = schema.Grow(ctx(t), db, p.Schema, nil)
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
}

// TestGrowKeepsWhatAGroupHolds: growing from one partition to two, a
// moving group that drained but keeps a state (within the queue's
// retention) or a dedup key (within its window) stays in its old
// partition, where its state and its keys are, until they expire; a
// publisher whose snapshot is older than a drain that emptied the group
// (REPEATABLE READ) fails to serialize rather than bring the group back;
// and the growth ends only once nothing of a moving group is left.
func TestGrowKeepsWhatAGroupHolds(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Growable(t, 1)
	db, old := p.Proxy, p.Parts[0]
	mover := func(prefix string) string { // one whose home in two partitions is 1
		t.Helper()
		for i := 0; ; i++ {
			g := fmt.Sprint(prefix, i)
			if home(t, p, g) == 0 { // one partition: every group's home is 0
				var h int
				is.NoErr(db.QueryRow(ctx(t), `SELECT hashtext($1) & 1`, g).Scan(&h))
				if h == 1 {
					return g
				}
			}
		}
	}
	kept, keyed, rr := mover("k"), mover("q"), mover("r")
	_, err := old.Exec(ctx(t), `UPDATE transport_policy SET state_retention = 600`)
	is.NoErr(err)
	var seq int64
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_publish($1, 'k1')`, kept).Scan(&seq))
	_, s1, _, ok := claim(t, db, "tk", 0)
	is.True(ok && s1 == seq)
	var held bool
	is.NoErr(old.QueryRow(ctx(t), `SELECT harel_ack_state($1, $2, 'tk', `+nowSQL+`, 'S1'::bytea)`, kept, seq).Scan(&held))
	is.True(held) // drained: its state is kept for 600 s
	var first int64
	is.NoErr(db.QueryRow(ctx(t), `SELECT s FROM harel_publish_keyed($1, '{q1}', '{0}', '{key1}', 600) AS s`, []string{keyed}).Scan(&first))
	g, s2, _, ok := claim(t, db, "tq", 0)
	is.True(ok && g == keyed && s2 == first)
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'tq', `+nowSQL+`)`, keyed, first).Scan(&held))
	is.True(held) // drained: its key is kept for 600 s
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_publish($1, 'r1')`, rr).Scan(&seq))

	n, err := p.Grow(ctx(t))
	is.NoErr(err)
	is.Equal(n, 2)

	var state []byte
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_state($1)`, kept).Scan(&state))
	is.Equal(string(state), "S1") // located in its old home
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_publish($1, 'k2')`, kept).Scan(&seq))
	is.Equal(seq&1, int64(0)) // stays with its state
	var again int64
	is.NoErr(db.QueryRow(ctx(t), `SELECT s FROM harel_publish_keyed($1, '{q1}', '{0}', '{key1}', 600) AS s`, []string{keyed}).Scan(&again))
	is.Equal(again, first) // the key, found where it is: not published twice
	is.NoErr(db.QueryRow(ctx(t), `SELECT s FROM harel_publish_keyed($1, '{q2}', '{0}', '{key2}', 600) AS s`, []string{keyed}).Scan(&seq))
	is.Equal(seq&1, int64(0)) // stays with its keys

	// A snapshot older than the drain that emptied rr: its publish must
	// not bring rr back to its old home (a publisher that saw it empty
	// went to the new one).
	tx, err := old.BeginTx(ctx(t), pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	is.NoErr(err)
	defer tx.Rollback(ctx(t))
	_, err = tx.Exec(ctx(t), `SELECT count(*) FROM transport_groups`) // the snapshot
	is.NoErr(err)
	var others []string // the other heads: held meanwhile, then given back
	g, s3, _, ok := claim(t, old, "tr", 0)
	for ok && g != rr {
		others = append(others, g)
		g, s3, _, ok = claim(t, old, "tr", 0)
	}
	is.True(ok)
	for _, o := range others {
		_, err = old.Exec(ctx(t), `SELECT harel_release($1, 'tr')`, o)
		is.NoErr(err)
	}
	is.NoErr(old.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'tr', `+nowSQL+`)`, rr, s3).Scan(&held))
	is.True(held) // rr has nothing left in partition 0
	_, err = tx.Exec(ctx(t), `SELECT harel_publish($1, 'r2')`, rr)
	is.Equal(sqlstate(err), "40001") // serialization failure: retry
	is.NoErr(tx.Rollback(ctx(t)))
	_, err = old.Exec(ctx(t), `SELECT harel_publish($1, 'r2')`, rr)
	is.Equal(sqlstate(err), "PT010") // and retried: it lives in partition 1 now
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_publish($1, 'r2')`, rr).Scan(&seq))
	is.Equal(seq&1, int64(1))

	for {
		g, s, _, ok := claim(t, db, "w", 0)
		if !ok {
			break
		}
		is.NoErr(db.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w', `+nowSQL+`)`, g, s).Scan(&held))
	}
	_, err = schema.Grown(ctx(t), db, p.Schema)
	is.True(errors.Is(err, schema.ErrNotGrown))
	is.True(strings.Contains(err.Error(), "p0: 0 groups, 0 dead letters, 1 kept states, 2 dedup keys")) // the state and the keys
	// Time passes: the state and the keys expire.
	_, err = old.Exec(ctx(t), `UPDATE transport_kept_states SET keep_until = 0`)
	is.NoErr(err)
	_, err = old.Exec(ctx(t), `UPDATE transport_dedup SET expires_at = 0`)
	is.NoErr(err)
	n, err = schema.Grown(ctx(t), db, p.Schema)
	is.NoErr(err)
	is.Equal(n, 2)
	is.NoErr(db.QueryRow(ctx(t), `SELECT harel_publish($1, 'k3')`, kept).Scan(&seq))
	is.Equal(seq&1, int64(1)) // moved: a fresh state there, as after any retention
}
