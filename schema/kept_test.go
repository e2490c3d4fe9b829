package schema_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestDrainedRowIsKeptAndRevived is "Kept rows" in functions/30_claim.sql,
// through the design's plain SQL: the ack that drains a group keeps its
// row, freed and marked, in place; the group's next two-INSERT publish
// readies that row (same slot, the new publish's priority, an entry in
// the ready log; the row unwritten when its priority stays, and marked
// until the claim that leases it)
// and wakes an idle consumer as a new group would, and so does
// harel_publish_many; claims pass the row, unwritten, while it is empty,
// and the reap of a claim that leases nothing 2 s after the drain or later
// deletes it (here the reap's slots cover it); and a message that reaches a marked
// row without its group insert (a publish that overlapped the drain) is
// handed out by the next claim.
func TestDrainedRowIsKeptAndRevived(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 3))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	publish := func(group, event string, priority int) {
		t.Helper()
		tx, err := c.Begin(ctx(t))
		is.NoErr(err)
		_, err = tx.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ($1, $2)`, group, event)
		is.NoErr(err)
		_, err = tx.Exec(ctx(t), `INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
		                          VALUES ($1, NULL, NULL, $2) ON CONFLICT (group_id) DO NOTHING`, group, priority)
		is.NoErr(err)
		is.NoErr(tx.Commit(ctx(t)))
	}
	now := 1000.0
	claim := func(floor int) (group, event string, seq int64) {
		t.Helper()
		now++
		err := c.QueryRow(ctx(t), `SELECT group_id, seq, event FROM harel_claim($1::float8, $1::float8 + 60, 'w', $2)`, now, floor).Scan(&group, &seq, &event)
		if err == pgx.ErrNoRows {
			return "", "", 0
		}
		is.NoErr(err)
		return group, event, seq
	}
	ack := func(group string, seq int64) {
		t.Helper()
		var ok bool
		is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w', $3)`, group, seq, now).Scan(&ok))
		is.True(ok)
	}
	type row struct {
		Slot     int
		Priority int
		Drained  bool
		Free     bool
	}
	rowOf := func(group string) (r row, ok bool) {
		t.Helper()
		err := c.QueryRow(ctx(t), `SELECT slot, priority, drained_at IS NOT NULL, locked_by IS NULL FROM transport_groups WHERE group_id = $1`, group).
			Scan(&r.Slot, &r.Priority, &r.Drained, &r.Free)
		if err == pgx.ErrNoRows {
			return r, false
		}
		is.NoErr(err)
		return r, true
	}

	publish("g", "first", 4)
	first, ok := rowOf("g")
	is.True(ok)
	g, ev, seq := claim(0)
	is.Equal(g+"/"+ev, "g/first")
	ack(g, seq)
	kept, ok := rowOf("g")
	is.True(ok)                                                                   // drained: the row is kept
	is.Equal(kept, row{Slot: first.Slot, Priority: 4, Drained: true, Free: true}) // freed and marked, in place
	var groups int
	is.NoErr(c.QueryRow(ctx(t), `SELECT groups FROM harel_stats() WHERE priority IS NULL`).Scan(&groups))
	is.Equal(groups, 0) // a kept row is not a group

	// An idle consumer waiting for a wake-up, on a connection of its own.
	l := db.Conn(t)
	var channel string
	is.NoErr(l.QueryRow(ctx(t), `SELECT harel_channel()`).Scan(&channel))
	_, err := l.Exec(ctx(t), `LISTEN `+pgx.Identifier{channel}.Sanitize())
	is.NoErr(err)
	_, err = c.Exec(ctx(t), `SELECT harel_wait('idle', 0, 60, $1)`, now) // on the test's clock, so that its reap passes the row
	is.NoErr(err)

	entries := func(group string) (n int) {
		t.Helper()
		is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_ready WHERE group_id = $1`, group).Scan(&n))
		return n
	}
	is.Equal(entries("g"), 0) // the claim took its entry
	publish("g", "second", 1)
	revived, ok := rowOf("g")
	is.True(ok)
	is.Equal(revived, row{Slot: first.Slot, Priority: 1, Drained: true, Free: true}) // the new first publish's priority, marked until leased
	is.Equal(entries("g"), 1)                                                        // ready: its entry in the log
	wctx, cancel := context.WithTimeout(ctx(t), 5*time.Second)
	defer cancel()
	_, err = l.WaitForNotification(wctx)
	is.NoErr(err) // woken, as for a new group

	publish("g", "second-b", 4) // not the first since the drain
	r, _ := rowOf("g")
	is.Equal(r.Priority, 1) // the first publish's priority stays
	g, _, _ = claim(2)
	is.Equal(g, "") // priority 1 now, below the floor
	g, ev, seq = claim(0)
	is.Equal(g+"/"+ev, "g/second")
	leased, _ := rowOf("g")
	is.True(!leased.Drained) // the lease cleared the mark
	ack(g, seq)
	g, ev, seq = claim(0)
	is.Equal(g+"/"+ev, "g/second-b")
	ack(g, seq)

	// Published again at the priority it has: the row is not written.
	var before, after string
	is.NoErr(c.QueryRow(ctx(t), `SELECT xmin::text FROM transport_groups WHERE group_id = 'g'`).Scan(&before))
	n := entries("g") // a stale one may be left (the free with second-b left wrote one)
	publish("g", "again", 1)
	is.NoErr(c.QueryRow(ctx(t), `SELECT xmin::text FROM transport_groups WHERE group_id = 'g'`).Scan(&after))
	is.Equal(after, before)     // the same version of the row
	is.Equal(entries("g"), n+1) // and one entry more
	g, ev, seq = claim(0)
	is.Equal(g+"/"+ev, "g/again")
	ack(g, seq)

	// Published again through the Go client's call, which revives a
	// batch in one statement.
	n = entries("g")
	rows, err := c.Query(ctx(t), `SELECT harel_publish_many('{g,g}', '{third,fourth}', '{3,0}')`)
	is.NoErr(err)
	rows.Close()
	is.NoErr(rows.Err())
	revived, _ = rowOf("g")
	is.Equal(revived, row{Slot: first.Slot, Priority: 3, Drained: true, Free: true}) // the batch's first priority for g
	is.Equal(entries("g"), n+1)                                                      // one entry for the batch
	g, ev, seq = claim(3)
	is.Equal(g+"/"+ev, "g/third")
	ack(g, seq)
	g, ev, seq = claim(0)
	is.Equal(g+"/"+ev, "g/fourth")
	ack(g, seq)

	// Not published again: passed, unwritten, until 2 s after the drain,
	// then deleted by the reap of a claim that leased nothing.
	g, _, _ = claim(0) // 1 s after the drain
	is.Equal(g, "")
	_, ok = rowOf("g")
	is.True(ok) // kept
	var untouched bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT lock_expiry = drained_at FROM transport_groups WHERE group_id = 'g'`).Scan(&untouched))
	is.True(untouched) // the claim wrote nothing to the empty row
	now += 2
	g, _, _ = claim(0) // 4 s after
	is.Equal(g, "")
	_, ok = rowOf("g")
	is.True(!ok) // reaped

	// A publish that overlapped the drain leaves its message under a
	// marked row (here: the message alone, as if its group insert had
	// come before the ack marked the row): the next claim reads the head,
	// not the mark.
	publish("h", "1", 0)
	g, _, seq = claim(0)
	ack(g, seq)
	_, err = c.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ('h', '2')`)
	is.NoErr(err)
	g, ev, _ = claim(0)
	is.Equal(g+"/"+ev, "h/2")
	r, _ = rowOf("h")
	is.True(!r.Drained) // the lease cleared the mark
}

// TestClaimGoesPastManyKeptRows: a claim of 1 that meets more freshly
// kept rows than it used to try (8) before the group that has a message
// still hands that group out ("Kept rows" in functions/30_claim.sql): a
// claim leases something when anything is claimable.
func TestClaimGoesPastManyKeptRows(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	_, err := c.Exec(ctx(t), `SELECT harel_publish('k' || lpad(i::text, 2, '0'), 'e', 0) FROM generate_series(1, 20) AS i`)
	is.NoErr(err)
	rows, err := c.Query(ctx(t), `SELECT group_id, seq FROM harel_claim_leases(1000, 1060, 'w', 0, 20)`)
	is.NoErr(err)
	type lease struct {
		Group string
		Seq   int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[lease])
	is.NoErr(err)
	is.Equal(len(got), 20)
	for _, l := range got {
		var ok bool
		is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w', 1001)`, l.Group, l.Seq).Scan(&ok))
		is.True(ok)
	}
	_, err = c.Exec(ctx(t), `SELECT setval('transport_claim_cursor', 0)`) // the sweep starts before the kept rows
	is.NoErr(err)
	_, err = c.Exec(ctx(t), `SELECT harel_publish('last', 'e', 0)`)
	is.NoErr(err)
	var g string
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1001.5, 1060, 'w')`).Scan(&g))
	is.Equal(g, "last") // past 20 kept rows, each probed and passed
}

// TestFilledClaimsReapKeptRows: claims whose limit the ready log fills
// never sweep, so each reaps the kept rows among the next as many slots
// as its limit (harel_reap in functions/30_claim.sql): under a backlog of
// one-message groups the rows their drains leave do not pile up. Rows
// drained less than 2 s ago, and rows with a message, stay.
func TestFilledClaimsReapKeptRows(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := c.Exec(ctx(t), sql, args...)
		is.NoErr(err)
	}
	// 100 rows drained at 1000 and 10 drained at 1009, then 120 jobs.
	exec(`INSERT INTO transport_groups (group_id, lock_expiry, drained_at) SELECT 'old' || i, 1000, 1000 FROM generate_series(1, 100) AS i`)
	exec(`INSERT INTO transport_groups (group_id, lock_expiry, drained_at) SELECT 'new' || i, 1009, 1009 FROM generate_series(1, 10) AS i`)
	exec(`SELECT harel_publish('job' || i, 'e', 0) FROM generate_series(1, 120) AS i`)
	for range 120 {
		var g string
		is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(1010, 1070, 'w')`).Scan(&g)) // a job, from the log
	}
	var old, recent, jobs int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FILTER (WHERE group_id LIKE 'old%'), count(*) FILTER (WHERE group_id LIKE 'new%'),
	                                    count(*) FILTER (WHERE group_id LIKE 'job%') FROM transport_groups`).Scan(&old, &recent, &jobs))
	is.Equal(old, 0)     // reaped, a slot a claim
	is.Equal(recent, 10) // drained less than 2 s ago: kept
	is.Equal(jobs, 120)  // leased, with their messages
}

// TestSweepLocksNoEmptyKeptRow: a claim whose sweep meets a drained
// group's kept row, empty, neither locks nor deletes it ("Kept rows" in
// functions/30_claim.sql), so the group's publisher, reviving the row,
// waits for no claim in progress (version 21's sweep took the row and
// held it to the claim's commit; a stream's exchange could hold hundreds).
// Once committed, the claims hand out the new message.
func TestSweepLocksNoEmptyKeptRow(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 3))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	drainAt1000(t, c, "kept")
	var seq int64
	var ok bool
	_, err := c.Exec(ctx(t), `SELECT harel_publish('other', 'e', 0)`)
	is.NoErr(err)

	for _, exchange := range []bool{false, true} {
		// A claim of 2, 3 s after the drain, in a transaction left open:
		// the log gives it "other", and its sweep, from the first slot,
		// meets the kept row.
		_, err = c.Exec(ctx(t), `SELECT setval('transport_claim_cursor', 0), setval('transport_claim_wrap', 0), setval('transport_claim_rest', 0)`)
		is.NoErr(err) // no rest or fruitless sweep recorded: this claim sweeps
		tx, err := db.Pool.Begin(ctx(t))
		is.NoErr(err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // a failure below leaves no transaction open
		var got []string
		q := `SELECT group_id FROM harel_claim_leases(1003, 1063, 'x', 0, 2)`
		if exchange {
			q = `SELECT group_id FROM harel_exchange_leases(1003, 1063, 'x', 0, 2, '{}', '{}', '{}', '{}', true) WHERE kind = 'c'`
		}
		rows, err := tx.Query(ctx(t), q)
		is.NoErr(err)
		got, err = pgx.CollectRows(rows, pgx.RowTo[string])
		is.NoErr(err)
		is.Equal(got, []string{"other"}) // the kept row is empty: not handed out

		// The kept group's publisher revives its row meanwhile.
		p := db.Conn(t)
		_, err = p.Exec(ctx(t), `SET lock_timeout = '2s'`)
		is.NoErr(err)
		_, err = p.Exec(ctx(t), `SELECT harel_publish('kept', 'again', 0)`)
		is.NoErr(err) // no wait on the claim's transaction
		is.NoErr(tx.Commit(ctx(t)))

		var group, event string
		is.NoErr(c.QueryRow(ctx(t), `SELECT group_id, seq, event FROM harel_claim(1004, 1064, 'w')`).Scan(&group, &seq, &event))
		is.Equal(group+"/"+event, "kept/again") // revived and handed out
		is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('kept', $1, 'w', 1004)`, seq).Scan(&ok))
		is.True(ok)
		_, err = c.Exec(ctx(t), `UPDATE transport_groups SET locked_by = NULL, lock_expiry = 1000, drained_at = 1000 WHERE group_id = 'kept'`)
		is.NoErr(err) // drained at 1000 again, for the exchange's turn
		_, err = c.Exec(ctx(t), `UPDATE transport_groups SET locked_by = NULL, lock_expiry = NULL WHERE group_id = 'other'`)
		is.NoErr(err) // and "other" free again, with its message
	}
}

