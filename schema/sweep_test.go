package schema_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestSweepServesEachGroupOncePerRound is the claim's order bound ("The
// sweep" in functions/30_claim.sql): with every group claimable
// throughout (each has a backlog and is acked at once), each round of as
// many claims as there are groups hands out every group exactly once, in
// slot order, whatever the batch size; a group that arrives mid-round is
// served in that round, after the groups that were already waiting.
func TestSweepServesEachGroupOncePerRound(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 7} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			db := noClockBound(t, pgtest.New(t, 2))
			is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
			c := db.Conn(t)
			const groups = 30
			_, err := c.Exec(ctx(t), `SELECT harel_publish('g' || lpad(i::text, 2, '0'), 'e', 0)
			                            FROM generate_series(1, 6) AS r, generate_series(1, $1) AS i`, groups)
			is.NoErr(err)
			now := 1000.0
			claimAck := func(n int) []string {
				t.Helper()
				now++
				rows, err := c.Query(ctx(t), `SELECT group_id, seq FROM harel_claim_leases($1::float8, $1::float8 + 60, 'w', 0, $2)`, now, n)
				is.NoErr(err)
				type lease struct {
					Group string
					Seq   int64
				}
				got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[lease])
				is.NoErr(err)
				var served []string
				for _, l := range got {
					var ok bool
					is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w', $3)`, l.Group, l.Seq, now).Scan(&ok))
					is.True(ok)
					served = append(served, l.Group)
				}
				return served
			}
			round := func(extra string) map[string]int {
				t.Helper()
				seen := map[string]int{}
				total := groups
				if extra != "" {
					total++
				}
				for n := 0; n < total; {
					k := min(batch, total-n)
					served := claimAck(k)
					is.Equal(len(served), k) // a claim takes as many as it may
					for _, g := range served {
						seen[g]++
					}
					n += k
					if extra != "" && n >= groups/2 && seen[extra] == 0 && n-k < groups/2 {
						_, err := c.Exec(ctx(t), `SELECT harel_publish($1, 'e', 0)`, extra)
						is.NoErr(err)
					}
				}
				return seen
			}
			for r := range 3 {
				extra := ""
				if r == 1 {
					extra = "late"
				}
				seen := round(extra)
				for i := 1; i <= groups; i++ {
					is.Equal(seen[fmt.Sprintf("g%02d", i)], 1) // once per round
				}
				if extra != "" {
					is.Equal(seen[extra], 1) // arrived mid-round, served in it
				}
			}
		})
	}
}

