package core

import (
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestRefusalsMapToSentinels sends each call the database refuses (the
// group-id rule, the functions' SQLSTATEs of class PT) as plain SQL, as
// another client or a caller's own statement would, and checks mapErr
// turns each into its sentinel.
func TestRefusalsMapToSentinels(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	ctx := pgtest.Context(t)
	_, err := New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)
	_, err = db.Pool.Exec(ctx, `SELECT harel_publish('g', 'e1')`)
	is.NoErr(err)
	_, err = db.Pool.Exec(ctx, `SELECT * FROM harel_claim(extract(epoch FROM clock_timestamp()), extract(epoch FROM clock_timestamp()) + 60, 'w:1')`)
	is.NoErr(err)
	const now = `extract(epoch FROM clock_timestamp())`
	for _, tc := range []struct {
		name, sql string
		args      []any
		want      error
	}{
		{"GroupIDRule", `INSERT INTO transport_messages (group_id, event) VALUES ('', 'x')`, nil, pgtransport.ErrInvalidGroup},
		{"PriorityCheck", `INSERT INTO transport_groups (group_id, priority) VALUES ('p', 9)`, nil, pgtransport.ErrInvalidPriority},
		{"NoToken", `SELECT * FROM harel_claim(` + now + `, ` + now + ` + 60, '')`, nil, pgtransport.ErrInvalidWorkerID},
		{"LeaseEndInThePast", `SELECT harel_extend('g', 'w:1', ` + now + ` - 3600)`, nil, pgtransport.ErrInvalidVisibility},
		{"NegativeDelay", `SELECT harel_nack('g', 'w:1', ` + now + `, -1)`, nil, pgtransport.ErrInvalidDelay},
		{"ClockSkew", `SELECT * FROM harel_claim(` + now + ` + 3600, ` + now + ` + 3660, 'w:2')`, nil, pgtransport.ErrClockSkew},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := db.Pool.Exec(ctx, tc.sql, tc.args...)
			if err == nil {
				t.Fatal("accepted")
			}
			if got := mapErr("op", err); !errors.Is(got, tc.want) {
				t.Errorf("mapErr(%v) = %v, want %v", err, got, tc.want)
			}
		})
	}
}

// TestClockTurnsBoundOffForItsOwnStatements: a core with Config.Clock
// passes its own time as now, far from the server's here, and its calls
// work; the bound is off only for the transactions of its statements, not
// for the next statement on the same connection.
func TestClockTurnsBoundOffForItsOwnStatements(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	ctx := pgtest.Context(t)
	conn := db.Conn(t)
	stopped := time.Unix(1_000_000_000, 0) // 2001
	c, err := New(ctx, conn, pgtransport.Config{Schema: db.Schema, Clock: func() time.Time { return stopped }})
	is.NoErr(err)
	_, err = c.Publish(ctx, "g", "e", 0)
	is.NoErr(err)
	l, err := c.Claim(ctx, "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l.Event, "e")                  // claimed in 2001
	is.NoErr(c.Extend(ctx, l, time.Minute)) // extended
	is.NoErr(c.Nack(ctx, l, time.Second))   // parked
	settled, claimed, err := c.Exchange(ctx, nil, false, "w", time.Minute, 0, 1)
	is.NoErr(err)
	is.Equal(len(settled)+len(claimed), 0) // still parked, by the 2001 clock
	stopped = stopped.Add(2 * time.Second)
	l, err = c.Claim(ctx, "w", time.Minute, 0)
	is.NoErr(err)
	is.NoErr(c.Ack(ctx, l)) // acked
	var bound *string
	is.NoErr(conn.QueryRow(ctx, `SELECT NULLIF(current_setting('pgtransport.max_clock_skew', true), '')`).Scan(&bound))
	is.True(bound == nil) // the bound is back for the connection's next statement
	_, err = conn.Exec(ctx, `SELECT * FROM harel_claim(1e9, 1e9 + 60, 'w:x')`)
	is.True(errors.Is(mapErr("claim", err), pgtransport.ErrClockSkew)) // and holds there
}
