package schema_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// claimAckOrder claims one group at a time with the design's harel_claim
// (so a plain-SQL consumer), acks each, n times, and returns the groups in
// the order they were handed out.
func claimAckOrder(t *testing.T, c *pgx.Conn, now *float64, n int) []string {
	t.Helper()
	is := is.New(t)
	var order []string
	for range n {
		*now++
		var g string
		var seq int64
		err := c.QueryRow(ctx(t), `SELECT group_id, seq FROM harel_claim($1::float8, $1::float8 + 60, 'w')`, *now).Scan(&g, &seq)
		if errors.Is(err, pgx.ErrNoRows) {
			break
		}
		is.NoErr(err)
		var ok bool
		is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w', $3)`, g, seq, *now).Scan(&ok))
		is.True(ok)
		order = append(order, g)
	}
	return order
}

// TestSharesInterleaveTenants is the bound of "Shares" in
// functions/25_ready.sql: a "sybil" tenant publishes 200 ready groups,
// then 9 light tenants 2 groups each. With tenants, plain-SQL claims hand
// out every light group within the first 2 rounds of 10 tenants (20
// hand-outs, one step each); the same publishes in one tenant hand them
// out after the sybil's 200.
func TestSharesInterleaveTenants(t *testing.T) {
	t.Parallel()
	for _, tenants := range []bool{true, false} {
		t.Run(fmt.Sprint("tenants=", tenants), func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			db := noClockBound(t, pgtest.New(t, 2))
			is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
			c := db.Conn(t)
			tenant := func(name string) *string {
				if !tenants {
					return nil
				}
				return &name
			}
			var groups, events []string
			var prios []int32
			var owners []*string
			add := func(g, owner string) {
				groups, events, prios, owners = append(groups, g), append(events, "e"), append(prios, 0), append(owners, tenant(owner))
			}
			for i := range 200 {
				add(fmt.Sprintf("s%03d", i), "sybil")
			}
			_, err := c.Exec(ctx(t), `SELECT harel_publish_many($1, $2, $3, $4)`, groups, events, prios, owners)
			is.NoErr(err)
			groups, events, prios, owners = nil, nil, nil, nil
			for l := range 9 {
				for i := range 2 {
					add(fmt.Sprintf("l%d-%d", l, i), fmt.Sprintf("light%d", l))
				}
			}
			_, err = c.Exec(ctx(t), `SELECT harel_publish_many($1, $2, $3, $4)`, groups, events, prios, owners)
			is.NoErr(err)

			now := 1000.0
			order := claimAckOrder(t, c, &now, 218)
			is.Equal(len(order), 218) // every group handed out once
			last := 0                 // the last light group's place
			for i, g := range order {
				if strings.HasPrefix(g, "l") {
					last = i + 1
				}
			}
			if tenants {
				is.True(last <= 20) // every light group within two rounds of the 10 tenants
				for i := 0; i < 10; i++ {
					is.True(strings.HasPrefix(order[i], "s") == (i == 0)) // the first round: one sybil group, then each light tenant's
				}
			} else {
				is.Equal(last, 218) // one tenant: the light groups wait behind the sybil's 200
			}
		})
	}
}

// TestSharesFollowWeights: tenants a (weight 3) and b (weight 1), each with
// 60 ready groups of one message; 40 plain-SQL claims hand out 30 of a's
// and 10 of b's, a's three to each of b's in every round. A weight set to
// a tenant with no row places its next entries (those already in the log
// keep their places), so the weights are set before the publish.
func TestSharesFollowWeights(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	_, err := c.Exec(ctx(t), `SELECT harel_set_tenant_weight('a', 3)`)
	is.NoErr(err)
	_, err = c.Exec(ctx(t), `SELECT harel_publish('b' || i, 'e', 0, 'b'), harel_publish('a' || i, 'e', 0, 'a')
	                           FROM generate_series(1, 60) AS i`)
	is.NoErr(err)
	now := 1000.0
	order := claimAckOrder(t, c, &now, 40)
	var a, b int
	for i, g := range order {
		if g[0] == 'a' {
			a++
		} else {
			b++
		}
		if (i+1)%4 == 0 {
			is.Equal(a, 3*b) // 3:1 in every round of four
		}
	}
	is.Equal(a, 30)
	is.Equal(b, 10)

	var weight, ready int
	is.NoErr(c.QueryRow(ctx(t), `SELECT weight, ready FROM harel_tenants() WHERE tenant = 'a'`).Scan(&weight, &ready))
	is.Equal(weight, 3)
	is.Equal(ready, 30) // a's groups still waiting
	var share float64
	is.NoErr(c.QueryRow(ctx(t), `SELECT share FROM harel_tenants() WHERE tenant = 'b'`).Scan(&share))
	is.Equal(share, 0.25)
}

