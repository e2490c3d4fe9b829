package schema_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestClaimsServeGroupsInTheOrderTheyBecameClaimable is the claim's
// order bound ("The ready log" in functions/30_claim.sql): with every
// group claimable throughout (each has a backlog and is acked at once),
// the claims hand the groups out in the order they became claimable. With
// claims of one, every group in turn, in the same order each round; with
// claims of 7 (whose leases come back in the order they are acked), no
// group twice between two hand-outs of another. A group that arrives is
// handed out after exactly the groups that were claimable before it (in
// the claim that reaches its turn): a claimable group waits at most as
// many hand-outs as there are claimable groups.
func TestClaimsServeGroupsInTheOrderTheyBecameClaimable(t *testing.T) {
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
			var claims [][]string // what each claim handed out
			claimAck := func(n int) {
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
				is.Equal(len(got), n) // a claim takes as many as it may
				var served []string
				for _, l := range got {
					var ok bool
					is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w', $3)`, l.Group, l.Seq, now).Scan(&ok))
					is.True(ok)
					served = append(served, l.Group)
				}
				claims = append(claims, served)
			}
			late := -1 // the claims made when "late" arrived
			for n := 0; n < 4*groups; n += batch {
				claimAck(batch)
				if late < 0 && n+batch >= 2*groups {
					_, err := c.Exec(ctx(t), `SELECT harel_publish('late', 'e', 0)`)
					is.NoErr(err)
					late = len(claims)
				}
			}
			served := slices.Concat(claims...)
			first := slices.Clone(served[:groups])
			if batch == 1 {
				for i := groups; i < len(served) && served[i] != "late"; i++ {
					is.Equal(served[i], served[i-groups]) // every group in turn, the same order each round
				}
			} else {
				// Between two hand-outs of a group, the claims in between
				// hand out every other group at most once.
				last := map[string]int{}
				for i, cl := range claims {
					for _, g := range cl {
						if j, ok := last[g]; ok && g != "late" {
							between := slices.Concat(claims[j+1 : i]...)
							slices.Sort(between)
							is.Equal(len(slices.Compact(between)), len(between)) // no group twice
						}
						last[g] = i
					}
				}
				first = slices.Concat(claims[:groups/batch]...) // whole claims of the first round
			}
			slices.Sort(first)
			is.Equal(len(slices.Compact(first)), len(first)) // the first round: no group twice
			// "late": after the 30 groups claimable when it arrived, in
			// the claim that reaches the 31st hand-out after its arrival.
			at := -1
			for i, cl := range claims {
				if slices.Contains(cl, "late") {
					at = i
				}
			}
			is.Equal(at, late+groups/batch) // the claim that reaches its turn
		})
	}
}

