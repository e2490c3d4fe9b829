package schema_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// The proxy tests speak the protocol in plain SQL to a PL/Proxy proxy over
// four partitions, as a client in another language would, and look at the
// partitions directly to see where things went.

const nowSQL = `extract(epoch FROM clock_timestamp())`

// home is the partition a group lives in, by the server's hashtext.
func home(t *testing.T, p *pgtest.Partitioned, group string) int {
	t.Helper()
	var h int
	if err := p.Proxy.QueryRow(ctx(t), `SELECT hashtext($1) & $2`, group, len(p.Parts)-1).Scan(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

// groupIn returns a group id (prefix plus a number) whose home is part.
func groupIn(t *testing.T, p *pgtest.Partitioned, prefix string, part int) string {
	t.Helper()
	for i := 0; ; i++ {
		g := prefix + strconv.Itoa(i)
		if home(t, p, g) == part {
			return g
		}
	}
}

func claim(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, token string, floor int) (group string, seq int64, event string, ok bool) {
	t.Helper()
	err := db.QueryRow(ctx(t), `SELECT * FROM harel_claim(`+nowSQL+`, `+nowSQL+` + 30, $1, $2)`, token, floor).Scan(&group, &seq, &event)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return group, seq, event, true
}

// twoInserts publishes the design's way, two INSERTs in one transaction,
// message first, and commits it (or rolls it back).
func twoInserts(t *testing.T, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, group, event string, priority int, commit bool) error {
	tx, err := db.Begin(ctx(t))
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ($1, $2)`, group, event); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx(t), `INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority) VALUES ($1, NULL, NULL, $2) ON CONFLICT (group_id) DO NOTHING`, group, priority); err != nil {
		return err
	}
	if !commit {
		return tx.Rollback(ctx(t))
	}
	return tx.Commit(ctx(t))
}

func sqlstate(err error) string {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Code
	}
	return ""
}

// TestProxyProtocol: the design's publish (both forms), claim and ack
// through the proxy, by four concurrent consumers: every message is
// delivered once, in order within its group, each group held by one
// consumer at a time; a rolled-back publish delivers nothing; every group
// lives in its hash's partition and every seq names its partition.
func TestProxyProtocol(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	const groups, per = 24, 5
	for m := range per {
		for g := range groups {
			group, event := "order-"+strconv.Itoa(g), strconv.Itoa(m)
			if g%2 == 0 {
				is.NoErr(twoInserts(t, p.Proxy, group, event, g%5, true))
			} else {
				_, err := p.Proxy.Exec(ctx(t), `SELECT harel_publish($1, $2, $3)`, group, event, g%5)
				is.NoErr(err)
			}
		}
	}
	is.NoErr(twoInserts(t, p.Proxy, "rolled-back", "x", 0, false))

	// Where everything went: each group in its home partition, with the
	// priority its first publish gave it; each seq's low bits its partition.
	total := 0
	for i, part := range p.Parts {
		rows, err := part.Query(ctx(t), `SELECT g.group_id, g.priority, m.seq FROM transport_groups g JOIN transport_messages m USING (group_id)`)
		is.NoErr(err)
		for rows.Next() {
			var group string
			var prio int
			var seq int64
			is.NoErr(rows.Scan(&group, &prio, &seq))
			is.Equal(home(t, p, group), i) // the group is in its home partition
			is.Equal(int(seq&1023), i)     // the seq names its partition
			n, _ := strconv.Atoi(group[len("order-"):])
			is.Equal(prio, n%5) // the first publish's priority
			total++
		}
		is.NoErr(rows.Err())
	}
	is.Equal(total, groups*per) // the rolled-back publish reached no partition
	var left int
	is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT (SELECT count(*) FROM transport_px_messages) + (SELECT count(*) FROM transport_px_groups)`).Scan(&left))
	is.Equal(left, 0) // nothing is kept on the proxy

	var mu stdsync.Mutex
	holder := map[string]string{}
	got := map[string][]string{}
	var wg stdsync.WaitGroup
	errs := make(chan error, groups*per*2)
	for w := range 4 {
		wg.Go(func() {
			for empty := 0; empty < 3; {
				token := fmt.Sprintf("w%d:%d", w, rand.Int64())
				var group, event string
				var seq int64
				err := p.Proxy.QueryRow(ctx(t), `SELECT * FROM harel_claim(`+nowSQL+`, `+nowSQL+` + 30, $1)`, token).Scan(&group, &seq, &event)
				if errors.Is(err, pgx.ErrNoRows) {
					empty++
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				empty = 0
				mu.Lock()
				h := holder[group]
				holder[group] = token
				got[group] = append(got[group], event)
				mu.Unlock()
				if h != "" {
					errs <- fmt.Errorf("group %s claimed by %s while %s holds it", group, token, h)
				}
				time.Sleep(time.Millisecond) // hold it a while
				mu.Lock()
				delete(holder, group) // before the ack: once it commits, another may claim
				mu.Unlock()
				var acked bool
				if err := p.Proxy.QueryRow(ctx(t), `SELECT harel_ack($1, $2, $3, `+nowSQL+`)`, group, seq, token).Scan(&acked); err != nil {
					errs <- err
					return
				}
				if !acked {
					errs <- fmt.Errorf("ack of %s/%d refused", group, seq)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	is.Equal(len(got), groups) // every group delivered, the rolled-back one not
	for g, events := range got {
		is.Equal(fmt.Sprint(events), "[0 1 2 3 4]") // once each, in publish order
		_ = g
	}
	var groupsLeft int64
	is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT groups + messages FROM harel_stats() WHERE priority IS NULL`).Scan(&groupsLeft))
	is.Equal(groupsLeft, int64(0)) // drained everywhere
}

// TestProxyClaimNeverEmptyWhileWork: with one claimable group in each
// partition, four claims in a row through the proxy lease all four (a
// claim asks the partitions in turn until one leases), the fifth finds
// none; a priority floor is applied in every partition.
func TestProxyClaimNeverEmptyWhileWork(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	for round := range 3 {
		want := map[string]bool{}
		for i := range p.Parts {
			g := groupIn(t, p, fmt.Sprintf("r%d-p%d-", round, i), i)
			want[g] = true
			_, err := p.Proxy.Exec(ctx(t), `SELECT harel_publish($1, 'x', $2)`, g, i)
			is.NoErr(err)
		}
		// A batch claim of none leases none.
		for _, limit := range []string{"0", "NULL"} {
			var n int
			is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT count(*) FROM harel_claim_many(`+nowSQL+`, `+nowSQL+` + 30, 'none', 0, `+limit+`)`).Scan(&n))
			is.Equal(n, 0)
		}
		// Floor 3: only partition 3's group (priority 3) qualifies.
		g, _, _, ok := claim(t, p.Proxy, "floor", 3)
		is.True(ok)
		is.Equal(home(t, p, g), 3)
		_, _, _, ok = claim(t, p.Proxy, "floor", 3)
		is.True(!ok) // nothing else at priority 3 or above
		delete(want, g)
		for range len(want) {
			g, _, _, ok := claim(t, p.Proxy, "any", 0)
			is.True(ok) // never empty while a partition has work
			is.True(want[g])
			delete(want, g)
		}
		_, _, _, ok = claim(t, p.Proxy, "any", 0)
		is.True(!ok)
		// Give everything back for the next round's partitions to drain.
		for _, part := range p.Parts {
			_, err := part.Exec(ctx(t), `DELETE FROM transport_messages; DELETE FROM transport_groups`)
			is.NoErr(err)
		}
	}
}

// TestProxyBatchesInInputOrder: a batch spread over every partition comes
// back in input order (publish, keyed publish, claim many, ack many,
// extend many), each answer the one its own partition gave.
func TestProxyBatchesInInputOrder(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	var groups, events []string
	for i := range 32 {
		groups = append(groups, "b"+strconv.Itoa(i%12))
		events = append(events, "e"+strconv.Itoa(i))
	}
	prios := make([]int32, len(groups))
	rows, err := p.Proxy.Query(ctx(t), `SELECT * FROM harel_publish_many($1, $2, $3)`, groups, events, prios)
	is.NoErr(err)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	is.NoErr(err)
	is.Equal(len(seqs), len(groups))
	for i, seq := range seqs {
		is.Equal(int(seq&3), home(t, p, groups[i])) // seq i is from group i's partition ...
		var event string
		is.NoErr(p.Parts[seq&3].QueryRow(ctx(t), `SELECT event FROM transport_messages WHERE seq = $1`, seq).Scan(&event))
		is.Equal(event, events[i]) // ... and is message i
	}

	// A keyed publish: a repeated key answers the first publish's seq.
	keys := []string{"k1", "k2", "k1", "k3"}
	kg := []string{"kg-a", "kg-b", "kg-a", "kg-c"}
	rows, err = p.Proxy.Query(ctx(t), `SELECT * FROM harel_publish_keyed($1, $2, $3, $4, 60)`, kg, []string{"1", "2", "3", "4"}, []int32{0, 0, 0, 0}, keys)
	is.NoErr(err)
	kseqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	is.NoErr(err)
	is.Equal(len(kseqs), 4)
	is.Equal(kseqs[2], kseqs[0]) // the repeat is the first message
	for i, seq := range kseqs {
		is.Equal(int(seq&3), home(t, p, kg[i]))
	}

	// Claim many leases one group of each of the 15 groups.
	type lease struct {
		group string
		seq   int64
	}
	rows, err = p.Proxy.Query(ctx(t), `SELECT group_id, seq FROM harel_claim_many(`+nowSQL+`, `+nowSQL+` + 30, 'batch', 0, 100)`)
	is.NoErr(err)
	leases, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lease, error) {
		var l lease
		return l, r.Scan(&l.group, &l.seq)
	})
	is.NoErr(err)
	is.Equal(len(leases), 15)
	rand.Shuffle(len(leases), func(i, j int) { leases[i], leases[j] = leases[j], leases[i] })
	// An extend of them all, one with a wrong token.
	var lg, ltok []string
	var ls []int64
	for i, l := range leases {
		lg, ls = append(lg, l.group), append(ls, l.seq)
		tok := "batch"
		if i == 3 {
			tok = "wrong"
		}
		ltok = append(ltok, tok)
	}
	rows, err = p.Proxy.Query(ctx(t), `SELECT group_id, held FROM harel_extend_many($1, $2, $3, `+nowSQL+` + 60)`, lg, ls, ltok)
	is.NoErr(err)
	ext, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var g string
		var held bool
		err := r.Scan(&g, &held)
		return [2]string{g, strconv.FormatBool(held)}, err
	})
	is.NoErr(err)
	is.Equal(len(ext), len(lg))
	for i := range ext {
		is.Equal(ext[i][0], lg[i])                      // input order
		is.Equal(ext[i][1], strconv.FormatBool(i != 3)) // the wrong token is not held
	}
	// Ack them all, keeping each group for its next message, plus a repeat
	// of the first entry at the end (refused, as a repeat is).
	lg, ls, ltok = append(lg, lg[0]), append(ls, ls[0]), append(ltok, "batch")
	keep := make([]bool, len(lg))
	for i := range keep {
		keep[i] = true
	}
	rows, err = p.Proxy.Query(ctx(t), `SELECT group_id, held, next_seq FROM harel_ack_many($1, $2, $3, $4, `+nowSQL+`, `+nowSQL+` + 30)`, lg, ls, ltok, keep)
	is.NoErr(err)
	type acked struct {
		group string
		held  bool
		next  *int64
	}
	acks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (acked, error) {
		var a acked
		return a, r.Scan(&a.group, &a.held, &a.next)
	})
	is.NoErr(err)
	is.Equal(len(acks), len(lg))
	for i, a := range acks {
		is.Equal(a.group, lg[i])                   // input order
		is.Equal(a.held, i != 3 && i != len(lg)-1) // the wrong token and the repeat are not held
		if a.held && a.next != nil {
			is.Equal(int(*a.next&3), home(t, p, a.group)) // the next message is from the group's partition
		}
	}
}

