package pgtest

import "fmt"

// Example gives one Example function its database: a fresh schema on the
// test server, found as the tests find it, with db.Pool's search_path set
// to it. drop closes the pool and drops the schema; call it (deferred)
// after closing every transport on it.
//
// An Example function has no *testing.T to fail, so a missing server, or a
// schema that cannot be created or dropped, panics: the example fails
// loudly, as a test would, and never passes by skipping.
func Example() (db *DB, drop func()) {
	db, err := Open(4)
	if err != nil {
		panic(fmt.Sprintf("pgtest: %v", err))
	}
	return db, func() {
		if err := db.Drop(); err != nil {
			panic(fmt.Sprintf("pgtest: %v", err))
		}
	}
}