// TestSharesChargeTurns: a turn costs its tenant one step, however many
// messages its holder kept the group for, and a hand-out outside the log
// (a due group's retry) is charged to its tenant a step: its next entries
// go a step further.
func TestSharesChargeTurns(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	const step = 100000
	_, err := c.Exec(ctx(t), `SELECT harel_publish('k', 'e' || i, 0, 't') FROM generate_series(1, 6) AS i`)
	is.NoErr(err)
	vnow := func() int64 {
		var v int64
		is.NoErr(c.QueryRow(ctx(t), `SELECT last_value FROM transport_ready_vnow`).Scan(&v))
		return v
	}
	entry := func(g string) int64 {
		var v int64
		is.NoErr(c.QueryRow(ctx(t), `SELECT vt FROM transport_ready WHERE group_id = $1`, g).Scan(&v))
		return v
	}
	// Claimed, kept for three more messages, then freed: one turn.
	var seq int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_claim(1001, 1060, 'w')`).Scan(&seq))
	for range 3 {
		is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_ack_claim('k', $1, 'w', true, 1001, 1060, 'w', 0)`, seq).Scan(&seq))
	}
	var held bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('k', $1, 'w', 1001)`, seq).Scan(&held))
	is.True(held)
	is.Equal(entry("k")-vnow(), int64(step)) // one step for the turn, whatever it took

	// A retry: the head is nacked at once, so its group comes back as a due
	// group, outside the log, and the claim charges tenant t a step.
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_claim(1002, 1060, 'w')`).Scan(&seq)) // from its entry
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_nack('k', 'w', 1002, 0)`).Scan(&held))
	is.True(held)
	var entries int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_ready`).Scan(&entries))
	is.Equal(entries, 0) // the retry comes as a due group, with no entry
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_claim(1003, 1060, 'w')`).Scan(&seq))
	var charged int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT charged FROM transport_tenants WHERE tenant = 't'`).Scan(&charged))
	is.Equal(charged-vnow(), int64(step)) // one hand-out outside the log
	_, err = c.Exec(ctx(t), `SELECT harel_publish('k2', 'e', 0, 't')`)
	is.NoErr(err)
	is.Equal(entry("k2")-charged, int64(step)) // t's next entry goes past the charge
}