// TestProxyDeadLetters: dead letters of every partition page through the
// proxy in one seq order, and a redrive or purge by seq alone reaches the
// partition each seq names.
func TestProxyDeadLetters(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	for _, part := range p.Parts { // the policy is each partition's
		_, err := part.Exec(ctx(t), `UPDATE transport_policy SET max_attempts = 1`)
		is.NoErr(err)
	}
	var groups []string
	for i := range p.Parts {
		for j := range 2 {
			g := groupIn(t, p, fmt.Sprintf("dl%d-%d-", i, j), i)
			groups = append(groups, g)
			_, err := p.Proxy.Exec(ctx(t), `SELECT harel_publish($1, 'poison')`, g)
			is.NoErr(err)
		}
	}
	for range groups {
		g, seq, _, ok := claim(t, p.Proxy, "f", 0)
		is.True(ok)
		var outcome string
		is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT harel_fail($1, $2, 'f', `+nowSQL+`, 'boom')`, g, seq).Scan(&outcome))
		is.Equal(outcome, "dead")
	}
	var all []int64
	var after *int64
	for {
		rows, err := p.Proxy.Query(ctx(t), `SELECT seq FROM harel_dead_letters(NULL, $1, 3)`, after)
		is.NoErr(err)
		page, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		is.NoErr(err)
		if len(page) == 0 {
			break
		}
		is.True(len(page) <= 3)
		all = append(all, page...)
		after = &page[len(page)-1]
	}
	is.Equal(len(all), len(groups)) // every partition's, once each
	for i := 1; i < len(all); i++ {
		is.True(all[i] > all[i-1]) // in seq order
	}
	var n int64
	is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT harel_redrive(NULL, $1)`, all[:3]).Scan(&n))
	is.Equal(n, int64(3)) // by seq alone
	is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT harel_purge_dead_letters($1, NULL)`, groups[7]).Scan(&n))
	is.Equal(n, int64(1)) // by group
	var dead, queued int64
	is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT dead_letters, messages FROM harel_stats() WHERE priority IS NULL`).Scan(&dead, &queued))
	is.Equal(dead, int64(len(groups)-4))
	is.Equal(queued, int64(3))
}

