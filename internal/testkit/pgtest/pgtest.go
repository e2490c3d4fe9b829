// Package pgtest gives each test its own PostgreSQL schema on a real server.
//
// The server is, in order: $TEST_DATABASE_URL; $DATABASE_URL; a local
// server on 127.0.0.1:5432 or the default Unix socket; a throwaway cluster
// started from the installed PostgreSQL binaries (initdb and pg_ctl in a
// temporary directory, run as the postgres user when the process is root)
// and stopped when the tests end. TEST_DATABASE_URL comes first because a
// developer's DATABASE_URL often names an application database; a variable
// that is set but does not connect fails the run rather than falling
// through. PGTRANSPORT_TEST_THROWAWAY=1 skips all but the throwaway cluster.
// No server at all fails the test run loudly with install instructions; it
// never skips.
//
// Each schema records in its comment the process that made it and when;
// that process's connections carry the same name as their
// application_name. A process killed before its t.Cleanup ran (the fuzzing
// coordinator does this to its workers) leaves its schemas behind; the
// next test process drops them once they are an hour old and no connection
// of their maker is left, so a running test's schema is never touched.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	stdsync "sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	mu      stdsync.Mutex
	baseDSN string
	admin   *pgxpool.Pool
	cluster *Cluster
	failed  error
)

// Main runs a package's tests and then stops a throwaway cluster if one was
// started. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	Shutdown()
	os.Exit(code)
}

// Shutdown stops the test PgBouncer, closes the partitions' and the shared pools and stops the
// throwaway cluster, if any.
func Shutdown() {
	stopBouncer()
	stopPartitions()
	mu.Lock()
	defer mu.Unlock()
	if admin != nil {
		admin.Close()
		admin = nil
	}
	if cluster != nil {
		cluster.Stop()
		cluster = nil
	}
}

const install = `no PostgreSQL server for the tests.
Set TEST_DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres), start a
local server on 127.0.0.1:5432, or install PostgreSQL's server binaries so a
throwaway cluster can be started (Debian/Ubuntu: apt-get install postgresql).`

// DSN returns the connection string of the test server, finding or starting
// it on first use. It fails the test when there is none.
func DSN(tb testing.TB) string {
	tb.Helper()
	dsn, _, err := server()
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return dsn
}

// Server returns the throwaway cluster the tests run on, or nil when they
// run on a server this process does not own.
func Server(tb testing.TB) *Cluster {
	tb.Helper()
	DSN(tb)
	mu.Lock()
	defer mu.Unlock()
	return cluster
}

func server() (string, *pgxpool.Pool, error) {
	mu.Lock()
	defer mu.Unlock()
	if admin != nil || failed != nil {
		return baseDSN, admin, failed
	}
	baseDSN, failed = find()
	if failed == nil {
		admin, failed = open(baseDSN, 8)
	}
	if failed == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A sweep that fails costs nothing but a line: the next one retries.
		if dropped, err := sweep(ctx, admin, time.Now()); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		} else if len(dropped) > 0 {
			fmt.Fprintf(os.Stderr, "pgtest: dropped %d test schemas left by dead runs\n", len(dropped))
		}
	}
	return baseDSN, admin, failed
}

func find() (string, error) {
	var tried []error
	if os.Getenv("PGTRANSPORT_TEST_THROWAWAY") == "" {
		// A variable that is set names the server the developer meant: if it
		// does not work, that is an error, not a hint to try the next one.
		for _, name := range []string{"TEST_DATABASE_URL", "DATABASE_URL"} {
			if dsn := os.Getenv(name); dsn != "" {
				if err := ping(dsn); err != nil {
					return "", fmt.Errorf("%s: %w", name, err)
				}
				return dsn, nil
			}
		}
		for _, dsn := range []string{
			"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
			"host=/var/run/postgresql user=postgres dbname=postgres",
		} {
			err := ping(dsn)
			if err == nil {
				return dsn, nil
			}
			tried = append(tried, err)
		}
	}
	c, err := StartCluster()
	if err != nil {
		tried = append(tried, err)
		return "", fmt.Errorf("%s\n%w", install, errors.Join(tried...))
	}
	cluster = c
	fmt.Fprintf(os.Stderr, "pgtest: started a throwaway PostgreSQL cluster (%s) at %s\n", c.bin, c.DSN())
	return c.DSN(), nil
}

func ping(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

func open(dsn string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	// At least one connection names this process as long as it runs, so
	// another process's sweep never takes its schemas for abandoned ones.
	cfg.MinConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = appName(owner)
	return pgxpool.NewWithConfig(context.Background(), cfg)
}

// DB is one test's database: a fresh schema, dropped when the test ends.
type DB struct {
	Schema string        // the test's own schema; pass it as Config.Schema
	DSN    string        // the server's connection string
	Pool   *pgxpool.Pool // search_path is Schema, so plain SQL finds the tables
	admin  *pgxpool.Pool
	fresh  *snapshot // ReusedDB's: the fresh queue's state
}

// New creates a fresh schema for tb and a pool (up to maxConns connections,
// 0 means 8) whose search_path is that schema. Both go away in tb.Cleanup.
func New(tb testing.TB, maxConns int32) *DB {
	tb.Helper()
	db, err := Open(maxConns)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := db.Drop(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return db
}

// Open is New for programs (the benchmark runner): the caller drops the
// schema with Drop.
func Open(maxConns int32) (*DB, error) {
	dsn, adm, err := server()
	if err != nil {
		return nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	if err := createSchema(ctx, adm, name, owner, time.Now()); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	pool, err := schemaPool(dsn, name, maxConns)
	if err != nil {
		return nil, err
	}
	return &DB{Schema: name, DSN: dsn, Pool: pool, admin: adm}, nil
}

// schemaPool is a pool of up to maxConns connections (0 means 8) on dsn
// whose search_path is schema.
func schemaPool(dsn, schema string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if maxConns == 0 {
		maxConns = 8
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["application_name"] = appName(owner)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	return pool, nil
}

// Drop closes the pool and drops the schema with everything in it. It tries
// three times: after a server restart (TestRestart) the shared admin pool's
// first use finds its old connection gone.
func (db *DB) Drop() error {
	db.Pool.Close()
	var err error
	for range 3 {
		if _, err = db.admin.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{db.Schema}.Sanitize()+" CASCADE"); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("drop schema %s: %w", db.Schema, err)
}

// Conn opens a single connection whose search_path is the test's schema,
// closed in tb.Cleanup.
func (db *DB) Conn(tb testing.TB) *pgx.Conn {
	tb.Helper()
	cfg, err := pgx.ParseConfig(db.DSN)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	cfg.RuntimeParams["search_path"] = db.Schema
	cfg.RuntimeParams["application_name"] = appName(owner)
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Context returns a context that ends after a minute or when tb ends,
// whichever comes first: the bound for one test's database calls.
func Context(tb testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	tb.Cleanup(cancel)
	return c
}