// TestTenantDeliveries: harel_tenants' delivered counts each hand-out
// of a tenant's groups (a claim's, a kept group's next message, a
// retry's; not a lease given back unused), and keeps them when the rows
// are deleted, truncated or revived for another tenant, and when the
// sessions' counts are folded (transport_tenant_counts).
func TestTenantDeliveries(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	_, err := c.Exec(ctx(t), `SELECT harel_publish('k', 'e' || i, 0, 't') FROM generate_series(1, 4) AS i`)
	is.NoErr(err)
	_, err = c.Exec(ctx(t), `SELECT harel_publish('o', 'e', 0, 'u')`)
	is.NoErr(err)
	delivered := func() map[string]int64 {
		t.Helper()
		rows, err := c.Query(ctx(t), `SELECT tenant, delivered FROM harel_tenants(1001)`)
		is.NoErr(err)
		out := map[string]int64{}
		var tn string
		var d int64
		_, err = pgx.ForEachRow(rows, []any{&tn, &d}, func() error { out[tn] = d; return nil })
		is.NoErr(err)
		return out
	}
	is.Equal(delivered(), map[string]int64{"t": 0, "u": 0})
	rows, err := c.Query(ctx(t), `SELECT group_id, seq FROM harel_claim_many(1001, 1060, 'w', 0, 2)`)
	is.NoErr(err)
	seqs := map[string]int64{}
	var g string
	var seq int64
	_, err = pgx.ForEachRow(rows, []any{&g, &seq}, func() error { seqs[g] = seq; return nil })
	is.NoErr(err)
	is.Equal(len(seqs), 2)
	seq = seqs["k"]
	for range 3 { // kept for its next message three times
		is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_ack_claim('k', $1, 'w', true, 1001, 1060, 'w', 0)`, seq).Scan(&seq))
	}
	is.Equal(delivered(), map[string]int64{"t": 4, "u": 1})
	var nacked bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_nack('o', 'w', 1001, 0)`).Scan(&nacked))
	is.True(nacked)
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_claim(1002, 1060, 'w')`).Scan(&seq))
	is.Equal(delivered(), map[string]int64{"t": 4, "u": 2}) // a retry is a delivery too
	_, err = c.Exec(ctx(t), `SELECT harel_release('o', 'w')`)
	is.NoErr(err)
	is.Equal(delivered(), map[string]int64{"t": 4, "u": 1}) // given back unused: not a delivery
	_, err = c.Exec(ctx(t), `DELETE FROM transport_groups WHERE group_id = 'k'`)
	is.NoErr(err)
	is.Equal(delivered(), map[string]int64{"t": 4, "u": 1}) // the row went, its count stays

	// A drained row kept for its next publish, revived for another
	// tenant: what it handed out stays its first tenant's.
	_, err = c.Exec(ctx(t), `SELECT harel_publish('r', 'e', 0, 'v')`)
	is.NoErr(err)
	var held bool
	for range 2 { // o's retry, then r
		is.NoErr(c.QueryRow(ctx(t), `SELECT group_id, seq FROM harel_claim(1003, 1060, 'w')`).Scan(&g, &seq))
		is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w', 1003)`, g, seq).Scan(&held))
		is.True(held)
	}
	is.Equal(delivered(), map[string]int64{"t": 4, "u": 2, "v": 1})
	_, err = c.Exec(ctx(t), `SELECT harel_publish('r', 'e2', 0, 'x')`)
	is.NoErr(err)
	var tenant string
	is.NoErr(c.QueryRow(ctx(t), `SELECT tenant FROM transport_groups WHERE group_id = 'r'`).Scan(&tenant))
	is.Equal(tenant, "x") // the kept row took the new tenant
	is.Equal(delivered(), map[string]int64{"t": 4, "u": 2, "v": 1, "x": 0})

	// A TRUNCATE, and the fold of the sessions' counts, change no total.
	_, err = c.Exec(ctx(t), `TRUNCATE transport_groups, transport_messages, transport_ready`)
	is.NoErr(err)
	want := map[string]int64{"t": 4, "u": 2, "v": 1}
	is.Equal(delivered(), want)
	_, err = c.Exec(ctx(t), `SELECT harel_fold_counts()`)
	is.NoErr(err)
	is.Equal(delivered(), want)
	added := func() (n int) { // the rows not folded yet
		t.Helper()
		is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_tenant_counts WHERE NOT folded`).Scan(&n))
		return n
	}
	is.Equal(added(), 0) // folded: a row a tenant

	// The retry of a keep whose answer was lost hands out its next
	// message again, and counts it once.
	_, err = c.Exec(ctx(t), `SELECT harel_publish('y', 'e' || i, 0, 'y') FROM generate_series(1, 2) AS i`)
	is.NoErr(err)
	is.NoErr(c.QueryRow(ctx(t), `SELECT seq FROM harel_claim(1010, 1060, 'w')`).Scan(&seq))
	var next int64
	for range 2 {
		var held bool
		is.NoErr(c.QueryRow(ctx(t), `SELECT held, seq FROM harel_exchange(1010, 1060, 'w', 0, 0, '{y}', ARRAY[$1::bigint], '{w}', '{true}')`, seq).Scan(&held, &next))
		is.True(held)
		is.True(next > seq)
	}
	want["y"] = 2
	is.Equal(delivered(), want)

	// The reap deletes the drained row, its count goes to this session's
	// row, and the reap's next lap folds it.
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('y', $1, 'w', 1010)`, next).Scan(new(bool)))
	is.Equal(added(), 0)
	left := 1
	for try := 0; left > 0 && try < 100; try++ { // round the slots to the row's
		_, err = c.Exec(ctx(t), `SELECT harel_reap(1020, 64)`)
		is.NoErr(err)
		is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups`).Scan(&left))
	}
	is.Equal(left, 0)    // reaped
	is.Equal(added(), 1) // the reap's delete added a row
	is.Equal(delivered(), want)
	_, err = c.Exec(ctx(t), `SELECT harel_reap(1020, 64)`) // past the last slot: a new lap
	is.NoErr(err)
	is.Equal(added(), 0)
	is.Equal(delivered(), want)
}

// TestCountsNeverWait: a fold while another fold's transaction is open
// is skipped, not waited for, and a delete's count is added while a fold
// holds the rows it folds; so no claim waits on the counts, nor holds one
// another claim waits for (a claim's reap may fold).
func TestCountsNeverWait(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 3))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	a, b := db.Conn(t), db.Conn(t)
	_, err := a.Exec(ctx(t), `SELECT harel_count_add('{t,u}', '{2,3}')`)
	is.NoErr(err)
	tx, err := a.Begin(ctx(t))
	is.NoErr(err)
	defer tx.Rollback(ctx(t))                              //nolint:errcheck // committed below
	_, err = tx.Exec(ctx(t), `SELECT harel_fold_counts()`) // holds what it folded until it commits
	is.NoErr(err)

	quick, cancel := context.WithTimeout(ctx(t), 5*time.Second)
	defer cancel()
	_, err = b.Exec(quick, `SELECT harel_publish('g', 'e', 0, 't')`)
	is.NoErr(err)
	var seq int64
	is.NoErr(b.QueryRow(quick, `SELECT seq FROM harel_claim(1001, 1060, 'w')`).Scan(&seq))
	_, err = b.Exec(quick, `DELETE FROM transport_messages; DELETE FROM transport_groups`) // counts 1 for t
	is.NoErr(err)
	_, err = b.Exec(quick, `SELECT harel_fold_counts()`) // skipped: a's is open
	is.NoErr(err)
	count := func(q string) (n int64) {
		t.Helper()
		is.NoErr(b.QueryRow(ctx(t), q).Scan(&n))
		return n
	}
	is.Equal(count(`SELECT count(*) FROM transport_tenant_counts WHERE NOT folded`), int64(3)) // as a left them (b sees its fold uncommitted), and b's
	is.NoErr(tx.Commit(ctx(t)))
	_, err = b.Exec(ctx(t), `SELECT harel_fold_counts()`)
	is.NoErr(err)
	is.Equal(count(`SELECT count(*) FROM transport_tenant_counts WHERE NOT folded`), int64(0))
	is.Equal(count(`SELECT delivered FROM harel_tenants(1001) WHERE tenant = 't'`), int64(3))
	is.Equal(count(`SELECT delivered FROM harel_tenants(1001) WHERE tenant = 'u'`), int64(3))
}

// TestTenantCallsRefuseBadInput: an empty or over-long tenant is PT011, a
// weight outside 1 to 1,000 PT012, and nothing is written.
func TestTenantCallsRefuseBadInput(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	long := strings.Repeat("x", 257)
	for _, call := range []struct {
		sql   string
		args  []any
		state string
	}{
		{`SELECT harel_publish('g', 'e', 0, '')`, nil, "PT011"},
		{`SELECT harel_publish('g', 'e', 0, $1)`, []any{long}, "PT011"},
		{`SELECT harel_publish_many('{g,h}', '{e,e}', '{0,0}', ARRAY['ok', ''])`, nil, "PT011"},
		{`SELECT harel_publish_many('{g,h}', '{e,e}', '{0,0}', '{ok}')`, nil, "22023"},
		{`SELECT harel_publish_keyed('{g}', '{e}', '{0}', '{k}', 60, ARRAY[$1])`, []any{long}, "PT011"},
		{`SELECT harel_set_tenant_weight('', 2)`, nil, "PT011"},
		{`SELECT harel_set_tenant_weight(NULL, 2)`, nil, "PT011"},
		{`SELECT harel_set_tenant_weight('t', 0)`, nil, "PT012"},
		{`SELECT harel_set_tenant_weight('t', 1001)`, nil, "PT012"},
		{`SELECT harel_set_tenant_weight('t', NULL)`, nil, "PT012"},
	} {
		_, err := c.Exec(ctx(t), call.sql, call.args...)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != call.state {
			t.Errorf("%s: got %v, want SQLSTATE %s", call.sql, err, call.state)
		}
	}
	var n int
	is.NoErr(c.QueryRow(ctx(t), `SELECT (SELECT count(*) FROM transport_messages) + (SELECT count(*) FROM transport_groups)
	                                  + (SELECT count(*) FROM transport_tenants) + (SELECT count(*) FROM transport_dedup)`).Scan(&n))
	is.Equal(n, 0) // nothing written
}

// TestProxyTenants: through a PL/Proxy proxy over 4 partitions, each
// publish names its tenant (harel_publish, harel_publish_many, the
// design's two INSERTs with the tenant column), a weight is set on every
// partition, harel_tenants merges the partitions', and a bad tenant or
// weight is refused before any partition writes.
func TestProxyTenants(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	exec := func(q string, args ...any) {
		t.Helper()
		_, err := p.Proxy.Exec(ctx(t), q, args...)
		is.NoErr(err)
	}
	exec(`SELECT harel_publish('one-' || i, 'e', 0, 'one') FROM generate_series(1, 8) AS i`)
	exec(`SELECT harel_publish_many(ARRAY['many-1', 'many-2', 'dflt'], '{e,e,e}', '{0,0,0}', ARRAY['many', 'many', NULL])`)
	tx, err := p.Proxy.Begin(ctx(t))
	is.NoErr(err)
	_, err = tx.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ('plain', 'e')`)
	is.NoErr(err)
	_, err = tx.Exec(ctx(t), `INSERT INTO transport_groups (group_id, priority, tenant) VALUES ('plain', 0, 'sql') ON CONFLICT (group_id) DO NOTHING`)
	is.NoErr(err)
	is.NoErr(tx.Commit(ctx(t)))
	exec(`SELECT harel_set_tenant_weight('one', 5)`)

	type tenant struct {
		Tenant         string
		Weight         int
		Groups, Leased int64
		Ready          int64
		Share          float64
		Delivered      int64
	}
	tenants := func() []tenant {
		t.Helper()
		rows, err := p.Proxy.Query(ctx(t), `SELECT * FROM harel_tenants()`)
		is.NoErr(err)
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[tenant])
		is.NoErr(err)
		return got
	}
	is.Equal(tenants(), []tenant{
		{"default", 1, 1, 0, 1, 1.0 / 8, 0},
		{"many", 1, 2, 0, 2, 1.0 / 8, 0},
		{"one", 5, 8, 0, 8, 5.0 / 8, 0},
		{"sql", 1, 1, 0, 1, 1.0 / 8, 0},
	})
	rows, err := p.Proxy.Query(ctx(t), `SELECT group_id, tenant FROM harel_groups(NULL, NULL, 'group', 0, 100, 'many')`)
	is.NoErr(err)
	type row struct{ Group, Tenant string }
	many, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	is.NoErr(err)
	is.Equal(many, []row{{"many-1", "many"}, {"many-2", "many"}}) // the tenant's groups, from every partition
	// Every group handed out once: the deliveries add up over the
	// partitions, each to its tenant.
	for range 12 {
		var g string
		is.NoErr(p.Proxy.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(`+nowSQL+`, `+nowSQL+` + 30, 'w:1')`).Scan(&g))
	}
	delivered := map[string]int64{}
	for _, tn := range tenants() {
		delivered[tn.Tenant] = tn.Delivered
	}
	is.Equal(delivered, map[string]int64{"default": 1, "many": 2, "one": 8, "sql": 1})
	for _, part := range p.Parts {
		var w int
		is.NoErr(part.QueryRow(ctx(t), `SELECT weight FROM transport_tenants WHERE tenant = 'one'`).Scan(&w))
		is.Equal(w, 5) // set on every partition
	}

	for _, call := range []struct {
		sql   string
		state string
	}{
		{`SELECT harel_publish('bad', 'e', 0, '')`, "PT011"},
		{`SELECT harel_publish_many('{bad,bad2}', '{e,e}', '{0,0}', ARRAY['ok', ''])`, "PT011"},
		{`SELECT harel_set_tenant_weight('', 2)`, "PT011"},
		{`SELECT harel_set_tenant_weight('t', 0)`, "PT012"},
	} {
		_, err := p.Proxy.Exec(ctx(t), call.sql)
		if sqlstate(err) != call.state {
			t.Errorf("%s: got %v, want SQLSTATE %s", call.sql, err, call.state)
		}
	}
	for i, part := range p.Parts {
		var n int
		is.NoErr(part.QueryRow(ctx(t), `SELECT (SELECT count(*) FROM transport_groups WHERE group_id LIKE 'bad%')
		                                      + (SELECT count(*) FROM transport_tenants WHERE tenant = 't')`).Scan(&n))
		if n != 0 {
			t.Errorf("partition %d: a refused call wrote %d rows", i, n)
		}
	}
}

// TestKeptRowTakesTenant: a drained group's kept row is revived in the
// tenant its first publish since names, and in its own where that publish
// names none; the design's two INSERTs with a tenant the row's check
// refuses are refused there too (23514), kept row or not.
func TestKeptRowTakesTenant(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := noClockBound(t, pgtest.New(t, 2))
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	tenant := func() string {
		var s string
		is.NoErr(c.QueryRow(ctx(t), `SELECT tenant FROM transport_groups WHERE group_id = 'g'`).Scan(&s))
		return s
	}
	now := 1000.0
	drain := func() {
		t.Helper()
		is.Equal(claimAckOrder(t, c, &now, 1), []string{"g"})
		var drained bool
		is.NoErr(c.QueryRow(ctx(t), `SELECT drained_at IS NOT NULL FROM transport_groups WHERE group_id = 'g'`).Scan(&drained))
		is.True(drained) // the row is kept
	}
	_, err := c.Exec(ctx(t), `SELECT harel_publish('g', 'e', 0, 'acme')`)
	is.NoErr(err)
	drain()
	_, err = c.Exec(ctx(t), `SELECT harel_publish('g', 'e', 0)`)
	is.NoErr(err)
	is.Equal(tenant(), "acme") // no tenant named: its own
	drain()
	_, err = c.Exec(ctx(t), `SELECT harel_publish_many('{g}', '{e}', '{0}', '{other}')`)
	is.NoErr(err)
	is.Equal(tenant(), "other") // the first publish since the drain names it
	drain()

	tx, err := c.Begin(ctx(t))
	is.NoErr(err)
	_, err = tx.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ('g', 'e')`)
	is.NoErr(err)
	_, err = tx.Exec(ctx(t), `INSERT INTO transport_groups (group_id, priority, tenant) VALUES ('g', 0, '') ON CONFLICT (group_id) DO NOTHING`)
	var pgErr *pgconn.PgError
	is.True(errors.As(err, &pgErr) && pgErr.Code == "23514") // refused, not revived
	is.NoErr(tx.Rollback(ctx(t)))
	is.Equal(tenant(), "other")
}