// TestProxyRefusals: a partition's refusal reaches the proxy's client with
// its SQLSTATE, and the proxy refuses what it checks itself the same way.
func TestProxyRefusals(t *testing.T) {
	t.Parallel()
	p := pgtest.Partitions(t, 4)
	for _, c := range []struct {
		name, sql, state string
	}{
		{"empty group", `SELECT harel_publish('', 'x')`, "23514"},
		{"NULL group", `SELECT harel_publish(NULL, 'x')`, "23502"},
		{"empty group, two INSERTs", `INSERT INTO transport_messages (group_id, event) VALUES ('', 'x')`, "23514"},
		{"bad priority, two INSERTs", `INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority) VALUES ('a', NULL, NULL, 5) ON CONFLICT (group_id) DO NOTHING`, "23514"},
		{"empty token", `SELECT * FROM harel_claim(` + nowSQL + `, ` + nowSQL + ` + 30, '')`, "PT002"},
		{"lease before now", `SELECT * FROM harel_claim(` + nowSQL + `, ` + nowSQL + ` - 1, 't')`, "PT003"},
		{"clock skew", `SELECT harel_ack('g', 1, 't', ` + nowSQL + ` - 3600)`, "PT005"},
		{"unknown group", `SELECT * FROM harel_peek('nobody', NULL, 10)`, "PT007"},
		{"arrays of different lengths", `SELECT * FROM harel_publish_many(ARRAY['a','b'], ARRAY['x'], ARRAY[0,0])`, "22023"},
		// A batch one partition would refuse is refused before any writes.
		{"a bad group in a batch", `SELECT * FROM harel_publish_many(ARRAY['a','b','c','d',''], ARRAY['1','2','3','4','5'], ARRAY[0,0,0,0,0])`, "23514"},
		{"a NULL event in a batch", `SELECT * FROM harel_publish_many(ARRAY['a','b','c','d','e'], ARRAY['1','2','3','4',NULL], ARRAY[0,0,0,0,0])`, "23502"},
		{"a bad priority in a batch", `SELECT * FROM harel_publish_many(ARRAY['a','b','c','d','e'], ARRAY['1','2','3','4','5'], ARRAY[0,0,0,0,5])`, "23514"},
		{"a NULL priority in a batch", `SELECT * FROM harel_publish_many(ARRAY['a','b','c','d','e'], ARRAY['1','2','3','4','5'], ARRAY[0,0,0,0,NULL])`, "23502"},
		{"a bad key in a batch", `SELECT * FROM harel_publish_keyed(ARRAY['a','b','c','d','e'], ARRAY['1','2','3','4','5'], ARRAY[0,0,0,0,0], ARRAY['k','k','k','k',''], 60)`, "PT006"},
		{"negative window", `SELECT * FROM harel_publish_keyed(ARRAY['a'], ARRAY['x'], ARRAY[0], ARRAY['k'], -1)`, "PT006"},
		{"unknown order", `SELECT * FROM harel_groups(NULL, NULL, 'sideways', 0, 10)`, "22023"},
	} {
		_, err := p.Proxy.Exec(ctx(t), c.sql)
		if got := sqlstate(err); got != c.state {
			t.Errorf("%s: SQLSTATE %q (%v), want %s", c.name, got, err, c.state)
		}
	}
	for i, part := range p.Parts {
		var n int
		if err := part.QueryRow(ctx(t), `SELECT count(*) FROM transport_messages`).Scan(&n); err != nil || n != 0 {
			t.Errorf("partition %d holds %d messages (%v) after refusals only", i, n, err)
		}
	}
}

