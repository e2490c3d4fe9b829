package schema_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestUpgradeKeepsGrantedWorker: where the owner's default privileges
// revoke EXECUTE from PUBLIC, a worker role granted schema.Grants before an
// upgrade still publishes, claims and acks after it, although the upgrade
// created helper functions the grants never named (version 8's guard
// helpers, which every publish runs through its trigger).
func TestUpgradeKeepsGrantedWorker(t *testing.T) {
	t.Parallel()
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
	exec(shipped(t, 7)) // version 7, owned by the owner, its functions not PUBLIC's
	grants, err := schema.Grants(db.Schema, "w_"+db.Schema)
	is.NoErr(err)
	exec(grants)                          // the worker's grants, as of version 7
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
}
