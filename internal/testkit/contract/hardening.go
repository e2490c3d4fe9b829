package contract

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// The cases of issue 12's items 1 and 4: leases the database issued are
// settled whatever their group id, and the database's refusals arrive as
// typed errors.
func init() {
	cases = append(cases,
		testCase{"OverlappingPublishAck", overlappingPublishAck},
		testCase{"SettlesGroupIDsFromBeforeTheRule", settlesGroupIDsFromBeforeTheRule},
	)
}

// overlappingPublishAck: two publishes to one group that overlap have no
// order but their commits': a claim hands out the higher seq while the
// lower is uncommitted, and the ack of what it handed out is accepted:
// the server records which message a claim handed out (since schema
// version 10), so this ack passes where one of a message behind the head
// under the same token is refused. The lower seq comes next.
func overlappingPublishAck(is *is.I, e *env) {
	e.publish("g", "m0", 0)
	first := e.claim("w", 0) // m0: the group row exists from here on
	tx, err := e.db.Pool.Begin(e.ctx())
	is.NoErr(err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(e.ctx(), `SELECT harel_publish('g', 'm1', 0)`)
	is.NoErr(err) // m1: the lower seq, not yet committed
	e.publish("g", "m2", 0)
	e.ack(first)
	l := e.claim("w", 0)
	is.Equal(l.Event, "m2") // m1 is not there yet
	is.NoErr(tx.Commit(e.ctx()))
	is.NoErr(e.tr.Ack(e.ctx(), l)) // m2 was handed out: its ack holds
	is.Equal(e.claim("w", 0).Event, "m1")
}

// settlesGroupIDsFromBeforeTheRule is issue 12's reproduction: a database
// of version 8 (no group-id rule in the schema) holds messages of groups
// whose ids the Go client refuses to publish (empty, longer than
// MaxGroupBytes). Upgraded by opening a transport, it delivers them, and
// every settling call works on their leases: the client never refuses to
// settle a lease the database issued. Until version 9 each of them
// returned ErrInvalidGroup, and the group stayed blocked.
func settlesGroupIDsFromBeforeTheRule(is *is.I, e *env) {
	db := pgtest.New(e.t, 4)
	_, here, _, _ := runtime.Caller(0)
	v8, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "..", "testdata", "schema", "v8.sql"))
	is.NoErr(err)
	_, err = db.Pool.Exec(e.ctx(), string(v8))
	is.NoErr(err) // a database at version 8
	long := strings.Repeat("L", 2*pgtransport.MaxGroupBytes)
	for _, q := range []string{
		`INSERT INTO transport_messages (group_id, event) VALUES ('', 'x')`, // the two statements
		`INSERT INTO transport_groups (group_id) VALUES ('')`,
		`INSERT INTO transport_messages (group_id, event) VALUES ('', 'y')`,
		`INSERT INTO transport_messages (group_id, event) VALUES ('` + long + `', 'z')`,
		`INSERT INTO transport_groups (group_id) VALUES ('` + long + `')`,
	} {
		_, err := db.Pool.Exec(e.ctx(), q)
		is.NoErr(err)
	}
	tr := e.openDB(db) // applies version 9 over them

	l, err := tr.Claim(e.ctx(), "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l.Group+"/"+l.Event, "/x")          // delivered
	is.NoErr(tr.Extend(e.ctx(), l, time.Minute)) // extended
	is.NoErr(tr.Nack(e.ctx(), l, 0))             // given back
	l, err = tr.Claim(e.ctx(), "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l.Group+"/"+l.Event, "/x")
	next, err := tr.AckNext(e.ctx(), l, time.Minute)
	is.NoErr(err) // acked, the group kept
	is.Equal(next.Event, "y")
	is.NoErr(tr.Ack(e.ctx(), next)) // acked, the group drained
	l, err = tr.Claim(e.ctx(), "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l.Group, long)
	errs, err := tr.AckMany(e.ctx(), []*pgtransport.Lease{l})
	is.NoErr(err)
	is.NoErr(errs[0]) // acked in a batch

	_, err = tr.Publish(e.ctx(), "", "new", 0)
	is.True(errors.Is(err, pgtransport.ErrInvalidGroup)) // publishing such a group is still refused
	var n int
	is.NoErr(db.Pool.QueryRow(e.ctx(), `SELECT (SELECT count(*) FROM transport_messages) + (SELECT count(*) FROM transport_groups)`).Scan(&n))
	is.Equal(n, 0) // all delivered, nothing left behind

	nul := *l
	nul.Group = "a\x00b"                                                // no PostgreSQL text holds a NUL
	is.True(errors.Is(tr.Ack(e.ctx(), &nul), pgtransport.ErrLeaseLost)) // a lease that cannot exist
}
