package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"
)

func TestMain(m *testing.M) { Main(m) }

// TestSweep: a sweep drops a stamped test schema only when it is old and
// its owner has no connection left; a live owner's schema, a young one and
// an unstamped one survive, however old.
func TestSweep(t *testing.T) {
	is := is.New(t)
	ctx := Context(t)
	DSN(t)
	_, adm, err := server()
	is.NoErr(err) // the test server
	now := time.Now()
	old := now.Add(-2 * staleAfter)

	other := randomOwner() // another process, alive while its connection is open
	conn := connectAs(t, appName(other))
	schema := func(owner string, created time.Time) string {
		name := randomName()
		is.NoErr(createSchema(ctx, adm, name, owner, created)) // create a stamped schema
		t.Cleanup(func() {
			_, _ = adm.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
		})
		return name
	}
	var (
		deadOld   = schema(randomOwner(), old)
		deadYoung = schema(randomOwner(), now.Add(-staleAfter/2))
		mineOld   = schema(owner, old)
		otherOld  = schema(other, old)
		unstamped = randomName()
		exists    = func(name string) bool {
			var ok bool
			is.NoErr(adm.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name).Scan(&ok))
			return ok
		}
	)
	_, err = adm.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{unstamped}.Sanitize())
	is.NoErr(err) // an unstamped t_ schema, as an older pgtest made them
	t.Cleanup(func() {
		_, _ = adm.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{unstamped}.Sanitize())
	})

	_, err = sweep(ctx, adm, now)
	is.NoErr(err)
	is.True(!exists(deadOld))  // old, owner gone: dropped
	is.True(exists(deadYoung)) // owner gone, but too young to tell from a pool between connections
	is.True(exists(mineOld))   // this process is alive
	is.True(exists(otherOld))  // another live process: its connection names it
	is.True(exists(unstamped)) // not pgtest's stamp: never touched

	// The other process ends: once its backend is gone, its schema goes too.
	is.NoErr(conn.Close(ctx))
	waitFor(t, 10*time.Second, func() bool {
		var n int
		is.NoErr(adm.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName(other)).Scan(&n))
		return n == 0
	})
	dropped, err := sweep(ctx, adm, now)
	is.NoErr(err)
	is.True(!exists(otherOld)) // owner gone: dropped
	is.True(exists(deadYoung))
	is.True(exists(mineOld))
	for _, d := range dropped {
		is.True(d != mineOld && d != deadYoung) // never reported what it kept
	}
}

// TestOpenStamps: a test's schema carries this process's stamp, and its
// pool this process's application_name, so sweeps elsewhere leave it alone.
func TestOpenStamps(t *testing.T) {
	is := is.New(t)
	db := New(t, 2)
	ctx := Context(t)
	var note, app string
	is.NoErr(db.Pool.QueryRow(ctx, `SELECT obj_description(to_regnamespace($1), 'pg_namespace'), current_setting('application_name')`, db.Schema).Scan(&note, &app))
	m := stampRE.FindStringSubmatch(note)
	is.True(m != nil)                          // stamped
	is.Equal(m[1], owner)                      // by this process
	is.Equal(app, appName(owner))              // whose connections say so
	is.True(schemaName.MatchString(db.Schema)) // a name the sweep recognises
}

func randomOwner() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func randomName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "t_" + hex.EncodeToString(b[:])
}

// connectAs opens a connection with the given application_name, closed in
// t.Cleanup if the test has not closed it.
func connectAs(t *testing.T, app string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(Context(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// waitFor polls cond until it holds or within passes. For conditions with
// no signal to wait on: a backend's exit shows only in pg_stat_activity.
func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", within)
		}
	}
}