// TestClaimAndAckAreHOT: a queue's working path (claims of one and of
// many, acks, kept leases, extends) rewrites its group rows in place:
// every update of transport_groups is HOT (no indexed column written; see
// "The sweep" in functions/30_claim.sql), so the table and its indexes do
// not grow per message.
func TestClaimAndAckAreHOT(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	// A database of its own: a page's dead versions are pruned only once
	// no snapshot in the same database may see them, and other tests hold
	// snapshots in theirs.
	admin, err := pgx.Connect(ctx(t), pgtest.DSN(t))
	is.NoErr(err)
	name := fmt.Sprintf("pgt_hot_%d", time.Now().UnixNano())
	_, err = admin.Exec(ctx(t), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	is.NoErr(err)
	t.Cleanup(func() {
		_, err := admin.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		is.NoErr(err)
		is.NoErr(admin.Close(context.Background()))
	})
	cfg, err := pgx.ParseConfig(pgtest.DSN(t))
	is.NoErr(err)
	cfg.Database = name
	cfg.RuntimeParams["pgtransport.max_clock_skew"] = "off" // the test's clock is its own
	c, err := pgx.ConnectConfig(ctx(t), cfg)
	is.NoErr(err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	is.NoErr(schema.Apply(ctx(t), c, "public"))
	_, err = c.Exec(ctx(t), `SELECT harel_publish('g' || i, 'e', 0) FROM generate_series(1, 8) AS r, generate_series(1, 20) AS i`)
	is.NoErr(err)
	for now := 1000.0; ; now++ {
		var one, many int
		is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_claim_one($1::float8, $1::float8 + 60, 'w:1')`, now).Scan(&one))
		is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_claim_leases($1::float8, $1::float8 + 60, 'w:2', 0, 5)`, now).Scan(&many))
		if one+many == 0 {
			break
		}
		_, err := c.Exec(ctx(t), `SELECT harel_extend(g.group_id, 'w:2', $1::float8 + 90) FROM transport_groups AS g WHERE g.locked_by = 'w:2'`, now)
		is.NoErr(err)
		_, err = c.Exec(ctx(t), `
			SELECT harel_ack(g.group_id, g.delivered_seq, g.locked_by, $1)
			  FROM transport_groups AS g WHERE g.locked_by = 'w:1'`, now)
		is.NoErr(err)
		_, err = c.Exec(ctx(t), `
			SELECT * FROM harel_ack_many(
			    ARRAY(SELECT group_id FROM transport_groups WHERE locked_by = 'w:2' ORDER BY group_id),
			    ARRAY(SELECT delivered_seq FROM transport_groups WHERE locked_by = 'w:2' ORDER BY group_id),
			    ARRAY(SELECT locked_by FROM transport_groups WHERE locked_by = 'w:2' ORDER BY group_id),
			    ARRAY(SELECT (hashtext(group_id) & 1) = 0 FROM transport_groups WHERE locked_by = 'w:2' ORDER BY group_id),
			    $1::float8, $1::float8 + 60)`, now)
		is.NoErr(err)
		is.True(now < 1300) // drains
	}
	var msgs int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_messages`).Scan(&msgs))
	is.Equal(msgs, 0) // every message was acked
	_, err = c.Exec(ctx(t), `SELECT pg_stat_force_next_flush()`)
	is.NoErr(err)
	var upd, hot int64
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		is.NoErr(c.QueryRow(ctx(t), `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'transport_groups'::regclass`).Scan(&upd, &hot))
		if upd > 0 || time.Since(start) > 5*time.Second {
			break
		}
	}
	is.True(upd >= 150) // the stats were flushed: claims, extends and acks of 160 messages
	// Not all: an update finds no room in its page when the page's dead
	// versions could not be pruned yet (another statement had it pinned).
	// Until version 16, none was HOT.
	if float64(hot) < 0.8*float64(upd) {
		t.Fatalf("%d of %d group-row updates were HOT, want at least 80%%", hot, upd)
	}
}

// TestSweepGoesRoundWithin50ms: a claim that found something ahead of the
// cursor skips the walk from the first slot for 50 ms after a claim that
// went round found nothing there ("Going round" in functions/30_claim.sql),
// and makes it after that; a claim that found nothing always goes round.
func TestSweepGoesRoundWithin50ms(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	claim := func(now float64, limit int) []string {
		t.Helper()
		rows, err := c.Query(ctx(t), `SELECT group_id FROM harel_claim_leases($1::float8, $1::float8 + 60, 'w', 0, $2) ORDER BY 1`, now, limit)
		is.NoErr(err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		is.NoErr(err)
		return got
	}
	_, err := c.Exec(ctx(t), `SELECT harel_publish('behind', 'e1', 0), harel_publish('behind', 'e2', 0)`)
	is.NoErr(err)
	is.Equal(claim(1000, 10), []string{"behind"})
	var seq int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT delivered_seq FROM transport_groups WHERE group_id = 'behind'`).Scan(&seq))
	is.Equal(len(claim(1000.01, 10)), 0) // nothing claimable: went round, found nothing
	_, err = c.Exec(ctx(t), `SELECT setval('transport_claim_rest', 0)`)
	is.NoErr(err) // however long that round took on a loaded machine: the 50 ms alone (TestCostlyRoundRests has the rest)
	_, err = c.Exec(ctx(t), `SELECT harel_ack('behind', $1, 'w', 1000.01), harel_publish('ahead', 'e', 0)`, seq)
	is.NoErr(err)
	is.Equal(claim(1000.02, 10), []string{"ahead"}) // behind the cursor, skipped within 50 ms of the empty round
	_, err = c.Exec(ctx(t), `SELECT harel_publish('ahead2', 'e', 0)`)
	is.NoErr(err)
	is.Equal(claim(1000.10, 10), []string{"ahead2", "behind"}) // 90 ms after it: round again
	is.Equal(len(claim(1000.11, 10)), 0)                       // nothing left
	_, err = c.Exec(ctx(t), `SELECT harel_ack('ahead', delivered_seq, 'w', 1000.12) FROM transport_groups WHERE group_id = 'ahead'`)
	is.NoErr(err)
	_, err = c.Exec(ctx(t), `SELECT harel_publish('ahead', 'e2', 0)`)
	is.NoErr(err)
	is.Equal(claim(1000.13, 10), []string{"ahead"}) // drained and published again: a new row, ahead of the cursor
}