// TestProxyStatsAndGroupsAddUp: the proxy's stats are the partitions'
// added up, and its group list is theirs merged in the order asked.
func TestProxyStatsAndGroupsAddUp(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	for i := range 20 {
		_, err := p.Proxy.Exec(ctx(t), `SELECT harel_publish($1, 'x', $2)`, "s"+strconv.Itoa(i%7), i%3)
		is.NoErr(err)
	}
	_, _, _, ok := claim(t, p.Proxy, "held", 0)
	is.True(ok)
	stats := func(db *pgxpool.Pool) (groups, leased, msgs int64) {
		is.NoErr(db.QueryRow(ctx(t), `SELECT groups, leased, messages FROM harel_stats() WHERE priority IS NULL`).Scan(&groups, &leased, &msgs))
		return
	}
	var sg, sl, sm int64
	for _, part := range p.Parts {
		g, l, m := stats(part)
		sg, sl, sm = sg+g, sl+l, sm+m
	}
	g, l, m := stats(p.Proxy)
	is.Equal([]int64{g, l, m}, []int64{sg, sl, sm})
	is.Equal([]int64{g, l, m}, []int64{7, 1, 20})

	rows, err := p.Proxy.Query(ctx(t), `SELECT group_id FROM harel_groups(NULL, NULL, 'group', 2, 3)`)
	is.NoErr(err)
	page, err := pgx.CollectRows(rows, pgx.RowTo[string])
	is.NoErr(err)
	is.Equal(page, []string{"s2", "s3", "s4"}) // merged by id, then the page
	var holder string
	is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT holder FROM harel_groups(NULL, 'leased', NULL, 0, 10)`).Scan(&holder))
	is.Equal(holder, "held")
}

// TestApplyProxyRefuses: a proxy over partitions that are not numbered, or
// numbered out of their places, is refused; the queue's Apply refuses a
// proxy's schema and ApplyProxy a queue's; a partition is not renumbered.
func TestApplyProxyRefuses(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	err := schema.Apply(ctx(t), p.Proxy, p.Schema)
	is.True(errors.Is(err, pgtransport.ErrInvalidSchema)) // a proxy holds no queue
	err = schema.ApplyProxy(ctx(t), p.Parts[0], p.Schema)
	is.True(errors.Is(err, pgtransport.ErrInvalidSchema))       // a queue is not a proxy
	is.NoErr(schema.Partition(ctx(t), p.Parts[1], p.Schema, 1)) // again: nothing changes
	err = schema.Partition(ctx(t), p.Parts[1], p.Schema, 2)
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // not renumbered
	err = schema.Partition(ctx(t), p.Parts[1], p.Schema, 1024)
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
	is.NoErr(schema.ApplyProxy(ctx(t), p.Proxy, p.Schema)) // up to date: checks and passes

	// A cluster whose partition count is not the one the proxy was checked
	// with (as after an ALTER SERVER that adds partitions) routes nothing.
	// So is one whose partitions' connection strings changed (swapped,
	// replaced): as if checked with others.
	for _, change := range []string{`UPDATE transport_proxy_parts SET parts = 8`, `UPDATE transport_proxy_parts SET digest = md5('another cluster')`} {
		_, err = p.Proxy.Exec(ctx(t), change)
		is.NoErr(err)
		for _, q := range []string{
			`SELECT harel_publish('moved', 'x')`,
			`SELECT * FROM harel_claim(` + nowSQL + `, ` + nowSQL + ` + 30, 't')`,
			`SELECT * FROM harel_stats()`,
			`SELECT * FROM harel_dead_letters('moved', NULL, 10)`,
		} {
			_, err = p.Proxy.Exec(ctx(t), q)
			is.Equal(sqlstate(err), "22023") // refused
		}
		if strings.Contains(change, "parts = 8") {
			// Another count is not checked again: that is a growth
			// (harel_px_grow), which moves groups with a fence.
			err = schema.ApplyProxy(ctx(t), p.Proxy, p.Schema)
			is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
			is.True(strings.Contains(err.Error(), "harel_px_grow") || strings.Contains(err.Error(), "checked with 8"))
			_, err = p.Proxy.Exec(ctx(t), `UPDATE transport_proxy_parts SET parts = 4`)
			is.NoErr(err)
		}
		is.NoErr(schema.ApplyProxy(ctx(t), p.Proxy, p.Schema)) // checked again: the cluster's own
	}
	_, err = p.Proxy.Exec(ctx(t), `SELECT harel_publish('moved', 'x')`)
	is.NoErr(err)

	// A database with messages from before is not numbered: they could be
	// another partition's groups.
	single := pgtest.New(t, 2)
	is.NoErr(schema.Apply(ctx(t), single.Pool, single.Schema))
	_, err = single.Pool.Exec(ctx(t), `SELECT harel_publish('before', 'x')`)
	is.NoErr(err)
	err = schema.Partition(ctx(t), single.Pool, single.Schema, 0)
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))

	// A partition that lost its number (as a database never numbered is).
	_, err = p.Parts[2].Exec(ctx(t), `DELETE FROM transport_partition`)
	is.NoErr(err)
	err = schema.ApplyProxy(ctx(t), p.Proxy, p.Schema)
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
	t.Log(err)
	// Numbered as another place: its groups would be looked for elsewhere.
	_, err = p.Parts[2].Exec(ctx(t), `INSERT INTO transport_partition (part) VALUES (3)`)
	is.NoErr(err)
	err = schema.ApplyProxy(ctx(t), p.Proxy, p.Schema)
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
}

// TestProxyLeastPrivilege: a role given ProxyGrants on the proxy and Grants
// on each partition, and nothing else, publishes (both forms), claims,
// acks and reads the stats through the proxy; it cannot change the
// proxy's functions. PL/Proxy connects to the partitions as that role,
// which has no password: the test needs a server that trusts local
// connections (the harness's own and CI's do). Its proxy is its own: the
// grant on the cluster's server row would race other tests' use of it.
func TestProxyLeastPrivilege(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	if cfg, err := pgx.ParseConfig(pgtest.DSN(t)); err != nil || cfg.Password != "" {
		t.Skip("needs a test server that trusts local connections: PL/Proxy connects as a role with no password")
	}
	p := pgtest.PartitionsOn(t, 4, nil)
	role := "w_" + p.Schema
	r := pgx.Identifier{role}.Sanitize()
	dbs := append([]*pgxpool.Pool{p.Proxy}, p.Parts...)
	_, err := p.Proxy.Exec(ctx(t), `CREATE ROLE `+r+` LOGIN`)
	is.NoErr(err)
	t.Cleanup(func() {
		for _, db := range dbs {
			if _, err := db.Exec(context.Background(), `DROP OWNED BY `+r); err != nil {
				t.Errorf("drop owned: %v", err)
			}
		}
		if _, err := p.Proxy.Exec(context.Background(), `DROP ROLE `+r); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})
	grants, err := schema.ProxyGrants(p.Schema, role)
	is.NoErr(err)
	_, err = p.Proxy.Exec(ctx(t), grants)
	is.NoErr(err)
	grants, err = schema.Grants(p.Schema, role)
	is.NoErr(err)
	for _, part := range p.Parts {
		_, err = part.Exec(ctx(t), grants)
		is.NoErr(err)
	}
	conn, err := p.Proxy.Acquire(ctx(t))
	is.NoErr(err)
	defer conn.Release()
	_, err = conn.Exec(ctx(t), `SET ROLE `+r)
	is.NoErr(err)
	defer conn.Exec(context.Background(), `RESET ROLE`)
	var user string
	is.NoErr(conn.QueryRow(ctx(t), `SELECT current_user`).Scan(&user))
	is.Equal(user, role)

	_, err = conn.Exec(ctx(t), `SELECT harel_publish('lp-a', '1')`)
	is.NoErr(err)
	is.NoErr(twoInserts(t, conn, "lp-b", "2", 0, true))
	for range 2 {
		g, seq, _, ok := claim(t, conn, "lp", 0)
		is.True(ok)
		var acked bool
		is.NoErr(conn.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'lp', `+nowSQL+`)`, g, seq).Scan(&acked))
		is.True(acked)
	}
	var groups int64
	is.NoErr(conn.QueryRow(ctx(t), `SELECT groups FROM harel_stats() WHERE priority IS NULL`).Scan(&groups))
	is.Equal(groups, int64(0))
	// The partitions saw the role itself, not the proxy's owner.
	var by string
	is.NoErr(p.Parts[0].QueryRow(ctx(t), `SELECT COALESCE(max(usename), '') FROM pg_stat_activity WHERE usename = $1`, role).Scan(&by))
	is.Equal(by, role)
	_, err = conn.Exec(ctx(t), `CREATE OR REPLACE FUNCTION harel_px_parts() RETURNS INT LANGUAGE sql AS $$ SELECT 1 $$`)
	is.Equal(sqlstate(err), "42501") // insufficient_privilege
}