// TestFindOrder: TEST_DATABASE_URL comes before DATABASE_URL, and a
// variable that is set but does not connect fails rather than falling
// through to the next candidate.
func TestFindOrder(t *testing.T) {
	is := is.New(t)
	good := DSN(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	is.NoErr(err) // a free port
	bad := "postgres://postgres@" + l.Addr().String() + "/postgres?sslmode=disable&connect_timeout=1"
	is.NoErr(l.Close()) // nothing listens there now
	t.Setenv("PGTRANSPORT_TEST_THROWAWAY", "")

	t.Setenv("TEST_DATABASE_URL", good)
	t.Setenv("DATABASE_URL", bad)
	dsn, err := find()
	is.NoErr(err)
	is.Equal(dsn, good) // TEST_DATABASE_URL wins; DATABASE_URL is not even tried

	t.Setenv("TEST_DATABASE_URL", bad)
	t.Setenv("DATABASE_URL", good)
	_, err = find()
	is.True(err != nil)                                           // a set variable that does not connect is an error
	is.True(strings.HasPrefix(err.Error(), "TEST_DATABASE_URL:")) // naming the variable

	t.Setenv("TEST_DATABASE_URL", "")
	dsn, err = find()
	is.NoErr(err)
	is.Equal(dsn, good) // then DATABASE_URL
}

// TestReusedPartitionsAreFresh: a queue ReusedPartitions hands out again
// holds nothing of the test before: no rows, no table of its own, the
// policy and the seqs of a fresh queue; one whose test made a function is
// not handed out again.
func TestReusedPartitionsAreFresh(t *testing.T) {
	type state struct {
		schema   string
		rows     int
		tables   int
		attempts int
		next     int64
	}
	read := func(t *testing.T, p *Partitioned) state {
		is := is.New(t)
		s := state{schema: p.Schema}
		part := p.Parts[1]
		is.NoErr(part.QueryRow(Context(t), `SELECT (SELECT count(*) FROM transport_messages) + (SELECT count(*) FROM transport_groups WHERE drained_at IS NULL)
			+ (SELECT count(*) FROM transport_dead_letters) + (SELECT count(*) FROM transport_dedup)`).Scan(&s.rows))
		is.NoErr(part.QueryRow(Context(t), `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&s.tables))
		is.NoErr(part.QueryRow(Context(t), `SELECT max_attempts FROM transport_policy`).Scan(&s.attempts))
		is.NoErr(part.QueryRow(Context(t), `SELECT CASE WHEN is_called THEN last_value + 1024 ELSE last_value END FROM transport_messages_seq_seq`).Scan(&s.next))
		return s
	}
	var first state
	t.Run("Use", func(t *testing.T) {
		is := is.New(t)
		p := ReusedPartitions(t, 4)
		first = read(t, p)
		is.Equal(first.rows, 0) // fresh
		_, err := p.Parts[1].Exec(Context(t), `CREATE TABLE effects (id BIGSERIAL PRIMARY KEY);
			INSERT INTO effects DEFAULT VALUES;
			UPDATE transport_policy SET max_attempts = 3;
			SELECT harel_publish('g', 'e', 0), harel_publish('h', 'e', 0)`)
		is.NoErr(err) // a test's writes
	})
	t.Run("Again", func(t *testing.T) {
		is := is.New(t)
		p := ReusedPartitions(t, 4)
		is.Equal(read(t, p), first) // the same queue, as fresh as it was
		_, err := p.Parts[0].Exec(Context(t), `CREATE FUNCTION mine() RETURNS INT LANGUAGE sql AS 'SELECT 1'`)
		is.NoErr(err) // a function reset does not undo
	})
	t.Run("NotAfterAFunction", func(t *testing.T) {
		is := is.New(t)
		p := ReusedPartitions(t, 4)
		is.True(p.Schema != first.schema) // that queue was dropped
		var mine bool
		is.NoErr(p.Parts[0].QueryRow(Context(t), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, first.schema).Scan(&mine))
		is.True(!mine)
	})
}

// TestReusedDBIsFresh: a schema ReusedDB hands out again holds a fresh
// queue: none of the rows, tables or policy of the test before.
func TestReusedDBIsFresh(t *testing.T) {
	read := func(t *testing.T, db *DB) [4]int {
		is := is.New(t)
		var s [4]int
		is.NoErr(db.Pool.QueryRow(Context(t), `SELECT (SELECT count(*) FROM transport_messages) + (SELECT count(*) FROM transport_groups WHERE drained_at IS NULL),
			(SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()),
			(SELECT max_attempts FROM transport_policy)`).Scan(&s[0], &s[1], &s[2]))
		is.NoErr(db.Pool.QueryRow(Context(t), `SELECT harel_publish('probe', 'e', 0)`).Scan(&s[3])) // the seq a publish takes
		return s
	}
	var first [4]int
	var schema string
	t.Run("Use", func(t *testing.T) {
		is := is.New(t)
		db := ReusedDB(t, 2)
		schema, first = db.Schema, read(t, db)
		_, err := db.Pool.Exec(Context(t), `CREATE TABLE effects (id BIGSERIAL PRIMARY KEY);
			UPDATE transport_policy SET max_attempts = 3;
			SELECT harel_publish('g', 'e', 0)`)
		is.NoErr(err) // a test's writes
	})
	t.Run("Again", func(t *testing.T) {
		is := is.New(t)
		db := ReusedDB(t, 2)
		is.Equal(db.Schema, schema)  // the same schema
		is.Equal(read(t, db), first) // as fresh as it was, down to the next seq
	})
}

// TestClusterSettings: a throwaway cluster starts with the settings it is
// given (bench's -pgconf) and refuses one that is not name=value or
// whose value breaks the line.
func TestClusterSettings(t *testing.T) {
	is := is.New(t)
	if _, err := findBin(); err != nil {
		t.Skipf("no server binaries to start a cluster with: %v", err)
	}
	_, err := StartCluster("shared_buffers")
	is.True(err != nil) // not name=value
	_, err = StartCluster("application_name=a\nfsync=off")
	is.True(err != nil) // a line break would write a second setting
	c, err := StartCluster("shared_buffers=48MB", " work_mem = 5MB ")
	is.NoErr(err)
	defer c.Stop()
	conn, err := pgx.Connect(Context(t), c.DSN())
	is.NoErr(err)
	defer conn.Close(context.Background())
	var buffers, workMem string
	is.NoErr(conn.QueryRow(Context(t), `SELECT current_setting('shared_buffers'), current_setting('work_mem')`).Scan(&buffers, &workMem))
	is.Equal(buffers, "48MB")
	is.Equal(workMem, "5MB")
}