// TestCostlyRoundRests: a round from the first slot that leased nothing
// and took 5 ms or more rests the rounds ("Going round" in
// functions/30_claim.sql): until the rest ends, a claim that found
// something ahead of the cursor, and a stream's exchange (p_rest), skip
// the round, while a claim that found nothing still goes
// round and hands out the group behind the cursor; and a drained group
// that comes back is revived at the end of the round, ahead of the
// cursor, where the resting claims find it.
func TestCostlyRoundRests(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	type lease struct {
		Kind  string
		Group string
		Seq   *int64
	}
	claim := func(now float64, limit int) []string {
		t.Helper()
		rows, err := c.Query(ctx(t), `SELECT group_id FROM harel_claim_leases($1::float8, $1::float8 + 60, 'w', 0, $2) ORDER BY 1`, now, limit)
		is.NoErr(err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		is.NoErr(err)
		return got
	}
	restsUntil := func() int64 {
		t.Helper()
		var until, now int64
		is.NoErr(c.QueryRow(ctx(t), `SELECT last_value, floor(date_part('epoch', clock_timestamp()) * 1000)::bigint FROM transport_claim_rest`).Scan(&until, &now))
		return until - now
	}
	// 200,000 rows a round must pass (held by others), and one group
	// behind the cursor.
	_, err := c.Exec(ctx(t), `INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
	                          SELECT 'held' || i, 'other', 1e12, 0 FROM generate_series(1, 200000) AS i`)
	is.NoErr(err)
	_, err = c.Exec(ctx(t), `SELECT harel_publish('behind', 'e1', 0), harel_publish('behind', 'e2', 0)`)
	is.NoErr(err)
	is.Equal(claim(1000, 10), []string{"behind"})
	is.Equal(len(claim(1000.01, 10)), 0) // went round past 200,000 rows, found nothing
	rest := restsUntil()
	is.True(rest > 0)     // a costly round: the rounds rest
	is.True(rest <= 2000) // at most 2 s
	_, err = c.Exec(ctx(t), `SELECT setval('transport_claim_rest', floor(date_part('epoch', clock_timestamp()) * 1000 + 2000)::bigint)`)
	is.NoErr(err) // the longest rest, so that the next steps do not race the clock
	var seq int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT delivered_seq FROM transport_groups WHERE group_id = 'behind'`).Scan(&seq))
	_, err = c.Exec(ctx(t), `SELECT harel_ack('behind', $1, 'w', 1000.02), harel_publish('ahead', 'e', 0)`, seq)
	is.NoErr(err) // 'behind' is free with a message left, behind the cursor

	is.Equal(claim(1000.2, 10), []string{"ahead"}) // found something: no round while resting
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM transport_messages WHERE group_id = 'ahead'`).Scan(&seq))
	rows, err := c.Query(ctx(t), `SELECT kind::text, group_id, seq FROM harel_exchange_leases(1000.3, 1060, 'w', 0, 10, '{ahead}', $1, '{w}', '{false}', true)`, []int64{seq})
	is.NoErr(err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[lease])
	is.NoErr(err)
	is.Equal(len(got), 1) // the stream's exchange settled 'ahead' and, resting, claimed nothing
	is.Equal(got[0].Kind+"/"+got[0].Group, "a/ahead")
	var n int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_exchange_leases(1000.31, 1060, 'w', 0, 10, '{}', '{}', '{}', '{}') WHERE group_id = 'behind'`).Scan(&n))
	is.Equal(n, 1) // without p_rest it goes round and finds 'behind'

	var slot, revived int
	is.NoErr(c.QueryRow(ctx(t), `SELECT slot FROM transport_groups WHERE group_id = 'ahead'`).Scan(&slot))
	_, err = c.Exec(ctx(t), `SELECT harel_publish('ahead', 'e2', 0)`)
	is.NoErr(err)
	is.NoErr(c.QueryRow(ctx(t), `SELECT slot FROM transport_groups WHERE group_id = 'ahead'`).Scan(&revived))
	is.True(revived > slot) // revived at the end of the round
	// At 1061 that lease of 'behind' has lapsed: claimable again, in its
	// place behind the cursor.
	is.Equal(claim(1061, 1), []string{"ahead"})   // ahead of the cursor: found while resting
	is.Equal(claim(1062, 10), []string{"behind"}) // found nothing ahead: went round all the same

	// A rest more than 2 s ahead (the server's clock stepped back) is no
	// rest: a costly round replaces it with its own.
	var ahead int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT r.rest - floor(date_part('epoch', clock_timestamp()) * 1000)::bigint
	                               FROM harel_rest_rounds(1063, 10, floor(date_part('epoch', clock_timestamp()) * 1000 + 60000)::bigint) AS r`).Scan(&ahead))
	is.True(ahead <= 2000)
	is.True(ahead > 0)
}