// TestPublishWaitsForNoDrainer: a publish to a drained group's kept row
// reads the row and writes the group's ready-log entry, and does not wait
// for a transaction that holds the row (a claim, an ack; "Kept rows" in
// functions/30_claim.sql, harel_revive), through the Go client's call and
// the design's two-INSERT publish alike; the message is handed out once
// that transaction ends. (Until version 24 the publish updated the row,
// and waited.)
func TestPublishWaitsForNoDrainer(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 3))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	drainAt1000(t, c, "kept")
	var seq int64
	var ok bool
	holder, err := db.Pool.Begin(ctx(t))
	is.NoErr(err)
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	_, err = holder.Exec(ctx(t), `SELECT 1 FROM transport_groups WHERE group_id = 'kept' FOR NO KEY UPDATE`)
	is.NoErr(err) // held, as a claim or an ack holds it

	p := db.Conn(t)
	_, err = p.Exec(ctx(t), `SET lock_timeout = '200ms'`)
	is.NoErr(err)
	_, err = p.Exec(ctx(t), `SELECT harel_publish('kept', 'one', 0)`)
	is.NoErr(err) // no wait for the holder
	tx, err := p.Begin(ctx(t))
	is.NoErr(err)
	_, err = tx.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ('kept', 'two')`)
	is.NoErr(err)
	_, err = tx.Exec(ctx(t), `INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
	                          VALUES ('kept', NULL, NULL, 0) ON CONFLICT (group_id) DO NOTHING`)
	is.NoErr(err) // the design's publish does not wait either
	is.NoErr(tx.Commit(ctx(t)))
	var entries int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_ready WHERE group_id = 'kept'`).Scan(&entries))
	is.Equal(entries, 2) // each publish saw the mark: an entry each
	is.NoErr(holder.Commit(ctx(t)))

	var group, event string
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id, seq, event FROM harel_claim(1001, 1061, 'w')`).Scan(&group, &seq, &event))
	is.Equal(group+"/"+event, "kept/one") // handed out, in order
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('kept', $1, 'w', 1001)`, seq).Scan(&ok))
	is.True(ok)
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id, seq, event FROM harel_claim(1002, 1062, 'w')`).Scan(&group, &seq, &event))
	is.Equal(group+"/"+event, "kept/two")
}

// TestIdleStreamReapsInItsWait: a stream's exchange that leases nothing
// leaves a kept row long drained where it is, and deletes no row it finds
// empty, so that it holds no publisher's guard bucket; the stream's
// harel_wait, a transaction of its own, reaps it (harel_reap in
// functions/30_claim.sql, harel_wait in functions/80_wakeups.sql). A
// plain claim that leases nothing still reaps.
func TestIdleStreamReapsInItsWait(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 3))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	drain := func(group string) { t.Helper(); drainAt1000(t, c, group) }
	rows := func() (n int) {
		t.Helper()
		is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups`).Scan(&n))
		return n
	}
	drain("a")
	drain("b")
	is.Equal(rows(), 2)
	var n int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_exchange_leases(1010, 1070, 'x', 0, 8, '{}', '{}', '{}', '{}', true)`).Scan(&n))
	is.Equal(n, 0)      // nothing to lease
	is.Equal(rows(), 2) // and nothing reaped: 10 s after the drain, both kept
	_, err := c.Exec(ctx(t), `SELECT harel_wait(NULL, 0, 60, 1010)`)
	is.NoErr(err)
	is.Equal(rows(), 0) // the stream's wait reaped them

	drain("c")
	_, err = c.Exec(ctx(t), `SELECT harel_wait(NULL, 1, 60, 1010)`)
	is.NoErr(err)
	is.Equal(rows(), 1) // a wait with a floor reaps nothing (as a claim with a floor)
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_claim_leases(1010, 1070, 'x', 0, 8)`).Scan(&n))
	is.Equal(n, 0)
	is.Equal(rows(), 0) // a plain claim that leased nothing reaps
}