// TestKeepYieldsToWaitingGroups is the bound with keeps ("A keep yields"
// in functions/40_ack.sql): consumers that ask to keep every lease for its
// group's next message while no other group waits (p_keep NULL), up to
// maxKeep in a row as the Go client does, so that a group that becomes
// claimable (at its publish, or freed with messages left) is handed out
// within as many hand-outs as there are groups, plus one more message of
// each lease then held. Kept regardless (p_keep true, as before version
// 26), each wait would be about maxKeep times that: a group freed after
// its keeps waits for every group ahead of it to take maxKeep messages. Group g00 has three times the others' messages: once
// it is left alone, none waits and its lease is kept.
func TestKeepYieldsToWaitingGroups(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	const groups, depth, consumers, maxKeep = 12, 9, 3, 4
	_, err := c.Exec(ctx(t), `SELECT harel_publish('g' || lpad(i::text, 2, '0'), 'e', 0)
	                            FROM generate_series(1, 3 * $2) AS r, generate_series(0, $1 - 1) AS i
	                           WHERE i = 0 OR r <= $2`, groups, depth)
	is.NoErr(err)
	type lease struct {
		group, token string
		seq          int64
		kept         int
	}
	var (
		held    = make([]*lease, consumers)
		left    = map[string]int{}
		readyAt = map[string]int{} // hand-outs made when the group became claimable
		handed  int
		worst   int
		kept    int
		acked   int
		now     = 1000.0
	)
	for g := range groups {
		name := fmt.Sprintf("g%02d", g)
		left[name], readyAt[name] = depth, 0
	}
	left["g00"] = 3 * depth
	total := (groups + 2) * depth
	handOut := func(group string) {
		if at, ok := readyAt[group]; ok {
			worst = max(worst, handed-at)
			delete(readyAt, group)
		}
		handed++
	}
	for step := 0; acked < total; step++ {
		is.True(step < 10*total) // the queue drains
		k := step % consumers
		now += 0.001
		token := fmt.Sprintf("w%d:%d", k, step)
		var gs, toks []string
		var seqs []int64
		var keep []*bool // NULL while it may keep: kept only while no group waits
		if l := held[k]; l != nil {
			gs, toks, seqs, keep = []string{l.group}, []string{l.token}, []int64{l.seq}, []*bool{nil}
			if l.kept+1 >= maxKeep {
				keep[0] = new(bool)
			}
		}
		rows, err := c.Query(ctx(t), `SELECT kind::text, group_id, held, seq
		                                FROM harel_exchange_leases($1::float8, $1::float8 + 60, $2, 0, 1, $3, $4, $5, $6)`,
			now, token, gs, seqs, toks, keep)
		is.NoErr(err)
		type row struct {
			Kind  string
			Group string
			Held  bool
			Seq   *int64
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		is.NoErr(err)
		for _, r := range got {
			switch {
			case r.Kind == "a":
				is.True(r.Held) // every lease is acked while it holds
				acked++
				left[r.Group]--
				l := held[k]
				held[k] = nil
				if r.Seq != nil {
					kept++
					held[k] = &lease{group: r.Group, token: l.token, seq: *r.Seq, kept: l.kept + 1}
					handOut(r.Group)
				} else if left[r.Group] > 0 {
					readyAt[r.Group] = handed
				}
			default:
				is.Equal(held[k], nil) // a claim only for a consumer that holds nothing
				held[k] = &lease{group: r.Group, token: token, seq: *r.Seq}
				handOut(r.Group)
			}
		}
	}
	t.Logf("worst wait %d hand-outs, %d of %d messages kept", worst, kept, total)
	is.True(worst <= groups+consumers) // within the bound
	is.True(kept > 0)                  // and kept where no group waited
}

// TestRetriedKeepKeepsWhileAGroupWaits: an exchange that kept a lease
// (p_keep NULL, no group waiting) and whose answer was lost is sent again
// as it was; by then another group waits, and the retry still keeps the
// lease with the same next message ("A keep yields" in
// functions/40_ack.sql), where yielding would free a group whose message
// the holder was told nothing of.
func TestRetriedKeepKeepsWhileAGroupWaits(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	_, err := c.Exec(ctx(t), `SELECT harel_publish('a', 'a1', 0), harel_publish('a', 'a2', 0)`)
	is.NoErr(err)
	var a1 int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_claim_one(1000, 1060, 'w')`).Scan(&a1))
	exchange := func() (held bool, next *int64) {
		t.Helper()
		is.NoErr(c.QueryRow(ctx(t), `SELECT held, seq FROM harel_exchange_leases(1001, 1061, NULL, 0, 0,
		                               ARRAY['a'], ARRAY[$1::bigint], ARRAY['w'], ARRAY[NULL::boolean])`, a1).Scan(&held, &next))
		return held, next
	}
	held, first := exchange()
	is.True(held && first != nil) // kept: no group waits
	_, err = c.Exec(ctx(t), `SELECT harel_publish('b', 'b1', 0)`)
	is.NoErr(err)
	held, again := exchange()
	is.True(held && again != nil) // the retry keeps, b waiting or not
	is.Equal(*again, *first)      // with the same next message
	var holder string
	is.NoErr(c.QueryRow(ctx(t), `SELECT locked_by FROM transport_groups WHERE group_id = 'a'`).Scan(&holder))
	is.Equal(holder, "w")
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

// TestSweepFindsWhatTheLogMisses: a lease that lapses writes no entry in
// the ready log; the sweep finds it ("Going round" in
// functions/30_claim.sql). A claim that finds nothing in the log sweeps at
// once; one that finds something sweeps only a second or more after a
// sweep that leased nothing, and then takes the lapsed group beside what
// the log gave it.
func TestSweepFindsWhatTheLogMisses(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	claim := func(now, lease float64, limit int) []string {
		t.Helper()
		rows, err := c.Query(ctx(t), `SELECT group_id FROM harel_claim_leases($1::float8, $2::float8, 'w', 0, $3) ORDER BY 1`, now, lease, limit)
		is.NoErr(err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		is.NoErr(err)
		return got
	}
	noRest := func() {
		t.Helper()
		_, err := c.Exec(ctx(t), `SELECT setval('transport_claim_rest', 0)`)
		is.NoErr(err) // however long a sweep took on a loaded machine: the second alone (TestCostlySweepRests has the rest)
	}
	_, err := c.Exec(ctx(t), `SELECT harel_publish('lapsed', 'e1', 0), harel_publish('lapsed', 'e2', 0)`)
	is.NoErr(err)
	is.Equal(claim(1000, 1001, 10), []string{"lapsed"}) // from the log; its lease ends at 1001
	var entries int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_ready`).Scan(&entries))
	is.Equal(entries, 0)                      // the claim took its entry
	is.Equal(len(claim(1000.5, 1060, 10)), 0) // nothing in the log, the sweep found nothing claimable
	noRest()
	_, err = c.Exec(ctx(t), `SELECT harel_publish('fresh', 'e', 0)`)
	is.NoErr(err)
	is.Equal(claim(1001.2, 1060, 10), []string{"fresh"}) // lapsed at 1001, but 0.7 s after the empty sweep: the log's alone
	_, err = c.Exec(ctx(t), `SELECT harel_publish('fresh2', 'e', 0)`)
	is.NoErr(err)
	is.Equal(claim(1001.6, 1060, 10), []string{"fresh2", "lapsed"}) // 1.1 s after it: swept too
	is.Equal(len(claim(1001.7, 1060, 10)), 0)                       // nothing left
	noRest()
	// A lapse found by a claim that found nothing in the log, at once.
	is.Equal(len(claim(1061, 1070, 1)), 1) // the three leases lapsed at 1060: the sweep hands one out
}

