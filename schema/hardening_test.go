package schema_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// noClockBound turns the functions' clock-skew bound off on every
// connection db opens from now on (its Pool, Conn and DSN), as the Go
// client does for a Config.Clock: the tests that use it pass made-up
// times (1, 1e9, ...) as p_now, to stay deterministic.
func noClockBound(t *testing.T, db *pgtest.DB) *pgtest.DB {
	t.Helper()
	const param = "pgtransport.max_clock_skew"
	if strings.Contains(db.DSN, "://") {
		sep := "?"
		if strings.Contains(db.DSN, "?") {
			sep = "&"
		}
		db.DSN += sep + param + "=off"
	} else {
		db.DSN += " " + param + "=off"
	}
	cfg := db.Pool.Config()
	cfg.ConnConfig.RuntimeParams[param] = "off"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	old := db.Pool
	db.Pool = pool // db's cleanup closes it
	old.Close()
	return db
}

// sqlState is err's SQLSTATE, or "" for no PostgreSQL error.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// tables is everything in the queue's two tables, as one string: what a
// refused call must leave as it was.
func tables(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	t.Helper()
	var s string
	err := q.QueryRow(ctx(t), `SELECT concat_ws(' | ',
		(SELECT string_agg(seq || ':' || group_id || ':' || event, ',' ORDER BY seq) FROM transport_messages),
		(SELECT string_agg(group_id || ':' || COALESCE(locked_by, '-') || ':' || COALESCE(lock_expiry::text, '-') || ':' || priority, ',' ORDER BY group_id) FROM transport_groups WHERE drained_at IS NULL))`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const groupIDConstraint = "transport_messages_group_id_valid"

// TestGroupIDRule: every way into the queue refuses a group id outside 1
// to MaxGroupBytes bytes (bytes, not characters), with SQLSTATE 23514 on
// the named constraint, and writes nothing.
func TestGroupIDRule(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	max := strings.Repeat("é", pgtransport.MaxGroupBytes/2) // 2 bytes each
	for _, bad := range []string{"", max + "x", strings.Repeat("g", 2000)} {
		for name, publish := range map[string]func() error{
			"plain": func() error {
				return pgx.BeginFunc(ctx(t), db.Pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ($1, 'x')`, bad); err != nil {
						return err
					}
					_, err := tx.Exec(ctx(t), `INSERT INTO transport_groups (group_id) VALUES ($1) ON CONFLICT (group_id) DO NOTHING`, bad)
					return err
				})
			},
			"harel_publish": func() error {
				_, err := db.Pool.Exec(ctx(t), `SELECT harel_publish($1, 'x', 0)`, bad)
				return err
			},
			"harel_publish_many": func() error {
				_, err := db.Pool.Exec(ctx(t), `SELECT harel_publish_many(ARRAY['ok', $1], '{x,y}', '{0,0}')`, bad)
				return err
			},
		} {
			err := publish()
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != groupIDConstraint {
				t.Errorf("%s of a %d-byte group id: got %v, want SQLSTATE 23514 on %s", name, len(bad), err, groupIDConstraint)
			}
		}
	}
	is.Equal(tables(t, db.Pool), "") // nothing written
	var seq int64
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT harel_publish($1, 'x', 0)`, max).Scan(&seq)) // MaxGroupBytes exactly is fine
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT harel_publish('g', 'x', 0)`).Scan(&seq))     // and one byte
}

// TestUpgradeKeepsBadGroupIDs reproduces, on a database of version 8,
// which had no group-id rule, the rows a plain-SQL publish could leave
// there (009_hardening.sql says how): the upgrade to the rule neither
// fails nor strands the rows already there; they are delivered in order
// and settled as any other, and only new messages for such a group are
// refused.
func TestUpgradeKeepsBadGroupIDs(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	load(t, db, shipped(t, 8))
	long := strings.Repeat("L", 2000)
	for _, q := range []string{
		`INSERT INTO transport_messages (group_id, event) VALUES ('', 'x')`, // the design's two-INSERT publish
		`INSERT INTO transport_groups (group_id) VALUES ('')`,
		`INSERT INTO transport_messages (group_id, event) VALUES ('', 'y')`,
		`INSERT INTO transport_messages (group_id, event) VALUES ('` + long + `', 'z')`,
		`INSERT INTO transport_groups (group_id) VALUES ('` + long + `')`,
	} {
		_, err := db.Pool.Exec(ctx(t), q)
		is.NoErr(err) // version 8 takes them
	}

	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema)) // the upgrade does not fail
	var def string
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = $1 AND connamespace = $2::regnamespace`, groupIDConstraint, db.Schema).Scan(&def))
	is.True(strings.HasSuffix(def, "NOT VALID")) // added without checking the rows there

	_, err := db.Pool.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ('', 'new')`)
	is.Equal(sqlState(err), "23514") // a new message for such a group is refused

	now := `extract(epoch FROM clock_timestamp())`
	claim := func() (group string, seq int64, event string) {
		t.Helper()
		err := db.Pool.QueryRow(ctx(t), `SELECT group_id, seq, event FROM harel_claim(`+now+`, `+now+` + 60, 'w:1', 0)`).Scan(&group, &seq, &event)
		is.NoErr(err)
		return group, seq, event
	}
	var held bool
	g, seq, ev := claim()
	is.Equal(g+"/"+ev, "/x") // the empty id's head, delivered
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT harel_nack($1, 'w:1', `+now+`, 0)`, g).Scan(&held))
	is.True(held) // given back
	g, seq, ev = claim()
	is.Equal(g+"/"+ev, "/x") // the same head again
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT harel_ack($1, $2, 'w:1', `+now+`)`, g, seq).Scan(&held))
	is.True(held)
	g2, seq2, ev2 := claim()
	is.True(g2 == long && ev2 == "z") // the long id's (never served, so before the empty id again)
	g, seq, ev = claim()
	is.Equal(g+"/"+ev, "/y") // then the empty id's next, in order
	rows, err := db.Pool.Query(ctx(t), `SELECT held FROM harel_ack_many(ARRAY[$1, $2], ARRAY[$3, $4]::bigint[], '{w:1,w:1}', '{false,false}', `+now+`, `+now+` + 60)`,
		g, g2, seq, seq2)
	is.NoErr(err)
	helds, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	is.NoErr(err)
	is.Equal(helds, []bool{true, true}) // settled, in a batch too
	is.Equal(tables(t, db.Pool), "")    // both groups drained and gone
}

// TestFunctionsRefuseMisuse calls each function with each argument that
// would break a guarantee: each is refused with its SQLSTATE (class PT,
// see functions/15_checks.sql) and changes nothing. Until version
// 9 every one of them was accepted.
func TestFunctionsRefuseMisuse(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t) // one session, for the settings
	var now float64
	is.NoErr(c.QueryRow(ctx(t), `SELECT extract(epoch FROM clock_timestamp())::float8`).Scan(&now))
	var seqs []int64
	for _, ev := range []string{"a1", "a2", "a3", "b1"} {
		var s int64
		is.NoErr(c.QueryRow(ctx(t), `SELECT harel_publish($1, $2, 0)`, ev[:1], ev).Scan(&s))
		seqs = append(seqs, s)
	}
	a3, b1 := seqs[2], seqs[3]
	rows, err := c.Query(ctx(t), `SELECT group_id FROM harel_claim_many($1::float8, $1::float8 + 600, 'w:1', 0, 2)`, now)
	is.NoErr(err)
	leased, err := pgx.CollectRows(rows, pgx.RowTo[string])
	is.NoErr(err)
	is.Equal(leased, []string{"a", "b"}) // w:1 holds a (head a1) and b
	before := tables(t, c)

	hour := 3600.0
	for _, tc := range []struct {
		name, sql string
		args      []any
		code      string
	}{
		{"ClaimNullToken", `SELECT * FROM harel_claim($1::float8, $1::float8 + 60, NULL, 0)`, []any{now}, "PT002"},
		{"ClaimEmptyToken", `SELECT * FROM harel_claim($1::float8, $1::float8 + 60, '', 0)`, []any{now}, "PT002"},
		{"ClaimManyNullToken", `SELECT * FROM harel_claim_many($1::float8, $1::float8 + 60, NULL, 0, 5)`, []any{now}, "PT002"},
		{"ExchangeEmptyToken", `SELECT * FROM harel_exchange($1::float8, $1::float8 + 60, '', 0, 5, '{}', '{}', '{}', '{}')`, []any{now}, "PT002"},
		{"ClaimLeaseEndAtNow", `SELECT * FROM harel_claim($1::float8, $1::float8, 'w:2', 0)`, []any{now}, "PT003"},
		{"ClaimLeaseEndBeforeNow", `SELECT * FROM harel_claim($1::float8, $1::float8 - 60, 'w:2', 0)`, []any{now}, "PT003"},
		{"ClaimNullLeaseEnd", `SELECT * FROM harel_claim($1::float8, NULL, 'w:2', 0)`, []any{now}, "PT003"},
		{"ClaimManyLeaseEndBeforeNow", `SELECT * FROM harel_claim_many($1::float8, $1::float8 - 1, 'w:2', 0, 5)`, []any{now}, "PT003"},
		{"ExchangeLeaseEndBeforeNow", `SELECT * FROM harel_exchange($1::float8, $1::float8 - 1, 'w:2', 0, 5, '{}', '{}', '{}', '{}')`, []any{now}, "PT003"},
		{"AckManyKeepsWithLeaseEndAtNow", `SELECT * FROM harel_ack_many('{b}', ARRAY[$2]::bigint[], '{w:1}', '{true}', $1::float8, $1::float8)`, []any{now, b1}, "PT003"},
		{"AckManyKeepsWhileNoneWaitsWithNoLeaseEnd", `SELECT * FROM harel_ack_many('{b}', ARRAY[$2]::bigint[], '{w:1}', '{NULL}', $1::float8, NULL)`, []any{now, b1}, "PT003"},
		{"ExtendNullLeaseEnd", `SELECT harel_extend('a', 'w:1', NULL)`, nil, "PT003"},
		{"ExtendToAMinuteAgo", `SELECT harel_extend('a', 'w:1', $1::float8 - 60)`, []any{now}, "PT003"},
		{"ParkWithNullNow", `SELECT harel_nack('a', 'w:1', NULL, 10)`, nil, "PT003"},
		{"NackNegativeDelay", `SELECT harel_nack('a', 'w:1', $1::float8, -10)`, []any{now}, "PT004"},
		{"NackNullDelay", `SELECT harel_nack('a', 'w:1', $1::float8, NULL)`, []any{now}, "PT004"},
		{"ClaimAnHourFast", `SELECT * FROM harel_claim($1::float8, $1::float8 + 60, 'w:2', 0)`, []any{now + hour}, "PT005"},
		{"ClaimAnHourSlow", `SELECT * FROM harel_claim($1::float8, $1::float8 + 60, 'w:2', 0)`, []any{now - hour}, "PT005"},
		{"ClaimManyAnHourFast", `SELECT * FROM harel_claim_many($1::float8, $1::float8 + 60, 'w:2', 0, 5)`, []any{now + hour}, "PT005"},
		{"ExchangeAnHourFast", `SELECT * FROM harel_exchange($1::float8, $1::float8 + 60, 'w:2', 0, 5, '{}', '{}', '{}', '{}')`, []any{now + hour}, "PT005"},
		{"AckManyAnHourFast", `SELECT * FROM harel_ack_many('{b}', ARRAY[$2]::bigint[], '{w:1}', '{false}', $1::float8, $1::float8 + 60)`, []any{now + hour, b1}, "PT005"},
		{"AckAnHourFast", `SELECT harel_ack('b', $2, 'w:1', $1::float8)`, []any{now + hour, b1}, "PT005"},
		{"NackAnHourFast", `SELECT harel_nack('b', 'w:1', $1::float8, 0)`, []any{now + hour}, "PT005"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Exec(ctx(t), tc.sql, tc.args...)
			if got := sqlState(err); got != tc.code {
				t.Errorf("got %v (SQLSTATE %q), want SQLSTATE %s", err, got, tc.code)
			}
			if got := tables(t, c); got != before {
				t.Errorf("a refused call changed the tables:\n got %s\nwant %s", got, before)
			}
		})
	}

	// An ack of a message behind its group's head, under the token that
	// holds the group, is refused (PT001, since version 10: the claim
	// records what it handed out) and changes nothing; a batch answers it
	// not held. The ack of the head it was handed is accepted.
	_, err = c.Exec(ctx(t), `SELECT harel_ack('a', $1, 'w:1', $2)`, a3, now)
	is.Equal(sqlState(err), "PT001")
	var held bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT held FROM harel_ack_many('{a}', ARRAY[$1]::bigint[], '{w:1}', '{false}', $2::float8, $2::float8 + 60)`, a3, now).Scan(&held))
	is.True(!held)
	is.Equal(tables(t, c), before)
	var accepted bool
	is.NoErr(c.QueryRow(ctx(t), `SELECT harel_ack('a', $1, 'w:1', $2)`, seqs[0], now).Scan(&accepted))
	is.True(accepted)
}