// drainAt1000 publishes one message to group (no other group claimable),
// claims and acks it at 1000: the group drains, its row kept and marked.
func drainAt1000(t *testing.T, c *pgx.Conn, group string) {
	t.Helper()
	is := is.New(t)
	var seq int64
	_, err := c.Exec(ctx(t), `SELECT harel_publish($1, 'e', 0)`, group)
	is.NoErr(err)
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_claim(1000, 1060, 'w')`).Scan(&seq))
	var ok bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w', 1000)`, group, seq).Scan(&ok))
	is.True(ok) // drained at 1000: the row is kept
}

// TestRepeatableReadPublishMeetsTheReap: the design's two-INSERT publish in
// a repeatable-read transaction whose snapshot predates a reap of the
// group's kept row either fails to serialize (40001, retry it) or leaves
// its message under a row: never a message with no group row (harel_revive
// in functions/20_publish.sql reads the kept row FOR KEY SHARE).
func TestRepeatableReadPublishMeetsTheReap(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 3))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	drainAt1000(t, c, "kept")

	p := db.Conn(t)
	tx, err := p.BeginTx(ctx(t), pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	is.NoErr(err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx(t), `SELECT count(*) FROM transport_groups`)
	is.NoErr(err) // the snapshot: the kept row is there
	_, err = c.Exec(ctx(t), `SELECT harel_wait(NULL, 0, 60, 1010)`)
	is.NoErr(err) // an idle stream's wait reaps the row, and commits
	var rows int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups`).Scan(&rows))
	is.Equal(rows, 0) // reaped

	_, err = tx.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ('kept', 'late')`)
	is.NoErr(err)
	_, err = tx.Exec(ctx(t), `INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority)
	                          VALUES ('kept', NULL, NULL, 0) ON CONFLICT (group_id) DO NOTHING`)
	if err != nil {
		var pgErr *pgconn.PgError
		is.True(errors.As(err, &pgErr))
		is.Equal(pgErr.Code, "40001") // could not serialize: nothing published
		is.NoErr(tx.Rollback(ctx(t)))
		is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_messages`).Scan(&rows))
		is.Equal(rows, 0)
		return
	}
	is.NoErr(tx.Commit(ctx(t)))
	var group, event string
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id, event FROM harel_claim(1011, 1071, 'w')`).Scan(&group, &event))
	is.Equal(group+"/"+event, "kept/late") // under a row, and handed out
}

// TestStreamDeletesAnEmptyRowWithAState: a stream's exchange deletes no
// empty row it meets but one that carries a state, which no reap takes
// (its ack's delete met a publisher), so that the policy's state_retention
// applies to it ("Kept rows" in functions/30_claim.sql).
func TestStreamDeletesAnEmptyRowWithAState(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 3))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	_, err := c.Exec(ctx(t), `INSERT INTO transport_groups (group_id, locked_by, lock_expiry, state) VALUES ('s', NULL, 1000, 'x')`)
	is.NoErr(err) // free, unmarked, no message, a state: as an ack leaves it when a publisher held the guard
	_, err = c.Exec(ctx(t), `SELECT setval('transport_claim_cursor', 0), setval('transport_claim_wrap', 0), setval('transport_claim_rest', 0)`)
	is.NoErr(err) // no rest recorded: the exchange sweeps
	var n int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_exchange_leases(1010, 1070, 'x', 0, 8, '{}', '{}', '{}', '{}', true)`).Scan(&n))
	is.Equal(n, 0) // nothing to hand out
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups WHERE group_id = 's'`).Scan(&n))
	is.Equal(n, 0) // deleted
}