// TestClaimWalksTheSlotsOnce: a claim that goes on past rows it picked and
// found empty walks on from the slot after the last it took, in the walk
// from the cursor and in the round, so one claim reads each row about once
// however many empty rows it meets ("Again only while nothing was leased"
// in harel_sweep). Here a claim of one meets 2,000 rows freshly marked
// drained (a kept row the claims must look into, then pass for 2 s), 1,000
// each side of the cursor, before the one group with a message, at the end
// of the round. Walking again from the cursor and the first slot each
// time, it read about 2 million rows. A stream's exchange stops earlier.
func TestClaimWalksTheSlotsOnce(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	const kept = 1000
	marked := func() {
		t.Helper()
		_, err := c.Exec(ctx(t), `INSERT INTO transport_groups (group_id, lock_expiry, drained_at)
		                          SELECT 'kept' || nextval('transport_groups_slot'), 1000, 1000 FROM generate_series(1, $1)`, kept)
		is.NoErr(err)
	}
	marked() // slots 0 to 999
	_, err := c.Exec(ctx(t), `SELECT harel_publish('last', 'e', 0)`)
	is.NoErr(err)
	marked()
	_, err = c.Exec(ctx(t), `SELECT setval('transport_claim_cursor', (SELECT slot + 1 FROM transport_groups WHERE group_id = 'last'))`)
	is.NoErr(err)

	// A stream's exchange (p_rest) stops after 256 rows picked and not
	// leased, and commits: it holds those rows until then.
	var n int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_exchange_leases(1000.4, 1060, 'w', 0, 1, '{}', '{}', '{}', '{}', true)`).Scan(&n))
	is.Equal(n, 0)
	var looked int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups WHERE lock_expiry > drained_at`).Scan(&looked))
	is.Equal(looked, 256)

	tx, err := c.Begin(ctx(t))
	is.NoErr(err)
	defer func() { _ = tx.Rollback(ctx(t)) }()
	var got string
	is.NoErr(tx.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1000.5, 1060, 'w')`).Scan(&got))
	is.Equal(got, "last") // found behind every empty row
	var fetched int64
	is.NoErr(tx.QueryRow(ctx(t), `SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relid = 'transport_groups'::regclass`).Scan(&fetched))
	t.Logf("rows read through an index: %d", fetched)
	is.True(fetched < 10*2*kept) // each row about once, not once per row picked before it
	var left int
	is.NoErr(tx.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups WHERE lock_expiry > drained_at`).Scan(&left))
	is.Equal(left, 2*kept) // and each was looked into: found empty, freed, kept
}