// TestClockBound: the bound is 10 s unless set, may be set per session
// (or role, or database) in seconds, or 'off'; a NULL p_now is not checked.
func TestClockBound(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
	c := db.Conn(t)
	claim := func(skew float64) string {
		t.Helper()
		_, err := c.Exec(ctx(t), `SELECT * FROM harel_claim(extract(epoch FROM clock_timestamp()) + $1, extract(epoch FROM clock_timestamp()) + $1 + 60, 'w:1', 0)`, skew)
		return sqlState(err)
	}
	is.Equal(claim(0), "")       // the server's clock
	is.Equal(claim(5), "")       // within the default bound
	is.Equal(claim(-5), "")      // either way
	is.Equal(claim(15), "PT005") // beyond it
	is.Equal(claim(-15), "PT005")
	_, err := c.Exec(ctx(t), `SET pgtransport.max_clock_skew = 2`)
	is.NoErr(err)
	is.Equal(claim(5), "PT005") // a bound of the session's
	_, err = c.Exec(ctx(t), `SET pgtransport.max_clock_skew = 7200`)
	is.NoErr(err)
	is.Equal(claim(3600), "")
	_, err = c.Exec(ctx(t), `SET pgtransport.max_clock_skew = '1 min'`)
	is.NoErr(err)
	is.Equal(claim(30), "")      // an interval reads as one
	is.Equal(claim(90), "PT005") // and bounds as one
	_, err = c.Exec(ctx(t), `SET pgtransport.max_clock_skew = 'off'`)
	is.NoErr(err)
	is.Equal(claim(-1e9), "") // none at all
	_, err = c.Exec(ctx(t), `RESET pgtransport.max_clock_skew`)
	is.NoErr(err)
	is.Equal(claim(3600), "PT005") // the default again
	_, err = c.Exec(ctx(t), `SELECT * FROM harel_claim(NULL, extract(epoch FROM clock_timestamp()) + 60, 'w:1', 0)`)
	is.NoErr(err) // NULL p_now is not checked: it means what it did
}