// TestCostlySweepRests: a sweep that leased nothing and took 5 ms or more
// rests the sweeps ("Going round" in functions/30_claim.sql): until the
// rest ends, a claim that found something in the log, and a stream's
// exchange (p_rest), do not sweep, while a claim that found nothing still
// does and hands out the groups whose leases lapsed; the rest is 9 times the
// sweep's cost, 1 s at least and 2 s at most.
func TestCostlySweepRests(t *testing.T) {
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
	restsUntil := func() int64 {
		t.Helper()
		var until, now int64
		is.NoErr(c.QueryRow(ctx(t), `SELECT last_value, floor(date_part('epoch', clock_timestamp()) * 1000)::bigint FROM transport_claim_rest`).Scan(&until, &now))
		return until - now
	}
	// 200,000 rows a sweep must pass (held by others), and two groups
	// whose leases will lapse.
	// (harel.revives on: the revival trigger stands aside for the load.)
	_, err := c.Exec(ctx(t), `SELECT set_config('harel.revives', 'on', false);
	                          INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
	                          SELECT 'held' || i, 'other', 1e12, 0 FROM generate_series(1, 200000) AS i;
	                          SELECT set_config('harel.revives', '', false)`)
	is.NoErr(err)
	_, err = c.Exec(ctx(t), `SELECT harel_publish(g, 'e1', 0), harel_publish(g, 'e2', 0) FROM unnest('{b1,b2}'::text[]) AS g`)
	is.NoErr(err)
	is.Equal(claim(1000, 10), []string{"b1", "b2"}) // from the log; their leases lapse at 1060
	is.Equal(len(claim(1000.01, 10)), 0)            // swept past 200,000 rows, found nothing
	rest := restsUntil()
	is.True(rest > 0)     // a costly sweep: the sweeps rest
	is.True(rest <= 2000) // at most 2 s
	_, err = c.Exec(ctx(t), `SELECT setval('transport_claim_rest', floor(date_part('epoch', clock_timestamp()) * 1000 + 2000)::bigint)`)
	is.NoErr(err) // the longest rest, so that the next steps do not race the clock

	_, err = c.Exec(ctx(t), `SELECT harel_publish('ahead', 'e', 0)`)
	is.NoErr(err)
	is.Equal(claim(1061, 10), []string{"ahead"}) // found something in the log: no sweep while resting
	var n int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_exchange_leases(1061.1, 1121, 'w', 0, 10, '{}', '{}', '{}', '{}', true)`).Scan(&n))
	is.Equal(n, 0)                                    // a stream's exchange, resting, claimed nothing
	is.Equal(claim(1061.2, 10), []string{"b1", "b2"}) // found nothing: swept all the same

	// A rest more than 2 s ahead (the server's clock stepped back) is no
	// rest: a costly sweep replaces it with its own.
	var ahead int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT r.rest - floor(date_part('epoch', clock_timestamp()) * 1000)::bigint
	                               FROM harel_rest_rounds(1063, 10, floor(date_part('epoch', clock_timestamp()) * 1000 + 60000)::bigint) AS r`).Scan(&ahead))
	is.True(ahead <= 2000)
	is.True(ahead > 0)

	// A sweep of 6 ms rests the sweeps 1 s, not 54 ms: a second at least
	// (version 24).
	is.NoErr(c.QueryRow(ctx(t), `SELECT r.rest - floor(date_part('epoch', clock_timestamp()) * 1000)::bigint
	                               FROM harel_rest_rounds(1064, 6, 0) AS r`).Scan(&ahead))
	is.True(ahead > 900)   // the floor
	is.True(ahead <= 1000) // not more
}