// TestProxyCallsRefuseBadInput: the proxy's Go calls refuse what they
// cannot do with a typed error and write nothing: a database without
// PL/Proxy or without the cluster, a partition number out of range, a bad
// schema or role name, a nil handle, a cancelled ctx.
func TestProxyCallsRefuseBadInput(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2) // the test server's own database: no proxy there
	err := schema.ApplyProxy(ctx(t), db.Pool, db.Schema)
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
	var tables int
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, db.Schema).Scan(&tables))
	is.Equal(tables, 0) // nothing written

	is.True(errors.Is(schema.Partition(ctx(t), db.Pool, db.Schema, -1), pgtransport.ErrInvalidConfig))
	is.True(errors.Is(schema.Partition(ctx(t), db.Pool, db.Schema, 1024), pgtransport.ErrInvalidConfig))
	is.True(errors.Is(schema.Partition(ctx(t), nil, db.Schema, 0), pgtransport.ErrInvalidConfig))
	is.True(errors.Is(schema.ApplyProxy(ctx(t), nil, db.Schema), pgtransport.ErrInvalidConfig))
	is.True(errors.Is(schema.ApplyProxy(ctx(t), db.Pool, "pg_proxy"), pgtransport.ErrInvalidSchema))
	_, err = schema.ProxyGrants(db.Schema, "")
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
	_, err = schema.ProxyGrants("pg_x", "worker")
	is.True(errors.Is(err, pgtransport.ErrInvalidSchema))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	is.True(errors.Is(schema.ApplyProxy(cancelled, db.Pool, db.Schema), context.Canceled))
	is.True(errors.Is(schema.Partition(cancelled, db.Pool, db.Schema, 0), context.Canceled))
	_, err = schema.ProxyVersion(ctx(t), db.Pool, db.Schema)
	is.Equal(sqlstate(err), "42P01") // no proxy's table here
}

