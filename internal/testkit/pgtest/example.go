package pgtest

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// MainWithExamples is MainNoLeaks for a package whose Example functions
// are written as a user writes them: they connect to
// os.Getenv("DATABASE_URL") with the zero Config, so that godoc shows no
// test harness. Before the package's tests and examples run, it points
// DATABASE_URL at a fresh schema on the test server (search_path set in
// the connection string), which the examples share in turn (they run one
// at a time, each leaving the queue as it found it); it drops that schema
// after them. A missing server fails the package loudly, as a test would.
func MainWithExamples(m *testing.M, pkgs ...string) {
	db, err := Open(4)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: the examples' database: %v\n", err)
		os.Exit(1)
	}
	db.Pool.Close()
	os.Setenv("DATABASE_URL", withSearchPath(db.DSN, db.Schema))
	runNoLeaks(m, pkgs, func() {
		if err := db.Drop(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: drop the examples' schema: %v\n", err)
		}
	})
}

// withSearchPath is dsn, a URL or a keyword/value string, with its
// search_path set to schema (a name pgtest made: no quoting needed).
func withSearchPath(dsn, schema string) string {
	switch {
	case !strings.Contains(dsn, "://"):
		return dsn + " search_path=" + schema
	case strings.Contains(dsn, "?"):
		return dsn + "&search_path=" + schema
	}
	return dsn + "?search_path=" + schema
}