// TestClaimWalksTheSlotsOnce: a claim of one whose sweep meets 2,000 kept
// rows, empty and freshly marked drained, 1,000 each side of the cursor,
// before the one group with a message, at the end of the round, whose
// lease lapsed (so that the ready log does not have it), reads each row
// about once and writes none of them: it probes each kept row for a
// message and passes it unlocked ("Kept rows" in functions/30_claim.sql).
// Until version 19 a claim walked again from the cursor each time it
// found picked rows empty (about 2 million rows read here); until
// version 22 it locked and freed every one of them.
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
	// "last" has a message and a lease that lapses at 1000.1: no entry in
	// the ready log, so only the sweep finds it.
	_, err := c.Exec(ctx(t), `SELECT harel_publish('last', 'e', 0)`)
	is.NoErr(err)
	var g string
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(999, 1000.1, 'gone')`).Scan(&g))
	is.Equal(g, "last")
	marked()
	_, err = c.Exec(ctx(t), `SELECT setval('transport_claim_cursor', (SELECT slot + 1 FROM transport_groups WHERE group_id = 'last'))`)
	is.NoErr(err)
	written := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) int {
		t.Helper()
		var n int
		is.NoErr(q.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups WHERE drained_at IS NULL OR lock_expiry <> drained_at`).Scan(&n))
		return n - 1 // "last" aside
	}

	// A stream's exchange before the lease lapses: nothing to lease, and
	// no kept row written.
	var n int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_exchange_leases(1000.05, 1060, 'w', 0, 1, '{}', '{}', '{}', '{}', true)`).Scan(&n))
	is.Equal(n, 0)
	is.Equal(written(c), 0)

	tx, err := c.Begin(ctx(t))
	is.NoErr(err)
	defer func() { _ = tx.Rollback(ctx(t)) }()
	var got string
	is.NoErr(tx.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1000.5, 1060, 'w')`).Scan(&got))
	is.Equal(got, "last") // found behind every kept row
	var fetched int64
	is.NoErr(tx.QueryRow(ctx(t), `SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relid = 'transport_groups'::regclass`).Scan(&fetched))
	t.Logf("rows read through an index: %d", fetched)
	is.True(fetched < 10*2*kept) // each row about once
	is.Equal(written(tx), 0)     // and none written
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM (SELECT 1 FROM transport_groups WHERE drained_at IS NOT NULL FOR NO KEY UPDATE NOWAIT) AS k`).Scan(&n))
	is.Equal(n, 2*kept) // none locked: another transaction takes them all at once
}

// TestBudgetedSweepGoesOnWhereItStopped: a stream's exchange sweeps for
// about 10 ms a call ("Going round" in functions/30_claim.sql), 512 slots
// at a time, and leaves the cursor where it stopped: past 200,000 held
// rows, one exchange stops part of the way, and the exchanges after it go
// on from there until one hands out the group whose lease lapsed at the
// end of the slots.
func TestBudgetedSweepGoesOnWhereItStopped(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	_, err := c.Exec(ctx(t), `SELECT set_config('harel.revives', 'on', false);
	                          INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
	                          SELECT 'held' || i, 'other', 1e12, 0 FROM generate_series(1, 200000) AS i;
	                          SELECT set_config('harel.revives', '', false)`)
	is.NoErr(err)
	_, err = c.Exec(ctx(t), `SELECT harel_publish('lapsed', 'e', 0)`)
	is.NoErr(err)
	var g string
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1000, 1000.5, 'gone')`).Scan(&g))
	is.Equal(g, "lapsed") // from the log; its lease lapses at 1000.5, the last slot
	cursor := func() int {
		t.Helper()
		var n int
		is.NoErr(c.QueryRow(ctx(t), `SELECT last_value FROM transport_claim_cursor`).Scan(&n))
		return n
	}
	start := cursor()
	exchange := func(now float64) int {
		t.Helper()
		_, err := c.Exec(ctx(t), `SELECT setval('transport_claim_rest', 0)`) // no rest between the calls
		is.NoErr(err)
		var n int
		is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_exchange_leases($1::float8, $1::float8 + 60, 'w', 0, 10, '{}', '{}', '{}', '{}', true) WHERE kind = 'c'`, now).Scan(&n))
		return n
	}
	is.Equal(exchange(1001), 0)
	first := cursor()
	t.Logf("one exchange swept slots %d to %d of 200,001", start, first)
	is.True(first > start)  // it went part of the way
	is.True(first < 200000) // and stopped at its budget
	calls, prev := 1, first
	for ; calls < 10000 && exchange(1001+float64(calls)) == 0; calls++ {
		is.True(cursor() != prev) // each goes on from where the last stopped
		prev = cursor()
	}
	t.Logf("found by exchange %d", calls+1)
	is.True(calls < 10000) // found, by exchanges alone
}