// partitionRows describes every row of the queue's two tables on every
// partition, and the proxy's publish tables: what a refused statement
// must leave as it was.
func partitionRows(t *testing.T, p *pgtest.Partitioned) string {
	t.Helper()
	var b strings.Builder
	for i, part := range p.Parts {
		var g, m string
		if err := part.QueryRow(ctx(t), `
			SELECT (SELECT COALESCE(string_agg(format('%s/%s/%s/%s/%s', group_id, locked_by, lock_expiry, priority, attempts), ' ' ORDER BY group_id), '') FROM transport_groups),
			       (SELECT COALESCE(string_agg(format('%s/%s/%s', seq, group_id, event), ' ' ORDER BY seq), '') FROM transport_messages)`).Scan(&g, &m); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "p%d groups [%s] messages [%s]\n", i, g, m)
	}
	var staged int
	if err := p.Proxy.QueryRow(ctx(t), `SELECT (SELECT count(*) FROM transport_px_messages) + (SELECT count(*) FROM transport_px_groups)`).Scan(&staged); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "proxy %d rows\n", staged)
	return b.String()
}

// TestProxyDesignStatements runs every statement of the design
// (docs/design.md, "The design we started from": its schema, publish,
// claim, ack and nack, and the statements inside harel_claim and
// harel_ack, which a client could send itself) on the proxy in plain SQL:
// each works, or is refused with an error that names the call to use and
// writes nothing anywhere. Before version 15 the proxy answered the
// design's nack, a fenced UPDATE, with UPDATE 0 and no error: a lease
// looked lost while it was held, and the group waited out its lease.
func TestProxyDesignStatements(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	const group = "design-1"
	part := p.Parts[home(t, p, group)]

	// Works: the design's publish, two INSERTs in one transaction, message
	// first; the group's row gets the priority of its first publish.
	is.NoErr(twoInserts(t, p.Proxy, group, "created", 3, true))
	is.NoErr(twoInserts(t, p.Proxy, group, "paid", 0, true))
	var prio, msgs int
	is.NoErr(part.QueryRow(ctx(t), `SELECT priority, (SELECT count(*) FROM transport_messages WHERE group_id = $1) FROM transport_groups WHERE group_id = $1`, group).Scan(&prio, &msgs))
	is.Equal([]int{prio, msgs}, []int{3, 2}) // on its partition, with its priority

	// Works: the design's claim, one call.
	var g, event string
	var seq int64
	is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT group_id, seq, event FROM harel_claim(`+nowSQL+`, `+nowSQL+` + 30, 'design:1', 0)`).Scan(&g, &seq, &event))
	is.Equal([]string{g, event}, []string{group, "created"})

	// Refused: every statement that would act on the proxy's own tables,
	// with the lease above held. Each names the call to use and writes
	// nothing, on the partitions or here.
	for _, c := range []struct {
		name, sql string
		args      []any
		state     string // SQLSTATE
		names     string // in the message
	}{
		{"schema: CREATE TABLE transport_messages", `CREATE TABLE transport_messages (seq BIGSERIAL PRIMARY KEY, group_id TEXT NOT NULL, event TEXT NOT NULL)`, nil, "42P07", "transport_messages"},
		{"schema: CREATE INDEX transport_messages_group", `CREATE INDEX transport_messages_group ON transport_messages (group_id, seq)`, nil, "42809", "transport_messages"},
		{"schema: CREATE TABLE transport_groups", `CREATE TABLE transport_groups (group_id TEXT PRIMARY KEY, locked_by TEXT, lock_expiry DOUBLE PRECISION, priority INT NOT NULL DEFAULT 0)`, nil, "42P07", "transport_groups"},
		{"schema: CREATE INDEX transport_groups_claimable", `CREATE INDEX transport_groups_claimable ON transport_groups (lock_expiry)`, nil, "42809", "transport_groups"},
		{"harel_claim's lease", `UPDATE transport_groups SET locked_by = $1, lock_expiry = ` + nowSQL + ` + 30
			WHERE group_id = (SELECT group_id FROM transport_groups
			                   WHERE (locked_by IS NULL OR lock_expiry < ` + nowSQL + `) AND priority >= 0
			                   ORDER BY COALESCE(lock_expiry, 0) ASC, group_id FOR UPDATE SKIP LOCKED LIMIT 1)
			RETURNING group_id`, []any{"design:2"}, "PT009", "harel_claim"},
		{"harel_claim's head", `SELECT group_id, seq, event FROM transport_messages WHERE group_id = $1 ORDER BY seq LIMIT 1`, []any{group}, "PT009", "harel_claim"},
		{"harel_claim's stale-group delete", `DELETE FROM transport_groups WHERE group_id = $1 AND locked_by = $2`, []any{group, "design:1"}, "PT009", "harel_claim"},
		{"harel_ack's fence", `SELECT EXISTS (SELECT 1 FROM transport_groups WHERE group_id = $1 AND locked_by = $2)`, []any{group, "design:1"}, "PT009", "harel_ack"},
		{"harel_ack's delete", `DELETE FROM transport_messages WHERE seq = $1`, []any{seq}, "PT009", "harel_ack"},
		{"harel_ack's free", `UPDATE transport_groups SET locked_by = NULL, lock_expiry = ` + nowSQL + ` WHERE group_id = $1 AND locked_by = $2`, []any{group, "design:1"}, "PT009", "harel_ack"},
		{"nack with a delay (park)", `UPDATE transport_groups SET lock_expiry = ` + nowSQL + ` + 60 WHERE group_id = $1 AND locked_by = $2`, []any{group, "design:1"}, "PT009", "harel_nack"},
		{"nack without (retry now)", `UPDATE transport_groups SET locked_by = NULL, lock_expiry = NULL WHERE group_id = $1 AND locked_by = $2`, []any{group, "design:1"}, "PT009", "harel_nack"},
		{"the session's read of the groups", `SELECT group_id, locked_by, lock_expiry > ` + nowSQL + ` AS held, priority FROM transport_groups ORDER BY group_id`, nil, "PT009", "harel_groups"},
		{"a count of the messages", `SELECT count(*) FROM transport_messages`, nil, "PT009", "harel_peek"},
	} {
		before := partitionRows(t, p)
		_, err := p.Proxy.Exec(ctx(t), c.sql, c.args...)
		pgErr, _ := errors.AsType[*pgconn.PgError](err)
		if pgErr == nil || pgErr.Code != c.state || !strings.Contains(pgErr.Message, c.names) {
			t.Errorf("%s: %v, want SQLSTATE %s naming %s", c.name, err, c.state, c.names)
			continue
		}
		if after := partitionRows(t, p); after != before {
			t.Errorf("%s: refused, but the rows changed:\n%s\nto\n%s", c.name, before, after)
		}
	}

	// A refusal in a publishing transaction aborts it: nothing published.
	before := partitionRows(t, p)
	tx, err := p.Proxy.Begin(ctx(t))
	is.NoErr(err)
	_, err = tx.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ($1, 'shipped')`, group)
	is.NoErr(err)
	_, err = tx.Exec(ctx(t), `UPDATE transport_groups SET priority = 4 WHERE group_id = $1`, group)
	is.Equal(sqlstate(err), "PT009")
	is.True(tx.Commit(ctx(t)) != nil) // the transaction was aborted
	is.Equal(partitionRows(t, p), before)

	// Works: the calls the refusals name. The read shows the lease; the
	// nack frees the group (true: the lease was held), and the ack of the
	// next claim answers true too.
	var holder string
	is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT holder FROM harel_groups(`+nowSQL+`, NULL, 'group', 0, 100) WHERE group_id = $1`, group).Scan(&holder))
	is.Equal(holder, "design:1")
	var ok bool
	is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT harel_nack($1, 'design:1', `+nowSQL+`, 0)`, group).Scan(&ok))
	is.True(ok) // the nack found its lease
	is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT group_id, seq, event FROM harel_claim(`+nowSQL+`, `+nowSQL+` + 30, 'design:2')`).Scan(&g, &seq, &event))
	is.Equal([]string{g, event}, []string{group, "created"}) // redelivered at once, in order
	is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'design:2', `+nowSQL+`)`, group, seq).Scan(&ok))
	is.True(ok)
	is.NoErr(part.QueryRow(ctx(t), `SELECT count(*) FROM transport_messages WHERE group_id = $1`, group).Scan(&msgs))
	is.Equal(msgs, 1) // "paid" is left
}

