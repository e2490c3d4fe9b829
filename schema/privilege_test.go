package schema_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestUpgradeKeepsGrantedWorker: where the owner's default privileges
// revoke EXECUTE from PUBLIC, a worker role granted schema.Grants before an
// upgrade still publishes, claims and acks after it, although the upgrade
// created helper functions the grants never named (version 8's guard
// helpers, which every publish runs through its trigger), and tables
// (version 10's dead letters, keys and policy, which a claim, a fail and
// a keyed publish use).
func TestUpgradeKeepsGrantedWorker(t *testing.T) {
	t.Parallel()
	for _, from := range []int{7, 9} {
		t.Run(fmt.Sprintf("FromV%d", from), func(t *testing.T) {
			t.Parallel()
			upgradeGrantedWorker(t, from)
		})
	}
}

func upgradeGrantedWorker(t *testing.T, from int) {
	is := is.New(t)
	db := pgtest.New(t, 2)
	s := pgx.Identifier{db.Schema}.Sanitize()
	owner, worker := pgx.Identifier{"o_" + db.Schema}.Sanitize(), pgx.Identifier{"w_" + db.Schema}.Sanitize()
	c := db.Conn(t)
	exec := func(q string) {
		t.Helper()
		if _, err := c.Exec(ctx(t), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE ROLE ` + owner)
	exec(`CREATE ROLE ` + worker)
	t.Cleanup(func() {
		for _, q := range []string{`RESET ROLE`, `ALTER SCHEMA ` + s + ` OWNER TO CURRENT_USER`, `DROP OWNED BY ` + owner + `, ` + worker, `DROP ROLE ` + owner + `, ` + worker} {
			if _, err := c.Exec(ctx(t), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	exec(`ALTER SCHEMA ` + s + ` OWNER TO ` + owner) // so that its grants take
	exec(`ALTER DEFAULT PRIVILEGES FOR ROLE ` + owner + ` REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC`)
	exec(`SET ROLE ` + owner)
	exec(shipped(t, from)) // owned by the owner, its functions not PUBLIC's
	grants := shippedGrants(db.Schema, "w_"+db.Schema)
	exec(grants)                          // the worker's grants, as of that version
	is.NoErr(schema.Apply(ctx(t), c, "")) // the upgrade, by the owner, in the current schema

	exec(`SET ROLE ` + worker)
	var seq int64
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_publish('g', 'e', 0)`).Scan(&seq)) // publish, through the guard's trigger
	var group string
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim(extract(epoch FROM clock_timestamp()), extract(epoch FROM clock_timestamp()) + 60, 'w:1')`).Scan(&group))
	is.Equal(group, "g") // claim
	var held bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('g', $1, 'w:1', extract(epoch FROM clock_timestamp()))`, seq).Scan(&held))
	is.True(held) // and an ack that drains, through the guard's try-lock

	// Version 10's parts: a keyed publish, and a fail that dead-letters
	// (the policy read, the dead letter written).
	is.NoErr(c.QueryRow(ctx(t), `SELECT s FROM harel_publish_keyed('{g}', '{e}', '{0}', '{k}', 60) AS s`).Scan(&seq))
	is.NoErr(c.QueryRow(ctx(t), `SELECT group_id FROM harel_claim_one(extract(epoch FROM clock_timestamp()), extract(epoch FROM clock_timestamp()) + 60, 'w:2')`).Scan(&group))
	exec(`RESET ROLE`)
	exec(`UPDATE transport_policy SET max_attempts = 1`)
	exec(`SET ROLE ` + worker)
	var outcome string
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_fail('g', $1, 'w:2', extract(epoch FROM clock_timestamp()), 'boom')`, seq).Scan(&outcome))
	is.Equal(outcome, "dead")
	var dead int
	is.NoErr(c.QueryRow(ctx(t), `SELECT count(*) FROM harel_dead_letters(NULL, NULL, 10)`).Scan(&dead))
	is.Equal(dead, 1)
}

// shippedGrants is what schema.Grants returned before version 10: the
// tables of those versions only.
func shippedGrants(s, role string) string {
	q, r := pgx.Identifier{s}.Sanitize(), pgx.Identifier{role}.Sanitize()
	return strings.Join([]string{
		"GRANT USAGE ON SCHEMA " + q + " TO " + r,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + q + ".transport_messages, " + q + ".transport_groups, " + q + ".transport_waiters TO " + r,
		"GRANT SELECT ON " + q + ".transport_schema_version TO " + r,
		"GRANT USAGE ON ALL SEQUENCES IN SCHEMA " + q + " TO " + r,
		"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA " + q + " TO " + r,
	}, ";\n") + ";\n"
}