// TestProxyUpgradeKeepsGrantedRole: where the owner's default privileges
// revoke EXECUTE from PUBLIC, a role granted the proxy's calls at version
// 26 may still publish after the upgrade, which recreated the publishes
// (they take a tenant), and may call the tenants' new functions; one
// granted them at version 27 may still list groups and tenants, whose
// functions version 28 recreated with new columns. (The
// owner is a superuser of its own: only one may create PL/Proxy functions,
// and default privileges are per role.)
func TestProxyUpgradeKeepsGrantedRole(t *testing.T) {
	t.Parallel()
	// One after the other: both grant and revoke on the one foreign
	// server, and two sessions updating its row at once fail ("tuple
	// concurrently updated").
	for _, from := range []int{26, 27} { // before the tenants; before the functions' new columns
		t.Run(fmt.Sprint("from", from), func(t *testing.T) {
			proxyUpgradeKeepsGrantedRole(t, from)
		})
	}
}

func proxyUpgradeKeepsGrantedRole(t *testing.T, from int) {
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	s := pgx.Identifier{p.Schema}.Sanitize()
	script, err := os.ReadFile(fmt.Sprintf("../testdata/proxy/v%d.sql", from))
	is.NoErr(err)
	old, found := strings.CutSuffix(string(script), fmt.Sprintf("SELECT harel_px_check(%d);\nCOMMIT;\n", from))
	is.True(found)
	owner, worker := "o27_"+p.Schema, "w27_"+p.Schema
	o, w := pgx.Identifier{owner}.Sanitize(), pgx.Identifier{worker}.Sanitize()
	conn, err := p.Proxy.Acquire(ctx(t))
	is.NoErr(err)
	defer conn.Release()
	c := conn.Conn()
	exec := func(q string) {
		t.Helper()
		if _, err := c.Exec(ctx(t), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE ROLE ` + o + ` SUPERUSER LOGIN`)
	exec(`CREATE ROLE ` + w)
	t.Cleanup(func() {
		for _, q := range []string{`RESET ROLE`, `ALTER SCHEMA ` + s + ` OWNER TO CURRENT_USER`, `REASSIGN OWNED BY ` + o + ` TO CURRENT_USER`,
			`DROP OWNED BY ` + o + `, ` + w, `DROP ROLE ` + o + `, ` + w} {
			if _, err := c.Exec(context.Background(), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	exec(`GRANT USAGE ON FOREIGN SERVER pgtransport TO ` + o)
	exec(`DROP SCHEMA ` + s + ` CASCADE; CREATE SCHEMA ` + s + `; ALTER SCHEMA ` + s + ` OWNER TO ` + o)
	exec(`ALTER DEFAULT PRIVILEGES FOR ROLE ` + o + ` REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC`)
	exec(`SET ROLE ` + o)
	exec(`SET search_path TO ` + s)
	exec(old + "COMMIT;\n")
	exec(`GRANT USAGE ON SCHEMA ` + s + ` TO ` + w + `; GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA ` + s + ` TO ` + w)
	is.NoErr(schema.ApplyProxy(ctx(t), c, p.Schema))
	exec(`RESET ROLE`)
	for _, fn := range []string{"harel_publish(text,text,integer,text)", "harel_publish_many(text[],text[],integer[],text[])",
		"harel_tenants(double precision)", "harel_set_tenant_weight(text,integer)",
		"harel_groups(double precision,text,text,integer,integer,text)", "harel_group(double precision,text)"} {
		var can bool
		is.NoErr(c.QueryRow(ctx(t), `SELECT has_function_privilege($1, $2, 'EXECUTE')`, worker, p.Schema+"."+fn).Scan(&can))
		if !can {
			t.Errorf("%s may not execute %s after the upgrade", worker, fn)
		}
	}
}