// TestProxyScriptIsShipped pins the proxy's script of the current version,
// as TestScriptIsShipped pins the queue's: ApplyProxy runs proxy.sql only
// on a proxy whose recorded version is older, so a change to it that comes
// without a new version would reach no proxy already at this one.
func TestProxyScriptIsShipped(t *testing.T) {
	n := schema.Version()
	want, err := os.ReadFile(fmt.Sprintf("../testdata/proxy/v%d.sql", n))
	if err != nil {
		t.Fatalf("testdata/proxy/v%d.sql: %v\nA new version needs its proxy script: make proxy-schema > testdata/proxy/v%d.sql", n, err, n)
	}
	if got := schema.ProxySQL(); got != string(want) {
		t.Fatalf("schema.ProxySQL() differs from testdata/proxy/v%d.sql, the proxy script of shipped version %d (first difference: %s).\n"+
			"Proxies already at version %d would never run the change: keep v%d.sql as it is, add a new numbered step "+
			"(schema/sql/%03d_<what>.sql; a comment-only one will do), then: make proxy-schema > testdata/proxy/v%d.sql",
			n, n, firstDiff(string(want), got), n, n, n+1, n+1)
	}
}

// proxyCatalog describes the proxy's objects in its schema: relations,
// columns and defaults, constraints, triggers, views and functions.
func proxyCatalog(t *testing.T, p *pgtest.Partitioned) string {
	t.Helper()
	rows, err := p.Proxy.Query(ctx(t), `
		WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = $1)
		SELECT format('rel %s %s', c.relname, c.relkind) FROM pg_class AS c, ns WHERE c.relnamespace = ns.oid
		UNION ALL
		SELECT format('col %s.%s %s %s %s', c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid))
		  FROM pg_class AS c JOIN ns ON c.relnamespace = ns.oid JOIN pg_attribute AS a ON a.attrelid = c.oid
		  LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		 WHERE a.attnum > 0 AND NOT a.attisdropped
		UNION ALL
		SELECT format('con %s %s %s', c.relname, k.conname, pg_get_constraintdef(k.oid))
		  FROM pg_constraint AS k JOIN pg_class AS c ON c.oid = k.conrelid JOIN ns ON c.relnamespace = ns.oid
		UNION ALL
		SELECT format('seq %s owned by %s.%s', s.relname, c.relname, a.attname)
		  FROM pg_depend AS dep JOIN pg_class AS s ON s.oid = dep.objid AND s.relkind = 'S' JOIN ns ON s.relnamespace = ns.oid
		  JOIN pg_class AS c ON c.oid = dep.refobjid JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum = dep.refobjsubid
		 WHERE dep.classid = 'pg_class'::regclass AND dep.refclassid = 'pg_class'::regclass AND dep.deptype = 'a'
		UNION ALL
		SELECT format('trg %s', pg_get_triggerdef(g.oid)) FROM pg_trigger AS g JOIN pg_class AS c ON c.oid = g.tgrelid JOIN ns ON c.relnamespace = ns.oid
		 WHERE NOT g.tgisinternal
		UNION ALL
		SELECT format('view %s %s', c.relname, pg_get_viewdef(c.oid)) FROM pg_class AS c JOIN ns ON c.relnamespace = ns.oid WHERE c.relkind = 'v'
		UNION ALL
		SELECT format('fn %s %s %s', f.proname, pg_get_function_identity_arguments(f.oid), md5(pg_get_functiondef(f.oid)))
		  FROM pg_proc AS f JOIN ns ON f.pronamespace = ns.oid
		ORDER BY 1`, p.Schema)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// TestApplyProxyUpgradesV14: a proxy set up at version 14, whose publish
// tables carried the design's names, takes version 15 from ApplyProxy and
// ends with the catalog of a fresh one; a role granted what version 14's
// ProxyGrants gave keeps what the two-INSERT publish needs; the design's
// nack, answered UPDATE 0 before, is refused (PT009); the publish works.
func TestApplyProxyUpgradesV14(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	fresh := proxyCatalog(t, p)
	s := pgx.Identifier{p.Schema}.Sanitize()
	script, err := os.ReadFile("../testdata/proxy/v14.sql")
	is.NoErr(err)
	// The partitions are at the current version, which version 14's check
	// refuses: ApplyProxy checks them below.
	v14, found := strings.CutSuffix(string(script), "SELECT harel_px_check(14);\nCOMMIT;\n")
	is.True(found)
	_, err = p.Proxy.Exec(ctx(t), `DROP SCHEMA `+s+` CASCADE; CREATE SCHEMA `+s)
	is.NoErr(err)
	_, err = p.Proxy.Exec(ctx(t), v14+"COMMIT;\n")
	is.NoErr(err)
	v, err := schema.ProxyVersion(ctx(t), p.Proxy, p.Schema)
	is.NoErr(err)
	is.Equal(v, 14)

	role := "w_" + p.Schema
	r := pgx.Identifier{role}.Sanitize()
	_, err = p.Proxy.Exec(ctx(t), `CREATE ROLE `+r)
	is.NoErr(err)
	t.Cleanup(func() {
		if _, err := p.Proxy.Exec(context.Background(), `DROP OWNED BY `+r+`; DROP ROLE `+r); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})
	_, err = p.Proxy.Exec(ctx(t), `GRANT USAGE ON SCHEMA `+s+` TO `+r+`;
		GRANT SELECT, INSERT, DELETE ON `+s+`.transport_messages, `+s+`.transport_groups TO `+r+`;
		GRANT USAGE ON SEQUENCE `+s+`.transport_messages_seq_seq TO `+r) // version 14's ProxyGrants, less what is not in the schema
	is.NoErr(err)
	tag, err := p.Proxy.Exec(ctx(t), `UPDATE transport_groups SET locked_by = NULL, lock_expiry = NULL WHERE group_id = 'g' AND locked_by = 't'`)
	is.NoErr(err)
	is.Equal(tag.RowsAffected(), int64(0)) // version 14: the silent UPDATE 0

	is.NoErr(schema.ApplyProxy(ctx(t), p.Proxy, p.Schema))
	v, err = schema.ProxyVersion(ctx(t), p.Proxy, p.Schema)
	is.NoErr(err)
	is.Equal(v, schema.Version())
	if got := proxyCatalog(t, p); got != fresh {
		t.Errorf("upgraded proxy differs from a fresh one (first difference: %s)", firstDiff(fresh, got))
	}
	var privs string
	is.NoErr(p.Proxy.QueryRow(ctx(t), `
		SELECT string_agg(format('%s:%s:%s', t, k, has_table_privilege($1, t, k)), ' ' ORDER BY t, k)
		  FROM unnest(ARRAY['transport_messages', 'transport_groups']) AS t, unnest(ARRAY['INSERT', 'SELECT']) AS k`, role).Scan(&privs))
	is.Equal(privs, "transport_groups:INSERT:t transport_groups:SELECT:t transport_messages:INSERT:t transport_messages:SELECT:t") // the views
	is.NoErr(p.Proxy.QueryRow(ctx(t), `
		SELECT string_agg(format('%s:%s:%s', t, k, has_table_privilege($1, t, k)), ' ' ORDER BY t, k)
		  FROM unnest(ARRAY['transport_px_messages', 'transport_px_groups']) AS t, unnest(ARRAY['DELETE', 'SELECT']) AS k`, role).Scan(&privs))
	is.Equal(privs, "transport_px_groups:DELETE:t transport_px_groups:SELECT:t transport_px_messages:DELETE:t transport_px_messages:SELECT:t") // the publisher's commit empties them

	_, err = p.Proxy.Exec(ctx(t), `UPDATE transport_groups SET locked_by = NULL, lock_expiry = NULL WHERE group_id = 'g' AND locked_by = 't'`)
	is.Equal(sqlstate(err), "PT009") // refused now
	is.NoErr(twoInserts(t, p.Proxy, "upgraded", "x", 2, true))
	var prio int
	is.NoErr(p.Parts[home(t, p, "upgraded")].QueryRow(ctx(t), `SELECT priority FROM transport_groups WHERE group_id = 'upgraded'`).Scan(&prio))
	is.Equal(prio, 2) // published on its partition
}
